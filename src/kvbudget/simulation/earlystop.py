"""Ending a simulation early once an objective is certainly missed (`recommend` stops a losing candidate's run)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvbudget.simulation.percentiles import check_metric

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.workload import Request


class Missed(Exception):
    """Raised inside a run once an objective is certainly missed (`EarlyStop`)."""


class EarlyStop:
    """Ends a run as soon as the requests finished so far miss an objective whatever the rest do: a nearest-rank
    percentile p of n values passes a limit once n - ceil(p n) + 1 of them are past it (the maximum: one)."""

    def __init__(self, requests: Sequence[Request], slo: Mapping[str, float]) -> None:
        totals = {"ttft": len(requests), "e2e": len(requests),
                  "tpot": sum(1 for r in requests if r.output_tokens > 1)}
        quantiles = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
        self.watch: list[tuple[str, int, float, int]] = []  # (name, which of ttft/tpot/e2e, limit, past needed)
        for name, limit in slo.items():
            kind, stat = check_metric(name)
            if stat in quantiles:
                n = totals[kind]
                self.watch.append((name, ("ttft", "tpot", "e2e").index(kind), limit,
                                   n - math.ceil(quantiles[stat] * n) + 1))
        self.past = [0] * len(self.watch)
        self.stopped: tuple[str, int, float] | None = None

    def __call__(self, *finished: Any) -> None:
        """A request answered: (replica index, in a fleet), request, ttft, tpot, e2e."""
        values = finished[-3:]
        for i, (name, which, limit, needed) in enumerate(self.watch):
            value = values[which]
            if value is not None and value > limit:
                self.past[i] += 1
                if self.past[i] >= needed:
                    self.stopped = (name, self.past[i], limit)
                    raise Missed
