"""The accelerator catalog (data/gpus.json): memory, HBM bandwidth and dense throughput, with sources."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from kvbudget.choices import Interconnect
from kvbudget.errors import KVBudgetError, spelled
from kvbudget.units import GIB, MIB


@dataclass(frozen=True, kw_only=True)
class GPU:
    name: str
    vendor: str  # "NVIDIA", "AMD", or "" for a card described only by its memory
    memory_bytes: int
    memory_basis: str  # "reported by the driver" or "nominal"
    bandwidth_bytes_per_s: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    source: str
    compute_capability: str | None = None  # NVIDIA's ("9.0"); None for other vendors and custom cards
    fp16_tflops: float | None = None  # dense fp16 tensor throughput (T4 and V100 have fp16 but no bf16)
    interconnect: str | None = None  # how GPUs of a server talk: NVLink, Infinity Fabric, or the PCIe slot
    interconnect_bytes_per_s: float | None = None  # per GPU, both directions together (datasheet figure)
    gpus_per_node: int = 8  # GPUs on one server's interconnect (HGX boards, cloud instances; GB200 NVL72: 72)
    segment: str = ""  # "datacenter", "workstation" or "consumer" as the vendor sells it; "" for custom cards
    host_link: str | None = None  # the link to host memory (PCIe 5.0 x16, NVLink-C2C): what KV offload loads over
    host_link_bytes_per_s: float | None = None  # its datasheet bandwidth, one direction
    links: tuple[Interconnect, ...] = ()  # GPU-to-GPU links the card can have in one node, the one it always has first
    nvlink_bytes_per_s: float | None = None  # its NVLink (or bridge), both directions together; None without
    reported_bytes: int | None = None  # the total nvidia-smi (memory.total) or rocminfo reports; None where unknown

    @property
    def link(self) -> Interconnect | None:
        """The link tensor parallelism within one node takes by default: the first the card always has."""
        return self.links[0] if self.links else None

    @property
    def half_tflops(self) -> float | None:
        """Dense 16-bit tensor throughput the card has: bf16's, else fp16's (what a bf16 model runs as there)."""
        return self.bf16_tflops or self.fp16_tflops


# how to size a GPU that is not in the catalog, as the library and the command line say it
GIVE_GPU_MEMORY = spelled("give gpu_memory", "pass --gpu-memory SIZE")


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Any]:
    return json.loads((resources.files("kvbudget") / "data" / "gpus.json").read_text(encoding="utf-8"))


def gpus() -> tuple[GPU, ...]:
    return tuple(_make(g) for g in _catalog()["gpus"])


def _make(g: dict[str, Any]) -> GPU:
    if g.get("memory_gib_torch"):
        memory = int(g["memory_gib_torch"] * GIB)
        basis = "as torch reports it (printed in a public log, to 0.01 GiB)"
    elif g.get("memory_mib_reported"):
        memory, basis = g["memory_mib_reported"] * MIB, "as nvidia-smi reports it (public reports; not measured here)"
    else:
        memory, basis = int(g["memory_gb_nominal"] * GIB), "nominal (vendor figure, read as GiB)"
    bandwidth = g["bandwidth_gbps"] * 1e9 if g.get("bandwidth_gbps") else None
    # an NVLink board's interconnect is its NVLink; a PCIe card's NVLink is its optional bridge
    nvlink_gbps = g.get("nvlink_bridge_gbps") or (g.get("interconnect_gbps") if g.get("links", [""])[:1] == ["nvlink"]
                                                  else None)
    nvlink = nvlink_gbps * 1e9 if nvlink_gbps else None
    return GPU(name=g["name"], vendor=g.get("vendor", ""), memory_bytes=memory, memory_basis=basis,
               bandwidth_bytes_per_s=bandwidth, bf16_tflops=g.get("bf16_tflops"), fp8_tflops=g.get("fp8_tflops"),
               source=g["source"], compute_capability=g.get("compute_capability"), fp16_tflops=g.get("fp16_tflops"),
               interconnect=g.get("interconnect"),
               interconnect_bytes_per_s=g["interconnect_gbps"] * 1e9 if g.get("interconnect_gbps") else None,
               gpus_per_node=g.get("gpus_per_node", 8), segment=g.get("segment", ""), host_link=g.get("host_link"),
               host_link_bytes_per_s=g["host_link_gbps"] * 1e9 if g.get("host_link_gbps") else None,
               links=tuple(Interconnect(k) for k in g.get("links", ())), nvlink_bytes_per_s=nvlink,
               reported_bytes=g["memory_mib_reported"] * MIB if g.get("memory_mib_reported") else None)


def reported_total(gpu_memory: int, gpu_name: str) -> int:
    """The card's total as nvidia-smi (memory.total) or rocminfo reports it, which SGLang reads where vLLM reads
    torch's: the catalog card's own where `gpu_memory` is that card's memory and the catalog has the figure, else
    `gpu_memory` (a memory given, or a card no source has given the driver's figure for)."""
    card = next((g for g in gpus() if g.name == gpu_name), None)
    if card is None or card.memory_bytes != gpu_memory or card.reported_bytes is None:
        return gpu_memory
    return card.reported_bytes


def _key(text: str) -> str:
    return text.strip().lower().replace("_", "-").replace(" ", "-")


def custom_gpu(memory_bytes: int, like: GPU | None = None) -> GPU:
    """A GPU given by its memory alone, or a catalog card with its memory replaced."""
    if like is None:
        return GPU(name="custom", vendor="", memory_bytes=memory_bytes, memory_basis="given",
                   bandwidth_bytes_per_s=None, bf16_tflops=None, fp8_tflops=None, source="given memory")
    return GPU(name=like.name, vendor=like.vendor, memory_bytes=memory_bytes, memory_basis="given",
               bandwidth_bytes_per_s=like.bandwidth_bytes_per_s, bf16_tflops=like.bf16_tflops,
               fp8_tflops=like.fp8_tflops, source=f"{like.source}; memory given",
               compute_capability=like.compute_capability, fp16_tflops=like.fp16_tflops,
               interconnect=like.interconnect, interconnect_bytes_per_s=like.interconnect_bytes_per_s,
               gpus_per_node=like.gpus_per_node, segment=like.segment, host_link=like.host_link,
               host_link_bytes_per_s=like.host_link_bytes_per_s, links=like.links,
               nvlink_bytes_per_s=like.nvlink_bytes_per_s)


def find_gpu(name: str) -> GPU:
    key = _key(name)
    for g in _catalog()["gpus"]:
        if key in {_key(g["name"]), *(_key(a) for a in g.get("aliases", ()))}:
            return _make(g)
    known = ", ".join(g["name"] for g in _catalog()["gpus"])
    raise KVBudgetError(f"gpu: unknown GPU {name!r}; choose one of {known}, or "
                        f"{GIVE_GPU_MEMORY}", param="gpu")


def gpu_card(gpu: str | None, gpu_memory: int | None) -> GPU:
    """The GPU a plan is for: a card of the catalog, one of `gpu_memory` bytes (like `gpu`'s where both are given),
    or the error naming what to give."""
    if gpu_memory is not None:
        return custom_gpu(gpu_memory, find_gpu(gpu) if gpu else None)
    if gpu is None:
        raise KVBudgetError(f"gpu: name a GPU ({spelled('kvbudget.gpus.gpus()', 'kvbudget gpus')} lists them) or "
                            f"{GIVE_GPU_MEMORY}", param="gpu")
    return find_gpu(gpu)
