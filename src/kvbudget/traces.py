"""The bundled request traces (data/traces/index.json): real production traces with their source and credit.

Every command that takes a trace takes one of these by name (`azure-conv-2023`) or a file path."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

from kvbudget.errors import KVBudgetError

_DATA = os.path.join(os.path.dirname(__file__), "data", "traces")  # package data beside the module


@dataclass(frozen=True, kw_only=True)
class BundledTrace:
    name: str  # what users type
    file: str  # file under data/traces
    what: str  # one line: what it records
    source: str  # where our copy came from
    licence: str
    credit: str  # what its licence asks to be shown beside results from it

    @property
    def path(self) -> str:
        return os.path.join(_DATA, self.file)


@lru_cache(maxsize=1)
def bundled() -> tuple[BundledTrace, ...]:
    with open(os.path.join(_DATA, "index.json"), encoding="utf-8") as fh:
        return tuple(BundledTrace(**item) for item in json.load(fh)["traces"])


def find(name: str) -> BundledTrace | None:
    """A bundled trace by name or by its file's name, or None."""
    key = name.strip().lower()
    return next((t for t in bundled() if key in (t.name, t.file.lower())), None)


def resolve(value: str, param: str = "trace") -> str:
    """The file a `--trace` value names: an existing file, else a bundled trace's name (or file name)."""
    if os.path.isfile(value):
        return value
    entry = find(value)
    if entry is not None:
        return entry.path
    names = ", ".join(t.name for t in bundled())
    raise KVBudgetError(f"trace {value}: no such file, and no bundled trace of that name (bundled: {names}; "
                        "`kvbudget traces` lists them)", param=param)
