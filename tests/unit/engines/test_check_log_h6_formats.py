"""check-log on the formats of the sixth held-out batch's logs not read when it was measured (tests/data/logs/
unseen/h6-*, looked at since: dev material now), each read as its engine's source prints it, with variants written
here. Expected figures are worked out from the lines themselves and the sources named beside each test."""

from __future__ import annotations

from pathlib import Path

from tests.unit.engines.test_check_log_h4_formats import partial, rows, run

# llama.cpp's cache line (src/llama-kv-cache.cpp, 2025-26): "size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs),
# K (%s): %7.2f MiB, V (%s): %7.2f MiB": the cells of one stream, n_seq_max over the streams (1 where unified)

# Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 bytes = 2 KiB of K a cell and layer
_SIZE_4096 = ("llama_kv_cache: size =  512.00 MiB (  4096 cells,  32 layers,  1/1 seqs), K (f16):  256.00 MiB, "
              "V (f16):  256.00 MiB\n")


def test_llamacpp_size_line_folded_inside_its_parentheses_is_joined(tmp_path: Path):
    # a terminal 80 columns wide cuts the line after 'K (f16'; the tail starts by closing that bracket
    text = _SIZE_4096.replace("K (f16)", "K (f16\n)")
    assert len(text.splitlines()[0]) >= 60
    found = rows(run(text, tmp_path=tmp_path)[1])
    assert found["KV cache: size"] == ("512.00 MiB", "512.00 MiB", True)
    assert partial("h6-llamacpp-odysseus-831-docker-cpu-kv-size-wrapped-80-cols.log")["KV cache: size"][2]


def test_llamacpp_size_lines_alone_state_the_context(tmp_path: Path):
    # no 'llama_context: n_ctx' lines: 4,096 cells of one stream, 1 sequence: n_ctx 4096
    status, result, err = run(_SIZE_4096, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["KV cache: size"] == ("512.00 MiB", "512.00 MiB", True)
    assert "implied by the cache's size lines" in result["assumed"]["n_ctx"]
    assert result["assumed"]["n_ctx"].startswith("4096")


def test_llamacpp_size_lines_alone_with_two_streams(tmp_path: Path):
    # 2 sequences in 2 streams of 2,048 cells: n_ctx 4096, the size over both streams (2 x 2048 x 32 x 2 KiB = 256)
    text = ("llama_kv_cache: size =  512.00 MiB (  2048 cells,  32 layers,  2/2 seqs), K (f16):  256.00 MiB, "
            "V (f16):  256.00 MiB\n")
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["KV cache: cells"][:2] == ("2048", "2048")
    assert result["assumed"]["n_seq_max"].startswith("2 ")


def test_llamacpp_iswa_size_lines_alone_check_the_window_cells():
    # gpt-oss-120b: 16,384 full cells; the SWA cache pad256(128 + 512) = 640 cells
    status, result, err = run("h6-llamacpp-issue-15105-vulkan-iswa-gpt-oss-120b-cells-refusal.log", "--model",
                              "gpt-oss-120b")
    assert status == 0, err
    assert rows(result)["SWA KV cache: cells"] == ("640", "640", True)


def test_llamacpp_size_line_of_another_model_is_refused_by_its_rows(tmp_path: Path):
    # the same line checked against Qwen2.5-7B (28 layers, 4 KV heads): the layers differ
    status, result, _ = run(_SIZE_4096, "--model", "qwen2.5-7b", tmp_path=tmp_path)
    assert status == 1 and not rows(result)["KV cache: layers"][2]


# ggml-rpc's devices name their buffers 'RPC[host:port]' (ggml/src/ggml-rpc/ggml-rpc.cpp, ggml_backend_rpc_buffer_
# type_name): the devices' KV buffer lines alone, cut before the size line


def test_llamacpp_rpc_kv_buffers_are_added(tmp_path: Path):
    text = ("llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB\n"
            "llama_kv_cache: RPC[192.168.1.20:50052] KV buffer size =   768.50 MiB\n")
    found = rows(run(text, tmp_path=tmp_path)[1])
    assert found["KV buffers over 2 devices"][:2] == ("1024.50 MiB", "-")
    assert partial("h6-llamacpp-beowulf-2-vulkan-rpc-kv-buffers-crash.log")["KV buffers over 2 devices"][0] == \
        "800.00 MiB"


# vLLM V0's refusal (worker/worker.py, raise_if_cache_size_invalid), retyped with a typo in 'seq'


def test_vllm_v0_refusal_retyped_is_read(tmp_path: Path):
    text = ("ValueError: The model's max sew len (32768) is larger than the maximum number of tokens that can be "
            "stored in KV cache (18896). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.\n")
    found = rows(run(text, tmp_path=tmp_path)[1])
    assert found["refused: tokens the cache holds"][0] == "18,896"
    assert partial("h6-vllm-langchain-17906-refusal-curly-quotes-sew-len.log")["refused: tokens the cache holds"][0] \
        == "18,896"


# llama.cpp's 2023 loader (llama.cpp, llama_model_load_internal; ggjt files): 'model size = 7B' names a LLaMA shape
# (32 layers x 4096), MEM_REQ_KV_SELF's "(+ N MB per state)" the f16 cache of 2048 cells rounded up (1026 MB for
# 7B), twice that for f32; "kv self size" the cache llama_init_from_file made


def _loader(per_state: str, kv_self: str) -> str:
    return ("llama_model_load_internal: n_parts    = 1\n"
            "llama_model_load_internal: model size = 7B\n"
            f"llama_model_load_internal: mem required  = 5407.71 MB (+ {per_state} MB per state)\n"
            f"llama_init_from_file: kv self size  = {kv_self} MB\n")


def test_llamacpp_2023_kv_self_implies_whole_cells_from_the_model_size(tmp_path: Path):
    # f16: 2 x 32 x 4096 x 2 bytes = 0.5 MiB a cell: 256 MiB is 512 cells
    found = rows(run(_loader("1026.00", " 256.00"), tmp_path=tmp_path)[1])
    assert found["kv self size (f16): cells"] == ("256.00 MB", "512.00 cells", True)
    # f32 (per state twice the table's): 1 MiB a cell
    found = rows(run(_loader("2052.00", " 256.00"), tmp_path=tmp_path)[1])
    assert found["kv self size (f32): cells"] == ("256.00 MB", "256.00 cells", True)
    # 256.30 MiB is 512.6 f16 cells: not a cache of this shape
    assert not rows(run(_loader("1026.00", " 256.30"), tmp_path=tmp_path)[1])["kv self size (f16): cells"][2]
    # the 30B log: 3120 MiB / (2 x 60 x 6656 x 2 bytes) = 2048 cells
    assert partial("h6-llamacpp-pr-1826-2023-metal-30b-kv-self-mb.log")["kv self size (f16): cells"][1] == \
        "2,048.00 cells"


# V0's executors name the device pool by the platform's dispatch key (engine/executor_base.py initialize_cache,
# "# %s blocks: %d, # CPU blocks: %d"): CUDA (ROCm too), XPU, XLA on TPU, HPU, forks' MLU and PrivateUse1 (Ascend)


def test_vllm_v0_blocks_of_any_device_are_read(tmp_path: Path):
    for device in ("CUDA", "XPU", "XLA", "HPU", "MLU", "PrivateUse1", "cuda"):
        text = f"INFO 05-06 10:00:00 executor_base.py:110] # {device} blocks: 10495, # CPU blocks: 2048\n"
        found = rows(run(text, tmp_path=tmp_path)[1])
        assert found[f"{device.upper()} blocks"][0] == "10,495", device
    text = "INFO 05-06 10:00:00 executor_base.py:110] # CPU blocks: 2048\n"  # the swap pool alone: no device pool
    assert run(text, tmp_path=tmp_path)[0] == 2


def test_vllm_v0_xpu_blocks_are_checked_against_the_model(tmp_path: Path):
    # Llama-3.1-8B at block size 16: 2,000 blocks hold 32,000 tokens; the V0 refusal's count is blocks x 16
    text = ("INFO 05-06 10:00:00 executor_base.py:110] # XPU blocks: 2000, # CPU blocks: 2048\n"
            "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
            "stored in KV cache (32000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.\n")
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status in (0, 1), err
    assert any(r["matches"] for r in result["rows"]), result["rows"]


# The same 2023 loader with the model given: its size beside the model's K and V for the loader's n_ctx (llama.cpp
# then kept n_ctx cells a layer, unpadded; f32 where memory_f16 was off). The seventh batch's one log not read.


def test_llamacpp_2023_kv_self_is_checked_against_the_model(tmp_path: Path):
    # Llama-2-13B: 40 layers x 5120 wide; 1,024 cells in f16: 2 x 1024 x 40 x 5120 x 2 bytes = 800 MiB
    text = ("llama_model_load_internal: n_ctx      = 1024\n" + _loader("1608.00", " 800.00")).replace("7B", "13B")
    status, result, err = run(text, "--model", "llama-2-13b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["kv self size (f16)"][:2] == ("800.00 MB", "800.00 MiB")
    # against Llama-3.1-8B (32 layers x 1024 of K and V) the same line differs: exit 1
    status, result, _ = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 1 and not next(v for k, v in rows(result).items() if k.startswith("kv self size ("))[2]
    # f32 at 2,048 cells (the textgen-webui log): 3,200 MiB
    status, result, err = run("h7-textgen-webui-issue-866-2023-ggjt-v1-kv-self-3200mb.log", "--model", "llama-2-13b")
    assert status == 0 and rows(result)["kv self size (f32)"][:2] == ("3200.00 MB", "3200.00 MiB"), err


# The eighth batch's two logs not read when it was measured (looked at since). vLLM's CPU worker (v1/worker/
# cpu_worker.py, 2026) refuses a cache its NUMA node cannot hold: "(kv/share GiB)", the share total x
# gpu_memory_utilization and kv the share less what the model took; "(kv GiB)" alone where the cache size is given


def test_vllm_cpu_node_refusal_is_read(tmp_path: Path):
    text = ("(Worker pid=7) ERROR 06-13 19:57:36 [multiproc_executor.py:989] ValueError: Available memory on node 0 "
            "(4.66/18.0 GiB) on kv cache allocation is less than requested memory for kv (-0.39/3.6 GiB). Reduce CPU "
            "memory used by other processes.\n")
    found = rows(run(text, tmp_path=tmp_path)[1])
    assert found["refused: KV cache on CPU node 0"] == ("-0.39 GiB", "nothing left of the share", True)
    # the share is 0.2 of the node; the model and its warm-up took 3.6 + 0.39 = 3.99 GiB of it
    assert found["CPU share (total x gpu_memory_utilization)"][1] == "0.200 of 18.0 GiB"
    text = ("ValueError: Available memory on node 1 (2.5/7.77 GiB) on kv cache allocation is less than requested "
            "memory for\n kv (12.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE\n")
    found = rows(run(text, tmp_path=tmp_path)[1])
    assert found["refused: KV cache on CPU node 1"] == ("12.0 GiB", "more than the 2.5 GiB free of 7.77", True)
    assert len(found) == 1
    # a cache that fits the node's free memory is not what this refusal says: shown as differing
    text = text.replace("(12.0 GiB)", "(2.0 GiB)")
    assert rows(run(text, tmp_path=tmp_path)[1])["refused: KV cache on CPU node 1"][2] is False
    assert partial("h8-vllm-cpu-lmcache-pr-3614-node-memory-kv-refused.log")["refused: KV cache on CPU node 0"][2]


# llama.cpp's 2023 Metal backend (ggml-metal.m, ggml_metal_add_buffer): each buffer and the device's running total
# (MB: MiB); the 'kv' buffer is the cache plus 2 MiB (llama.cpp 2023: cache.buf.resize(... + 2u*MB))

_METAL = ("llama_model_load_internal: n_ctx      = 512\n"
          "ggml_metal_add_buffer: allocated 'data            ' buffer, size =  6984.06 MB, ( 6984.52 / 21845.34)\n"
          "ggml_metal_add_buffer: allocated 'kv              ' buffer, size =   258.00 MB, ( 7242.52 / 21845.34)\n")


def test_llamacpp_2023_metal_kv_buffer_is_checked(tmp_path: Path):
    found = rows(run(_METAL, tmp_path=tmp_path)[1])
    assert found["Metal 'kv' buffer: running total"] == ("7242.52 MB", "7242.52 MiB", True)
    assert found["KV cache (Metal 'kv' buffer)"][0] == "256.00 MiB"
    # Llama-2-7B at 512 cells in f16: 2 x 512 x 32 x 4096 x 2 bytes = 256 MiB, the buffer less its 2 MiB
    status, result, err = run(_METAL, "--model", "llama-2-7b", tmp_path=tmp_path)
    assert status == 0 and rows(result)["KV cache (Metal) (f16)"][:2] == ("256.00 MB", "256.00 MiB"), err
    # a running total that does not add up
    assert not rows(run(_METAL.replace("( 7242.52", "( 7250.52"), tmp_path=tmp_path)[1])[
        "Metal 'kv' buffer: running total"][2]
    assert partial("h8-llamacpp-issue-3606-2023-metal-kv-buffer-402mb-over-working-set.log")[
        "KV cache (Metal 'kv' buffer)"][0] == "400.00 MiB"


# The ninth batch's two logs not read when it was measured (looked at since): a V0 log printing its budget and
# blocks but no max_model_len (the model's own length assumed, as for the other lines), and llama.cpp 2026's
# meta-backend over several devices naming its KV buffer 'Meta()'


def test_vllm_v0_budget_without_max_model_len_is_checked(tmp_path: Path):
    # Llama-3.1-8B at TP 1: 7.71 GiB // 2 MiB a 16-token block = 3,947 blocks
    text = ("INFO 04-02 10:20:55 worker.py:266] the current vLLM instance can use total_gpu_memory (44.42GiB) x "
            "gpu_memory_utilization (0.90) = 39.98GiB\n"
            "INFO 04-02 10:20:55 worker.py:266] model weights take 14.99GiB; non_torch_memory takes 0.30GiB; PyTorch "
            "activation peak memory takes 1.26GiB; the rest of the memory reserved for KV Cache is 7.71GiB.\n"
            "INFO 04-02 10:20:55 executor_base.py:108] # CUDA blocks: 3947, # CPU blocks: 2048\n")
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status in (0, 1), err
    assert rows(result)["blocks"][0] == "3,947" and rows(result)["blocks"][2]
    assert "the model's own length" in result["assumed"]["max_model_len"]
    # the same log at TP 2 of Qwen2.5-32B's shape reads, the blocks off by the ranks (the cause named)
    status, result, err = run("h9-vllm-0.7-issue-15815-qwen2.5-32b-l40s-tp2-cuda-blocks.log", "--model",
                              "qwen2.5-32b")
    assert status == 1 and not rows(result)["blocks"][2], err
    status, result, err = run("h9-vllm-0.7-issue-15815-qwen2.5-32b-l40s-tp2-cuda-blocks.log", "--model",
                              "qwen2.5-32b", "--tp", "2")
    assert rows(result)["blocks"][2], err


def test_llamacpp_meta_backend_kv_buffer_is_read(tmp_path: Path):
    text = "llama_kv_cache:     Meta() KV buffer size =  4096.00 MiB\n"
    assert rows(run(text, tmp_path=tmp_path)[1])["KV buffers over 1 device"][0] == "4096.00 MiB"
    assert partial("h9-llamacpp-issue-26208-rocm-gfx1201-journal-meta-kv-buffer-4096mib.log")[
        "KV buffers over 1 device"][0] == "4096.00 MiB"
