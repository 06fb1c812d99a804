"""The error band on a simulated latency: how far real runs have landed from the simulation, on other GPUs whose
step times rest on the same basis, in runs that were never fitted on (data/latency_bands.json, written by
benchmarks/latency_bands.py from the public runs benchmarks/served.py reads).

A GPU's step times rest on one of three bases (`basis_of`, from the GPUs steptimes took its projections and
attention from): its own kernel measurements; the kernel efficiencies of measured GPUs of its architecture (the
same compute capability: steptimes' transfer rule) on its datasheet; or those of other architectures. Per basis and
metric (mean TTFT, TPOT, end-to-end latency) the band runs from the lowest to the highest (real - simulated) /
simulated over that basis' runs. Why the whole range: the simulation's error differs more from GPU to GPU than
from run to run of one GPU, so a band from the middle of the other GPUs' runs misses a GPU left out. On the runs
of December 2026, leaving one GPU out, the 10th to 90th percentile of the basis held 16, 63 and 65 of the 84
measured runs (TTFT, TPOT, E2E); the whole range within classes of tensor parallel size (1 / more) and load (peak
running sequences up to 32 / more), the enclosing class where one had too few runs, 48, 60 and 66; the whole range
of the basis 61, 81 and 81. A basis with fewer than `MIN_RUNS` runs or `MIN_GPUS` GPUs takes the runs of the
wider bases with its own (measured, then within an architecture, then across); none enough: unknown (None), never
a made-up number.

The band is judged leaving one GPU out (`coverage`): each run against the band sized without any run of its GPU,
so a GPU's own runs never size the band it is judged by; across architectures, without any run of its
architecture (a GPU on that basis has no measured sibling, so none of its architecture's runs either: leaving only
the GPU out, the A100 40GB and 80GB judged each other, and TTFT held 92 of 96 runs instead of 70). Each band
records how many runs it held so, and `simulate` says so where that is under 80%.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.setup import Setup
    from kvbudget.gpus import GPU


class Basis(Enum):
    """What a GPU's simulated step times rest on, as its error band is sized (narrowest first)."""

    MEASURED = "measured"
    SAME_ARCHITECTURE = "transferred within an architecture"
    ACROSS_ARCHITECTURES = "transferred across architectures"


BASES = tuple(Basis)  # a basis with too few runs takes the wider ones' (those after it) with its own
METRICS = ("ttft", "tpot", "e2e")
MIN_RUNS = 10  # fewer runs of a basis than this: the wider bases' runs join its own
MIN_GPUS = 2  # runs of fewer GPUs than this (one GPU's bias is not another's): likewise


def basis_of(card: GPU, measured: bool, donors: Iterable[GPU]) -> Basis:
    """The basis of `card`'s step times: `measured` (its own kernels), else transferred from `donors` (the
    measured GPUs the transfer took its projections and attention from: steptimes.MAIN_KERNELS): within its
    architecture where all of them share its compute capability."""
    if measured:
        return Basis.MEASURED
    given = list(donors)
    if given and card.compute_capability and all(d.compute_capability == card.compute_capability for d in given):
        return Basis.SAME_ARCHITECTURE
    return Basis.ACROSS_ARCHITECTURES


@dataclass(frozen=True, kw_only=True)
class CaseError:
    """One held-out run (or load stage) beside its simulation: (real - simulated) / simulated per metric."""

    run: str
    gpu: str
    architecture: str  # the GPU's compute capability ("" where it has none)
    basis: Basis
    tp: int
    errors: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "gpu": self.gpu, "architecture": self.architecture, "basis": self.basis.value,
                "tp": self.tp, **self.errors}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseError:
        return cls(run=d["run"], gpu=d["gpu"], architecture=d["architecture"], basis=Basis(d["basis"]), tp=d["tp"],
                   errors={m: d[m] for m in METRICS if m in d})

    def unit(self, basis: Basis) -> str:
        """What is left out with this run when a band of `basis` judges it: its GPU, across architectures its
        architecture."""
        return f"compute capability {self.architecture}" if basis is Basis.ACROSS_ARCHITECTURES and self.architecture \
            else self.gpu


@dataclass(frozen=True, kw_only=True)
class Band:
    """The relative bounds of (real - simulated) / simulated that held every run behind it."""

    lower: float
    upper: float
    basis: Basis
    runs: int
    gpus: tuple[str, ...]
    widened: bool = False  # too few runs or GPUs of its own basis: the wider bases' runs joined them
    # judged leaving one GPU (or architecture) out (`coverage`): how many of the basis' runs the band without
    # their GPU held, of how many; None where not judged
    held: tuple[int, int] | None = None
    held_by: str = "GPU"  # what was left out: "GPU", or "architecture" across architectures

    def around(self, seconds: float) -> tuple[float, float]:
        """Where the true value of a simulated `seconds` likely lies."""
        return seconds * (1 + self.lower), seconds * (1 + self.upper)

    def to_dict(self) -> dict[str, Any]:
        return {"lower": self.lower, "upper": self.upper, "basis": self.basis.value, "runs": self.runs,
                "gpus": list(self.gpus), "widened": self.widened,
                "leave_one_out": None if self.held is None else {"inside": self.held[0], "runs": self.held[1],
                                                                 "by": self.held_by}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Band:
        held = d["leave_one_out"]
        return cls(lower=d["lower"], upper=d["upper"], basis=Basis(d["basis"]), runs=d["runs"],
                   gpus=tuple(d["gpus"]), widened=d["widened"],
                   held=None if held is None else (held["inside"], held["runs"]),
                   held_by="GPU" if held is None else held["by"])


def band(cases: Sequence[CaseError], basis: Basis, metric: str, leave_out: Collection[str] = ()) -> Band | None:
    """The band of `basis` for `metric` from `cases`, none of `leave_out`'s (GPU names) counted: the lowest to
    the highest error of the basis' runs, the wider bases' joining them until `MIN_RUNS` runs of `MIN_GPUS` GPUs."""
    at = BASES.index(basis)
    for wider in range(at, len(BASES)):
        pool = BASES[at:wider + 1]
        errors = [(c.errors[metric], c.gpu) for c in cases
                  if c.basis in pool and c.gpu not in leave_out and metric in c.errors]
        gpus = tuple(sorted({g for _, g in errors}))
        if len(errors) >= MIN_RUNS and len(gpus) >= MIN_GPUS:
            values = [e for e, _ in errors]
            return Band(lower=min(values), upper=max(values), basis=basis, runs=len(values), gpus=gpus,
                        widened=wider > at)
    return None


def left_out(cases: Sequence[CaseError], basis: Basis, unit: str) -> frozenset[str]:
    """The GPUs whose runs a band of `basis` is sized without when it judges the runs of `unit` (`CaseError.unit`)."""
    return frozenset(c.gpu for c in cases if c.unit(basis) == unit)


def coverage(cases: Sequence[CaseError], basis: Basis, metric: str) -> tuple[int, int]:
    """Leave one GPU (across architectures: one architecture) out: how many of `basis`' cases lie inside the band
    sized without their GPU's runs, of how many."""
    mine = [c for c in cases if c.basis is basis and metric in c.errors]
    without = {u: band(cases, basis, metric, left_out(cases, basis, u)) for u in {c.unit(basis) for c in mine}}
    inside = sum(b is not None and b.lower <= c.errors[metric] <= b.upper
                 for c in mine for b in [without[c.unit(basis)]])
    return inside, len(mine)


def bands(cases: Sequence[CaseError]) -> dict[str, Any]:
    """Every basis' band per metric over all its runs, with how many of its runs lie inside the band sized
    without their own GPU's runs (`coverage`); None where too few runs size one."""
    out: dict[str, Any] = {}
    for basis in Basis:
        out[basis.value] = {}
        for metric in METRICS:
            b = band(cases, basis, metric)
            out[basis.value][metric] = None if b is None else replace(
                b, held=coverage(cases, basis, metric),
                held_by="architecture" if basis is Basis.ACROSS_ARCHITECTURES else "GPU").to_dict()
    return out


@cache
def _data() -> dict[str, Any]:
    text = (resources.files("kvbudget") / "data" / "latency_bands.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def judged(setup: Setup) -> bool:
    """Whether held-out runs judge the simulation's engine: one the runs were served by (all vLLM today), with
    its paged allocator (not a contiguous baseline)."""
    return setup.engine in _data()["engines"] and setup.allocator == "paged"


def band_for(setup: Setup, metric: str) -> Band | None:
    """The band the mean `metric` (ttft|tpot|e2e) of a simulation of `setup` carries; None where unknown: no
    held-out runs judge its times (a calibration, the roofline, a time model given) or its engine."""
    times = setup.time_model
    if not times.band_basis or not judged(setup):
        return None
    entry = _data()["bands"].get(times.band_basis)
    if entry is None:
        raise KVBudgetError(f"time_model.band_basis {times.band_basis!r}: not a basis the held-out runs judge; "
                            f"give one of {', '.join(repr(b.value) for b in Basis)}, or '' for none",
                            param="time_model")
    return Band.from_dict(entry[metric]) if entry[metric] is not None else None


def as_dict(setup: Setup, metric: str) -> dict[str, Any] | None:
    """`band_for` in JSON: relative lower and upper bounds, the basis, the runs and GPUs behind it; None
    where unknown."""
    found = band_for(setup, metric)
    return found.to_dict() if found is not None else None
