"""Reading a running engine's gauges: the Prometheus text exposition, and the records of the KV pool it states
(`PoolGauge`, `PoolReport`, `ReportsPool`). Each engine's own readers live in its package (`gauges.py`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvbudget.engines.base import Engine, EngineOptions
    from kvbudget.model.spec import ModelSpec


def parse_prometheus(text: str, name: str) -> float | None:
    """The largest sample of metric `name` in a Prometheus text exposition (one per engine or rank)."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text,
                                                        re.M)]
    return max(values) if values else None


def first_gauge(text: str, names: tuple[str, ...]) -> float | None:
    """The first of `names` the exposition has (a metric's current name, then the names it had before)."""
    for name in names:
        value = parse_prometheus(text, name)
        if value is not None:
            return value
    return None


def gauge_ratio(text: str, used: str, total: str) -> float | None:
    """used / total from two gauges of one exposition."""
    current, whole = parse_prometheus(text, used), parse_prometheus(text, total)
    return current / whole if current is not None and whole else None


# --- the pool a running engine states ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PoolReport:
    """A running engine's KV pool, as the engine itself states it."""

    tokens: int  # token slots of the pool (blocks x block size where it has blocks)
    source: str  # where it was read, in words
    blocks: int | None = None
    block_size: int | None = None
    context: int | None = None  # the longest request it takes, where it says


@dataclass(frozen=True, kw_only=True)
class PoolGauge:
    """Where a running engine states its KV pool (the first of `paths` that answers) and how to read it."""

    paths: tuple[str, ...]
    read: Callable[[str], PoolReport | None]  # the body -> the pool, or None when it states none (yet)


@runtime_checkable
class ReportsPool(Protocol):
    """An engine that states its KV pool while it runs."""

    pool_gauge: PoolGauge

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """The KV budget, in this engine's allocation of `model`, that holds the pool `report` states."""


def tokens_budget(engine: Engine, model: ModelSpec, report: PoolReport, kv_dtype: str = "auto", tp: int = 1,
                  options: EngineOptions | None = None) -> int:
    """The budget of a pool counted in tokens: its tokens at the bytes per token of the engine's allocation."""
    from kvbudget.engines.base import EngineOptions

    return report.tokens * engine.allocate(model, kv_dtype, tp, options or EngineOptions()).bytes_per_token


def whole_number(value: Any) -> int | None:
    """A positive whole number, or None (a label "None", a missing field, a boolean)."""
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number > 0 else None
