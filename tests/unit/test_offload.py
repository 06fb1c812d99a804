"""KV offload tiers: each engine's sizing rules from its source, and the simulated CPU tier behind vLLM's prefix
cache. Expected figures are worked out here from the configs and the engines' rules, not read off the code."""

from __future__ import annotations

import pytest

from kvbudget.cli import main
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.sglang.hicache import hicache_tokens
from kvbudget.engines.vllm.offload import native_tier
from kvbudget.gpus import find_gpu
from kvbudget.model.load import load_model
from kvbudget.offload import host_report
from kvbudget.simulation.run import simulate
from kvbudget.simulation.workload import Request
from kvbudget.units import GIB, MIB

# Llama-3.1-8B: 32 layers, 8 KV heads of 128, bf16: 2 x 8 x 128 x 2 B = 4 KiB per token per layer
LLAMA_TOKEN = 32 * 2 * 8 * 128 * 2


@pytest.fixture(scope="module")
def llama():
    return load_model("llama-3.1-8b")


def test_vllm_native_chunks_are_blocks_of_every_rank_padded_to_pages(llama):
    report = host_report(get_engine("vllm"), llama, memory=64 * GIB, gpu=find_gpu("H100-80GB"), lengths=(4096,))
    tier = report.tiers[0]
    block = 16 * LLAMA_TOKEN  # 2 MiB: already whole pages
    assert (tier.unit_tokens, tier.unit_bytes, tier.units) == (16, block, 64 * GIB // block)
    assert tier.prefixes(4096) == 64 * GIB // block // 256
    # a 4,096-token prefix is 256 blocks over PCIe 5.0 x16 at 0.875 x 64 GB/s
    assert report.load_seconds(tier, 4096) == pytest.approx(256 * block / 56e9)
    # tensor parallel: every rank's share of a block in one chunk; the total over ranks is the setting
    two = host_report(get_engine("vllm"), llama, memory=64 * GIB, tp=2).tiers[0]
    assert (two.unit_bytes, two.units, two.ranks) == (block, 64 * GIB // block, 2)
    # a block that is not whole pages is padded to the next 4,096 bytes
    odd = native_tier(llama, memory=GIB, block_bytes=5000, block_size=16, tp=1)
    assert (odd.unit_bytes, odd.units) == (8192, GIB // 8192)


def test_vllm_native_mla_keeps_one_copy_under_tensor_parallelism():
    model = load_model("deepseek-v2-lite")
    one = host_report(get_engine("vllm"), model, memory=16 * GIB, tp=1).tiers[0]
    two = host_report(get_engine("vllm"), model, memory=16 * GIB, tp=2).tiers[0]
    assert two.ranks == 1 and two.unit_bytes == one.unit_bytes  # replicated_layout: rank 0's copy only


def test_lmcache_chunks_are_256_tokens_per_rank_and_drop_a_partial_one(llama):
    tiers = host_report(get_engine("vllm"), llama, memory=64 * GIB, disk=GIB * 1024, backend="lmcache",
                        tp=2).tiers
    cpu, disk = tiers
    per_rank_chunk = 256 * LLAMA_TOKEN // 2  # [2, 32 layers, 256, 4 heads x 128] bf16
    assert (cpu.unit_tokens, cpu.units, cpu.unit_bytes) == (256, 32 * GIB // per_rank_chunk, 2 * per_rank_chunk)
    assert disk.medium == "disk" and disk.units == 512 * GIB // per_rank_chunk
    assert cpu.units_for(300) == 1 and cpu.units_for(255) == 0  # save_unfull_chunk False


def test_sglang_host_pool_rounds_to_pages_by_release(llama):
    # 68 GB at 128 KiB a token: int(68e9 // 131072) = 518,798 tokens
    assert hicache_tokens(68, LLAMA_TOKEN, 64, (0, 5, 3)) == 518_784  # 0.5.3-0.5.5: down to whole pages
    assert hicache_tokens(68, LLAMA_TOKEN, 64, (0, 5, 6)) == 518_848  # 0.5.6 on: one page past
    tier = host_report(get_engine("sglang"), llama, memory=68 * 10**9, tp=1,
                       options=EngineOptions(block_size=64)).tiers[0]
    assert tier.setting.endswith("--hicache-size 68 (per rank)") and tier.tokens == 518_784


def test_llamacpp_prompt_cache_is_cache_ram_over_the_token_bytes(llama):
    tier = host_report(get_engine("llamacpp"), llama, memory=8192 * MIB).tiers[0]
    assert tier.setting == "--cache-ram 8192" and tier.tokens == 8192 * MIB // LLAMA_TOKEN


@pytest.mark.parametrize("argv, message", [
    (["--offload-disk", "1TiB"], "give --offload-memory too"),
    (["--engine", "tgi", "--offload-memory", "1GiB"], "not tgi"),
    (["--offload-memory", "8GiB", "--offload-disk", "1TiB"], "no disk tier"),
    (["--offload-memory", "8GiB", "--offload-backend", "mooncake"], "offload backends are native, lmcache"),
    (["--gpu", "H100-80GB"], "give --offload-memory too"),
])
def test_estimate_refuses_offload_settings_in_one_line(capsys, argv, message):
    assert main(["estimate", "llama-3.1-8b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _repeat_after(k: int) -> list[Request]:
    """Prompt A (1,024 tokens, 64 blocks), then k other prompts, then A again, one at a time."""
    prompts = ["A", *(f"X{i}" for i in range(k)), "A"]
    return [Request(arrival=60.0 * i, prompt_tokens=1024, output_tokens=1, prefix=((p, 1024),))
            for i, p in enumerate(prompts)]


@pytest.mark.parametrize("k, tier_blocks, held", [(2, 3 * 64, True), (3, 3 * 64, False), (5, 8 * 64, True)])
def test_simulated_cpu_tier_keeps_the_last_blocks_it_stored(llama, k, tier_blocks, held):
    """Each prompt stores its 64 blocks; the tier keeps the last `tier_blocks`, so A is found again after k other
    prompts exactly when (k + 1) x 64 blocks fit. The GPU pool (69 usable blocks) keeps one prompt only."""
    block = 16 * LLAMA_TOKEN
    sim = simulate(llama, _repeat_after(k), gpu="H100-80GB", num_blocks=70, max_model_len=1040,
                   offload_memory=tier_blocks * block)
    base = simulate(llama, _repeat_after(k), gpu="H100-80GB", num_blocks=70, max_model_len=1040)
    assert sim.prefix_hit_tokens == base.prefix_hit_tokens == 0  # the GPU never keeps A
    assert sim.offload.hit_tokens == (1008 if held else 0)  # 63 blocks: never the last known token
    assert sim.offload.stored_blocks == (k + 2) * 64 - (64 if held else 0)
    last_with, last_without = sim.ttft_sorted, base.ttft_sorted
    if held:  # A's second prefill computes 16 tokens after loading 63 blocks over the host link
        assert min(last_with) < min(last_without)
    else:
        assert last_with == last_without


def test_simulate_refuses_a_tier_it_does_not_follow(capsys):
    assert main(["simulate", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100-80GB", "--rate", "1",
                 "--requests", "5", "--offload-memory", "8GiB"]) == 2
    assert "native offloading connector" in capsys.readouterr().err
    assert main(["simulate", "llama-3.1-8b", "--gpu", "B300", "--rate", "1", "--requests", "5",
                 "--offload-memory", "8GiB"]) == 2
    assert "host link" in capsys.readouterr().err
