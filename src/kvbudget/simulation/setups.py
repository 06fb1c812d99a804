"""The simulator's setup: the memory and scheduler settings of a simulation, from the planner and the engine's
defaults, and its time model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.choices import Device, EntryPoint, Interconnect, parse_allocator
from kvbudget.engines import Engine, engine_release, get_engine
from kvbudget.engines.scheduling.setup import ExpertGroup, Planned, Setup, Simulates, SimulationAsk, with_host
from kvbudget.engines.scheduling.timing import NOMINAL, MeasuredStep, TimeModel, calibrate
from kvbudget.errors import KVBudgetError, named, spelled
from kvbudget.model.spec import ModelSpec
from kvbudget.simulation import steptimes
from kvbudget.simulation.drafting import drafting_for

if TYPE_CHECKING:
    from kvbudget.speculative import Speculative

NO_GPU_MEMORY = 40 << 30  # stands in for the GPU when only a KV budget is given (vLLM's small-GPU defaults)


def setup_for(model: ModelSpec, engine: str | Engine = "vllm", gpu: str | None = None, gpu_memory: int | None = None,
              kv_memory: int | None = None, num_blocks: int | None = None, tp: int = 1, pp: int = 1,
              kv_dtype: str = "auto", max_model_len: int | None = None, block_size: int | None = None,
              device: str = "cuda", max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
              prefix_caching: bool = True, long_prefill_token_threshold: int = 0,
              time_model: TimeModel | None = None, allocator: str = "paged",
              measured: Sequence[MeasuredStep] | None = None, kv_unified: bool = False,
              cache_ram: int | None = None, weights: int | None = None, utilization: float | None = None,
              enforce_eager: bool = False, entry_point: str = "server", lora: tuple[int, int] | None = None,
              offload_memory: int | None = None, offload_backend: str | None = None, interconnect: str | None = None,
              offload_disk: int | None = None, disk_read: float | None = None,
              speculative: Speculative | None = None, expert_parallel: int = 1,
              extensible_kv_cache: bool = True) -> Setup:
    """The memory and scheduler settings from the planner and the engine's defaults, and the default time model.
    `weights` (bytes per GPU) replaces the parameter count where kvbudget has none; `engine` may name a release;
    `speculative`: speculative decoding (vLLM's: engines/vllm/specdecode.py; its drafter: simulation/drafting.py);
    `expert_parallel`: the setup of one rank of that many data-parallel ranks sharing an MoE's routed experts
    (simulation/expertgroup.py runs them)."""
    name, version = engine_release(engine) if isinstance(engine, str) else (engine, None)
    chosen = get_engine(name)
    ask = SimulationAsk(model=model, engine=chosen, gpu=gpu, gpu_memory=gpu_memory, kv_memory=kv_memory,
                        num_blocks=num_blocks, tp=tp, pp=pp, kv_dtype=kv_dtype, max_model_len=max_model_len,
                        block_size=block_size, device=Device.parse(device, "device"), max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, prefix_caching=prefix_caching,
                        long_prefill_token_threshold=long_prefill_token_threshold, time_model=time_model,
                        allocator=parse_allocator(allocator), measured=measured, kv_unified=kv_unified,
                        cache_ram=cache_ram, weights=weights, utilization=utilization, enforce_eager=enforce_eager,
                        extensible_kv_cache=extensible_kv_cache,
                        entry_point=EntryPoint.parse(entry_point, "entry_point"), lora=lora,
                        offload_memory=offload_memory, offload_backend=offload_backend, offload_disk=offload_disk,
                        disk_read=disk_read, engine_version=version, speculative=speculative,
                        expert_parallel=expert_parallel,
                        interconnect=None if interconnect is None else Interconnect.parse(interconnect, "interconnect"))
    return setup_of(ask)


def setup_of(ask: SimulationAsk) -> Setup:
    """`setup_for` of a typed ask: the engine's scheduler model fills in what is its own."""
    from kvbudget.gpus import find_gpu
    from kvbudget.planner import plan

    model, chosen = ask.model, ask.engine
    if not isinstance(chosen, Simulates):
        raise KVBudgetError(f"engine {chosen.name}: the simulator follows vLLM's, llama.cpp's and SGLang's "
                            "schedulers only so far", param="engine")
    simulator = chosen.simulator()
    options = simulator.options(ask)
    if ask.speculative is not None and not simulator.speculates:
        raise KVBudgetError(f"speculative: simulate follows vLLM's speculative decoding, not {chosen.name}'s",
                            param="speculative")
    if ask.offload_memory is not None and not simulator.offloads:
        raise KVBudgetError(f"offload_memory: simulate follows vLLM's offload tiers and SGLang's HiCache; "
                            f"{chosen.name}'s is sized by estimate and plan (llama.cpp: cache_ram)",
                            param="offload_memory")
    ranks = ask.expert_parallel
    if ranks > 1 and not simulator.expert_groups:
        raise KVBudgetError(f"expert_parallel: simulate follows vLLM's expert-parallel groups, not {chosen.name}'s "
                            "(plan sizes its memory)", param="expert_parallel")
    if ranks > 1 and (ask.measured is not None or ask.time_model is not None):
        raise KVBudgetError(f"expert_parallel: a calibrated time model times one replica alone, without the "
                            f"group's all-gathers; leave {spelled('measured / time_model', '--calibrate')} out",
                            param="expert_parallel")
    gpus = ask.tp * ask.pp * ranks if ranks > 1 else None  # (with expert_parallel: the group's GPUs)
    max_len = ask.max_model_len or model.max_position_embeddings
    if not max_len:
        raise KVBudgetError(f"max_model_len: {model.name}'s config has no max_position_embeddings; give "
                            "max_model_len", param="max_model_len")
    card = find_gpu(ask.gpu) if ask.gpu else None
    if ask.gpu is None and ask.gpu_memory is None:
        if ask.kv_memory is None and ask.num_blocks is None and not simulator.sized_without_budget(ask):
            raise KVBudgetError("simulate: give a GPU (gpu or gpu_memory), a KV budget (kv_memory) or num_blocks",
                                param="gpu")
        if ask.utilization is not None:
            raise KVBudgetError(f"utilization: goes with {named('gpu')} or {named('gpu_memory')} (the memory it is "
                                "a share of)", param="utilization")
        # no GPU: the budget is given, and vLLM's scheduler defaults are those of a GPU under 70 GiB
        p = plan(model, engine=chosen, gpu_memory=NO_GPU_MEMORY, tp=ask.tp, pp=ask.pp, kv_dtype=ask.kv_dtype,
                 max_model_len=max_len, options=options, kv_memory=ask.kv_memory or NO_GPU_MEMORY,
                 recommend=False, weights=ask.weights, gpus=gpus, expert_parallel=ranks > 1)
    else:
        p = plan(model, engine=chosen, gpu=ask.gpu, gpu_memory=ask.gpu_memory, tp=ask.tp, pp=ask.pp,
                 kv_dtype=ask.kv_dtype, max_model_len=max_len, options=options, kv_memory=ask.kv_memory,
                 recommend=False, weights=ask.weights, utilization=ask.utilization, gpus=gpus,
                 expert_parallel=ranks > 1)
    if ask.measured is not None:
        time_model = calibrate(ask.measured)
    elif ask.time_model is not None:
        time_model = ask.time_model
    else:
        time_model = with_host(simulator, steptimes.default_time_model(model, p, card, ask.interconnect), p.options,
                               p.tp, p.pp)
    gather_latency = gather_per_token = 0.0
    if ranks > 1:
        time_model, gather_latency, gather_per_token = steptimes.expert_parallel(time_model, model, card,
                                                                                 ask.interconnect, ranks)
    if time_model.basis == NOMINAL:
        raise KVBudgetError("simulate: the time model needs a GPU from the catalog (its bandwidth and peak "
                            "FLOPS), or measured timings to calibrate it "
                            f"({spelled('measured / time_model', '--calibrate FILE')})", param="gpu")
    planned = Planned(capacity=p.capacity, allocation=p.estimate.allocation, kv_memory_bytes=p.kv_memory_bytes,
                      gpu_memory_bytes=p.gpu_memory_bytes, gpu_name=p.gpu, serving_options=p.options,
                      options=options, max_model_len=max_len, time_model=time_model,
                      gpu=p.gpu if card or ask.gpu_memory else None,
                      kv_memory=p.kv_memory_bytes if ask.budget_given else None,
                      drafting=drafting_for(ask, p, card, time_model, max_len))
    setup = simulator.setup(ask, planned)
    if ranks == 1:
        return setup
    # vLLM's largest CUDA graph: min(max_num_seqs x (1 + speculative tokens) x 2, 512, max_num_batched_tokens)
    # (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes); none under --enforce-eager
    drafts = setup.drafting.spec.num_tokens if setup.drafting is not None else 0
    graphs = 0 if ask.enforce_eager else min(setup.max_num_seqs * (1 + drafts) * 2, 512,
                                             setup.max_num_batched_tokens)
    return replace(setup, expert_group=ExpertGroup(ranks=ranks, gather_latency=gather_latency,
                                                   gather_per_token=gather_per_token, graph_tokens=graphs))
