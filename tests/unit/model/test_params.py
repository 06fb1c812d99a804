"""Parameter counts and weight bytes from configs and checkpoints (kvbudget.model.params, kvbudget.model.weights)."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget import load_model
from kvbudget.model.params import count_parameters
from kvbudget.model.weights import analytic_weights, model_weights
from kvbudget.units import GIB

# Published totals (model cards / papers) the analytic count must reproduce within 2%.
PUBLISHED_TOTALS = {
    "llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9, "mixtral-8x7b": 46.7e9,
    "deepseek-v3": 671e9, "gpt-oss-20b": 20.9e9, "gpt-oss-120b": 116.8e9, "qwen3-next-80b-a3b": 80e9,
    "kimi-k2": 1.04e12, "qwen3-235b-a22b": 235e9, "deepseek-v2": 236e9, "deepseek-v2-lite": 15.7e9,
    "llama-4-scout": 109e9, "jamba-1.5-mini": 52e9, "mistral-7b": 7.24e9, "gemma-2-9b": 9.24e9,
    "gemma-2-27b": 27.2e9, "qwen2.5-72b": 72.7e9, "yi-34b": 34.4e9, "glm-4-9b-chat": 9.4e9, "opt-13b": 12.85e9,
}


# 2025-2026 families: the totals their model names and cards round to (text model; Qwen3.5's vision tower is not
# counted), a weaker check than the figures above.
PUBLISHED_TOTALS.update({"qwen3.5-27b": 27e9, "qwen3.5-35b-a3b": 35e9, "nemotron-h-8b": 8e9})
# Gemma 3 Technical Report, Table 1: 4B = 417M vision encoder + 675M embedding + 3,209M non-embedding parameters
PUBLISHED_TOTALS["gemma-3-4b"] = 4.301e9


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_analytic_parameter_count_matches_published_totals(name):
    total = count_parameters(load_model(name)).total
    assert abs(total / PUBLISHED_TOTALS[name] - 1) < 0.02, f"{name}: {total / 1e9:.2f}B"


def test_moe_active_parameters():
    # Mixtral: 12.9B active (2 of 8 experts); DeepSeek-V3: 37B; Qwen3-235B-A22B: 22B (model cards).
    for name, active in (("mixtral-8x7b", 12.9e9), ("deepseek-v3", 37e9), ("qwen3-235b-a22b", 22e9)):
        assert abs(count_parameters(load_model(name)).active / active - 1) < 0.02, name


def test_deepseek_v3_mtp_module_counted_apart():
    counts = count_parameters(load_model("deepseek-v3"))
    assert 10e9 < counts.mtp < 15e9  # the 14B of the 685B upload is MTP layer + shared embedding and head


def test_quantized_checkpoints():
    # gpt-oss-20b: MXFP4 experts make its checkpoint about 12.8 GiB; DeepSeek-V3 fp8 about 1 byte per param.
    assert abs(analytic_weights(load_model("gpt-oss-20b")).total_bytes / (12.8 * GIB) - 1) < 0.03
    ds = analytic_weights(load_model("deepseek-v3"))
    assert 1.0 < ds.total_bytes / ds.total_params < 1.01
    assert "fp8" in ds.basis and not ds.exact


def test_weights_per_gpu_under_parallelism():
    model = load_model("llama-3.1-70b")
    one = analytic_weights(model)
    tp8 = analytic_weights(model, tp=8)
    assert abs(tp8.per_gpu_bytes * 8 / one.total_bytes - 1) < 0.001  # only norms are replicated
    pp2 = analytic_weights(model, stages=kvbudget.get_engine("vllm").pipeline_stages(model.num_layers, 2))
    assert 0.45 < pp2.per_gpu_bytes / one.total_bytes < 0.55


def test_exact_weights_from_safetensors_headers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=96, vocab_size=256, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, torch_dtype="bfloat16")
    config = transformers.CONFIG_MAPPING["llama"](**{k: v for k, v in cfg.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    spec = load_model(tmp_path)
    w = model_weights(spec)
    assert w.exact and "safetensors" in w.basis
    assert w.total_bytes == 2 * sum(p.numel() for p in model.parameters())
    assert analytic_weights(spec).total_bytes == w.total_bytes  # the analytic count agrees exactly here


def test_hub_weights_offline_are_labelled_not_silent(tmp_path, monkeypatch):
    import json as _json

    base = tmp_path / "models--acme--tiny"
    rev = "0" * 40
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(rev)
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(_json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                                    "num_attention_heads": 4, "hidden_size": 64,
                                                    "intermediate_size": 128, "vocab_size": 100,
                                                    "torch_dtype": "bfloat16"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    from kvbudget import hub

    hub.offline_reason.cache_clear()  # found once per process; this test sets HF_HUB_OFFLINE
    try:
        w = model_weights(load_model("acme/tiny"))
    finally:
        hub.offline_reason.cache_clear()
    assert not w.exact and "was not read: HF_HUB_OFFLINE is set" in w.basis


def test_a_vision_tower_is_counted_with_the_model():
    """Gemma 3 4B's SigLIP tower: 417M parameters in the Gemma 3 Technical Report (Table 1); vLLM loads it beside
    the text model, on the first pipeline stage, and it is not read per generated token."""
    groups = [g for g in count_parameters(load_model("gemma-3-4b")).groups if g.part == "vision"]
    assert len(groups) == 1 and abs(groups[0].count / 417e6 - 1) < 0.02 and groups[0].active == 0


def test_weights_kvbudget_cannot_count_are_asked_for_by_the_flag(capsys, tmp_path):
    """A family whose parameters kvbudget does not count (Granite 4's hybrid; every catalog model is counted): the
    command line names the flag that gives them, the library its parameter (not "plan's weights", which neither
    front end can be given)."""
    from tiny_configs import TINY

    from kvbudget.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY["granitemoehybrid"]))
    assert main(["plan", str(path), "--gpu", "L4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvbudget: error: --weights: ") and "(--weights SIZE)" in err, err
    with pytest.raises(kvbudget.ConfigError) as refused:
        kvbudget.plan(load_model(path), gpu="L4")
    assert refused.value.param == "weights" and str(refused.value).endswith("per GPU to plan (weights)")
    assert kvbudget.plan(load_model(path), gpu="L4", weights=1 * GIB).kv_memory_bytes > 0


def test_deepseek_v32_indexer_weights_are_counted_on_every_rank():
    """DeepSeek-V3.2's lightning indexer, per layer (vLLM's deepseek_v2.py Indexer, replicated): wq_b 1,536 x 64
    heads x 128 + wk and weights_proj 7,168 x (128 + 64) + a LayerNorm of 128 (weight and bias) = 13,959,424
    parameters; V3.2 is V3 with it, so at TP 8 each GPU holds 61 of them more, whole (fp8: about a byte each)."""
    v3, v32 = load_model("deepseek-v3"), load_model("deepseek-v3.2")
    per_layer = 1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128
    assert count_parameters(v32).total - count_parameters(v3).total == 61 * per_layer == 61 * 13_959_424
    extra = analytic_weights(v32, tp=8).per_gpu_bytes - analytic_weights(v3, tp=8).per_gpu_bytes
    assert abs(extra / (61 * per_layer) - 1) < 0.001
