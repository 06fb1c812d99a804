"""`kvbudget plan`: weights, budgets, capacity, roofline, degradation levels, recommendations."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget import KVBudgetError, load_model
from kvbudget.cli import main
from kvbudget.gpus import find_gpu, gpus
from kvbudget.model.params import count_parameters
from kvbudget.planner import plan
from kvbudget.units import GIB
from kvbudget.model.weights import analytic_weights, model_weights

# Published totals (model cards / papers) the analytic count must reproduce within 2%.
PUBLISHED_TOTALS = {
    "llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9, "mixtral-8x7b": 46.7e9,
    "deepseek-v3": 671e9, "gpt-oss-20b": 20.9e9, "gpt-oss-120b": 116.8e9, "qwen3-next-80b-a3b": 80e9,
    "kimi-k2": 1.04e12, "qwen3-235b-a22b": 235e9, "deepseek-v2": 236e9, "deepseek-v2-lite": 15.7e9,
    "llama-4-scout": 109e9, "jamba-1.5-mini": 52e9, "mistral-7b": 7.24e9, "gemma-2-9b": 9.24e9,
    "gemma-2-27b": 27.2e9, "qwen2.5-72b": 72.7e9, "yi-34b": 34.4e9, "glm-4-9b-chat": 9.4e9, "opt-13b": 12.85e9,
}


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


def test_the_guides_24_gb_example():
    # 24 GiB - 4.2 GiB of weights - 2 GiB of overhead = 17.8 GiB; / 128 KiB per token = 145,817 tokens.
    p = plan(load_model("mistral-7b"), engine="hf", gpu_memory=24 * GIB, weights=int(4.2 * GIB), overhead=2 * GIB,
             activation=0, max_model_len=4096)
    assert p.capacity.physical_token_slots == 145_817


def test_plan_json_contract(capsys):
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--engine", "vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"parameters", "weights_bytes", "kv_memory_bytes", "capacity", "fits"}
    assert data["parameters"]["total"] == count_parameters(load_model("llama-3.1-8b")).total
    gpu = find_gpu("H100-80GB").memory_bytes
    stack = {t["name"]: t["bytes"] for t in data["stack"]}
    assert data["kv_memory_bytes"] == int(gpu * 0.92) - data["weights_bytes"] - stack["activation peak"] - stack["overhead"]
    assert data["capacity"]["num_blocks"] == data["kv_memory_bytes"] // (32 * 16 * 8 * 256 * 2)
    assert data["fits"] is True


def test_plan_table_explains_itself(capsys):
    assert main(["plan", "gemma-2-9b", "--gpu", "L4", "--engine", "vllm", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    for text in ("Memory of one GPU", "estimate", "Capacity", "Decode roofline", "Degradation plan",
                 "What to change"):
        assert text in out


def test_roofline_lower_bound():
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", concurrency=4)
    bandwidth = find_gpu("H100-80GB").bandwidth_bytes_per_s
    first = p.roofline[0]
    kv = p.estimate.allocation.kv_bytes(4, first.context)
    assert first.step_seconds == pytest.approx((p.weights.active_bytes + kv) / bandwidth)
    assert first.aggregate_tokens_per_second == pytest.approx(4 * first.tokens_per_second)
    speeds = [r.tokens_per_second for r in p.roofline]
    assert speeds == sorted(speeds, reverse=True)


def test_longest_context_for_a_concurrency():
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="L40S", concurrency=8)
    assert p.longest_context is not None
    # 8 requests of that length fit, 8 of one block more do not.
    per_block = 16 * 32 * 8 * 256 * 2
    blocks = p.capacity.num_blocks
    assert 8 * -(-p.longest_context // 16) <= blocks < 8 * (-(-p.longest_context // 16) + 1) + 8
    assert per_block > 0


def test_degradation_levels_and_guard_config(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    out = tmp_path / "guard.yaml"
    assert main(["plan", "qwen3-8b", "--gpu", "A100-80GB", "--guard-config", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = yaml.safe_load(out.read_text())
    assert [lv["threshold"] for lv in config["levels"]] == [0.7, 0.85, 0.95]
    assert [lv["action"] for lv in config["levels"]] == ["cap_max_tokens", "force_single_sample", "reject_503"]
    assert config["kv_budget_bytes"] == data["kv_memory_bytes"]
    assert config["levels"][2]["tokens"] == int(data["capacity"]["physical_token_slots"] * 0.95)


def test_recommendations_are_computed():
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", beams=4)
    changes = {r.change: r for r in p.recommendations}
    assert changes["--kv-dtype fp8"].gain == pytest.approx(2.0, rel=0.01)
    assert "no beam search (--beams 1)" in changes
    assert [r.gain for r in p.recommendations] == sorted((r.gain for r in p.recommendations), reverse=True)
    short = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="L4")
    assert not short.fits
    assert any(r.change.startswith("--max-model-len") for r in short.recommendations)


def test_gpu_catalog():
    catalog = gpus()
    assert len(catalog) >= 20 and all(g.source for g in catalog)
    assert {"A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-PCIe", "H100-80GB", "H100-NVL", "H200", "GH200",
            "B200", "MI300X", "MI325X", "RTX-3090", "RTX-4090", "RTX-5090"} <= {g.name for g in catalog}


@pytest.mark.parametrize("argv, expected", [
    (["plan", "llama-3.1-8b", "--gpu", "H1000"], "unknown GPU"),
    (["plan", "llama-3.1-8b"], "--gpu"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--tp", "4", "--gpus", "2"], "needs 4 GPUs"),
    (["plan", "llama-3.1-70b", "--gpu", "L4"], "leave no KV budget"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--utilization", "1.5"], "--utilization"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--utilization", "most"], "--utilization"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--tp", "3"], "tensor parallel size 3"),
    (["plan", "llama-3.1-8b", "--gpu-memory", "lots"], "--gpu-memory"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--guard-config", "/no/such/dir/g.yaml"], "does not exist"),
])
def test_plan_bad_input(argv, expected, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and expected in err, err


def test_every_catalog_model_plans_on_a_large_gpu():
    for entry in kvbudget.catalog.entries():
        model = load_model(entry.name)
        tp = 16 if count_parameters(model).total > 300e9 else 8 if count_parameters(model).total > 60e9 else 1
        try:
            p = plan(model, engine="vllm", gpu="B200", tp=tp, recommend=False)
        except KVBudgetError as exc:
            assert "tensor parallel" in str(exc) or "attention heads" in str(exc), (entry.name, exc)
            continue
        assert p.kv_memory_bytes > 0 and p.capacity.max_concurrency > 0, entry.name


@pytest.mark.parametrize("ext, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plot_writes_a_picture(tmp_path, ext, magic, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"plan{ext}"
    assert main(["plan", "gemma-2-9b", "--gpu", "L4", "--max-model-len", "8192", "--plot", str(out), "--json"]) == 0
    assert out.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left behind


def test_plot_bad_extension_writes_nothing(tmp_path, capsys):
    out = tmp_path / "plan.jpg"
    assert main(["plan", "gemma-2-9b", "--gpu", "L4", "--plot", str(out)]) == 2
    assert "png or .svg" in capsys.readouterr().err and not out.exists()


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
    w = model_weights(load_model("acme/tiny"))
    assert not w.exact and "could not be read" in w.basis
