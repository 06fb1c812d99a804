"""The KV budget's error band: how far `plan`'s KV budget has landed from what real start-ups logged, per release era
of the engine and GPU family, over the corpus's check cases alone (never fitted on). The bands are
data/budget_bands.json, written by `python benchmarks/bench_memory.py --write-bands` from tests/data/memory/;
regenerate it when the memory model or the corpus changes (tests/corpus/test_memory_corpus.py fails while it is
stale).

A plan carries the band of its engine's era and its GPU's family. Where no check case has that era and family,
this rule picks the band, the first that applies:
1. the same GPU family's band in the nearest era of the same engine (eras in release order; of two as near, the
   wider band);
2. else the widest band of the nearest era of the same engine that has check cases, on any GPU family (of two eras
   as near, the wider band; issue 55: "a band from the corpus errors of the nearest era");
3. else (an engine with no check case at all) the widest band of the corpus;
and the plan says so: "not checked on <family> with <era>: band of <era> on <family>" (either part where it
differs). The widest band is the one of the largest span from its most pessimistic to its most optimistic error,
then the more optimistic.

A band's errors are the planned budget less the logged one as a fraction of the engine's share of the GPU
(gpu_memory_utilization x its memory, or the engine's like figure), positive where the plan was optimistic: the
errors come from terms that do not grow with the budget (the weights, the profiling peak, other memory), so a
fraction of the share carries over from one model to another where a fraction of the budget does not (5 GiB too
many is +300% of gpt-oss-120b's 1.65 GiB budget at a 0.95 share of an H100, and 6.9% of the share). The budget the
engine would find then lies between budget - high x share, the band's low end (the plan as optimistic as it has
been), and budget - low x share. A band always holds the plan's own figure: one case at -3.2% makes it -3.2% to 0.

Engines with no corpus of real start-ups (no `budget_eras`: llama.cpp, TGI, transformers) carry no band, nor does
a KV budget given as kv_memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol, runtime_checkable

from kvbudget.engines import EngineOptions
from kvbudget.gpus import GPU
from kvbudget.units import format_bytes

# The GPU families the bands are measured per (issue 55: the cards users have), in the accuracy table's order.
A100, ADA_AMPERE, GEFORCE = "A100", "L4 / L40S / A10G", "GeForce (RTX 3090 / 4090 / 5090)"
HOPPER, BLACKWELL = "Hopper (H100, H200, GH200)", "Blackwell (B200, GB200, GB10)"
AMD, XPU, OTHER = "AMD Instinct", "Intel XPU", "other"
FAMILIES = (A100, ADA_AMPERE, GEFORCE, HOPPER, BLACKWELL, AMD, XPU)


def gpu_family(card: GPU) -> str:
    """The card's family, from the catalog's vendor, segment and compute capability (data/gpus.json; NVIDIA's CUDA
    GPUs list): AMD's and Intel's datacenter cards; NVIDIA's GeForce cards; then by architecture: 8.0 the A100,
    8.6 and 8.9 the datacenter and workstation Ampere and Ada cards (A10G, L4, L40S), 9.x Hopper, 10.x and 12.x
    Blackwell; anything else (a card given by its memory alone, Volta, Turing) "other"."""
    if card.vendor in ("AMD", "Intel"):
        return (AMD if card.vendor == "AMD" else XPU) if card.segment == "datacenter" else OTHER
    if card.vendor != "NVIDIA" or not card.compute_capability:
        return OTHER
    if card.segment == "consumer":
        return GEFORCE
    major, minor = (int(x) for x in card.compute_capability.split(".")[:2])
    by_arch = {(8, 0): A100, (8, 6): ADA_AMPERE, (8, 9): ADA_AMPERE}
    return by_arch.get((major, minor)) or {9: HOPPER, 10: BLACKWELL, 12: BLACKWELL}.get(major, OTHER)


@runtime_checkable
class ChecksBudget(Protocol):
    """An engine whose KV budget real start-ups check, era by era (its package names the eras, from its source)."""

    budget_eras: tuple[str, ...]  # oldest first

    def budget_era(self, options: EngineOptions) -> str:
        """The era of budget_eras the release `options` model falls in."""
        ...


@dataclass(frozen=True, kw_only=True)
class BudgetBand:
    """The error band a plan's KV budget carries: the measured group's errors, and the plan's own era and family."""

    era: str  # the measured group's release era and GPU family
    family: str
    cases: int  # check cases it rests on
    low: float  # the most pessimistic error measured: (planned - logged budget) / the planned engine share
    high: float  # the most optimistic
    plan_era: str  # the plan's own
    plan_family: str

    @property
    def checked(self) -> bool:
        """Whether check cases of the plan's own era and family measured it."""
        return (self.era, self.family) == (self.plan_era, self.plan_family)

    @property
    def basis(self) -> str:
        """Where the band is not the plan's own group, what was not checked ("" where it is)."""
        family = self.plan_family if self.plan_family != OTHER else "this GPU"
        where = [f"on {family}" if family != self.family else "", f"with {self.plan_era}" if self.plan_era != self.era
                 else ""]
        return f"not checked {' '.join(w for w in where if w)}" if not self.checked else ""

    def budget_range(self, kv_bytes: int, share_bytes: int) -> tuple[int, int]:
        """The budget the engine would find, from the band's low end (the plan at its most optimistic) to its high
        end, for a planned budget of `kv_bytes` out of an engine share of `share_bytes`; the plan's own figure always
        lies between (the low end is 0 at the least)."""
        return (max(0, math.floor(kv_bytes - max(self.high, 0.0) * share_bytes)),
                math.ceil(kv_bytes - min(self.low, 0.0) * share_bytes))

    def text(self, kv_bytes: int, share_bytes: int) -> str:
        """The band as the plan prints it beside the budget."""
        low, high = self.budget_range(kv_bytes, share_bytes)
        span = f"{self.low:+.1%} to {self.high:+.1%}" if self.cases > 1 else f"{self.high:+.1%}"
        group = f"{self.era} on {self.family}"
        found = f"error band of {group}:" if self.checked else f"{self.basis}: band of {group},"
        return (f"{found} {span} of the engine share on {self.cases} check start-up{'s' if self.cases > 1 else ''}, "
                f"so {format_bytes(low)} to {format_bytes(high)} (accuracy page)")

    def to_dict(self, kv_bytes: int, share_bytes: int) -> dict[str, Any]:
        low, high = self.budget_range(kv_bytes, share_bytes)
        return {"era": self.era, "family": self.family, "cases": self.cases, "low": self.low, "high": self.high,
                "plan_era": self.plan_era, "plan_family": self.plan_family, "checked": self.checked,
                "basis": self.basis, "low_bytes": low, "high_bytes": high}


@cache
def _bands() -> tuple[dict[str, Any], ...]:
    text = (resources.files("kvbudget") / "data" / "budget_bands.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["bands"])


def _span(band: dict[str, Any]) -> tuple[float, float]:
    return max(band["share_high"], 0.0) - min(band["share_low"], 0.0), band["share_high"]


def budget_band(engine: object, options: EngineOptions, card: GPU) -> BudgetBand | None:
    """The band a plan on `card` with `engine` (its release in `options`) carries, by the module's rule; None for an
    engine without budget eras."""
    if not isinstance(engine, ChecksBudget):
        return None
    era, family, eras = engine.budget_era(options), gpu_family(card), engine.budget_eras
    bands = _bands()
    own = next((b for b in bands if b["era"] == era and b["family"] == family), None)
    same_family = [b for b in bands if b["family"] == family and b["era"] in eras]
    if own is not None:
        found = own
    elif same_family:
        where = eras.index(era)
        found = min(same_family, key=lambda b: (abs(eras.index(b["era"]) - where), [-x for x in _span(b)]))
    else:
        where = eras.index(era)
        measured = [b for b in bands if b["era"] in eras]
        found = min(measured, key=lambda b: (abs(eras.index(b["era"]) - where), [-x for x in _span(b)])) \
            if measured else max(bands, key=_span)
    return BudgetBand(era=found["era"], family=found["family"], cases=found["cases"], low=found["share_low"],
                      high=found["share_high"], plan_era=era, plan_family=family)
