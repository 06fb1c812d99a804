"""check-log on the formats of the fifth held-out batch's logs not read when it was measured (tests/data/logs/
unseen/h5-*, looked at since: dev material now), each read as its engine's source prints it. Expected figures are
worked out here from the lines themselves and the engines' sources named beside each test."""

from __future__ import annotations

from pathlib import Path

from tests.unit.engines.test_check_log_h4_formats import partial, rows, run

# vLLM 0.7-0.8's V1 refusal in "GB" (v1/core/kv_cache_utils.py, check_enough_kv_cache_memory: the bytes / 1024**3,
# a GiB figure labelled GB, and no estimated maximum length yet)


def test_vllm_08_refusal_in_gb_is_read_without_a_model():
    found = partial("h5-vllm-issue-15617-v0.8.2-refusal-gb-8x4090.log")
    assert found["refused: max seq len"][0] == "116,160"
    assert found["refused: KV cache needed"] == ("4.43 GiB", "more than the 3.48 GiB available", True)


def test_vllm_08_refusal_in_gb_checks_the_request_against_the_model(tmp_path: Path):
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB a token; 131,072 tokens: 16 GiB
    text = ("ERROR 03-27 16:43:19 [core.py:343] ValueError: To serve at least one request with the models's max seq "
            "len (131072), (16.00 GB KV cache is needed, which is larger than the available KV cache memory (10.00 "
            "GB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.\n")
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["refused: KV cache needed"][:2] == ("16.00 GiB", "16.00 GiB")


# A budget printed below zero (V1's gpu_worker.py determine_available_memory, unclamped; vllm-ascend's worker the
# same): kv_cache_utils.py check_enough_kv_cache_memory then refuses any budget <= 0 for want of one block


def test_vllm_negative_budget_is_the_no_block_refusal_with_the_weights_checked():
    # Qwen3-14B: 14.77e9 parameters x 2 bytes = 27.5 GiB, the 27.5376 GB (GiB) the log loaded
    status, result, err = run("h5-vllm-ascend-9372-vnpu-negative-budget.log", "--model", "qwen3-14b")
    assert status == 0, err
    found = rows(result)
    assert found["refused: no cache block"][0] == "-0.87 GiB" and found["refused: no cache block"][2]
    assert found["refused: fits"] == ("no", "no", True)
    assert found["weights per GPU"][0] == "27.54 GiB" and found["weights per GPU"][2]


def test_vllm_negative_budget_without_a_model_shows_the_refusal():
    found = partial("h5-vllm-ascend-9372-vnpu-negative-budget.log")
    assert found["refused: no cache block"][0] == "-0.87 GiB"


# SGLang's refusal for want of memory after the weights (python/sglang/srt/model_executor/model_runner.py,
# _profile_available_bytes, 2026): rest = available after the weights - pre_model_load_memory x (1 -
# mem_fraction_static), refused at 0 or less


def test_sglang_no_kv_memory_refusal_follows_from_the_weights_line():
    # avail 12.25 GB after the weights, 125.65 GB used by them: 137.90 before; 12.25 - 137.90 x 0.12 = -4.30
    for found in (partial("h5-sglang-inferencex-2128-dsv4-pro-h200-no-kv-memory.log"),
                  rows(run("h5-sglang-inferencex-2128-dsv4-pro-h200-no-kv-memory.log", "--model",
                           "deepseek-v4-pro")[1])):
        assert found["refused: memory left for the KV pool"] == ("none", "-4.30 GiB", True)


def test_sglang_no_kv_memory_refusal_checks_its_minimum_fraction(tmp_path: Path):
    # 79.00 GB free before the weights, 20.00 after: 20 - 79 x 0.3 = -3.70; minimum 1 - 20 / 79 = 0.7468
    text = ("[2026-08-28 01:41:10 TP0] Load weight begin. avail mem=79.00 GB\n"
            "[2026-08-28 01:41:17 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail "
            "mem=20.00 GB, mem usage=59.00 GB.\n"
            "ValueError: Loaded weights leave no GPU memory for the KV cache under\n"
            "--mem-fraction-static=0.7. Raise --mem-fraction-static above 0.747\n"
            "(minimum viable = 1 - available/pre = 0.7468). If using speculative decoding, draft weights are now "
            "counted.\n")
    status, result, err = run(text, tmp_path=tmp_path)
    found = rows(result)
    assert status == 2 and "--model" in err
    assert found["refused: memory left for the KV pool"] == ("none", "-3.70 GiB", True)
    assert found["minimum mem_fraction_static"] == ("0.7468", "0.7468", True)


def test_sglang_no_kv_memory_refusal_alone_says_what_to_pass(tmp_path: Path):
    status, _, err = run("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                         "--mem-fraction-static=0.5.\n", tmp_path=tmp_path)
    assert status == 2 and "nothing to check" in err and "Load weight begin" in err and err.count("\n") == 0


# ggml's 2023 example loaders (ggml examples/gpt-j and gpt-2 main.cpp, koboldcpp's otherarch copies): n_mem = n_layer
# x n_ctx, K and V each n_embd x n_mem of f16 or f32, printed in MiB as "MB"


def test_ggml_gptj_memory_size_and_n_mem_against_the_loaders_shape():
    # GPT-J 6B: 28 layers x 2,048 cells = 57,344; 2 x 57,344 x 4,096 x 2 bytes (f16) = 896 MiB
    found = partial("h5-koboldcpp-41-2023-gptj-memory-size-n-mem.log")
    assert found["memory_size"] == ("896.00 MB", "896.00 MiB (f16)", True)
    assert found["n_mem"] == ("57,344", "57,344", True)


def test_ggml_gpt2_memory_size_in_f32(tmp_path: Path):
    # GPT-2 117M: 12 x 1,024 = 12,288 cells; 2 x 12,288 x 768 x 4 bytes (f32) = 72 MiB
    text = ("gpt2_model_load: n_vocab = 50257\ngpt2_model_load: n_ctx   = 1024\ngpt2_model_load: n_embd  = 768\n"
            "gpt2_model_load: n_head  = 12\ngpt2_model_load: n_layer = 12\n"
            "gpt2_model_load: memory size =    72.00 MB, n_mem = 12288\n")
    status, result, _ = run(text, tmp_path=tmp_path)
    found = rows(result)
    assert status == 2 and found["memory_size"] == ("72.00 MB", "72.00 MiB (f32)", True)
    assert found["n_mem"] == ("12,288", "12,288", True)


# torchrun's per-rank tee (torch.distributed.elastic) puts '[rank0]: ' before every line of a rank's output, the
# wrapped lines of one message included (the h5 refusal under '[rank0]: ', written here hard-wrapped)


def test_vllm_refusal_wrapped_under_rank_prefixes_checks_its_estimate(tmp_path: Path):
    # one cache group: the estimate is max seq len x available / needed = 131,072 x 10 / 16 = 81,920
    text = ("[rank0]: ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV "
            "cache is\n[rank0]: needed, which is larger than the available KV cache memory (10.00 GiB). Based on "
            "the available memory,\n[rank0]: the estimated maximum model length is 81920. Try increasing "
            "`gpu_memory_utilization` or decreasing\n")
    status, result, err = run(text, tmp_path=tmp_path)
    found = rows(result)
    assert status == 2 and "--model" in err
    assert found["refused: KV cache needed"] == ("16.00 GiB", "more than the 10.00 GiB available", True)
    assert found["refused: estimated maximum model length"] == ("81,920", "81,920.00", True)


def test_vllm_estimate_of_a_hybrid_is_shown_not_judged():
    # a hybrid's fixed recurrent state: 250,000 x 0.35 / 1.8 = 48,611, the log's 856: shown, not a difference
    found = partial("h5-vllm-backport-15-8x3090-refusal-250k.log")
    assert found["refused: estimated maximum model length"][0] == "856"
    assert found["refused: estimated maximum model length"][2] is None


# llama.cpp's KV allocation refusal on a GPU (ggml-cuda.cu, ggml_backend_cuda_buffer_type_alloc_buffer: "allocating
# %.2f MiB on device %d: cudaMalloc failed", the ROCm build's the same source) before llama_kv_cache_init's
# "failed to allocate buffer for kv cache"
REFUSED_ON_GPU = ("llama_new_context_with_model: n_ctx      = 131072\n"
                  "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 16384.00 MiB on device 0: cudaMalloc failed: "
                  "out of memory\nllama_kv_cache_init: failed to allocate buffer for kv cache\n"
                  "llama_new_context_with_model: llama_kv_cache_init() failed for self-attention cache\n")


def test_llamacpp_kv_refusal_on_a_gpu_is_checked_against_the_cache(tmp_path: Path):
    # Llama-3.1-8B: 131,072 bytes a cell x 131,072 cells = 16 GiB = 16,384.00 MiB
    status, result, err = run(REFUSED_ON_GPU, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["refused: KV cache buffer (bytes)"] == (f"{16 * 2**30:,}", f"{131072 * 131072:,}", True)
    status, result, _ = run(REFUSED_ON_GPU, "--model", "llama-2-7b", tmp_path=tmp_path)  # 512 KiB a cell: not it
    assert status == 1


def test_llamacpp_kv_refusal_without_a_size_says_what_to_pass(tmp_path: Path):
    text = "llama_kv_cache_init: failed to allocate buffer for kv cache\n"
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 2 and not result and "nothing to check" in err and err.count("\n") == 0


# Ollama 0.11 on (ml/backend/ggml/ggml.go, then ml/device.go): each device's 'model weights', 'kv cache' and
# 'compute graph' figures, then 'total memory', all in format.HumanBytes2 (one decimal); the runner's load request
# names the cache's cells (KvSize) and type (KvCacheType, empty: f16)
OLLAMA_DEVICES = (
    'time=2025-10-01T10:00:01.000Z level=INFO source=runner.go:1200 msg=load request="{Operation:commit '
    'Parallel:1 BatchSize:512 FlashAttention:false KvSize:8192 KvCacheType: NumThreads:8 GPULayers:33}"\n'
    'time=2026-02-25T18:14:34.262Z level=INFO source=device.go:240 msg="model weights" device=Metal size="4.7 GiB"\n'
    'time=2026-02-25T18:14:34.262Z level=INFO source=device.go:251 msg="kv cache" device=Metal size="1.0 GiB"\n'
    'time=2026-02-25T18:14:34.262Z level=INFO source=device.go:262 msg="compute graph" device=Metal size="2.1 GiB"\n'
    'time=2026-02-25T18:14:34.262Z level=INFO source=device.go:272 msg="total memory" size="7.8 GiB"\n')


def test_ollama_device_lines_add_up_without_a_model(tmp_path: Path):
    # 4.7 + 1.0 + 2.1 = 7.8 GiB, the total it prints
    status, result, err = run(OLLAMA_DEVICES, tmp_path=tmp_path)
    found = rows(result)
    assert status == 2 and "--model" in err
    assert found["Ollama: kv cache"][0] == "1.0 GiB"
    assert found["Ollama: total memory"] == ("7.8 GiB", "7.8 GiB", True)


def test_ollama_device_kv_cache_against_the_model_at_kv_size(tmp_path: Path):
    # Llama-3.1-8B: 8,192 cells x 32 layers x (128 + 128) x 8 KV heads x 2 bytes = 1.0 GiB; Llama-2-7B (32 KV
    # heads): 4.0 GiB
    status, result, err = run(OLLAMA_DEVICES, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["Ollama: kv cache"] == ("1.0 GiB", "1.0 GiB", True)
    assert run(OLLAMA_DEVICES, "--model", "llama-2-7b", tmp_path=tmp_path)[0] == 1
