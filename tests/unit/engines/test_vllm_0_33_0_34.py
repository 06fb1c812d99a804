"""vLLM 0.33 and 0.34 (engines/vllm/releases.py, extensible.py), each rule from the release's wheel.

0.34's budget with its extensible KV cache, as v1/worker/extensible_kv_cache.py measure_kv_cache_bytes computes it:

    non_kv_used = init_free - free - committed
    headroom    = free + committed                       (= init_free - non_kv_used)
    margin      = max(1 GiB (3 GiB on ROCm), int(0.75 x peak))
    available   = min(requested - non_kv_used, headroom - margin) - max(peak, reserve growth)

with requested = ceil(total x gpu_memory_utilization) (v1/worker/utils.py request_memory), the utilization 1.0 when
unset (config/cache.py resolved_gpu_memory_utilization). The expected budgets below are that arithmetic, written
out with the plan's terms pinned (weights, activation peak, overhead = non-torch + graphs given), and the memory
in use at the snapshot as kvbudget's stated estimate: 0.42 GiB below 8 ranks."""

from __future__ import annotations

import math

import pytest

from kvbudget import load_model, plan
from kvbudget.cli import main
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm.releases import parse_release
from kvbudget.errors import EngineRuleError
from kvbudget.gpus import find_gpu
from kvbudget.units import GIB

IN_USE = int(0.42 * GIB)  # kvbudget's estimate of what the snapshot finds in use (CUDA context, NCCL)
WEIGHTS, OVERHEAD = 15 * GIB, GIB


def _stack(version: tuple[int, int], gpu: str = "H100-80GB", activation: int = 2 * GIB,
           utilization: float | None = None, **options: object) -> dict[str, int]:
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu=gpu, max_model_len=4096, weights=WEIGHTS,
             activation=activation, overhead=OVERHEAD, utilization=utilization, recommend=False,
             options=EngineOptions(engine_version=version, **options))  # type: ignore[arg-type]
    return {t.key: t.bytes for t in p.stack}


def _measured(stack: dict[str, int], requested: int, peak: int, floor: int = GIB) -> int:
    """measure_kv_cache_bytes, written out (non_kv_used: the weights term (the given 15 GiB and the rotary tables
    vLLM makes at load) + the overhead)."""
    total = stack["gpu"]
    used = stack["weights"] + OVERHEAD
    init_free = total - IN_USE
    margin = max(floor, int(peak * 0.75))
    return min(requested - used, (init_free - used) - margin) - peak  # the reserve growth: not modelled


@pytest.mark.parametrize("activation", [GIB, 2 * GIB, 4 * GIB])  # margin: the 1 GiB floor, 1.5 GiB, 3 GiB
def test_0_34_sizes_the_cache_from_what_start_up_leaves_free(activation):
    stack = _stack((0, 34), activation=activation)
    assert stack["kv"] == _measured(stack, math.ceil(stack["gpu"] * 1.0), activation)


def test_a_share_below_the_free_memory_caps_the_0_34_cache_where_it_binds():
    """gpu_memory_utilization 0.8 asks less than is free: requested - used binds, as before 0.34; 0.99 asks more
    than the margin leaves, so the free memory binds."""
    for share in (0.8, 0.99):
        stack = _stack((0, 34), utilization=share)
        assert stack["kv"] == _measured(stack, math.ceil(stack["gpu"] * share), 2 * GIB)
    low = _stack((0, 34), utilization=0.8)
    assert low["kv"] == math.ceil(low["gpu"] * 0.8) - low["weights"] - 2 * GIB - OVERHEAD
    high = _stack((0, 34), utilization=0.99)
    assert high["share"] == high["gpu"] - IN_USE - int(0.75 * 2 * GIB)  # 0.75 x the 2 GiB peak over the 1 GiB floor


def test_rocm_keeps_a_3_gib_floor():
    """KV_CACHE_MARGIN_FLOOR_BYTES = (3 if current_platform.is_rocm() else 1) << 30."""
    stack = _stack((0, 34), gpu="MI300X")
    assert stack["kv"] == _measured(stack, stack["gpu"], 2 * GIB, floor=3 * GIB)


def test_without_the_extensible_cache_0_34_takes_0_92_of_the_card():
    """--no-enable-extensible-kv-cache: resolved_gpu_memory_utilization falls back to DEFAULT_GPU_MEMORY_UTILIZATION
    (0.92), and determine_available_memory sizes the cache as 0.33 does."""
    total = find_gpu("H100-80GB").memory_bytes
    off = _stack((0, 34), extensible_kv_cache=False)
    assert off["share"] == math.ceil(total * 0.92)
    assert off["kv"] == math.ceil(total * 0.92) - off["weights"] - 2 * GIB - OVERHEAD


def test_0_33_takes_the_budget_as_0_32():
    """0.33's gpu_worker.py determine_available_memory, request_memory and config/cache.py's 0.92 are 0.32's."""
    assert _stack((0, 33)) == _stack((0, 32))
    assert _stack((0, 33))["share"] == math.ceil(find_gpu("H100-80GB").memory_bytes * 0.92)


@pytest.mark.parametrize(("version", "block"), [((0, 33), 16), ((0, 34), 64)])
def test_default_block_size_by_release(version, block):
    """config/cache.py DEFAULT_BLOCK_SIZE: 16 in 0.33, 64 in 0.34 (FlashAttention accepts any multiple of 16, so
    _preferred_block_size_for_backends keeps the default)."""
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", max_model_len=4096, recommend=False,
             options=EngineOptions(engine_version=version))
    assert p.capacity.block_size == block


@pytest.mark.parametrize(("version", "gpu", "block"), [((0, 33), "H100-80GB", 16), ((0, 34), "H100-80GB", 64),
                                                       ((0, 33), "B200", 32), ((0, 34), "B200", 64)])
def test_mla_blocks_by_release(version, gpu, block):
    """0.33: FlashAttention MLA (16) on 9.x, FlashInfer MLA (32) on 10.x; 0.34: both take the default 64
    (flashattn_mla.py MultipleOf(16), flashinfer_mla.py [32, 64])."""
    p = plan(load_model("deepseek-v3"), engine="vllm", gpu="H200" if gpu == "H100-80GB" else gpu, gpus=8, tp=8,
             max_model_len=4096, recommend=False,
             options=EngineOptions(engine_version=version))
    assert p.capacity.block_size == block


def test_0_35_is_refused_in_one_line(capsys):
    with pytest.raises(EngineRuleError, match="0.35's source is not read") as err:
        parse_release("0.35.1")
    assert err.value.param == "engine_version"
    assert main(["plan", "llama-3.1-8b", "--engine", "vllm@0.35", "--gpu", "H100-80GB"]) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and "--engine vllm@0.34" in out


def test_turning_off_what_a_release_lacks_is_refused(capsys):
    assert main(["plan", "llama-3.1-8b", "--engine", "vllm@0.33", "--gpu", "H100-80GB",
                 "--no-extensible-kv-cache"]) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and "--no-extensible-kv-cache: vLLM 0.33 has no extensible KV cache" in out


def test_check_log_reads_0_34s_final_size_not_the_reserved_capacity():
    """0.34 logs "Available KV cache memory" for the reservation (gpu_worker.py determine_available_memory), then the
    size measured after warm-up (extensible_kv_cache.py extend_kv_cache), which is the budget; lines formatted with
    the source's own format strings."""
    from kvbudget.engines.vllm.logs import _rank_budgets

    formats = ("Available KV cache memory: %s GiB", "Extended KV cache to %d blocks (%.2f GiB).")
    log = "\n".join(["INFO [gpu_worker.py:797] " + formats[0] % "63.52",  # the source's own formats
                     "INFO [extensible_kv_cache.py:531] " + formats[1] % (7506, 58.64)])
    assert _rank_budgets(log) == ["58.64"]
    assert _rank_budgets(log.split("\n")[0]) == ["63.52"]  # before 0.34: the one budget line


def test_a_given_kv_budget_stands_on_0_34():
    """kv_cache_memory_bytes turns the extensible KV cache off (config/vllm.py _resolve_extensible_kv_cache) and is
    the budget itself (gpu_worker.py: "reserved ... memory for KV Cache as specified by kv_cache_memory_bytes")."""
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", max_model_len=4096, kv_memory=20 * GIB,
             recommend=False, options=EngineOptions(engine_version=(0, 34)))
    assert p.kv_memory_bytes == 20 * GIB


def test_other_engines_refuse_the_switch(capsys):
    assert main(["plan", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100-80GB", "--no-extensible-kv-cache"]) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and "--no-extensible-kv-cache: a vLLM setting" in out
