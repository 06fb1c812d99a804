"""vLLM 0.34's extensible KV cache: the budget measured after warm-up and CUDA-graph capture, read from the 0.34.0
wheel (vllm/v1/worker/extensible_kv_cache.py, gpu_worker.py, config/cache.py, config/vllm.py, v1/worker/utils.py,
v1/core/kv_cache_planning.py).

- When: config/vllm.py _resolve_extensible_kv_cache turns it on where `enable_extensible_kv_cache` is unset, on CUDA
  and ROCm (`is_cuda_alike`), unless kv_cache_memory_bytes or num_gpu_blocks_override is given, elastic EP runs, or a
  KV connector shares the cache by legacy CUDA IPC (LMCache's MP connector); --no-enable-extensible-kv-cache turns
  it off (engine/arg_utils.py: a `bool | None` field, so argparse's BooleanOptionalAction).
- The share: config/cache.py `gpu_memory_utilization` is `None` by default and resolved_gpu_memory_utilization makes
  it 1.0 with the extensible KV cache, 0.92 without; request_memory (v1/worker/utils.py) still asks
  ceil(total x share). A share given under 1.0 caps the cache there (what the source warns about when it holds back
  a GiB or more between 0.7 and 1.0).
- The size: after the profiling pass (which still sizes the address space it reserves: determine_available_memory,
  as 0.33), warm-up steps over max_num_batched_tokens (gpu/warmup.py run_kv_cache_sizing_warmup) record the
  transient peak (allocated at peak less allocated after), the graphs are captured, and measure_kv_cache_bytes
  takes `min(requested - used, free + committed - margin) - max(peak, torch's reserve growth)`, where `used` is
  everything that grew since the worker's start-up snapshot but the committed KV blocks (weights, non-torch memory,
  the captured graphs), `free + committed` is what was free at that snapshot less `used`, and the margin is
  max(KV_CACHE_MARGIN_FLOOR_BYTES: 1 GiB, 3 GiB on ROCm; 0.75 x the peak). The final blocks are the fewest of that
  and the reserved capacity (kv_cache_planning.py finalize_extensible_kv_cache), whole blocks in whole 2 MiB-class
  granules (blocks_within: not modelled, under a granule per layer segment).

In kvbudget's terms the share is `min(ceil(total x share), total - in use at the snapshot - margin)`, the rest as
before (weights, activation peak, non-torch and graphs). What is in use at the snapshot (the CUDA context, cuBLAS
handles, NCCL buffers: gpu_worker.py takes the snapshot after them) is not in any log kvbudget reads per release:
the estimate is SGLang's fitted figure for the same memory (engines/sglang/engine.py PRELOAD: 0.42 GiB on an L4 at
tp 4 of torch's total, 1.96 GiB on an H200 at tp 8).
"""

from __future__ import annotations

from kvbudget.choices import Device
from kvbudget.engines.base import EngineOptions
from kvbudget.engines.freecap import FreeMemoryCap
from kvbudget.engines.vllm.releases import Release
from kvbudget.errors import EngineRuleError, KVBudgetError, named
from kvbudget.units import GIB

MARGIN_FLOOR = {False: GIB, True: 3 * GIB}  # by ROCm: KV_CACHE_MARGIN_FLOOR_BYTES (3 if is_rocm() else 1) << 30
MARGIN_FRACTION = 0.75  # KV_CACHE_MARGIN_FRACTION
EXTENSIBLE_SHARE = 1.0  # resolved_gpu_memory_utilization with the extensible KV cache
# Memory in use at the worker's snapshot, an estimate (see above): below 8 ranks, from 8
IN_USE = int(0.42 * GIB)
IN_USE_TP8 = int(1.96 * GIB)


def extensible(rel: Release, options: EngineOptions) -> bool:
    """Whether release `rel` sizes the cache after warm-up for `options`: from 0.34 on a GPU (kvbudget's CUDA device
    covers ROCm cards), unless turned off; refused where asked of a release without it."""
    if not options.extensible_kv_cache and not rel.extensible_kv_cache:
        raise EngineRuleError(f"{named('extensible_kv_cache', value=False)}: vLLM {rel.label} has no extensible KV "
                              "cache to turn off (from 0.34: v1/worker/extensible_kv_cache.py); leave it out for this "
                              "release", param="extensible_kv_cache")
    return rel.extensible_kv_cache and options.extensible_kv_cache and options.device == Device.CUDA


def free_memory_cap(gpu_name: str, tp: int) -> FreeMemoryCap:
    """The cap measure_kv_cache_bytes puts on the share on the card named (an AMD card: vLLM's ROCm platform; a card
    the catalog does not know is taken as CUDA): the memory free at the snapshot less the margin."""
    from kvbudget.gpus import find_gpu

    try:
        rocm = find_gpu(gpu_name).vendor == "AMD"
    except KVBudgetError:
        rocm = False
    in_use = IN_USE_TP8 if tp >= 8 else IN_USE
    floor = MARGIN_FLOOR[rocm]
    return FreeMemoryCap(in_use=in_use, floor=floor, fraction=MARGIN_FRACTION,
                         note=(f"the memory free at start-up (the card less {in_use / GIB:.2f} GiB then in use: CUDA "
                               f"context, NCCL; estimate) less max({floor // GIB} GiB, {MARGIN_FRACTION:g} x the "
                               "activation peak), from the source (extensible_kv_cache.py)"))


def serving_share(rel: Release, options: EngineOptions, gpu_name: str, tp: int
                  ) -> tuple[float, str, FreeMemoryCap | None]:
    """The share release `rel` takes by default for `options` on the card named, how to say it, and its cap."""
    if extensible(rel, options):
        return (EXTENSIBLE_SHARE, f"gpu_memory_utilization default with vLLM {rel.label}'s extensible KV cache",
                free_memory_cap(gpu_name, tp))
    off = " without the extensible KV cache" if rel.extensible_kv_cache and options.device == Device.CUDA else ""
    return rel.gpu_memory_utilization, f"gpu_memory_utilization default{off}", None
