"""Where a config comes from: a bundled catalog name, a file, a model folder, or a Hub id."""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from kvbudget import catalog
from kvbudget.errors import ConfigError
from kvbudget.model.config import parse_config
from kvbudget.model.spec import ModelSpec

if TYPE_CHECKING:
    from pathlib import Path  # imported where a path is read: a catalog name needs no pathlib


def read_json(path: str | os.PathLike[str]) -> dict:
    """A config file, within the bounds of `kvbudget.files.read_document` (size, UTF-8 text, nesting)."""
    from kvbudget.files import read_json as read_bounded

    return read_bounded(path, "model", error=ConfigError)  # parse_config checks its type


def _from_hub(repo_id: str) -> Path:
    """config.json of a Hub repo through huggingface_hub (its cache, HF_HUB_OFFLINE and HF_TOKEN apply)."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:  # pragma: no cover - a declared dependency
        raise ConfigError("huggingface_hub is not installed; pip install huggingface_hub") from None
    from kvbudget import hub

    offline = hub.offline_reason()
    try:
        from pathlib import Path

        return Path(hf_hub_download(repo_id, "config.json", local_files_only=offline is not None))
    except GatedRepoError:
        raise ConfigError(
            f"{repo_id}: the repository is gated; accept its licence on the Hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        hint = "" if os.environ.get("HF_TOKEN") else " (if it is private, set HF_TOKEN)"
        raise ConfigError(f"{repo_id}: no such model on the Hub{hint}{catalog.did_you_mean(repo_id)}; or name a "
                          "catalog model (kvbudget models)") from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: test it first
        raise ConfigError(
            f"{repo_id}: config.json is not in the local Hugging Face cache and the Hub cannot be reached"
            f" ({offline or 'no network'}){catalog.did_you_mean(repo_id)}; download it once online, or pass a file"
        ) from None
    except EntryNotFoundError:
        raise ConfigError(f"{repo_id}: the repository has no config.json") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{repo_id}: could not fetch config.json from the Hub: {exc}".splitlines()[0]) from None


def from_transformers(model: Any, name: str, dtype: str | None = None) -> ModelSpec:
    """The ModelSpec of a loaded transformers model (its config object), with `dtype` standing for the weights'
    own dtype when the loaded one is not it (a GGUF file dequantized to float32)."""
    config = model.config.to_dict()
    if "gguf" in str((config.get("quantization_config") or {}).get("quant_method", "")).lower():
        del config["quantization_config"]  # transformers' mark of a GGUF load: its weights are the file's bytes
    if dtype is not None:
        config["torch_dtype"] = config["dtype"] = dtype
    return parse_config(config, name=name, source="transformers")


def save_dequantized(model: Any, folder: Path) -> None:
    """A transformers model loaded from a GGUF file (dequantized), saved as a plain model folder: its config
    without the GGUF mark and its float weights in safetensors (save_pretrained refuses GGUF-loaded models)."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(folder / "model.safetensors"))


# The folders a model argument may name files in: None (the default) lets it name any file. `kvbudget web` narrows
# it to its upload folder, so that what a request names is read as a catalog name or a Hub id, never a server file.
readable_roots: ContextVar[tuple[Path, ...] | None] = ContextVar("kvbudget_readable_roots", default=None)


def _may_read(path: Path) -> bool:
    roots = readable_roots.get()
    if roots is None:
        return True
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):
        return False
    return any(resolved.is_relative_to(root) for root in roots)


def _from_path(path: Path, name: str | None) -> ModelSpec | None:
    """A config.json, a model folder or a GGUF file, or None where `path` is outside the readable roots."""
    if not _may_read(path):
        return None
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ConfigError(f"{path}: folder has no config.json; pass a config file or a model folder")
        return parse_config(read_json(config_path), name=name or path.name, source=str(config_path))
    if not path.is_file():  # a device or a pipe: not a model, read no further
        return None
    if path.suffix.lower() == ".gguf":
        from kvbudget.model.gguf import gguf_config

        config = gguf_config(path)
        return parse_config(config, name=name or path.stem, source=f"gguf:{path}")
    return parse_config(read_json(path), name=name or path.stem, source=str(path))


RESOLUTION_ORDER = ("an existing file (config.json or .gguf) or folder", "a catalog name (kvbudget models)",
                    "a Hub id (org/name)")


def load_model(source: str | os.PathLike | dict, name: str | None = None) -> ModelSpec:
    """A ModelSpec from, in this order: an existing config.json or model folder, a catalog name, a Hub id (its
    config.json through huggingface_hub's cache; offline, only that cache), or a config dict."""
    if isinstance(source, dict):
        return parse_config(source, name=name or "model", source="<dict>")
    text = str(source)
    expanded = os.path.expanduser(text)
    if os.path.exists(expanded):
        from pathlib import Path

        model = _from_path(Path(expanded), name)
        if model is not None:
            return model
    entry = catalog.find(text)
    if entry is not None:
        return parse_config(read_json(entry.file_path), name=entry.name, source=f"catalog:{entry.name}")
    if text.endswith((".json", ".gguf")) or text.startswith((".", "/", "~")):
        raise ConfigError(f"{expanded}: no such file; pass a config.json, a model folder, a catalog "
                          "name or a Hub id")
    if text.count("/") == 1 and all(text.split("/")):
        return parse_config(read_json(_from_hub(text)), name=name or text, source=f"hub:{text}")
    raise ConfigError(
        f"{text!r} is not a file, a folder, a catalog model or a Hub id (org/name){catalog.did_you_mean(text)}; "
        "run `kvbudget models` for the catalog"
    )
