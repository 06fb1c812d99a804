"""KV beyond the GPU, for people: the tiers an engine makes of the host memory (and disk) given, with the link they
load over and what whole prefixes they hold (what `estimate` and `plan` print). The tiers themselves are the
engines' (`kvbudget.engines.tiers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.engines.base import EngineOptions
from kvbudget.engines.tiers import HostLink, HostTier, OffloadsKV, host_link
from kvbudget.errors import EngineRuleError, named

if TYPE_CHECKING:
    from kvbudget.engines.base import Engine
    from kvbudget.gpus import GPU
    from kvbudget.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class HostReport:
    """The tiers of one deployment, with the link they load over and the prefix lengths asked about."""

    tiers: tuple[HostTier, ...]
    link: HostLink | None
    lengths: tuple[int, ...]

    def load_seconds(self, tier: HostTier, length: int) -> float | None:
        """Time to bring a prefix of `length` tokens back from a host-memory tier (None: disk, or no link)."""
        if self.link is None or tier.medium != "host memory":
            return None
        return self.link.seconds(tier.units_for(length) * tier.unit_bytes, tier.ranks)

    def to_dict(self) -> dict[str, Any]:
        link = None if self.link is None else {"name": self.link.name, "bytes_per_s": self.link.bytes_per_s,
                                               "datasheet_bytes_per_s": self.link.datasheet_bytes_per_s,
                                               "estimate": True, "source": self.link.source}
        return {"link": link, "tiers": [
            {**t.to_dict(), "prefixes": {str(n): {"whole_prefixes": t.prefixes(n),
                                                  "load_seconds": self.load_seconds(t, n)} for n in self.lengths}}
            for t in self.tiers]}


def host_report(engine: Engine, model: ModelSpec, *, memory: int, disk: int | None = None,
                backend: str | None = None, kv_dtype: str = "auto", tp: int = 1, options: EngineOptions | None = None,
                gpu: GPU | None = None, lengths: Sequence[int] = ()) -> HostReport:
    """The host tiers `engine` makes of `memory` bytes of host memory (and `disk`), with the GPU's link."""
    if not isinstance(engine, OffloadsKV):
        raise EngineRuleError(f"offload_memory: kvbudget models KV offload tiers for vllm, sglang and llamacpp, not "
                              f"{engine.name}; leave {named('offload_memory')} out", param="offload_memory")
    chosen = backend or engine.offload_backends[0]
    if chosen not in engine.offload_backends:
        raise EngineRuleError(f"offload_backend {chosen!r}: {engine.name}'s offload backends are "
                              f"{', '.join(engine.offload_backends)}", param="offload_backend")
    if memory <= 0:
        raise EngineRuleError(f"offload_memory: give a positive size (host memory for the tier), not {memory}",
                              param="offload_memory")
    tiers = engine.host_tiers(model, memory=memory, disk=disk, backend=chosen, kv_dtype=kv_dtype, tp=tp,
                              options=options or EngineOptions())
    return HostReport(tiers=tiers, link=host_link(gpu), lengths=tuple(lengths))


__all__ = ["HostReport", "host_report"]
