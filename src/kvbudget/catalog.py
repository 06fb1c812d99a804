"""The bundled model catalog: real config.json files with their provenance (data/models/index.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

_DATA = Path(str(resources.files("kvbudget") / "data" / "models"))


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # short name users type
    hf_id: str  # the Hub repository the config belongs to
    file: str  # config file under data/models
    source: str  # where our copy came from
    note: str  # caveats of the copy

    @property
    def path(self) -> Path:
        return _DATA / self.file


@lru_cache(maxsize=1)
def entries() -> tuple[CatalogEntry, ...]:
    index = json.loads((_DATA / "index.json").read_text(encoding="utf-8"))
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
