"""Figures published by others, and the architecture traps the issue names, on the bundled configs."""

from __future__ import annotations

from functools import partial

import pytest

import kvbudget
from kvbudget import load_model
from kvbudget.units import MIB

estimate = partial(kvbudget.estimate, engine="hf")  # the published figures are transformers' caches


def bpt(name: str, **kw) -> int:
    return estimate(load_model(name), **kw).bytes_per_token


def test_opt_13b_fp16_is_the_pagedattention_papers_800_kb():
    # Kwon et al. 2023 (vLLM paper), section 3: "2 (key and value vectors) x 5120 (hidden state size)
    # x 40 (number of layers) x 2 (bytes per FP16)" = 819,200 bytes per token.
    assert bpt("opt-13b", kv_dtype="fp16") == 819_200


def test_deepseek_v2_mla_caches_576_elements_per_layer():
    # DeepSeek-V2 paper (arXiv 2405.04434): MLA caches (d_c + d_h^R) x l = (512 + 64) x 60 = 34,560 elements.
    result = estimate(load_model("deepseek-v2"), kv_dtype="fp16")
    assert result.bytes_per_token == 34_560 * 2
    assert result.allocation.kv_dtype.block_bytes == 2


def test_llama_3_1_8b_bf16():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
    assert bpt("llama-3.1-8b") == 131_072


def test_mistral_7b_at_4096_tokens_is_512_mib_without_the_window():
    result = estimate(load_model("mistral-7b"), context=[4096, 32768])
    at_4096, at_32k = result.points
    assert at_4096.uncapped_kv_bytes == 512 * MIB
    # The dynamic cache keeps window - 1 = 4095 tokens per layer once the window is reached.
    assert at_4096.kv_bytes == 4095 * 131_072
    assert at_32k.kv_bytes == at_4096.kv_bytes
    assert at_32k.uncapped_kv_bytes == 8 * 512 * MIB


@pytest.mark.parametrize("name, head_dim", [("qwen3-32b", 128), ("mistral-nemo-12b", 128)])
def test_explicit_head_dim_beats_hidden_over_heads(name, head_dim):
    spec = load_model(name)
    assert {s.k_dim for s in spec.layers} == {head_dim}


def test_falcon_7b_is_multi_query():
    spec = load_model("falcon-7b-instruct")
    assert {s.kv_heads for s in spec.layers} == {1}
    assert bpt("falcon-7b-instruct") == 2 * 32 * 1 * 64 * 2


def test_gemma_2_alternates_local_and_global():
    kinds = [s.kind for s in load_model("gemma-2-9b").layers]
    assert kinds[:4] == ["sliding_window", "full_attention"] * 2
    assert kinds.count("sliding_window") == 21


def test_gemma_3_has_five_local_layers_per_global():
    kinds = [s.kind for s in load_model("gemma-3-1b").layers]
    assert kinds[:6] == ["sliding_window"] * 5 + ["full_attention"]
    assert {s.window for s in load_model("gemma-3-1b").layers if s.kind == "sliding_window"} == {512}


def test_gpt_oss_alternates_128_token_window():
    spec = load_model("gpt-oss-20b")
    assert [s.kind for s in spec.layers][:2] == ["sliding_window", "full_attention"]
    windows = {s.window for s in spec.layers if s.kind == "sliding_window"}
    assert windows == {128}
    # At long context only the 12 full layers grow: 12 x 2 x 8 x 64 x 2 bytes per token.
    result = estimate(spec, context=[100_000, 100_001])
    assert result.points[1].kv_bytes - result.points[0].kv_bytes == 12 * 2 * 8 * 64 * 2


def test_llama_4_scout_chunked_local_with_global_every_fourth():
    spec = load_model("llama-4-scout")
    kinds = [s.kind for s in spec.layers]
    assert kinds[:4] == ["chunked_local"] * 3 + ["full_attention"]
    assert {s.chunk for s in spec.layers if s.kind == "chunked_local"} == {8192}


def test_deepseek_v3_mla_is_70272_bytes_per_token_in_bf16():
    # (512 + 64) x 61 layers x 2 bytes; transformers 4.x cached 128 x (192 + 128) x 61 x 2 instead.
    result = estimate(load_model("deepseek-v3"))
    assert result.bytes_per_token == 70_272
    spec = load_model("deepseek-v3").layers[0]
    expanded = 61 * spec.heads * (spec.expanded_k_dim + spec.v_dim) * 2
    assert round(expanded / result.bytes_per_token) == 71


def test_kimi_k2_is_mla_like_deepseek():
    assert bpt("kimi-k2") == 70_272


def test_qwen3_next_state_is_fixed_per_sequence():
    result = estimate(load_model("qwen3-next-80b-a3b"), context=[1024, 65536])
    # 12 full-attention layers grow: 2 KV heads x 256 x 2 (K, V) x 2 bytes.
    assert result.bytes_per_token == 12 * 2 * 256 * 2 * 2
    # 36 gated-delta-net layers: conv (2*16*128 + 32*128) x 4 in bf16 + state 32x128x128 in float32.
    conv = (2 * 16 * 128 + 32 * 128) * 4 * 2
    state = 32 * 128 * 128 * 4
    assert result.fixed_bytes_per_sequence == 36 * (conv + state)


def test_jamba_has_four_attention_layers_of_32():
    kinds = load_model("jamba-1.5-mini").kinds()
    assert kinds == {"recurrent_state": 28, "full_attention": 4}


def test_falcon_h1_layers_hold_attention_and_mamba():
    kinds = load_model("falcon-h1-7b").kinds()
    assert kinds == {"full_attention": 44, "recurrent_state": 44}


def test_glm4_reads_chatglm_field_names():
    spec = load_model("glm-4-9b-chat")
    assert spec.num_layers == 40 and spec.max_position_embeddings == 131072
    assert {(s.kv_heads, s.k_dim) for s in spec.layers} == {(2, 128)}


def test_every_catalog_model_estimates():
    for entry in kvbudget.catalog.entries():
        result = estimate(load_model(entry.name), batch=[1, 4])
        assert result.bytes_per_token > 0, entry.name
        assert all(p.kv_bytes > 0 for p in result.points)


def test_catalog_has_35_models_with_provenance():
    entries = kvbudget.catalog.entries()
    assert len(entries) >= 35
    for e in entries:
        assert e.path.is_file() and e.source and "/" in e.hf_id, e.name
