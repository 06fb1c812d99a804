"""Questions answered by many simulations: the highest rate that meets latency objectives, and sweeps."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, final

from kvbudget.choices import Interconnect, parse_allocator
from kvbudget.engines.scheduling.setup import SimulationAsk
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.model.spec import ModelSpec
from kvbudget.simulation.percentiles import check_metric
from kvbudget.simulation.run import Simulation, simulate
from kvbudget.speculative import MAX_SPECULATIVE_TOKENS
from kvbudget.units import parse_size

Workload = Callable[[float], Iterable[Request]]  # a rate scale -> the requests at that rate


@final
class Seconds(float):
    """A duration in seconds that keeps the unit it was written in ("ms" or "s"), to be shown in it."""

    unit: str

    def __new__(cls, seconds: float, unit: str) -> Seconds:
        duration = super().__new__(cls, seconds)
        duration.unit = unit
        return duration

    def __reduce__(self) -> tuple[type[Seconds], tuple[float, str]]:  # pickles (a process pool's arguments)
        return Seconds, (float(self), self.unit)


def shown(seconds: float, unit: str) -> str:
    """A duration in `unit` ("ms" or "s"), to three figures: 13.8 ms, 2.35 s, 1,250 ms."""
    x = seconds * 1000 if unit == "ms" else seconds
    return f"{x:.3g} {unit}" if abs(x) < 1000 else f"{x:,.0f} {unit}"


def parse_slo(text: str) -> dict[str, float]:
    """'ttft_p99=2s,tpot_p99=100ms' -> {'ttft_p99': 2.0, 'tpot_p99': 0.1} (each a `Seconds`, which remembers the
    unit written)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", value)
        if not eq or not m:
            raise KVBudgetError(f"slo {part!r}: write NAME=SECONDS, e.g. ttft_p99=2s,tpot_p99=100ms", param="slo")
        unit = m.group(2) or "s"
        out[name.strip()] = Seconds(float(m.group(1)) / (1000 if unit == "ms" else 1), unit)
    if not out:
        raise KVBudgetError("slo: give at least one objective, e.g. ttft_p99=2s", param="slo")
    return out


def meets(sim: Simulation, slo: Mapping[str, float]) -> bool:
    """Every objective met, and every request served (a run that leaves requests unfinished meets nothing)."""
    return not missed(sim, slo)


def missed(sim: Simulation, slo: Mapping[str, float]) -> tuple[str, ...]:
    """What `sim` fails of `slo`: each objective it misses, by name ("value > limit", both in the unit the limit
    was written in, or in ms below a second), and "requests" where it left some unfinished."""
    failed = [f"requests: {sim.requests - sim.completed:,} of {sim.requests:,} unfinished"] \
        if sim.completed < sim.requests else []
    for name, limit in slo.items():
        value = sim.metric(name)
        if value is None or value > limit:
            unit = getattr(limit, "unit", "ms" if limit < 1 else "s")
            failed.append(f"{name} {'none' if value is None else shown(value, unit)} > {shown(limit, unit)}")
    return tuple(failed)


@dataclass(frozen=True)
class RateSearch:
    rate_scale: float  # the highest scale found that meets the objectives (0 when none does)
    best: Simulation | None
    tried: tuple[tuple[float, bool], ...]  # (scale, met) in the order tried
    binding: tuple[str, ...] = ()  # when none meets them: what the lowest rate tried missed (missed())


def find_max_rate(model: ModelSpec, workload: Workload, slo: Mapping[str, float], precision: float = 0.02,
                  start: float = 1.0, **settings: Any) -> RateSearch:
    """The highest rate scale (arrivals this many times as often) whose simulation meets `slo`: doubling or
    halving from `start` to bracket it, then bisecting to `precision` (relative)."""
    for name in slo:  # a bad name fails now, not after the first run
        check_metric(name)
    tried: list[tuple[float, bool]] = []
    runs: dict[float, Simulation] = {}

    def ok(scale: float) -> bool:
        sim = simulate(model, workload(scale), **settings)
        runs[scale] = sim
        met = meets(sim, slo)
        tried.append((scale, met))
        return met

    lo, hi = 0.0, start
    if ok(start):
        lo = start
        while True:
            hi = lo * 2
            if not ok(hi):
                break
            lo = hi
            if lo > 1e6:
                raise KVBudgetError("find-max-rate: every rate meets the objectives; they cannot bind",
                                    param="slo")
    else:
        while True:
            hi_failed = hi
            hi = hi / 2
            if hi < start / 1024:
                return RateSearch(0.0, None, tuple(tried), missed(runs[min(runs)], slo))
            if ok(hi):
                lo, hi = hi, hi_failed
                break
    while (hi - lo) / hi > precision:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return RateSearch(lo, runs[lo], tuple(tried))


def _offload_size(text: str) -> int | None:
    """A host tier's size in a sweep; 0 is no tier."""
    return None if text.lower() in ("0", "none", "off") else parse_size(text, "offload_memory")


SWEEPABLE: dict[str, Callable[[str], Any]] = {
    "tp": int, "pp": int, "kv-dtype": str, "max-num-seqs": int, "max-num-batched-tokens": int,
             "block-size": int, "allocator": parse_allocator, "gpu": str, "max-model-len": int,
             "long-prefill-token-threshold": int, "prefix-caching": lambda v: v.lower() in ("1", "true", "on", "yes"),
             "rate-scale": float, "offload-memory": _offload_size,
             "interconnect": lambda v: Interconnect.parse(v, "interconnect"),
             "replicas": int, "router": str,  # a fleet of that many replicas behind that router (commands/fleet.py)
             "num-speculative-tokens": int}  # the drafts a step of the speculative decoding asked (0: none)


def ask_with(ask: SimulationAsk, combo: Mapping[str, Any]) -> SimulationAsk:
    """`ask` with a sweep's settings (those of the ask: a fleet's replicas and router and the rate apart)."""
    combo = dict(combo)
    if "num_speculative_tokens" in combo:
        k = combo.pop("num_speculative_tokens")
        if ask.speculative is None:
            raise KVBudgetError(f"sweep num-speculative-tokens={k}: give {named('speculative')} (the method whose "
                                "drafts it varies)", param="sweep")
        if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise KVBudgetError(f"sweep num-speculative-tokens={k}: give 0 (none) to {MAX_SPECULATIVE_TOKENS}",
                                param="sweep")
        combo["speculative"] = ask.speculative.with_tokens(k)
    return replace(ask, **combo)


def parse_sweep(items: Sequence[str]) -> list[dict[str, Any]]:
    """['tp=1,2', 'kv-dtype=auto,fp8'] -> one settings dict per combination (parameter names as the API's)."""
    axes: list[list[tuple[str, Any]]] = []
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or key not in SWEEPABLE or not values.strip():
            raise KVBudgetError(f"sweep {item!r}: write NAME=V1,V2 with NAME one of {', '.join(SWEEPABLE)}",
                                param="sweep")
        convert = SWEEPABLE[key]
        try:
            axes.append([(key.replace("-", "_"), convert(v.strip())) for v in values.split(",") if v.strip()])
        except ValueError:
            raise KVBudgetError(f"sweep {item!r}: {values!r} are not all valid values of {key}", param="sweep") \
                from None
    return [dict(combo) for combo in itertools.product(*axes)]
