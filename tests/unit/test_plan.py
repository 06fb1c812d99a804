"""`kvbudget plan`: budgets, serving defaults, capacity, roofline, degradation levels, recommendations, plots."""

from __future__ import annotations

import json
import math

import pytest

import kvbudget
from kvbudget import KVBudgetError, estimate, load_model
from kvbudget.cli import main
from kvbudget.engines import EngineOptions
from kvbudget.errors import ConfigError
from kvbudget.gpus import find_gpu, gpus
from kvbudget.model.params import count_parameters
from kvbudget.planner import plan
from kvbudget.units import GIB


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
    assert [t["key"] for t in data["stack"]] == ["gpu", "share", "weights", "activation", "overhead", "kv"]
    others = data["weights_bytes"] + stack["activation peak"] + stack["overhead"]
    assert data["kv_memory_bytes"] == math.ceil(gpu * 0.92) - others  # vLLM's request_memory rounds up
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
    model = load_model("llama-3.1-8b")
    p = plan(model, engine="vllm", gpu="L40S", concurrency=8)
    n = p.longest_context
    assert n is not None and n < model.max_position_embeddings

    def concurrency(length: int) -> float:
        cap = kvbudget.estimate(model, engine="vllm", kv_memory=p.kv_memory_bytes, max_model_len=length,
                                options=p.options).capacity
        return cap.max_concurrency

    assert concurrency(n) >= 8 > concurrency(n + 1)  # 8 requests of n tokens fit, 8 of n + 1 do not
    # the same in blocks of 16 tokens: 8 x cdiv(n, 16) fit in the pool, 8 x cdiv(n + 1, 16) do not
    assert 8 * -(-n // 16) <= p.capacity.num_blocks < 8 * -(-(n + 1) // 16)


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


def test_guard_config_also_prints_vllms_own_queue_flags_from_the_reject_level(tmp_path, capsys):
    """vLLM sheds load itself with --max-num-queued-reqs / --max-num-queued-tokens (0.29 on, 503 past them):
    `plan --guard-config` says them with the numbers of the guard's reject level written in the same file: the
    requests that run at once (--max-num-seqs) plus the whole requests the reject level holds, and its tokens."""
    yaml = pytest.importorskip("yaml")
    out = tmp_path / "guard.yaml"
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--max-num-seqs", "128",
                 "--guard-config", str(out)]) == 0
    reject = yaml.safe_load(out.read_text())["levels"][2]
    flags = f"--max-num-queued-reqs {128 + reject['requests']} --max-num-queued-tokens {reject['tokens']}"
    assert f"own limits at the same reject level (503 past them; in the file too):\n  {flags}\n" in \
        capsys.readouterr().err
    assert out.read_text().splitlines()[-1] == f"# vllm's own admission from the reject level: {flags}"
    # a release without them says so, and writes no flag
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--engine", "vllm@0.28",
                 "--guard-config", str(out), "--force"]) == 0
    err = capsys.readouterr().err
    assert "vLLM 0.28 has no --max-num-queued-reqs (from 0.29)" in err and "own limits" not in err
    # two data-parallel replicas: one vLLM server over both counts its unfinished requests over both
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--gpus", "2",
                 "--guard-config", str(out), "--force"]) == 0
    assert "one server of 2 data-parallel replicas counts over all of them (x2)" in capsys.readouterr().err


def test_recommendations_are_computed():
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", beams=4)
    changes = {tuple(r.parameters.items()): r for r in p.recommendations}
    assert changes[(("kv_dtype", "fp8"),)].gain == pytest.approx(2.0, rel=0.01)
    assert changes[(("beams", 1),)].gain == 4.0
    order = [next(iter(r.parameters)) for r in p.recommendations]  # cheapest first: settings, then hardware
    assert order.index("kv_dtype") < order.index("gpu") < order.index("tp") and order.index("beams") < order.index("tp")
    assert [r.more_gpus for r in p.recommendations if "tp" in r.parameters] == [1, 3]
    short = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="L4")
    assert not short.fits
    longest = next(r for r in short.recommendations if "max_model_len" in r.parameters)
    assert longest.parameters["max_model_len"] == short.capacity.estimated_max_model_len


def test_gpu_catalog():
    catalog = gpus()
    assert len(catalog) >= 20 and all(g.source for g in catalog)
    assert {"A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-PCIe", "H100-80GB", "H100-NVL", "H200", "GH200",
            "B200", "MI300X", "MI325X", "RTX-3090", "RTX-4090", "RTX-5090"} <= {g.name for g in catalog}


@pytest.mark.parametrize("argv, expected", [
    (["plan", "llama-3.1-8b", "--gpu", "H1000"], "unknown GPU"),
    (["plan", "llama-3.1-8b"], "--gpu"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--tp", "4", "--gpus", "2"], "needs 4 GPUs"),
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
        try:
            total, weights = count_parameters(model).total, None
        except ConfigError:  # families kvbudget cannot count yet: the plan takes their weights as given
            total, weights = 0, 10 * GIB
        tp = 16 if total > 300e9 else 8 if total > 60e9 else 1
        try:
            p = plan(model, engine="vllm", gpu="B200", tp=tp, recommend=False, weights=weights)
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


@pytest.mark.parametrize("gpu, tokens, seqs", [("L4", 2048, 256), ("A100-80GB", 2048, 256),
                                                ("H100-80GB", 8192, 1024), ("H200", 8192, 1024),
                                                ("B200", 16384, 1024)])
def test_vllm_batch_defaults_follow_the_gpu(gpu, tokens, seqs):
    """vLLM's OpenAI server picks max_num_batched_tokens and max_num_seqs by the GPU's memory (>= 70 GiB and not an
    A100: 8192 and 1024; >= 160 GiB: 16384); the plan uses them for the activation peak and the window reservation."""
    model = load_model("mistral-7b")  # every layer a 4,096-token window: the reservation depends on the batch
    p = plan(model, engine="vllm", gpu=gpu, max_model_len=32768)
    assert p.options.max_num_batched_tokens == tokens
    assert str(tokens) in next(t.note for t in p.stack if t.key == "activation")
    given = kvbudget.estimate(model, engine="vllm", kv_memory=p.kv_memory_bytes, max_model_len=32768,
                              options=EngineOptions(max_num_batched_tokens=tokens)).capacity
    assert p.capacity == given
    # an explicit setting wins over the GPU's default
    chosen = plan(model, engine="vllm", gpu=gpu, max_model_len=32768,
                  options=EngineOptions(max_num_batched_tokens=4096))
    assert chosen.options.max_num_batched_tokens == 4096


def test_h100_window_reservation_is_not_overstated():
    # With 2048 batched tokens (the old default everywhere) mistral-7b on an H100 looked about twice as roomy:
    # each request reserves cdiv(4095 + mnbt, 16) + 1 blocks per layer, 385 with 2048 and 769 with 8192.
    p = plan(load_model("mistral-7b"), engine="vllm", gpu="H100-80GB", max_model_len=32768)
    assert p.capacity.max_concurrency == pytest.approx(p.capacity.num_blocks / (-(-(4095 + 8192) // 16) + 1))
    old = kvbudget.estimate(load_model("mistral-7b"), engine="vllm", kv_memory=p.kv_memory_bytes,
                            max_model_len=32768).capacity
    assert old.max_concurrency / p.capacity.max_concurrency == pytest.approx(769 / 385, rel=1e-3)


def test_plan_with_a_given_kv_budget_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"  # the stack is only the GPU and the given budget: the picture still draws
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--kv-memory", "8GiB", "--plot", str(out), "--json"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_guard_yaml_levels_read_by_name_or_action():
    from kvbudget.guard.config import parse

    by_action = parse({"levels": [{"action": "cap_max_tokens", "threshold": 0.5},
                                  {"action": "force_single_sample", "threshold": 0.6},
                                  {"action": "reject_503", "threshold": 0.7}]}).policy
    assert by_action.thresholds == (0.5, 0.6, 0.7)
    with pytest.raises(kvbudget.UpstreamConfigError, match="belongs to 'reject'"):
        parse({"levels": [{"name": "warn", "action": "reject_503", "threshold": 0.5}]})
    with pytest.raises(kvbudget.UpstreamConfigError, match="names no known level"):
        parse({"levels": [{"name": "panic", "threshold": 0.5}]})


def test_plan_yaml_round_trips_through_the_guard_policy(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    from kvbudget.guard.config import parse
    from kvbudget.levels import LEVELS

    out = tmp_path / "guard.yaml"
    assert main(["plan", "qwen3-8b", "--gpu", "A100-80GB", "--guard-config", str(out), "--json"]) == 0
    policy = parse(yaml.safe_load(out.read_text())).policy
    assert policy.thresholds == tuple(level.threshold for level in LEVELS)


def test_no_kv_budget_is_an_answer_with_the_change_that_makes_room(capsys):
    """Llama-3.1-70B's 131 GiB of bf16 weights on one L4 (issue 15): not bad input but a plan that does not fit,
    printed in full (JSON too, fits false, exit 0), with the smallest tensor parallel size that leaves a KV budget."""
    assert main(["plan", "llama-3.1-70b", "--gpu", "L4", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["fits"] is False and answer["kv_memory_bytes"] < 0
    tps = [r["parameters"]["tp"] for r in answer["recommendations"] if "tp" in r["parameters"]]
    # 131.42 GiB / 8 = 16.46 GiB a rank, and 0.92 x torch's 22.05 GiB less 0.49 GiB of activation and 3.35 of
    # non-torch memory and graphs leaves -9.51 MiB: 16 ranks (two nodes) are the smallest that leave a budget
    assert tps == [16]
    assert "V100-32GB" not in {r["parameters"].get("gpu") for r in answer["recommendations"]}
    assert main(["plan", "llama-3.1-70b", "--gpu", "L4"]) == 0
    assert "does not fit" in capsys.readouterr().out


def test_a_larger_gpu_is_never_a_consumer_card_for_a_datacenter_one(capsys):
    """Llama-3.1-8B at 131,072 tokens under transformers on an L4: the larger card offered is the datacenter L40S
    (48 GB), not the RTX-5090 whose 32 GB come first by size (GeForce cards are not for datacenter deployment);
    from an RTX 4090 a datacenter card is still a step up."""
    from kvbudget.gpus import find_gpu
    from kvbudget.planner import _larger_gpus

    assert main(["plan", "llama-3.1-8b", "--engine", "hf", "--gpu", "L4", "--json"]) == 0
    offered = [r["parameters"]["gpu"] for r in json.loads(capsys.readouterr().out)["recommendations"]
               if "gpu" in r["parameters"]]
    assert offered == ["L40S"]
    assert all(g.segment != "consumer" for g in _larger_gpus(find_gpu("L4")))
    assert _larger_gpus(find_gpu("RTX-4090"))[0].name == "L40S"


def test_the_change_that_makes_vllm_start_comes_first(capsys):
    """qwen3-8b on an RTX 4090 (issue 15): vLLM refuses 40,960 tokens on its budget; the longest max_model_len
    that budget starts with costs no hardware, so it is first; a model of another class (MoE, hybrid with a
    different active size) is not offered as 'similar'."""
    assert main(["plan", "qwen3-8b", "--gpu", "RTX-4090", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    recs = answer["recommendations"]
    longest = estimate(load_model("qwen3-8b"), kv_memory=answer["kv_memory_bytes"], max_model_len=40960,
                       options=EngineOptions(max_num_batched_tokens=2048)).capacity.estimated_max_model_len
    assert not answer["fits"] and longest is not None and 30000 < longest < 40960
    assert recs[0]["parameters"] == {"max_model_len": longest} and recs[0]["makes_it_fit"]
    assert all("similar" not in r["note"] or "dense" in r["note"] for r in recs)


def test_similar_models_share_the_class_and_the_active_size(capsys):
    """A dense 70B is no peer of Jamba-1.5-Mini (12B active of 52B) or any MoE."""
    assert main(["plan", "llama-3.1-70b", "--gpu", "H100-80GB", "--tp", "2", "--json"]) == 0
    recs = json.loads(capsys.readouterr().out)["recommendations"]
    assert not [r for r in recs if r["parameters"].get("model") in ("jamba-1.5-mini", "qwen3-30b-a3b", "mixtral-8x7b")]


def test_tensor_parallel_past_one_node_is_labelled():
    from kvbudget.planner import _gpus_note

    assert _gpus_note(8, 1) == "8 GPUs"
    assert _gpus_note(16, 1).startswith("16 GPUs on 2 nodes of 8: tensor parallel across nodes")
    assert _gpus_note(32, 1, 72) == "32 GPUs"  # a GB200 NVL72 rack is one NVLink domain


def test_gpus_are_replicas_of_the_tp_pp_group(capsys):
    """--gpus 8 at tp 2 is four data-parallel replicas, each with its own KV cache (issue 15: --gpus did nothing)."""
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--tp", "2", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--tp", "2", "--gpus", "8", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert (one["replicas"], four["replicas"], four["gpus"]) == (1, 4, 8)
    assert four["total_max_concurrency"] == 4 * one["capacity"]["max_concurrency"]
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--tp", "2", "--gpus", "7"]) == 2
    assert "not a whole number of replicas" in capsys.readouterr().err


def test_roofline_adds_the_tensor_parallel_all_reduces(capsys):
    """DeepSeek-V3 on 8 H200s (issue 15: 1,004 tokens/s ignored the all-reduces): two per layer of one bf16 hidden
    vector (7168) per sequence, a ring over NVLink (0.8 of half its 900 GB/s both-ways figure, nccl-tests' share),
    plus vLLM's custom kernel's 4.9 us each (data/interconnects.json)."""
    assert main(["plan", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--json"]) == 0
    roof = json.loads(capsys.readouterr().out)["roofline"]
    one = 2 * 7 / 8 * 7168 * 2 / (0.8 * 450e9) + 4.9e-6
    assert roof[0]["all_reduce_seconds"] == pytest.approx(2 * 61 * one)
    assert roof[0]["step_seconds"] == pytest.approx(roof[0]["memory_seconds"] + roof[0]["all_reduce_seconds"])
    assert main(["plan", "llama-3.1-8b", "--gpu", "H200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["roofline"][0]["all_reduce_seconds"] == 0


def test_data_parallel_attention_with_expert_parallelism(capsys):
    """DeepSeek-V3 on 8 H200s: under tp 8 every rank holds the same MLA latent (one GPU's worth of KV for the
    whole group); as 8 data-parallel attention ranks sharing the experts, each rank keeps its own cache, at the
    price of every rank holding the non-expert weights whole (issue 15: no DP-attention or EP options)."""
    assert main(["plan", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--json"]) == 0
    tp8 = json.loads(capsys.readouterr().out)
    assert main(["plan", "deepseek-v3", "--gpu", "H200", "--gpus", "8", "--expert-parallel", "--json"]) == 0
    dp8 = json.loads(capsys.readouterr().out)
    assert dp8["replicas"] == 8 and dp8["total_max_concurrency"] == 8 * dp8["capacity"]["max_concurrency"]
    assert tp8["weights_bytes"] < dp8["weights_bytes"] < tp8["weights"]["total_bytes"] / 4
    assert dp8["total_max_concurrency"] > 4 * tp8["total_max_concurrency"]
    first = tp8["recommendations"][0]
    assert first["parameters"] == {"tp": 1, "gpus": 8, "expert_parallel": True}
    assert first["gain"] == pytest.approx(dp8["total_max_concurrency"] / tp8["total_max_concurrency"])
    assert main(["plan", "llama-3.1-70b", "--gpu", "H100-80GB", "--gpus", "4", "--expert-parallel"]) == 2
    assert "no routed experts" in capsys.readouterr().err
    assert main(["plan", "qwen3-30b-a3b", "--engine", "llamacpp", "--gpu", "L4", "--gpus", "2",
                 "--expert-parallel"]) == 2
    assert "no expert parallelism" in capsys.readouterr().err


def test_compare_takes_the_plans_budget_with_the_same_flags(capsys):
    """compare's KV budget for a model is plan's for the same GPU, length, share and vLLM knobs (one stack)."""
    import json

    from kvbudget.cli import main

    flags = ["--gpu", "H100-80GB", "--utilization", "0.8", "--max-num-seqs", "16", "--enforce-eager",
             "--entry-point", "llm", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "32"]
    assert main(["compare", "llama-3.1-8b", "qwen3-8b", "--context", "8192", *flags, "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    for name in ("llama-3.1-8b", "qwen3-8b"):
        assert main(["plan", name, "--max-model-len", "8192", *flags, "--json"]) == 0
        assert rows[name]["kv_memory_bytes"] == json.loads(capsys.readouterr().out)["kv_memory_bytes"]
    assert main(["compare", "llama-3.1-8b", "qwen3-8b", "--gpu", "H100-80GB", "--json"]) == 0
    default = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert default["llama-3.1-8b"]["kv_memory_bytes"] != rows["llama-3.1-8b"]["kv_memory_bytes"]


@pytest.mark.parametrize("argv, message", [
    (["--max-num-seqs", "100000000"], "--max-num-seqs 100000000: vLLM refuses more sequences than"),
    (["--enable-lora", "--max-lora-rank", "100000"], "--max-lora-rank 100000: vLLM takes 1, 8, 16"),
])
def test_compare_refuses_settings_every_row_shares_in_one_line_before_the_rows(capsys, argv, message):
    """A setting the engine refuses whatever the model is an error of the command, not a note on each row."""
    assert main(["compare", "llama-3.1-8b", "mistral-7b", "--gpu", "H100-80GB", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("kvbudget: error: ") and message in err, err


def test_compare_keeps_a_rows_own_answer_as_its_note():
    """Whether a model fits, and whether kvbudget can count its weights, are each row's own."""
    from tiny_configs import TINY

    granite = kvbudget.parse_config(TINY["granitemoehybrid"])  # a family whose parameters kvbudget does not count
    rows = kvbudget.compare([load_model("deepseek-v3"), granite, load_model("mistral-7b")], gpu="H100-80GB")
    assert [r.budget.value for r in rows] == ["does not fit", "weights unknown", "fits"]
    assert "leave no KV budget" in rows[0].note and "does not count granitemoehybrid parameters" in rows[1].note
    assert rows[2].note == "" and rows[2].kv_memory_bytes > 0
    with pytest.raises(KVBudgetError) as refused:
        kvbudget.compare([load_model("deepseek-v3"), load_model("mistral-7b")], gpu="H100-80GB",
                         options=EngineOptions(max_num_seqs=100_000_000))
    assert refused.value.param == "max_num_seqs"
