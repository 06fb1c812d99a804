"""KV beyond the GPU, as engines build it: a host-memory or disk tier, the link a load from it crosses, and what a
simulated tier did. Each engine that offloads describes its tiers from its own source, per release
(`OffloadsKV.host_tiers`); the report `estimate` and `plan` print is `kvbudget.offload`. Bytes throughout; a
tier's own setting is shown in the engine's units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kvbudget.errors import EngineRuleError, named
from kvbudget.units import cdiv

if TYPE_CHECKING:
    from kvbudget.engines.base import Allocation, EngineOptions
    from kvbudget.gpus import GPU
    from kvbudget.model.spec import ModelSpec

# Copies between pinned host memory and the GPU reach less than a link's datasheet rate: 52-60 GB/s of PCIe 5.0
# x16's 64 GB/s each way (arXiv 2512.16056, Table 1, on an H20). The middle of that range, applied to every link.
LINK_EFFICIENCY = 56 / 64
LINK_SOURCE = ("the GPU's host link at 0.875 of its datasheet rate (52-60 GB/s measured of PCIe 5.0 x16's 64: "
               "arXiv 2512.16056, Table 1): an estimate, within about 7% on that link")


@dataclass(frozen=True, kw_only=True)
class HostTier:
    """One tier an engine keeps KV in beyond the GPU, as the engine sizes it."""

    engine: str
    backend: str  # the engine's offload backend ("native", "lmcache", "hicache", "prompt cache")
    medium: str  # "host memory" or "disk"
    setting: str  # the engine's own setting for this size, as it is given
    unit: str  # what the tier stores by ("block", "chunk", "page", "token")
    unit_tokens: int  # tokens per unit
    unit_bytes: int  # bytes of one unit over every rank, padding included
    units: int  # units the tier holds
    ranks: int  # ranks that each store their share (and load it over their own link)
    host_bytes: int  # what the tier takes, over every rank
    pinned: bool  # page-locked host memory (it cannot be swapped out or shared)
    partial_units: bool  # a prefix's last, partly filled unit is stored too
    policy: str  # what it evicts
    movement: str  # when KV goes there and comes back
    source: str  # the engine's files read, and the release
    notes: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens the tier holds when every unit is full."""
        return self.units * self.unit_tokens

    def units_for(self, length: int) -> int:
        """Units a prefix of `length` tokens takes here (a partly filled last one only where the tier keeps it)."""
        return cdiv(length, self.unit_tokens) if self.partial_units else length // self.unit_tokens

    def prefixes(self, length: int) -> int:
        """Whole prefixes of `length` tokens the tier holds at once."""
        need = self.units_for(length)
        return self.units // need if need else 0

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("engine", "backend", "medium", "setting", "unit", "unit_tokens",
                                              "unit_bytes", "units", "ranks", "host_bytes", "pinned",
                                              "partial_units", "policy", "movement", "source")}
        return {**out, "tokens": self.tokens, "notes": list(self.notes)}


@dataclass(frozen=True, kw_only=True)
class HostLink:
    """The link a load from host memory crosses, per GPU, one direction."""

    name: str
    bytes_per_s: float  # what a copy reaches: an estimate
    datasheet_bytes_per_s: float
    source: str = LINK_SOURCE

    def seconds(self, nbytes: float, ranks: int = 1) -> float:
        """Time to move `nbytes` spread over `ranks` GPUs, each over its own link."""
        return nbytes / ranks / self.bytes_per_s


def host_link(gpu: GPU | None) -> HostLink | None:
    """The GPU's link to host memory from the GPU table, or None where the table has none."""
    if gpu is None or not gpu.host_link or not gpu.host_link_bytes_per_s:
        return None
    return HostLink(name=gpu.host_link, bytes_per_s=gpu.host_link_bytes_per_s * LINK_EFFICIENCY,
                    datasheet_bytes_per_s=gpu.host_link_bytes_per_s)


def required_link(gpu: str | None) -> HostLink:
    """The named GPU's host link, which a simulated load's time needs; refused where there is none."""
    from kvbudget.gpus import find_gpu

    link = host_link(find_gpu(gpu)) if gpu else None
    if link is None:
        raise EngineRuleError("offload_memory: a load's time needs the GPU's host link: give a GPU from the table "
                              "with one (kvbudget gpus)", param="gpu")
    return link


@runtime_checkable
class OffloadsKV(Protocol):
    """An engine with KV tiers beyond the GPU."""

    offload_backends: tuple[str, ...]  # the first is the default

    def host_tiers(self, model: ModelSpec, *, memory: int, disk: int | None, backend: str, kv_dtype: str, tp: int,
                   options: EngineOptions) -> tuple[HostTier, ...]:
        """The tiers `memory` bytes of host memory (and `disk` bytes of disk, where the backend has a disk tier)
        make, over every rank, for `model`; raises where the engine would not start so."""


@dataclass(frozen=True, kw_only=True)
class OffloadTotals:
    """What a simulated host tier did over a run (the engines' offloading schedulers keep it)."""

    hit_tokens: int  # prompt tokens loaded from the tiers at first admissions
    loaded_blocks: int  # units (blocks or chunks) loaded
    stored_blocks: int  # ... and stored in host memory
    block_bytes: int  # one unit over every rank
    disk_hit_tokens: int = 0  # of hit_tokens, those read from a disk tier

    def to_dict(self) -> dict[str, int]:
        return {"hit_tokens": self.hit_tokens, "disk_hit_tokens": self.disk_hit_tokens,
                "loaded_bytes": self.loaded_blocks * self.block_bytes,
                "stored_bytes": self.stored_blocks * self.block_bytes}


def no_disk(engine: str, backend: str, disk: int | None, why: str) -> None:
    """Refuse a disk size for a backend without a disk tier."""
    if disk:
        raise EngineRuleError(f"offload_disk: {engine}'s {backend} offload has no disk tier ({why}); leave "
                              f"{named('offload_disk')} out", param="offload_disk")


def full_layers_only(model: ModelSpec, alloc: Allocation, engine: str, backend: str) -> None:
    """Refuse a model whose cache layers do not all keep every token, for a tier that stores them as if they did."""
    if not all(g.token_cap is None and not g.fixed_bytes and g.period == 1 for g in alloc.groups):
        raise EngineRuleError(f"offload_memory: {engine}'s {backend} tier is modelled for models whose every cache "
                              f"layer keeps all tokens (full attention or MLA); {model.name} has windows or state "
                              "layers", param="offload_memory")


__all__ = ["LINK_EFFICIENCY", "HostLink", "HostTier", "OffloadTotals", "OffloadsKV", "full_layers_only", "host_link",
           "no_disk", "required_link"]
