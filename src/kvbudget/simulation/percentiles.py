"""A run's latencies as percentiles, over the whole run and over windows of it."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

from kvbudget.errors import KVBudgetError


def check_metric(name: str) -> tuple[str, str]:
    """A latency's name split into what and which statistic; an error names the choices."""
    kind, _, stat = name.partition("_")
    if kind not in ("ttft", "tpot", "e2e") or stat not in ("p50", "p90", "p99", "mean", "max"):
        raise KVBudgetError(f"slo {name}: name a latency as ttft|tpot|e2e _ p50|p90|p99|mean|max, e.g. ttft_p99",
                            param="slo")
    return kind, stat


def metric_of(name: str, ttft: Percentiles | None, tpot: Percentiles | None, e2e: Percentiles | None
              ) -> float | None:
    """A latency figure by name (ttft|tpot|e2e _ p50|p90|p99|mean|max, seconds) of a run's percentiles."""
    kind, stat = check_metric(name)
    pct = {"ttft": ttft, "tpot": tpot, "e2e": e2e}[kind]
    return None if pct is None else float(getattr(pct, stat))


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float
    max: float

    @staticmethod
    def of(values: array | tuple[float, ...]) -> Percentiles | None:
        if not values:
            return None
        s = sorted(values)

        def q(p: float) -> float:  # nearest rank
            return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

        return Percentiles(q(0.5), q(0.9), q(0.99), sum(s) / len(s), s[-1])


LATENCY_WINDOWS = 60  # latency percentiles over time: the run cut into this many windows of completions


@dataclass(frozen=True)
class LatencyWindow:
    """The requests that completed in [start, end): how many, and their TTFT and end-to-end percentiles."""

    start: float
    end: float
    completed: int
    ttft: Percentiles | None
    e2e: Percentiles | None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "completed": self.completed,
                "ttft_s": None if self.ttft is None else dict(self.ttft.__dict__),
                "e2e_s": None if self.e2e is None else dict(self.e2e.__dict__)}


def latency_windows(finished: array | tuple[float, ...], ttft: array | tuple[float, ...],
                    e2e: array | tuple[float, ...], duration: float, count: int = LATENCY_WINDOWS
                    ) -> tuple[LatencyWindow, ...]:
    """Completions (finish time, TTFT, end to end) cut into `count` equal windows of the run."""
    if not duration or not finished:
        return ()
    width = duration / count
    groups: list[tuple[list[float], list[float]]] = [([], []) for _ in range(count)]
    for t, a, b in zip(finished, ttft, e2e, strict=True):
        group = groups[min(count - 1, int(t / width))]
        group[0].append(a)
        group[1].append(b)
    return tuple(LatencyWindow(i * width, (i + 1) * width, len(a), Percentiles.of(tuple(a)), Percentiles.of(tuple(b)))
                 for i, (a, b) in enumerate(groups))
