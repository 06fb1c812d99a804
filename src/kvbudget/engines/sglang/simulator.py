"""SGLang's scheduler model for `simulate`: its token pool is the allocator (no blocks), with its defaults for
the prefill chunk and the running requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.base import EngineOptions
from kvbudget.engines.sglang.scheduler import SGLangScheduler
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.seq import Queues
from kvbudget.simulation.setup import Planned, Setup, SimulationAsk, SimulatorDefaults, config_of

if TYPE_CHECKING:
    from kvbudget.engines.sglang.engine import SGLangEngine


class SGLangSimulator(SimulatorDefaults):
    def __init__(self, engine: SGLangEngine):
        self.engine = engine

    def options(self, ask: SimulationAsk) -> EngineOptions:
        if ask.num_blocks is not None or ask.allocator != "paged" or ask.long_prefill_token_threshold:
            raise KVBudgetError("SGLang: its token pool is the allocator (no blocks) and it has no long-prefill "
                                "threshold; leave num_blocks, allocator and long_prefill_token_threshold out",
                                param="engine")
        return super().options(ask)

    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        p = planned.plan
        if p.estimate.allocation.fixed_bytes_per_sequence:
            raise KVBudgetError(f"simulate: {ask.model.name} keeps recurrent state per request; SGLang's state pool "
                                "is not simulated yet", param="engine")
        tokens = p.capacity.kv_cache_tokens
        chunk, rows = self.engine.scheduler_defaults(tokens, planned.max_model_len,
                                                     p.gpu_memory_bytes if planned.gpu else None)
        return Setup(engine=self.engine.name, model=ask.model.name, num_blocks=tokens, block_size=1,
                     kv_memory_bytes=planned.kv_memory, max_num_seqs=ask.max_num_seqs or rows,
                     max_num_batched_tokens=ask.max_num_batched_tokens or chunk,
                     max_model_len=planned.max_model_len, prefix_caching=ask.prefix_caching,
                     long_prefill_token_threshold=0, gpu=planned.gpu, time_model=planned.time_model,
                     bytes_per_token=p.estimate.bytes_per_token, allocator="tokens",
                     allocation=p.estimate.allocation,
                     scheduling="the scheduling follows SGLang 0.5.23's source and is not checked against a running "
                                "SGLang: an estimate", simulator=self)

    def scheduler(self, setup: Setup) -> Queues:
        return SGLangScheduler(config_of(setup))
