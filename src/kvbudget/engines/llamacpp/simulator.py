"""llama-server's model for `simulate`: its slots are the allocator (-np slots of n_ctx / np cells, or one
unified pool), with the host-RAM prompt cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.base import EngineOptions
from kvbudget.engines.llamacpp.releases import CACHE_RAM_MIB, N_BATCH
from kvbudget.engines.llamacpp.scheduler import LlamaServerScheduler, PromptCache
from kvbudget.engines.scheduling.seq import Queues
from kvbudget.engines.scheduling.setup import CACHE_RAM, Planned, Setup, SimulationAsk, SimulatorDefaults, config_of
from kvbudget.errors import KVBudgetError, flag, named, spelled

SLOTS, UNIFIED = "slots", "slots-unified"

if TYPE_CHECKING:
    from kvbudget.engines.llamacpp.engine import LlamaCppEngine


class LlamaCppSimulator(SimulatorDefaults):
    def __init__(self, engine: LlamaCppEngine):
        self.engine = engine

    def options(self, ask: SimulationAsk) -> EngineOptions:
        self.check_release(ask)
        if ask.num_blocks is not None:
            raise KVBudgetError(f"num_blocks: llama.cpp has no KV blocks; give its slots "
                                f"({spelled('max_num_seqs, -np', flag('max_num_seqs'))}) and their context "
                                f"({named('max_model_len')})", param="num_blocks")
        if not ask.allocator.paged or ask.long_prefill_token_threshold:
            raise KVBudgetError("llama.cpp: its slots are the allocator and it has no long-prefill threshold; leave "
                                "allocator and long_prefill_token_threshold out", param="allocator")
        if ask.cache_ram is not None and ask.cache_ram < 0:
            raise KVBudgetError(CACHE_RAM, param="cache_ram")
        if ask.speculative is not None:
            raise KVBudgetError("speculative: simulate does not follow llama-server's drafting (its slots' draft "
                                "tokens, acceptance); estimate and plan size the draft model's cache",
                                param="speculative")
        return ask.engine_options(batched=False)

    def sized_without_budget(self, ask: SimulationAsk) -> bool:
        return bool(ask.max_num_seqs)

    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        max_len = planned.max_model_len
        fit = int(planned.capacity.max_concurrency) if ask.budget_given else None
        n = ask.max_num_seqs or fit or 0
        if not n or (fit is not None and n > fit):
            raise KVBudgetError(f"simulate: the KV budget holds {fit or 0} llama.cpp slot(s) of {max_len} cells; "
                                f"{'-np ' + str(n) + ' would fail to allocate' if n else 'nothing to serve with'}: "
                                "give more memory, fewer slots or a shorter context",
                                param="max_num_seqs" if n else "kv_memory")
        n_ctx_slot, shared = self.engine.slot_context(ask.model, max_len, n, ask.kv_unified)
        return Setup(engine=self.engine.name, model=ask.model.name, num_blocks=shared or n * n_ctx_slot,
                     block_size=1, kv_memory_bytes=planned.kv_memory, max_num_seqs=n,
                     max_num_batched_tokens=ask.max_num_batched_tokens or N_BATCH, max_model_len=n_ctx_slot,
                     prefix_caching=ask.prefix_caching, long_prefill_token_threshold=0, gpu=planned.gpu,
                     time_model=planned.time_model, bytes_per_token=planned.allocation.bytes_per_token,
                     allocator=UNIFIED if ask.kv_unified else SLOTS, allocation=planned.allocation,
                     scheduling="the scheduling follows llama-server's loop exactly (the host-RAM prompt cache's "
                                "size limit in bytes is an estimate)",
                     prompt_cache_bytes=(CACHE_RAM_MIB if ask.cache_ram is None else ask.cache_ram) << 20,
                     simulator=self)

    def scheduler(self, setup: Setup) -> Queues:
        ram = PromptCache(setup.prompt_cache_bytes, setup.bytes_per_token) if setup.prompt_cache_bytes else None
        return LlamaServerScheduler(config_of(setup), setup.num_blocks if setup.allocator == UNIFIED else 0, ram)

    def describe(self, setup: Setup, short: bool = False) -> str:
        s = setup
        if short:
            return self.memory(s)
        pool = "one pool of" if s.allocator == UNIFIED else "in all:"
        return (f"-np {s.max_num_seqs} slots of {s.max_model_len:,} cells ({pool} {s.token_slots:,} cells); "
                f"n_batch {s.max_num_batched_tokens}, prompt cache {'on' if s.prefix_caching else 'off'}")
