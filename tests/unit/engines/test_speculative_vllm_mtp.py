"""vLLM's MTP drafters (--speculative mtp) for every catalog model whose architecture has MTP layers, from vLLM
0.32's source: vllm/config/speculative.py (hf_config_override: which families draft with which MTP model),
model_executor/models/deepseek_mtp.py, glm4_moe_mtp.py, qwen3_next_mtp.py, qwen3_5_mtp.py (the modules each MTP
layer builds), v1/spec_decode/llm_base_proposer.py (an MTP drafter shares the target's embeddings and LM head).

Every expected figure is worked out here by hand from those modules' shapes and the catalog configs' values (written
out below), not from kvbudget's parameter counts."""

from __future__ import annotations

from math import ceil

import pytest

import kvbudget
from kvbudget.cli import main
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.vllm import speculative as drafters
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.model.params import count_parameters
from kvbudget.speculative import SpecMethod, Speculative

VLLM = get_engine("vllm")
BF16 = 2


def mtp(k: int = 1) -> EngineOptions:
    return EngineOptions(speculative=Speculative(method=SpecMethod.MTP, num_tokens=k))


def fp8_block(rows: int, cols: int) -> int:
    """An fp8 linear weight of DeepSeek's checkpoint as vLLM loads it: one byte a value and a float32 scale per
    128 x 128 block (weight_scale_inv)."""
    return rows * cols + ceil(rows / 128) * ceil(cols / 128) * 4


def deepseek_v3_mtp_bytes(tp: int) -> float:
    """DeepSeek-V3's one MTP layer (model.layers.61; hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64,
    nope 128, v 128, 256 routed experts of 2048, one shared, fp8 block-quantized linear weights, bf16 the rest):
    DeepSeekMultiTokenPredictorLayer = enorm, hnorm, eh_proj (nn.Linear 14336 -> 7168: unquantized, replicated),
    shared_head.norm, and a DeepseekV2DecoderLayer with MoE (61 >= first_k_dense_replace 3)."""
    h = 7168
    attention = (fp8_block(1536, h) + fp8_block(128 * 192, 1536) + fp8_block(576, h) + fp8_block(128 * 256, 512)
                 + fp8_block(h, 128 * 128)) / tp + (1536 + 512) * BF16  # q_a, q_b, kv_a, kv_b, o; two latent norms
    experts = 256 * 3 * fp8_block(2048, h) / tp  # gate, up, down per expert (fused MoE, split over the ranks)
    shared = 3 * fp8_block(2048, h) / tp
    gate = h * 256 * BF16 + 256 * 4  # GateLinear in bf16, e_score_correction_bias in float32 (noaux_tc)
    norms = 2 * h * BF16 + 3 * h * BF16  # input / post-attention norms; enorm, hnorm, shared_head.norm
    eh_proj = 2 * h * h * BF16
    return attention + experts + shared + gate + norms + eh_proj


def deepseek_v32_mtp_bytes(tp: int) -> float:
    """DeepSeek-V3.2's: V3's and the lightning indexer, on every rank (deepseek_v2.py Indexer): wq_b (q_lora 1536
    -> 64 heads x 128, a ReplicatedLinear in fp8), wk_weights_proj (7168 -> 128 + 64, disable_tp, unquantized: bf16)
    and k_norm (a LayerNorm of 128 in float32, weight and bias)."""
    return deepseek_v3_mtp_bytes(tp) + fp8_block(64 * 128, 1536) + 7168 * (128 + 64) * BF16 + 2 * 128 * 4


def glm_4_6_mtp_bytes(tp: int) -> float:
    """GLM-4.6's MTP layer (model.layers.92; hidden 5120, 96 heads and 8 KV heads of 128, qkv bias, qk norm, 160
    experts of 1536, one shared, bf16): Glm4MoeMultiTokenPredictorLayer = enorm, hnorm, eh_proj (nn.Linear,
    replicated), shared_head.norm, Glm4MoeDecoderLayer with MoE (92 >= first_k_dense_replace 3)."""
    h = 5120
    attention = (h * (96 + 16) * 128 + (96 + 16) * 128 + 96 * 128 * h) * BF16 / tp + 2 * 128 * BF16
    moe = (160 + 1) * 3 * h * 1536 * BF16 / tp
    gate = (h * 160 + 160) * 4  # glm4_moe.py: the gate and its e_score_correction_bias in float32
    norms = 5 * h * BF16
    return attention + moe + gate + norms + 2 * h * h * BF16


def qwen_mtp_bytes(tp: int, *, h: int, heads: int, kv_heads: int, mlp: int, replicated: int = 0) -> float:
    """Qwen3-Next / Qwen3.5's MTP (qwen3_next_mtp.py, qwen3_5_mtp.py): fc (ColumnParallelLinear 2h -> h, split),
    pre_fc_norm_hidden, pre_fc_norm_embedding and norm once, and one full-attention decoder layer: gated attention
    (the query projection twice as wide, for the gate), q/k norms of 256, head_dim 256; `mlp` its MLP or MoE
    parameters split over the ranks, `replicated` those on every rank (the MoE's routers), its two norms."""
    attention = h * (2 * heads + 2 * kv_heads) * 256 + heads * 256 * h
    return ((2 * h * h + attention + mlp) / tp + (3 * h + 2 * 256 + 2 * h) + replicated) * BF16


def qwen_moe(h: int, experts: int) -> dict[str, int]:
    """Experts of 512 (gate, up, down) and a shared expert of 512, split; the router (h x experts, a
    ReplicatedLinear) and the shared expert's gate (h -> 1) on every rank (qwen3_next.py)."""
    return {"mlp": experts * 3 * h * 512 + 3 * h * 512, "replicated": h * experts + h}


HAND = {  # model: (bytes on one rank at tp 1, bytes at tp 8, how close kvbudget's analytic count must come)
    "deepseek-v3": (deepseek_v3_mtp_bytes(1), deepseek_v3_mtp_bytes(8), 1e-4),
    "deepseek-r1": (deepseek_v3_mtp_bytes(1), deepseek_v3_mtp_bytes(8), 1e-4),
    "deepseek-v3.2": (deepseek_v32_mtp_bytes(1), deepseek_v32_mtp_bytes(8), 1e-3),
    "glm-4.6": (glm_4_6_mtp_bytes(1), glm_4_6_mtp_bytes(8), 2e-3),
    "qwen3-next-80b-a3b": (qwen_mtp_bytes(1, h=2048, heads=16, kv_heads=2, **qwen_moe(2048, 512)),
                           qwen_mtp_bytes(8, h=2048, heads=16, kv_heads=2, **qwen_moe(2048, 512)), 1e-4),
    "qwen3.5-27b": (qwen_mtp_bytes(1, h=5120, heads=24, kv_heads=4, mlp=3 * 5120 * 17408),
                    qwen_mtp_bytes(8, h=5120, heads=24, kv_heads=4, mlp=3 * 5120 * 17408), 1e-4),
    "qwen3.5-35b-a3b": (qwen_mtp_bytes(1, h=2048, heads=16, kv_heads=2, **qwen_moe(2048, 256)),
                        qwen_mtp_bytes(8, h=2048, heads=16, kv_heads=2, **qwen_moe(2048, 256)), 1e-4),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_mtp_drafter_weights_by_hand(name):
    """Exact at tp 1 for the Qwen models (bf16 throughout); within what kvbudget's per-model byte rates round:
    GLM's float32 gate (h x 160, on every rank) as bf16 (0.02% at tp 1, 0.15% at tp 8), DeepSeek's fp8 scales
    counted per value rather than per 128 x 128 block and its float32 correction bias as bf16 (under 0.01%), V3.2's
    indexer all at the fp8 rate though vLLM keeps its wk and weights_proj in bf16 (under 0.1%); at
    tp 8 Qwen's q/k norms and shared-expert gate (on every rank) counted as split (under 0.01%)."""
    model = load_model(name)
    for tp, expected in zip((1, 8), HAND[name][:2], strict=True):
        got = drafters.drafter_weights(model, Speculative(method=SpecMethod.MTP, num_tokens=1), tp)
        assert got is not None
        tolerance = HAND[name][2] if tp == 8 or not name.startswith("qwen") else 1e-9
        assert abs(got[0] / expected - 1) < tolerance, (tp, got[0], expected)


def test_qwen_mtp_weights_exact_at_tp_1():
    """bf16 throughout: the count is exact (3,300,942,848 B = 1,650,471,424 parameters x 2 for Qwen3-Next)."""
    got = drafters.drafter_weights(load_model("qwen3-next-80b-a3b"), Speculative(method=SpecMethod.MTP,
                                                                                num_tokens=2), 1)
    assert got is not None and got[0] == 1_650_471_424 * 2


def test_deepseek_v3_mtp_against_its_published_size():
    """The README: 685B on the Hub, 671B of the main model and 14B of the MTP module, each rounded to a billion:
    the MTP module as stored (its layer, its own copies of the 129,280 x 7,168 embeddings and head) lies in
    685 - 671 +- 1, so between 13B and 15B."""
    counts = count_parameters(load_model("deepseek-v3"))
    stored = counts.mtp + 2 * 129_280 * 7_168
    assert 13e9 <= stored <= 15e9


# KV per token of the drafter's layers: one MTP layer of the model's own attention, in the same pool
KV_PER_TOKEN = {  # model: (bytes at tp 1, at tp 8)
    "deepseek-v3": ((512 + 64) * BF16,) * 2,  # the latent and rope key, on every rank
    "deepseek-v3.2": ((512 + 64) * BF16 + 128 + 4,) * 2,  # and the indexer key: 128 fp8 values + a float32 scale
    "glm-4.6": (8 * 128 * 2 * BF16, 1 * 128 * 2 * BF16),
    "qwen3-next-80b-a3b": (2 * 256 * 2 * BF16, 1 * 256 * 2 * BF16),  # 2 KV heads: one per rank at tp 8 (copied)
    "qwen3.5-27b": (4 * 256 * 2 * BF16, 1 * 256 * 2 * BF16),
    "qwen3.5-35b-a3b": (2 * 256 * 2 * BF16, 1 * 256 * 2 * BF16),
}


@pytest.mark.parametrize("name", sorted(KV_PER_TOKEN))
def test_mtp_layers_kv_bytes_per_token(name):
    model = load_model(name)
    for tp, expected in zip((1, 8), KV_PER_TOKEN[name], strict=True):
        plain = kvbudget.estimate(model, engine="vllm", tp=tp, context=[4096]).bytes_per_token
        drafting = kvbudget.estimate(model, engine="vllm", tp=tp, context=[4096], options=mtp()).bytes_per_token
        assert drafting - plain == expected


def test_qwen3_next_has_the_mtp_layer_vllm_builds_though_its_config_names_none():
    """Qwen3-Next's published config.json has no MTP field; qwen3_next_mtp.py builds
    getattr(config, "num_nextn_predict_layers", 1) layers."""
    model = load_model("qwen3-next-80b-a3b")
    assert "num_nextn_predict_layers" not in model.config
    assert [(s.kind, s.layer) for s in model.draft_layers] == [("full_attention", 48)]


@pytest.mark.parametrize("name", ["kimi-k2", "minimax-m2", "llama-3.1-8b"])
def test_a_model_without_mtp_layers_vllm_drafts_with_is_refused_in_one_line(name, capsys):
    """Kimi-K2's config has num_nextn_predict_layers 0; MiniMax-M2's declares MTP modules (num_mtp_modules 3) but
    vLLM 0.32 has no MTP model for minimax_m2 (hf_config_override maps none)."""
    with pytest.raises(KVBudgetError, match="MTP layers") as caught:
        kvbudget.estimate(load_model(name), engine="vllm", options=mtp(2))
    assert caught.value.param == "speculative"
    assert main(["plan", name, "--gpu", "H200", "--tp", "8", "--speculative", "mtp",
                 "--num-speculative-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--speculative" in err


def test_num_speculative_tokens_alone_loads_the_mtp_layers_too():
    model = load_model("glm-4.6")
    legacy = VLLM.loaded_bytes(model, EngineOptions(num_speculative_tokens=1), 8)
    asked = VLLM.loaded_bytes(model, mtp(1), 8)
    plain = VLLM.loaded_bytes(model, EngineOptions(), 8)
    assert legacy == asked and legacy is not None and plain is not None
    assert abs((legacy[0] - plain[0]) / glm_4_6_mtp_bytes(8) - 1) < 2e-3  # the float32 gate, as above


def test_draft_tokens_must_be_a_multiple_of_several_mtp_layers():
    """speculative.py: num_speculative_tokens above n_predict must be divisible by it (the layers reused in turn)."""
    config = dict(load_model("deepseek-v3").config, num_nextn_predict_layers=2)
    model = load_model(config, name="deepseek-v3-2mtp")
    assert len(model.draft_layers) == 2
    for k in (1, 2, 4):
        kvbudget.estimate(model, engine="vllm", options=mtp(k))
    with pytest.raises(KVBudgetError, match="multiple of 2") as caught:
        kvbudget.estimate(model, engine="vllm", options=mtp(3))
    assert caught.value.param == "num_speculative_tokens"


def test_plan_advice_counts_the_mtp_weights():
    plan = kvbudget.plan(load_model("qwen3.5-27b"), gpu="H200", max_model_len=32768, options=mtp(2))
    advice = plan.drafter
    assert advice is not None
    assert advice.weights_bytes == qwen_mtp_bytes(1, h=5120, heads=24, kv_heads=4, mlp=3 * 5120 * 17408)
    assert advice.bytes_per_token == 4 * 256 * 2 * BF16


def test_simulate_drafts_with_deepseeks_mtp_layer(capsys):
    """Refused before (no MTP layers modelled for DeepSeek); its one group of MLA layers is what the simulator runs."""
    import json

    assert main(["simulate", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--max-model-len", "8192", "--rate", "2",
                 "--requests", "5", "--speculative", "mtp", "--num-speculative-tokens", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 5 and out["speculation"]
