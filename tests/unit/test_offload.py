"""KV offload tiers: each engine's sizing rules from its source, and the simulated CPU tier behind vLLM's prefix
cache. Expected figures are worked out here from the configs and the engines' rules, not read off the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbudget.cli import main
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.sglang.hicache import hicache_tokens
from kvbudget.engines.vllm.offload import native_tier
from kvbudget.gpus import find_gpu
from kvbudget.model.load import load_model
from kvbudget.offload import host_report
from kvbudget.simulation.run import simulate
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


CHUNK = 256 * LLAMA_TOKEN  # an LMCache chunk of Llama-3.1-8B on one GPU: 32 MiB, already whole pages


@pytest.mark.parametrize("k, chunks, held", [(2, 12, True), (3, 12, False), (5, 24, True)])
def test_simulated_lmcache_keeps_whole_prompt_chunks(llama, k, chunks, held):
    """Each prompt of 1,024 tokens stores 4 chunks of 256 (its one generated token is not stored); A is found
    after k others exactly when (k + 1) x 4 chunks fit, and 3 chunks load: the 4th ends at A's last token."""
    sim = simulate(llama, _repeat_after(k), gpu="H100-80GB", num_blocks=70, max_model_len=1040,
                   offload_memory=chunks * CHUNK, offload_backend="lmcache")
    base = simulate(llama, _repeat_after(k), gpu="H100-80GB", num_blocks=70, max_model_len=1040)
    assert sim.offload.hit_tokens == (768 if held else 0)
    assert sim.offload.stored_blocks == (k + 1) * 4 + (0 if held else 4)  # chunks; a held one is only touched
    assert sim.offload.to_dict()["loaded_bytes"] == (3 * CHUNK if held else 0)
    if held:  # the load runs inside A's step: 3 x 32 MiB over PCIe 5.0 at 56 GB/s, far less than 768 tokens' compute
        assert min(sim.ttft_sorted) < min(base.ttft_sorted)
    else:
        assert sim.ttft_sorted == base.ttft_sorted


def test_simulated_lmcache_disk_tier_serves_what_host_memory_let_go(llama):
    """Host memory holds the last prompt's 4 chunks, the disk the last 12: A comes back from disk after two others,
    and a slow enough drive makes its first token later than computing it again (at 7 GB/s, the three chunks'
    14 ms beside the 256 tokens computed already take longer than A's 21.5 ms prefill on an H100)."""
    fast = simulate(llama, _repeat_after(2), gpu="H100-80GB", num_blocks=70, max_model_len=1040,
                    offload_memory=4 * CHUNK, offload_backend="lmcache", offload_disk=12 * CHUNK, disk_read=50e9)
    slow = simulate(llama, _repeat_after(2), gpu="H100-80GB", num_blocks=70, max_model_len=1040,
                    offload_memory=4 * CHUNK, offload_backend="lmcache", offload_disk=12 * CHUNK, disk_read=1e7)
    base = simulate(llama, _repeat_after(2), gpu="H100-80GB", num_blocks=70, max_model_len=1040)
    assert fast.offload.hit_tokens == fast.offload.disk_hit_tokens == 768
    assert min(fast.ttft_sorted) < min(base.ttft_sorted) and max(slow.ttft_sorted) > max(base.ttft_sorted)
    # at 10 MB/s the three chunks take 3 x 32 MiB / 1e7 s, added to A's step
    assert max(slow.ttft_sorted) - max(base.ttft_sorted) == pytest.approx(3 * CHUNK / 1e7, rel=0.05)


def test_simulate_refuses_a_tier_it_does_not_follow(capsys):
    assert main(["simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "H100-80GB", "--rate", "1",
                 "--requests", "5", "--offload-memory", "8GiB"]) == 2
    assert "vLLM's offload tiers" in capsys.readouterr().err
    assert main(["simulate", "llama-3.1-8b", "--gpu", "B300", "--rate", "1", "--requests", "5",
                 "--offload-memory", "8GiB"]) == 2
    assert "host link" in capsys.readouterr().err


# --- check-log: the tiers engines print -----------------------------------------------------------------------


def vllm_rows(model, text, tp=1):
    from kvbudget.engines.vllm.logsettings import setting as _setting
    from kvbudget.engines.vllm.memorylog import offload_rows

    return offload_rows(get_engine("vllm"), model, text, size=_setting(text, "kv_offloading_size"),
                        backend=_setting(text, "kv_offloading_backend"), kv_dtype="auto", tp=tp,
                        options=EngineOptions())


def test_check_log_reads_vllms_offload_region(llama):
    args = "INFO [utils.py:253] non-default args: {'model': 'meta-llama/Llama-3.1-8B', 'kv_offloading_size': 64.0}\n"
    # 64 GiB of 2 MiB blocks: 32,768 chunks, 68,719,476,736 bytes, printed in 10^9 bytes
    mmap = "INFO [shared_offload_region.py:142] Created mmap file /dev/shm/vllm_offload_0f3a.mmap ({} GB)\n"
    (row,) = vllm_rows(llama, args + mmap.format("68.72"))
    assert (row.logged, row.predicted, row.matches) == ("68.72 GB", "68.72 GB", True)
    assert "32,768 chunks of 2,097,152 bytes" in row.note
    (wrong,) = vllm_rows(llama, args + mmap.format("34.36"))  # half the region: a different block, not ours
    assert wrong.matches is False
    (unseen,) = vllm_rows(llama, args)
    assert unseen.matches is None and unseen.predicted == "68.72 GB"
    # the connector configured by hand in bytes (kv_connector_extra_config cpu_bytes_to_use): 8e9 // 2 MiB = 3,814
    # chunks of 2,097,152 bytes = 7.998 GB
    direct = ("Creating v1 connector with name: OffloadingConnector\nkv_transfer_config: {\"kv_connector\": "
              "\"OffloadingConnector\", \"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 8000000000}}\n")
    (by_hand,) = vllm_rows(llama, direct + mmap.format("8.00"))
    assert by_hand.matches is True and "3,814 chunks" in by_hand.note
    assert vllm_rows(llama, "INFO non-default args: {'model': 'x'}\n") == []


def test_check_log_reads_lmcaches_configuration(llama):
    # LMCache's configuration line as LMCache/LMCache issue #792 shows it (0.3 era, four TP workers)
    line = ("(VllmWorker rank=0 pid=247) [2025-06-07 20:33:02,562] LMCache INFO: LMCache Configuration: "
            "{'chunk_size': 256, 'local_cpu': True, 'max_local_cpu_size': '300.0 GB', 'local_disk': None, "
            "'max_local_disk_size': '0.0 GB', 'remote_url': None}")
    (row,) = vllm_rows(llama, line, tp=4)
    # a worker's chunk: 256 tokens x 32 KiB (a quarter of Llama-3.1-8B's 128 KiB) = 8 MiB; 300 GiB of them
    assert row.predicted == f"{300 * 1024 // 8:,} chunks, {300 * 1024 // 8 * 256:,} tokens"
    assert row.matches is None and "GiB" in row.note
    # the older form (LMCacheEngineConfig(...), LMCache/LMCache issue #1088) with a disk tier
    older = ("LMCache INFO: Creating LMCacheEngine with config: LMCacheEngineConfig(chunk_size=256, local_cpu=True, "
             "max_local_cpu_size=5.0, local_disk='file:///tmp/lmc/', max_local_disk_size=20, remote_url=None)")
    cpu, disk = vllm_rows(llama, older)
    assert (cpu.predicted, disk.predicted) == ("160 chunks, 40,960 tokens", "640 chunks, 163,840 tokens")


def test_check_log_reads_sglangs_host_pool(tmp_path, capsys):
    from kvbudget.engines.sglang.hicache import hicache_rows

    # --hicache-size 10 at 128 KiB a token: 76,293 tokens; pages of 64: 76,288 (0.5.3) or 76,352 (0.5.6 on)
    text = "hicache_size=10, page_size=64\nAllocating {} GB host memory for hierarchical KV cache.\n"
    (old,) = hicache_rows(text.format("10.00"), 131072, 100_000, (0, 5, 3))
    (new,) = hicache_rows(text.format("10.01"), 131072, 100_000, (0, 5, 6))
    assert old.matches and new.matches and "76,352 tokens" in new.note
    assert not hicache_rows(text.format("10.00"), 131072, 100_000, (0, 5, 6))[0].matches
    # a real SGLang log (Qwen3-235B at tp 4: 48,128 bytes a token per rank) with the default --hicache-ratio 2:
    # 2 x 367,404 = 734,808 tokens x 48,128 bytes = 35.36 GB a rank
    log = tmp_path / "sglang.log"
    real = Path(__file__).parents[1] / "data" / "logs" / "sglang-issue-vllm-21348-qwen3-235b-tp4.log"
    log.write_text(real.read_text() + "Allocating 35.36 GB host memory for hierarchical KV cache.\n")
    assert main(["check-log", str(log), "--model", "qwen3-235b-a22b", "--tp", "4", "--json"]) in (0, 1)
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["host pool per rank (HiCache)"]["matches"] is True


@pytest.mark.parametrize("k, held", [(6, True), (7, False)])
def test_simulated_hicache_writes_finished_requests_through_to_host(llama, k, held):
    """SGLang with HiCache: --hicache-size 1 (GB) holds int(1e9 // 131,072) = 7,629 tokens a rank; each finished
    prompt writes its 1,024 tokens through, so A is found after k others exactly when (k + 1) x 1,024 fit. The GPU
    pool (1,100 tokens) keeps one prompt only; 1,023 tokens load back (never the last), beside the step."""
    kw = dict(engine="sglang", gpu="H100-80GB", kv_memory=1100 * LLAMA_TOKEN, max_model_len=1040)
    sim = simulate(llama, _repeat_after(k), offload_memory=10**9, **kw)
    base = simulate(llama, _repeat_after(k), **kw)
    assert sim.setup.host_tier.tokens == 7629
    assert sim.prefix_hit_tokens == base.prefix_hit_tokens == 0
    assert sim.offload.hit_tokens == (1023 if held else 0)
    assert sim.offload.stored_blocks == (k + 1 + (0 if held else 1)) * 1024  # tokens; a held piece is not copied again
    if held:  # the copy (1,023 x 128 KiB at 56 GB/s) runs beside a one-token step: far less than a 1,024-token prefill
        assert 1023 * LLAMA_TOKEN / 56e9 <= min(sim.ttft_sorted) < min(base.ttft_sorted)
    else:
        assert sim.ttft_sorted == base.ttft_sorted


def test_simulated_hicache_refuses_a_host_pool_no_larger_than_the_gpus(llama):
    with pytest.raises(Exception, match="no larger than the GPU"):
        simulate(llama, _repeat_after(1), engine="sglang", gpu="H100-80GB", max_model_len=1040,
                 offload_memory=10**9)
