"""Parameter counts of Gemma 3n, Gemma 4, Kimi Linear and DeepSeek-V4 (kvbudget.model.mixed): against the modules
transformers builds for the same configs (on the meta device: no memory, no weights), and against published
totals."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget import load_model
from kvbudget.model.params import activation_widths, count_parameters, routed_experts

torch = pytest.importorskip("torch", reason="test extra: pip install -e '.[test]'")
transformers = pytest.importorskip("transformers")


def built(cfg: dict, multimodal: bool = False) -> int:
    """sum(p.numel()) of the model transformers builds for `cfg` (its text model unless `multimodal`)."""
    return sum(p.numel() for p in build(cfg, multimodal).parameters())


def build(cfg: dict, multimodal: bool = False):
    """The model transformers builds for `cfg` on the meta device."""
    if multimodal:
        config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "transformers_version"})
        with torch.device("meta"):
            model = getattr(transformers, config.architectures[0])(config)
    else:
        cfg = cfg.get("text_config", cfg)
        mt = cfg["model_type"]
        if mt not in transformers.CONFIG_MAPPING:
            pytest.skip(f"transformers {transformers.__version__} has no {mt}")
        config = transformers.CONFIG_MAPPING[mt](**{k: v for k, v in cfg.items() if k not in ("model_type",
                                                                                               "torch_dtype")})
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    return model


def catalog_config(name: str) -> dict:
    return json.loads(kvbudget.catalog.find(name).path.read_text())


@pytest.mark.parametrize("name", ["gemma-3n-e2b", "gemma-4-26b-a4b", "kimi-linear-48b-a3b", "deepseek-v4-flash"])
def test_catalog_configs_count_what_transformers_builds(name):
    """Weight for weight: the text model's parameters (MTP modules apart; transformers builds none for DeepSeek-V4)."""
    counts = count_parameters(load_model(name))
    text = sum(g.count for g in counts.groups if g.part not in ("mtp", "vision"))
    assert text == built(catalog_config(name))


def test_gemma4_vision_tower_counts_what_transformers_builds():
    """Gemma 4's own vision tower (learned position table, gated MLP, Q/K norms) and its projection."""
    assert count_parameters(load_model("gemma-4-26b-a4b")).total == built(catalog_config("gemma-4-26b-a4b"), True)


_GEMMA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=320,
              max_position_embeddings=512, sliding_window=8, torch_dtype="bfloat16")
# the layouts the catalog entries leave out: Gemma 4's per-layer embeddings, shared K/V with double-wide MLPs, a
# dense MLP only, biases; Gemma 3n's per-layer MLP widths; Kimi Linear with a low-rank query; DeepSeek-V4's two
# MTP-free layouts (plain sliding layers, CSA and HCA)
TINY = {
    "gemma4_ple_shared": dict(_GEMMA, model_type="gemma4_text", num_hidden_layers=8, global_head_dim=32,
                              intermediate_size=96, hidden_size_per_layer_input=8, vocab_size_per_layer_input=160,
                              num_kv_shared_layers=2, use_double_wide_mlp=True, attention_bias=True),
    "gemma4_moe_k_is_v": dict(_GEMMA, model_type="gemma4_text", num_hidden_layers=6, global_head_dim=32,
                              intermediate_size=96, hidden_size_per_layer_input=0, attention_k_eq_v=True,
                              num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
                              moe_intermediate_size=24),
    "gemma3n_widths": dict(_GEMMA, model_type="gemma3n_text", num_hidden_layers=10, num_kv_shared_layers=2,
                           intermediate_size=[96, 64] * 4 + [128, 32], hidden_size_per_layer_input=8,
                           vocab_size_per_layer_input=160, laurel_rank=4, altup_num_inputs=3),
    "kimi_q_lora": dict(model_type="kimi_linear", pad_token_id=0, hidden_size=64, num_hidden_layers=4, vocab_size=300,
                        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_experts=4, num_experts_per_token=2,
                        num_shared_experts=2, moe_intermediate_size=16, first_k_dense_replace=1,
                        intermediate_size=96, linear_attn_config={"full_attn_layers": [2], "kda_layers": [1, 3, 4],
                                                                  "head_dim": 8, "num_heads": 4,
                                                                  "short_conv_kernel_size": 4}),
}


def tiny(name: str) -> dict:
    from tiny_configs import TINY as SHARED  # DeepSeek-V4's configs of the cache tests (sliding, CSA and HCA layers)

    # transformers reads intermediate_size as DeepSeek-V4's moe_intermediate_size: the configs state only the latter
    return TINY.get(name) or {k: v for k, v in dict(SHARED[name], num_nextn_predict_layers=1).items()
                              if k != "intermediate_size"}


@pytest.mark.parametrize("name", [*sorted(TINY), "deepseek_v4", "deepseek_v4_ratios"])
def test_other_layouts_count_what_transformers_builds(name):
    cfg = tiny(name)
    counts = count_parameters(kvbudget.parse_config(cfg))
    assert counts.total == built(cfg)
    assert (counts.mtp > 0) == name.startswith("deepseek_v4")


# Published totals, each with its source (text model unless said; not computed by kvbudget):
PUBLISHED = {
    # DeepSeek-V4 release (2026-04-24; model cards of deepseek-ai/DeepSeek-V4-Flash and -Pro as reported by
    # featherless.ai/models/deepseek-ai/DeepSeek-V4-Flash and news.triggerhive.com, 2026-04-25): 284B total / 13B
    # activated; 1.6T / 49B
    "deepseek-v4-flash": (284e9, 13e9, 0.01, 0.1),
    "deepseek-v4-pro": (1.6e12, 49e9, 0.02, 0.02),
    # google/gemma-4-26B-A4B model card as vast.ai/model/gemma-4-26b-a4b-it and llmradar.eu quote it: 25.2B total /
    # 3.8B active, beside a ~550M vision encoder (counted apart below)
    "gemma-4-26b-a4b": (25.2e9, 3.8e9, 0.01, 0.01),
    # moonshotai/Kimi-Linear-48B-A3B model card: 48B total, 3B activated (the name's rounding: 49.1B here)
    "kimi-linear-48b-a3b": (48e9, 3e9, 0.03, 0.17),
    # maceip/gemma3n-executorch e2b/README_HF.md: text parameters of google/gemma-3n-E2B-it 4.46B (lmstudio.ai's
    # text-only GGUF of it: 4.5B; the whole model with its audio and vision towers is 5B: huggingface.co/blog/gemma3n)
    "gemma-3n-e2b": (4.46e9, None, 0.01, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals(name):
    total, active, within, active_within = PUBLISHED[name]
    counts = count_parameters(load_model(name))
    text = sum(g.count for g in counts.groups if g.part not in ("mtp", "vision"))
    assert abs(text / total - 1) < within, f"{text / 1e9:.2f}B"
    if active is not None:
        assert abs(counts.active / active - 1) < active_within, f"{counts.active / 1e9:.2f}B active"


def test_parts_that_matter_for_memory_and_time():
    """Gemma 3n's per-layer embeddings are an embedding (a lookup: on the first stage, not read whole per token);
    Gemma 4's dense MLP runs beside its experts as a shared expert; Kimi's KDA layers are mixers; DeepSeek-V4's MTP
    layer is apart (part "mtp": not in the total, loaded only for speculative decoding)."""
    gemma3n = count_parameters(load_model("gemma-3n-e2b"))
    assert sum(g.count for g in gemma3n.groups if g.part == "embedding") == 262_400 * 2048 + 262_144 * 30 * 256
    gemma4 = count_parameters(load_model("gemma-4-26b-a4b"))
    assert {g.part for g in gemma4.groups if g.layer == 0} == {"attention", "experts", "router", "shared_expert",
                                                               "norm"}
    kimi = count_parameters(load_model("kimi-linear-48b-a3b"))
    assert sorted({g.layer for g in kimi.groups if g.part == "mixer"}) == [i - 1 for i in (
        1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26)]
    v4 = count_parameters(load_model("deepseek-v4-flash"))
    # vLLM 0.32's DeepSeekV4MultiTokenPredictorLayer: a decoder layer (sliding window only: its compress ratio is 0,
    # as transformers' layer 0), e_proj and h_proj (h x h each), enorm, hnorm and the shared head's norm, and the
    # hyper-connection head (hc_mult x hc_mult x h, hc_mult, 1); the embedding and head it shares are not counted
    h, streams = 4096, 4
    layer = sum(p.numel() for p in build(catalog_config("deepseek-v4-flash")).model.layers[0].parameters())
    assert v4.mtp == layer + 2 * h * h + 3 * h + streams * streams * h + streams + 1


@pytest.mark.parametrize("name, experts, top_k, mlp", [
    ("gemma-4-26b-a4b", 128, 8, 8 * 704), ("kimi-linear-48b-a3b", 256, 8, 9216),
    ("deepseek-v4-flash", 256, 6, 6 * 2048), ("gemma-3n-e2b", None, None, 8192)])
def test_widths_for_step_time_and_workspace(name, experts, top_k, mlp):
    """The MoE layout the vLLM fused-MoE workspace and llama.cpp's graph read, and the MLP width activations take
    (the config's own numbers)."""
    model = load_model(name)
    moe = routed_experts(model)
    assert (moe.experts, moe.top_k) == (experts, top_k) if experts else moe is None
    assert activation_widths(model).mlp == mlp


def test_deepseek_v4_experts_take_fp4_bytes_where_the_config_says_so():
    """expert_dtype "fp4": DeepSeek's checkpoints store the routed experts as 4-bit floats with an 8-bit scale per
    32 (its inference/model.py; vLLM loads them as MXFP4). The native FP8 + FP4 conversion of DeepSeek-V4-Flash is
    ~146 GB (nsparks/DeepSeek-V4-Flash-FP4-FP8-GGUF, its non-expert weights in FP8); this copy of the config states
    no quantization_config, so the rest counts as bfloat16: a little more, never the 569 GB of bf16 experts."""
    from kvbudget.model.weights import analytic_weights

    model = load_model("deepseek-v4-flash")
    weights = analytic_weights(model)
    assert 146e9 < weights.total_bytes < 146e9 * 1.15 and "FP4 experts" in weights.basis
    bf16 = analytic_weights(kvbudget.parse_config({k: v for k, v in model.config.items() if k != "expert_dtype"}))
    assert bf16.total_bytes > 560e9


@pytest.mark.parametrize("mtp_ratio", [0, 4, 128])
def test_deepseek_v4_mtp_layer_is_a_decoder_layer_of_its_compress_ratio(mtp_ratio):
    """compress_ratios' entry after the model's layers is the MTP layer's: the same decoder layer transformers builds
    for that ratio, with the MTP module's projections, norms and hyper-connection head (vLLM 0.32's
    DeepSeekV4MultiTokenPredictorLayer)."""
    cfg = tiny("deepseek_v4_ratios")
    cfg["compress_ratios"] = [*cfg["compress_ratios"][:4], mtp_ratio]
    layers = cfg["num_hidden_layers"]
    longer = dict(cfg, num_hidden_layers=layers + 1, num_nextn_predict_layers=0,
                  compress_ratios=[*cfg["compress_ratios"], 0])
    layer = sum(p.numel() for p in build(longer).model.layers[layers].parameters())
    h, streams = cfg["hidden_size"], cfg["hc_mult"]
    mtp = count_parameters(kvbudget.parse_config(cfg)).mtp
    assert mtp == layer + 2 * h * h + 3 * h + streams * streams * h + streams + 1


def test_configs_these_counts_cannot_read_are_refused_in_one_line():
    """One intermediate_size per layer must name every layer; a list of any other length, a width beyond the limit,
    or a Gemma 4 vision tower without its position table size is a one-line error naming the config."""
    cfg = TINY["gemma3n_widths"]
    for widths, says in (([96] * 9, "lists 9 widths for 10 layers"), ([96] * 9 + [1 << 21], "0 to 1,048,576")):
        with pytest.raises(kvbudget.ConfigError) as refused:
            count_parameters(kvbudget.parse_config(dict(cfg, intermediate_size=widths)))
        assert refused.value.param == "model" and says in str(refused.value) and "\n" not in str(refused.value)
    gemma4 = catalog_config("gemma-4-26b-a4b")
    gemma4["vision_config"].pop("position_embedding_size")
    with pytest.raises(kvbudget.ConfigError, match="'position_embedding_size' is None"):
        count_parameters(kvbudget.parse_config(gemma4))
