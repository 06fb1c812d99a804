"""check-log on the formats of the third held-out batch's logs not read when it was measured (tests/data/logs/unseen/
h3-*, looked at since: dev material now), each read as its engine's source prints it. Expected figures are worked out
here from the lines themselves and the engines' sources named beside each test."""

from __future__ import annotations

import pytest

from tests.unit.engines.test_check_log_h4_formats import rows, run

# TGI 0.9-1.1: the warm-up's refusal (server/text_generation_server/models/flash_causal_lm.py, v1.1.0), its batch
# max_batch_prefill_tokens tokens (router/client/src/client.rs)

def test_tgi_warmup_refusal_as_an_issue_title_checked_against_the_routers_span():
    status, result, _ = run("h3-tgi-issue-1164-title-warmup-refusal-256.log", "--model", "llama-2-7b")
    found = rows(result)
    assert status == 0
    assert found["warm-up refused: prefill tokens"] == ("256", "256", True)  # max_prefill_tokens=256 in the span
    # Llama-2-7B: 32 layers x 32 KV heads x 128 x 2 (K, V) x 2 bytes = 524,288 bytes a token; 256 of them
    assert found["KV memory of those tokens per shard"][1] == f"{256 * 524288 / 2**30:.2f} GiB"
    assert found["max input tokens <= max batch prefill tokens"] == ("64 / 256", "holds", True)
    assert "num_shard" not in result["settings"] and "num_shard" in result["assumed"]  # the log states no shards
    status, result, _ = run("h3-tgi-issue-1164-title-warmup-refusal-256.log", "--model", "llama-2-7b", "--tp", "2")
    assert result["settings"]["num_shard"] == 2  # its source's two shards, given: half the KV on each
    assert rows(result)["KV memory of those tokens per shard"][1] == f"{256 * 524288 / 2 / 2**30:.2f} GiB"


def test_tgi_shards_runtime_error_without_a_model_is_a_partial_check():
    status, result, err = run("h3-tgi-issue-1067-awq-warmup-refusal.log")
    assert status == 2 and result["partial"] and "--model" in err
    assert rows(result)["warm-up refused: prefill tokens"][0] == "4,096"


def test_tgi_launchers_warmup_error_alone_says_what_to_pass():
    status, _, err = run("h3-tgi-issue-755-title-warmup-refusal-llama-2-70b-gptq.log", "--model", "llama-2-70b")
    assert status == 2 and "warm-up's refusal" in err and "Args" in err and err.count("\n") == 0


# vLLM 0.1: '# GPU blocks: -1', the unclamped (total x gpu_memory_utilization - peak) // block of
# vllm/worker/worker.py (profile_num_available_blocks), later refused as 'No available memory for the cache blocks'

def test_vllm_0_1_negative_gpu_blocks_is_the_refusal_for_want_of_one_block():
    status, result, _ = run("h3-vllm-issue-184-gpu-blocks-minus-one.log", "--model", "llama-2-7b")
    found = rows(result)
    assert status == 0
    # a block: 16 tokens x 524,288 bytes = 8 MiB; V0's 4 GiB swap space holds 512 of them, as the log says
    assert found["CPU blocks (4 GiB swap space)"] == ("512", "512", True)
    assert found["refused: no cache block"] == ("refused", "under 8.00 MiB per GPU", None)
    status, result, err = run("h3-vllm-issue-184-gpu-blocks-minus-one.log")
    assert status == 2 and result["partial"] and "--model" in err and "refused: no cache block" in rows(result)


def test_vllm_negative_blocks_never_read_as_a_count(tmp_path):
    status, result, _ = run("INFO 06-21 10:00:18 llm_engine.py:128] # GPU blocks: -12, # CPU blocks: 512\n",
                            "--model", "llama-2-7b", tmp_path=tmp_path)
    assert status == 0 and "blocks" not in rows(result)


# vLLM V0 0.6.5's 'Memory profiling results:' printed one field a line (worker.py, the table of PR #10511)

def test_vllm_v0_profiling_table_one_field_a_line():
    status, result, _ = run("h3-vllm-pr-10511-profiling-table-columns.log", "--model", "llama-3.1-8b", "--tp", "1")
    found = rows(result)
    assert status == 0
    assert found["KV budget"][0] == "53.29 GiB" and found["KV budget"][2] is True
    assert found["memory: engine share"][0] == f"{79.22 * 0.9:.2f} GiB"
    assert found["memory: profiling peak"][0] == "1.26 GiB" and found["memory: non-torch memory"][0] == "1.79 GiB"


# SGLang: 'max_total_tokens=M is larger than the profiled value P' (model_runner.py), P below zero a refusal; and
# 'server_args=ServerArgs(...)' alone

def test_sglang_negative_profiled_pool_on_every_rank_is_a_refusal():
    name = "h3-sglang-issue-7691-rocm-dp8-negative-profiled.log"
    status, result, _ = run(name, "--model", "deepseek-r1")
    found = rows(result)
    assert status == 0 and result["settings"]["tp"] == 8  # '[... DP7 TP7]': eight ranks
    assert found["profiled pool (tokens)"] == ("-561,981", "-", True)  # the 8 ranks print one value
    # DeepSeek-R1's MLA cell: 61 layers x (512 latent + 64 rope) x 2 bytes = 70,272 bytes a token
    assert found["memory the pool fell short by (per rank)"][1] == f"{561981 * 70272 / 2**30:.2f} GiB"
    assert found["memory: weights as loaded"][0] == "166.59 GB"
    assert found["refused: fits"] == ("no", "no", True)
    status, result, err = run(name)
    assert status == 2 and result["partial"] and "--model" in err and "profiled pool (tokens)" in rows(result)


def test_sglang_positive_profiled_value_is_the_pool(tmp_path):
    text = ("[2026-02-11 06:45:01] max_total_tokens=131072 is larger than the profiled value 50756. Use the "
            "profiled value instead.\n")
    status, result, _ = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0 and rows(result)["pool (tokens)"][0] == "50,756"


def test_sglang_server_args_alone_checked_against_the_model():
    status, result, _ = run("h3-sglang-issue-1030-server-args-llama-3-8b.log", "--model", "llama-3.1-8b")
    assert status == 0
    assert rows(result)["context_length within the model's context"] == ("4,096", "<= 131,072", True)


def test_sglang_server_args_beyond_the_models_context_and_heads(tmp_path):
    text = "server_args=ServerArgs(model_path='x', context_length=262144, tp_size=3, mem_fraction_static=0.88)\n"
    status, result, _ = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    found = rows(result)
    assert status == 1
    assert found["context_length within the model's context"][2] is False  # 262,144 > 131,072
    assert found["tensor parallel size fits the heads"] == ("3", "32 attention heads, 8 KV heads", False)


# llama.cpp: the KV allocation refusal (llama_kv_cache_init, b3184 on) and ik_llama.cpp's MLA 'c^KV' cache

def test_llamacpp_kv_allocation_refusal_in_backticks_checked_against_the_cache():
    name = "h3-llamacpp-issue-8101-kv-alloc-failed-1m-ctx-backticks.log"
    status, result, _ = run(name, "--model", "llama-3.1-8b")
    found = rows(result)
    # Llama-3.1-8B at 1,048,576 cells: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes a cell;
    # ggml asked for 32 bytes more (alignment)
    assert status == 0 and result["settings"]["n_ctx"] == 1048576
    assert found["refused: KV cache buffer (bytes)"] == ("137,438,953,504", f"{1048576 * 131072:,}", True)
    status, result, _ = run(name, "--model", "llama-2-7b")  # four times the bytes a cell: not this log's model
    assert status == 1 and rows(result)["refused: KV cache buffer (bytes)"][2] is False
    status, result, err = run(name)
    assert status == 2 and result["partial"] and "--model" in err
    assert rows(result)["refused: KV cache buffer"][0] == "128.00 GiB"


def test_llama_cpp_python_refusal_between_another_apps_timestamped_lines():
    status, result, err = run("h3-llamacpp-python-khoj-1127-kv-alloc-failed-timestamps.log")
    assert status == 2 and result["partial"] and "--model" in err
    assert rows(result)["refused: KV cache buffer"][0] == f"{17179869216 / 2**30:.2f} GiB"


def test_ik_llamacpp_mla_kv_self_over_sixteen_and_eleven_gpus():
    for name, size in (("h3-iklamacpp-pr-239-sixteen-gpus-mla-kv-self.log", "137.25"),
                       ("h3-iklamacpp-issue-749-eleven-gpus-kv-self-280gb-oom.log", "1005.79")):
        status, result, err = run(name)
        found = rows(result)
        assert status == 2 and result["partial"] and "--model" in err
        assert found["KV self size"][2] is True and found["KV self size over the devices"][0] == f"{size} MiB"
        assert found["KV self size over the devices"][2] is True


def test_ik_llamacpp_mla_cells_implied_by_the_latent_cache():
    status, result, _ = run("h3-iklamacpp-pr-235-mla-kv-self-compute-oom.log", "--model", "deepseek-r1")
    found = rows(result)
    # DeepSeek-R1: 61 layers x (512 + 64) x 2 bytes = 70,272 bytes a cell; 2196.00 MiB is 32,768 of them
    assert status == 0 and found["c^KV (f16): cells"] == ("2196.00 MiB", "32,768.00 cells", True)
    assert "KV self size over the devices" not in found  # the paste starts at CUDA11: not every device's buffer


def test_ik_llamacpp_mla_cells_stated(tmp_path):
    text = ("llama_new_context_with_model: n_ctx      = 4096\n"
            "llama_new_context_with_model: KV self size  =  274.50 MiB, c^KV (f16):  274.50 MiB, kv^T: not used\n")
    status, result, _ = run(text, "--model", "deepseek-r1", tmp_path=tmp_path)
    assert status == 0 and rows(result)["c^KV (f16)"] == ("274.50 MiB", f"{4096 * 70272 / 2**20:.2f} MiB", True)


# Ollama's scheduler line (logfmt, llm/memory.go and llm/ggml.go of v0.5.11)

def test_ollama_offload_line_kv_estimate_against_the_model():
    name = "h3-ollama-issue-9181-offload-line-kv-19.5gib.log"
    status, result, _ = run(name, "--model", "llama-3.1-70b")
    found = rows(result)
    # 64,000 x 80 layers x (128 + 128) x 8 KV heads x 2 bytes = 20,971,520,000 bytes, printed as 19.5 GiB
    assert status == 0 and found["Ollama: memory.required.kv"] == ("19.5 GiB", "19.5 GiB", True)
    assert found["Ollama: GPU allocations added"] == ("87.2 GiB", "87.1 GiB", True)  # 4 x 21.8, each rounded
    status, result, _ = run(name, "--model", "llama-3.1-8b")  # 32 layers: 7.8 GiB, not this log's model
    assert status == 1 and rows(result)["Ollama: memory.required.kv"][1] == "7.8 GiB"


def test_ollama_offload_line_under_journald_without_a_model():
    status, result, err = run("h3-ollama-pr-12000-journal-offload-line-kv.log")
    found = rows(result)
    assert status == 2 and result["partial"] and "--model" in err
    assert found["Ollama: memory.required.kv"][0] == "992.0 MiB"
    assert found["Ollama: GPU allocations added"] == ("8.9 GiB", "8.9 GiB", True)


# vLLM logs that state no KV figure but their settings: Model Runner V2's cross-layer KV cache shape
# (kv_connector_model_runner_mixin.py) and the argument namespace

def test_vllm_cross_layer_kv_shape_against_the_models_block():
    name = "h3-vllm-pr-45947-mrv2-cross-layer-kv-shape.log"
    status, result, _ = run(name, "--model", "llama-3.1-70b")
    found = rows(result)
    # (8724, 8, 80, 2, 16, 128): 8 KV heads x 80 layers x K and V x 16 tokens x 128 a block
    assert status == 0 and found["cross-layer KV cache: values a block"] == ("2,621,440", f"{8 * 80 * 2 * 16 * 128:,}",
                                                                               True)
    assert found["GPU blocks"][0] == "8,724"
    assert found["KV memory these blocks take"][1] == f"{8724 * 2621440 * 2 / 2**30:.2f} GiB"
    status, result, _ = run(name, "--model", "llama-3.1-8b")  # 32 layers: not this log's model
    assert status == 1 and rows(result)["cross-layer KV cache: values a block"][2] is False
    status, result, err = run(name)
    assert status == 2 and result["partial"] and "--model" in err and rows(result)["GPU blocks"][0] == "8,724"


def test_vllm_argument_namespace_alone(tmp_path):
    args = ("Namespace(model='x', dtype='auto', kv_cache_dtype='fp8', max_model_len={}, tensor_parallel_size={}, "
            "gpu_memory_utilization=0.9, num_gpu_blocks_override=None, max_num_batched_tokens=None)\n")
    status, result, _ = run(args.format(430000, 4), "--model", "llama-3.1-70b", tmp_path=tmp_path)
    found = rows(result)
    assert status == 1  # 430,000 beyond Llama-3.1-70B's 131,072
    assert found["max_model_len within the model's context"] == ("430,000", "<= 131,072", False)
    assert found["tensor parallel size fits the heads"] == ("4", "64 attention heads, 8 KV heads", True)
    assert result["settings"]["kv_cache_dtype"] == "fp8"  # quoted in the namespace
    status, _, err = run(args.format(32768, 3), "--model", "llama-3.1-70b", tmp_path=tmp_path)
    assert status == 2 and "64 attention heads" in err and err.count("\n") == 0  # vLLM's own rule refuses tp 3


def test_vllm_argument_namespace_without_a_model_says_what_to_pass():
    status, _, err = run("h3-vllm-issue-16474-rocm-mi300x-maverick-args-wrapped.log")
    assert status == 2 and "--model" in err and err.count("\n") == 0


def test_llamacpp_iswa_log_cut_before_its_size_lines_shows_the_cells():
    status, result, err = run("h2-llamacpp-issue-14043-iswa-240k-cells.log")
    assert status == 2 and result["partial"] and "--model" in err
    assert rows(result)["non-SWA KV cache: cells"] == ("240,000", "-", None)


@pytest.mark.parametrize("text", [
    "server_args=ServerArgs(context_length=4096, tp_size=0)",
    "[2025 DP0 TP0] max_total_tokens=5 is larger than the profiled value 0. Use the profiled value instead.",
    "ERROR warmup{max_input_length=0 max_prefill_tokens=0}: Not enough memory to handle 0 prefill tokens",
    'msg=offload memory.required.kv="1.2.3 GiB" memory.required.partial="0 B" memory.required.allocations="[]"\n'
    'cmd="ollama runner --ctx-size 0 --parallel 0"',
    "llama_new_context_with_model: n_ctx = 0\nggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer "
    "of size 0\nllama_kv_cache_init: failed to allocate buffer for kv cache",
    "llama_new_context_with_model: KV self size  =    1.2.3 MiB, c^KV (f16):    0.00 MiB, kv^T: not used",
    "INFO x] Allocating a cross layer KV cache of shape (0, 0, 0, 0)",
    "INFO llm_engine.py:128] # GPU blocks: -99999999999999999999, # CPU blocks: 0",
])
@pytest.mark.parametrize("model", [None, "llama-3.1-8b", "deepseek-r1"])
def test_hostile_lines_of_these_formats_never_crash(text, model, tmp_path):
    status, _, err = run(text + "\n", *(["--model", model] if model else []), tmp_path=tmp_path)
    assert status in (0, 1, 2) and (status != 2 or err.count("\n") == 0), err


def test_ollama_offload_to_cuda_line_of_earlier_releases(tmp_path):
    """Ollama v0.3.0's llm/memory.go: msg="offload to cuda", the runner's --ctx-size in its command line."""
    text = ('time=2024-08-01T10:00:00.000Z level=INFO source=memory.go:309 msg="offload to cuda" '
            'layers.requested=-1 layers.model=33 layers.offload=33 layers.split="" memory.available="[23.5 GiB]" '
            'memory.required.full="5.8 GiB" memory.required.partial="5.8 GiB" memory.required.kv="256.0 MiB" '
            'memory.required.allocations="[5.8 GiB]" memory.weights.total="4.7 GiB"\n'
            'time=2024-08-01T10:00:00.001Z level=INFO source=server.go:384 msg="starting llama server" '
            'cmd="/tmp/ollama/runners/cuda_v11/ollama_llama_server --model /root/.ollama/models/blobs/sha256-x '
            '--ctx-size 2048 --batch-size 512 --embedding --n-gpu-layers 33 --parallel 1 --port 40000"\n')
    status, result, _ = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    # 2,048 x 32 layers x (128 + 128) x 8 KV heads x 2 bytes = 268,435,456 bytes: 256.0 MiB
    assert status == 0 and rows(result)["Ollama: memory.required.kv"] == ("256.0 MiB", "256.0 MiB", True)


def test_tgi_0_9_warmup_refusal_of_its_total_tokens():
    """TGI 0.9.0-0.9.3's refusal names the cache it allocated: max_batch_total_tokens (flash_causal_lm.py)."""
    status, result, _ = run("h3-tgi-issue-710-args-block-8-shards-16000.log", "--model", "llama-2-70b")
    assert status == 0
    assert rows(result)["warm-up refused: total tokens"] == ("16,000", "16,000", True)
