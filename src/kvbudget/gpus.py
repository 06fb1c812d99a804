"""The accelerator catalog (data/gpus.json): memory, HBM bandwidth and dense throughput, with sources."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from kvbudget.errors import KVBudgetError
from kvbudget.units import GIB, MIB


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    memory_basis: str  # "reported by the driver" or "nominal"
    bandwidth_bytes_per_s: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    source: str


@lru_cache(maxsize=1)
def _catalog() -> dict:
    return json.loads((resources.files("kvbudget") / "data" / "gpus.json").read_text(encoding="utf-8"))


def gpus() -> tuple[GPU, ...]:
    return tuple(_make(g) for g in _catalog()["gpus"])


def _make(g: dict) -> GPU:
    if g.get("memory_mib_reported"):
        memory, basis = g["memory_mib_reported"] * MIB, "as nvidia-smi reports it (public reports; not measured here)"
    else:
        memory, basis = int(g["memory_gb_nominal"] * GIB), "nominal (vendor figure, read as GiB)"
    bandwidth = g["bandwidth_gbps"] * 1e9 if g.get("bandwidth_gbps") else None
    return GPU(g["name"], memory, basis, bandwidth, g.get("bf16_tflops") or g.get("fp16_tflops"),
               g.get("fp8_tflops"), g["source"])


def _key(text: str) -> str:
    return text.strip().lower().replace("_", "-").replace(" ", "-")


def find_gpu(name: str) -> GPU:
    key = _key(name)
    for g in _catalog()["gpus"]:
        if key in {_key(g["name"]), *(_key(a) for a in g.get("aliases", ()))}:
            return _make(g)
    known = ", ".join(g["name"] for g in _catalog()["gpus"])
    raise KVBudgetError(f"--gpu: unknown GPU {name!r}; choose one of {known}, or pass --gpu-memory SIZE")
