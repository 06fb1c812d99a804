"""The bundled model catalog: real config.json files with their provenance (data/models/index.json)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_DATA = os.path.join(os.path.dirname(__file__), "data", "models")  # package data beside the module


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # short name users type
    hf_id: str  # the Hub repository the config belongs to
    file: str  # config file under data/models
    source: str  # where our copy came from
    note: str  # caveats of the copy

    @property
    def file_path(self) -> str:
        return os.path.join(_DATA, self.file)

    @property
    def path(self) -> Path:
        from pathlib import Path

        return Path(self.file_path)


@lru_cache(maxsize=1)
def entries() -> tuple[CatalogEntry, ...]:
    with open(os.path.join(_DATA, "index.json"), encoding="utf-8") as fh:
        index = json.load(fh)
    return tuple(CatalogEntry(**item) for item in index["models"])


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def find(name: str) -> CatalogEntry | None:
    """A catalog entry by short name or Hub id (case-insensitive), or None."""
    key = _key(name)
    for entry in entries():
        if key in (_key(entry.name), _key(entry.hf_id)):
            return entry
    return None


_SUFFIXES = r"-(instruct|chat|it|hf|base|bf16|fp8|awq|gptq|gguf|\d{4})$"  # compiled (and cached) by re on use


def _stem(name: str) -> str:
    """A model name without its owner, variant suffixes and punctuation: 'meta-llama/Llama-3.1-8B-Instruct' ->
    'llama318b'."""
    tail = name.strip().lower().split("/")[-1]
    while (trimmed := re.sub(_SUFFIXES, "", tail)) != tail:
        tail = trimmed
    return re.sub(r"[^a-z0-9]", "", tail)


def similar(name: str, limit: int = 3) -> list[str]:
    """Catalog names close to `name` (typos, a missing dot or dash, an -Instruct Hub id of a catalog model)."""
    by_stem: dict[str, str] = {}
    for entry in entries():
        by_stem.setdefault(_stem(entry.name), entry.name)
        by_stem.setdefault(_stem(entry.hf_id), entry.name)
    stem = _stem(name)
    if stem in by_stem:
        return [by_stem[stem]]
    import difflib  # only when a name was not found

    scored = sorted(((difflib.SequenceMatcher(None, stem, s).ratio(), s) for s in by_stem), reverse=True)
    best = scored[0][0] if scored else 0.0
    close = [s for ratio, s in scored if ratio >= max(0.75, best - 0.05)]
    return list(dict.fromkeys(by_stem[c] for c in close))[:limit]


def did_you_mean(name: str) -> str:
    """' (did you mean llama-3.1-8b?)' or ''."""
    names = similar(name)
    return f" (did you mean {' or '.join(names)}?)" if names else ""
