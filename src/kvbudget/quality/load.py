"""The edges of `kvbudget quality`: the model (a folder with weights, a .gguf file that transformers
dequantizes, or the bundled test model) and the user's text as token ids."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvbudget
from kvbudget.bundled import BUNDLED, bundled_gguf, cache_dir
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import from_transformers, save_dequantized
from kvbudget.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Loaded:
    model: Any  # transformers, float32, on the CPU
    tokenizer: Any
    name: str
    gguf: Path | None  # the file it came from, for llama.cpp
    spec: ModelSpec  # what its cache holds, for the checks and the memory columns
    matmul: str = "float32"  # how the linear layers take their inputs (a GGUF's: as llama.cpp rounds them)
    as_llamacpp: bool = False  # llama.cpp's arithmetic: matmul inputs, Q's conversion, f32 caches kept as f16
    unmodelled: tuple[str, ...] = ()  # linear layers whose weight type has no input rule (left in float)

    @property
    def baseline(self) -> str:
        """The format of the untouched cache: f32, which llama.cpp's flash attention keeps as f16."""
        return "f16" if self.as_llamacpp else "f32"


@dataclass(frozen=True)
class Header:
    """What a model is, from its GGUF header or config.json alone (a fraction of a second): enough to refuse a
    request before the weights load (half a minute, and a float32 copy in the cache for a GGUF)."""

    name: str
    spec: ModelSpec
    gguf: Path | None


def read_header(source: str) -> Header:
    """The `Header` of a model folder, a .gguf file or the bundled name; a source that `load_model` would refuse
    is refused in its words."""
    path = bundled_gguf() if source == BUNDLED else Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise KVBudgetError(f"{source}: no such GGUF file")
        name = BUNDLED if source == BUNDLED else path.name
        from kvbudget.model.gguf import gguf_config

        config = gguf_config(path)
        config["torch_dtype"] = config["dtype"] = "float16"  # as load_model's spec: llama.cpp caches f16
        return Header(name, kvbudget.load_model(config, name=name), path)
    if not path.is_dir():
        raise KVBudgetError(f"{source}: not a model folder or a .gguf file (or {BUNDLED}, the bundled test model)")
    if not (path / "config.json").is_file():
        raise KVBudgetError(f"{source}: no config.json in the folder")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise KVBudgetError(f"{source}: the folder has a config but no weights (*.safetensors or *.bin); "
                            "kvbudget quality runs the model, so it needs them")
    return Header(path.name, kvbudget.load_model(path), None)


def load_model(source: str, as_engine: bool = True) -> Loaded:
    """The model from a folder, a .gguf file or the bundled name. A GGUF model's linear layers round their inputs
    as llama.cpp's matmuls do for each weight type (quality.matmul), and attention converts Q and keeps an f32
    cache as llama.cpp's does (quality.formats), unless `as_engine` is False."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise KVBudgetError("kvbudget quality runs the model with transformers and torch: "
                            "pip install 'kvbudget[quality]'") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = bundled_gguf() if source == BUNDLED else Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise KVBudgetError(f"{source}: no such GGUF file")
        _need("gguf", "accelerate")
        converted = _converted(path)
        if (converted / "config.json").is_file():  # dequantized once before: a plain folder loads in seconds
            model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(converted)
        else:
            try:  # transformers dequantizes every tensor to float32 (half a minute for SmolLM2 on 2 cores)
                with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # (its progress bar)
                    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                 dtype=torch.float32)
                    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            except (ValueError, OSError, KeyError) as exc:
                raise KVBudgetError(f"{source}: transformers cannot load this GGUF "
                                    f"({str(exc).splitlines()[0]})") from None
            part = converted.with_name(converted.name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            save_dequantized(model, part)
            tokenizer.save_pretrained(part)
            keep_one_copy(part, converted)
        model.eval()
        name = BUNDLED if source == BUNDLED else path.name
        spec = from_transformers(model, name, dtype="float16")  # (llama.cpp caches f16 unless told otherwise)
        if not as_engine:
            return Loaded(model=model, tokenizer=tokenizer, name=name, gguf=path, spec=spec)
        from kvbudget.quality import matmul  # torch: only once a model loads

        types = matmul.weight_types(model, path)
        unmodelled = matmul.engine_inputs(model, types)
        kinds = ", ".join(sorted(set(types.values())))
        return Loaded(model=model, tokenizer=tokenizer, name=name, gguf=path, spec=spec,
                      matmul=f"as llama.cpp rounds inputs to {kinds} weights",
                      as_llamacpp=True, unmodelled=tuple(unmodelled))
    spec = read_header(source).spec  # (a folder: refused as read_header refuses it)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Loaded(model=model, tokenizer=tokenizer, name=path.name, gguf=None, spec=spec)


def _converted(gguf_file: Path) -> Path:
    """Where the dequantized float32 copy of a GGUF file is kept (keyed by its name, size and time)."""
    st = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "converted" / f"{gguf_file.stem}-{key}"


def keep_one_copy(part: Path, converted: Path) -> None:
    """Put the new float32 copy (`part`) in its place, and remove the older copies of a GGUF file of the same name
    (another folder or time of it: a fresh download, a moved file), so the cache keeps one copy per file name (the
    bundled model's is 538 MB) instead of one more each time the file's path or time changes."""
    shutil.rmtree(converted, ignore_errors=True)
    part.rename(converted)
    stem = converted.name[:-17]  # less "-" and the 16 hex digits of the key
    for old in converted.parent.iterdir():
        if old != converted and re.fullmatch(re.escape(stem) + r"-[0-9a-f]{16}(\.part)?", old.name):
            shutil.rmtree(old, ignore_errors=True)


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise KVBudgetError(f"loading a GGUF file needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def read_text(tokenizer: Any, files: list[str]) -> str:
    """The data as one text: plain text files as they are; a .jsonl of chat requests rendered with the model's
    chat template, one request after another."""
    from kvbudget.files import iter_lines, read_text
    from kvbudget.tokens import read_request

    texts: list[str] = []
    for name in files:
        if name.endswith(".jsonl"):
            for n, line in enumerate(iter_lines(name), 1):
                if not line.strip():
                    continue
                messages, _ = read_request(f"{name}:{n}", line)
                if tokenizer.chat_template is None:
                    raise KVBudgetError(f"{name}: chat requests need the model's chat template, and its "
                                        "tokenizer has none; give plain text instead")
                texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        else:
            texts.append(read_text(name, "data"))
    text = "".join(texts)
    if not text.strip():
        raise KVBudgetError(f"data: {', '.join(files)} holds no text; give text files or chat requests",
                            param="data")
    return text
