"""The error band on a simulated latency: how far real runs have landed from the simulation, on GPUs whose step
times rest on the same basis, in runs that were never fitted on (data/latency_bands.json, written by
benchmarks/latency_bands.py from the public runs in benchmarks/data/served).

A GPU's step times rest on one of three bases (`basis_of`, from what steptimes knows of it): its own kernel
measurements; the measured GPUs' kernel efficiencies transferred to its datasheet, where one of them is of its
generation (NVIDIA's architecture, by compute capability); or transferred across generations. Per basis and
metric (mean TTFT, TPOT, end-to-end latency) the band is the 10th to the 90th percentile of
(real - simulated) / simulated over that basis' runs. Fewer than `MIN_RUNS` runs: the band reaches as far as the
largest of their errors, by the same factor either way, and at least over the next wider basis' band (measured,
then within a generation, then across); no runs and no wider basis: unknown (None), never a made-up number.

The band is judged leaving one GPU out (`coverage`): each run against the band sized without any run of its GPU,
so a GPU's own runs never size the band it is judged by; each band records how many runs it held so, and
`simulate` says so where that is under 80%.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
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
    """What a GPU's simulated step times rest on, as its error band is sized."""

    MEASURED = "measured"
    SAME_GENERATION = "transferred within a generation"
    ACROSS_GENERATIONS = "transferred across generations"


# the next wider basis, whose band a basis with too few runs is widened by
WIDER = {Basis.MEASURED: Basis.SAME_GENERATION, Basis.SAME_GENERATION: Basis.ACROSS_GENERATIONS,
         Basis.ACROSS_GENERATIONS: None}
METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (0.10, 0.90)  # the band: these quantiles of (real - simulated) / simulated
MIN_RUNS = 10  # fewer runs behind a band than this: widened with the next wider basis' band
# NVIDIA's architecture by compute capability (NVIDIA's CUDA GPUs list, developer.nvidia.com/cuda-gpus)
GENERATIONS = {"7.0": "Volta", "7.2": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere",
               "8.9": "Ada Lovelace", "9.0": "Hopper", "10.0": "Blackwell", "10.3": "Blackwell",
               "12.0": "Blackwell", "12.1": "Blackwell"}


def generation(card: GPU) -> str | None:
    """The card's architecture, or None where it is not an NVIDIA card of a known compute capability."""
    return GENERATIONS.get(card.compute_capability or "")


def basis_of(card: GPU, measured: bool, donors: Iterable[GPU]) -> Basis:
    """The basis of `card`'s step times: `measured` (its own kernels), else transferred from `donors` (the
    measured GPUs the transfer takes its efficiencies from)."""
    if measured:
        return Basis.MEASURED
    mine = generation(card)
    if mine is not None and any(generation(d) == mine for d in donors):
        return Basis.SAME_GENERATION
    return Basis.ACROSS_GENERATIONS


@dataclass(frozen=True, kw_only=True)
class CaseError:
    """One held-out run (or load stage) beside its simulation: (real - simulated) / simulated per metric."""

    run: str
    gpu: str
    basis: Basis
    errors: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "gpu": self.gpu, "basis": self.basis.value, **self.errors}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseError:
        return cls(run=d["run"], gpu=d["gpu"], basis=Basis(d["basis"]), errors={m: d[m] for m in METRICS if m in d})


@dataclass(frozen=True, kw_only=True)
class Band:
    """The relative bounds of (real - simulated) / simulated that held the middle 80% of the runs behind it."""

    lower: float
    upper: float
    basis: Basis
    runs: int
    gpus: tuple[str, ...]
    widened: bool = False  # fewer than MIN_RUNS runs of its own basis: their reach and the wider band's
    # judged leaving one GPU out (`coverage`): how many of the basis' runs the band without their GPU held, of
    # how many; None where not judged
    held: tuple[int, int] | None = None

    def around(self, seconds: float) -> tuple[float, float]:
        """Where the true value of a simulated `seconds` likely lies."""
        return seconds * (1 + self.lower), seconds * (1 + self.upper)

    def to_dict(self) -> dict[str, Any]:
        return {"lower": self.lower, "upper": self.upper, "basis": self.basis.value, "runs": self.runs,
                "gpus": list(self.gpus), "widened": self.widened,
                "leave_one_gpu_out": None if self.held is None else {"inside": self.held[0], "runs": self.held[1]}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Band:
        held = d["leave_one_gpu_out"]
        return cls(lower=d["lower"], upper=d["upper"], basis=Basis(d["basis"]), runs=d["runs"],
                   gpus=tuple(d["gpus"]), widened=d["widened"],
                   held=None if held is None else (held["inside"], held["runs"]))


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values`, linear between order statistics (numpy's default)."""
    s = sorted(values)
    at = q * (len(s) - 1)
    low = math.floor(at)
    high = min(low + 1, len(s) - 1)
    return s[low] + (s[high] - s[low]) * (at - low)


def band(cases: Sequence[CaseError], basis: Basis, metric: str, leave_out: str | None = None) -> Band | None:
    """The band of `basis` for `metric` from `cases`, none of `leave_out`'s (a GPU name) counted."""
    errors = [(c.errors[metric], c.gpu) for c in cases
              if c.basis is basis and c.gpu != leave_out and metric in c.errors]
    values = [e for e, _ in errors]
    gpus = tuple(sorted({g for _, g in errors}))
    if len(values) >= MIN_RUNS:
        return Band(lower=quantile(values, QUANTILES[0]), upper=quantile(values, QUANTILES[1]), basis=basis,
                    runs=len(values), gpus=gpus)
    # too few to read quantiles from: as far as any of them went, by the same factor either way (real / simulated
    # from 1 / f to f), and at least over the wider basis' band
    factor = max((max(1 + e, 1 / (1 + e)) for e in values), default=1.0)
    low, high = 1 / factor - 1, factor - 1
    wider_basis = WIDER[basis]
    wider = band(cases, wider_basis, metric, leave_out) if wider_basis is not None else None
    if wider is None:
        return None if not values else Band(lower=low, upper=high, basis=basis, runs=len(values), gpus=gpus,
                                            widened=True)
    return Band(lower=min(wider.lower, low), upper=max(wider.upper, high), basis=basis,
                runs=len(values) + wider.runs, gpus=tuple(sorted({*gpus, *wider.gpus})), widened=True)


def coverage(cases: Sequence[CaseError], basis: Basis, metric: str) -> tuple[int, int]:
    """Leave one GPU out: how many of `basis`' cases lie inside the band sized without their GPU's runs, of how
    many."""
    mine = [c for c in cases if c.basis is basis and metric in c.errors]
    inside = 0
    for c in mine:
        b = band(cases, basis, metric, leave_out=c.gpu)
        inside += b is not None and b.lower <= c.errors[metric] <= b.upper
    return inside, len(mine)


def bands(cases: Sequence[CaseError]) -> dict[str, Any]:
    """Every basis' band per metric over all its runs, with how many of its runs lie inside the band sized
    without their own GPU's runs (`coverage`); None where the basis has no runs."""
    out: dict[str, Any] = {}
    for basis in Basis:
        out[basis.value] = {}
        for metric in METRICS:
            b = band(cases, basis, metric)
            out[basis.value][metric] = None if b is None else replace(b, held=coverage(cases, basis, metric)).to_dict()
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
