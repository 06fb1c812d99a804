"""SGLang's scheduler model for `simulate`: its token pool is the allocator (no blocks), with its defaults for
the prefill chunk and the running requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvbudget.engines.base import EngineOptions
from kvbudget.engines.scheduling.seq import Queues
from kvbudget.engines.scheduling.setup import Planned, Setup, SimulationAsk, SimulatorDefaults, config_of
from kvbudget.engines.sglang.hiradix import HiCacheScheduler
from kvbudget.engines.sglang.scheduler import SGLangScheduler
from kvbudget.engines.tiers import required_link
from kvbudget.errors import KVBudgetError, named
from kvbudget.gpus import reported_total

if TYPE_CHECKING:
    from kvbudget.engines.sglang.engine import SGLangEngine


class SGLangSimulator(SimulatorDefaults):
    offloads = True

    def __init__(self, engine: SGLangEngine):
        self.engine = engine

    def _host_tier(self, ask: SimulationAsk, planned: Planned, gpu_tokens: int) -> dict[str, Any]:
        """HiCache's host pool the ask gives host memory for, and one page's load time."""
        if ask.offload_memory is None:
            return {}
        if ask.offload_disk is not None or ask.disk_read is not None:
            raise KVBudgetError("offload_disk: HiCache's third tier is an external storage backend, not simulated; "
                                f"leave {named('offload_disk')} out", param="offload_disk")
        if ask.offload_backend not in (None, "hicache"):
            raise KVBudgetError(f"offload_backend {ask.offload_backend!r}: SGLang's is hicache",
                                param="offload_backend")
        if not ask.prefix_caching:
            raise KVBudgetError("offload_memory: HiCache sits behind the radix cache; leave prefix caching on",
                                param="offload_memory")
        link = required_link(ask.gpu)
        tier = self.engine.host_tiers(ask.model, memory=ask.offload_memory, disk=None, backend="hicache",
                                      kv_dtype=ask.kv_dtype, tp=ask.tp, options=planned.options)[0]
        if tier.tokens <= gpu_tokens:
            raise KVBudgetError(f"offload_memory: SGLang refuses a host pool no larger than the GPU's ({tier.tokens:,} "
                                f"against {gpu_tokens:,} tokens a rank); give more", param="offload_memory")
        return {"host_tier": tier, "host_block_seconds": link.seconds(tier.unit_bytes, tier.ranks)}

    def options(self, ask: SimulationAsk) -> EngineOptions:
        if ask.num_blocks is not None or not ask.allocator.paged or ask.long_prefill_token_threshold:
            raise KVBudgetError("SGLang: its token pool is the allocator (no blocks) and it has no long-prefill "
                                "threshold; leave num_blocks, allocator and long_prefill_token_threshold out",
                                param="engine")
        if ask.speculative is not None:
            raise KVBudgetError("speculative: simulate does not follow SGLang's drafting (draft and verified tokens, "
                                "acceptance); estimate and plan size the drafter's pool", param="speculative")
        return super().options(ask)

    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        if planned.allocation.fixed_bytes_per_sequence:
            raise KVBudgetError(f"simulate: {ask.model.name} keeps recurrent state per request; SGLang's state pool "
                                "is not simulated yet", param="engine")
        tokens = planned.capacity.kv_cache_tokens
        tiers = self._host_tier(ask, planned, tokens)
        chunk, rows = self.engine.scheduler_defaults(tokens, planned.max_model_len,
                                                     reported_total(planned.gpu_memory_bytes, planned.gpu_name)
                                                     if planned.gpu else None)
        return Setup(engine=self.engine.name, model=ask.model.name, num_blocks=tokens, block_size=1,
                     kv_memory_bytes=planned.kv_memory, max_num_seqs=ask.max_num_seqs or rows,
                     max_num_batched_tokens=ask.max_num_batched_tokens or chunk,
                     max_model_len=planned.max_model_len, prefix_caching=ask.prefix_caching,
                     long_prefill_token_threshold=0, gpu=planned.gpu, time_model=planned.time_model,
                     bytes_per_token=planned.allocation.bytes_per_token, allocator="tokens",
                     allocation=planned.allocation,
                     scheduling="the scheduling follows SGLang 0.5.23's source and is not checked against a running "
                                "SGLang: an estimate" + ("; HiCache follows 0.5.6's source, its load times an estimate "
                                                         "from the GPU's host link" if tiers else ""),
                     simulator=self, **tiers)

    def scheduler(self, setup: Setup) -> Queues:
        tier = setup.host_tier
        if tier is not None:
            return HiCacheScheduler(config_of(setup), host_tokens=tier.tokens,
                                    token_seconds=setup.host_block_seconds / tier.unit_tokens,
                                    page_bytes=tier.unit_bytes, page=tier.unit_tokens)
        return SGLangScheduler(config_of(setup))
