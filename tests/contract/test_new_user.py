"""What a new user met (issue 50, item 6): compare's figures and names whole at any width, multi-GPU plans said per
replica and for the deployment, notes only about what was asked, weights that are not known said so."""

from __future__ import annotations

import json
import re

import pytest

from kvbudget.cli import main

# a figure as the tables print it: 131,072 / 139.66x / 12.00 GiB / 0 B
FIGURE = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?: (?:B|KiB|MiB|GiB|TiB)\b|x)?")
LONG_NAMES = ["qwen3-coder-480b-a35b", "kimi-linear-48b-a3b", "qwen3-30b-a3b", "llama-3.1-8b", "mistral-7b",
              "deepseek-v3"]


def output(monkeypatch, capsys, columns: int, argv: list[str]) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("columns", [80, 60])
@pytest.mark.parametrize("gpu", [[], ["--gpu", "H200"]])
def test_compare_keeps_every_name_and_figure_whole_on_one_line(monkeypatch, capsys, columns, gpu):
    argv = ["compare", *LONG_NAMES, "--context", "128k", *gpu]
    wide = output(monkeypatch, capsys, 400, argv)
    table = [line for line in wide.splitlines() if line.strip("│ ").split(" ")[0] in LONG_NAMES]
    assert len(table) == len(LONG_NAMES)  # one line per model where there is room
    figures = {f for line in table for f in FIGURE.findall(line)}
    assert {"128.00 KiB", "16.00 GiB"} <= figures
    narrow = output(monkeypatch, capsys, columns, argv)
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= columns
    for name in LONG_NAMES:
        assert any(re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", line) for line in lines), name
    found = {f for line in lines for f in FIGURE.findall(line)}
    assert figures <= found, figures - found


def test_compare_says_the_weights_are_unknown_not_that_the_model_does_not_fit(monkeypatch, capsys, tmp_path):
    """A Granite 4 hybrid's parameters are not counted (plan asks for --weights; every catalog model is counted);
    deepseek-v3's 671B do not fit one H200; mistral-7b fits."""
    from tiny_configs import TINY

    granite = tmp_path / "granite" / "config.json"
    granite.parent.mkdir()
    granite.write_text(json.dumps(dict(TINY["granitemoehybrid"], hidden_size=4096, num_attention_heads=32,
                                       num_key_value_heads=8, max_position_embeddings=4096)))
    argv = ["compare", str(granite), "deepseek-v3", "mistral-7b", "--gpu", "H200"]
    assert main([*argv, "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    unknown = next(r for name, r in rows.items() if name not in ("deepseek-v3", "mistral-7b"))
    assert unknown["kv_memory_bytes"] is None and unknown["budget"] == "weights unknown"
    assert rows["deepseek-v3"]["kv_memory_bytes"] is None and rows["deepseek-v3"]["budget"] == "does not fit"
    assert rows["mistral-7b"]["kv_memory_bytes"] > 0 and rows["mistral-7b"]["budget"] == "fits"
    table = output(monkeypatch, capsys, 200, argv)
    line = next(line for line in table.splitlines() if "weights unknown" in line)
    assert "KiB" in line and "does not fit" not in line
    assert main(["compare", str(granite), "mistral-7b", "--json"]) == 0
    assert {r["budget"] for r in json.loads(capsys.readouterr().out)} == {"no gpu"}


@pytest.mark.parametrize("argv, beyond", [
    (["plan", "llama-2-7b", "--gpu", "H100-80GB"], []),  # trained for 4,096 and asked nothing longer
    (["plan", "phi-3-mini", "--gpu", "L4"], []),
    (["plan", "llama-2-7b", "--gpu", "H100-80GB", "--max-model-len", "8192"], ["max model length 8,192"]),
    (["estimate", "llama-2-7b"], []),
    (["estimate", "llama-2-7b", "--context", "2k,8k"], ["context 8,192"]),
    (["estimate", "llama-2-7b", "--kv-memory", "10GiB", "--max-model-len", "6k"], ["max model length 6,144"]),
])
def test_a_length_beyond_the_model_is_noted_only_where_it_was_asked(capsys, argv, beyond):
    """llama-2-7b's config says max_position_embeddings 4,096; phi-3-mini's 4,096 too."""
    assert main([*argv, "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if "is beyond the model's" in n]
    assert [n.split(" is beyond")[0] for n in notes] == beyond
    assert all(n.endswith("max_position_embeddings (4,096)") for n in notes)


def plan_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_multi_gpu_plan_says_per_replica_and_for_the_deployment(monkeypatch, capsys):
    """Two H100s as data-parallel attention ranks of qwen3-30b-a3b sharing its experts: the capacity line is one
    rank's, and the deployment's line holds both ranks' requests, slots and KV budget."""
    argv = ["qwen3-30b-a3b", "--gpu", "H100-80GB", "--gpus", "2", "--expert-parallel"]
    doc = plan_json(capsys, argv)
    each = doc["capacity"]
    assert doc["replicas"] == 2 and doc["gpus"] == 2
    assert doc["deployment"] == {"gpus": 2, "replicas": 2, "kv_memory_bytes": 2 * doc["kv_memory_bytes"],
                                 "physical_token_slots": 2 * each["physical_token_slots"],
                                 "max_concurrency": pytest.approx(2 * each["max_concurrency"])}
    assert doc["total_max_concurrency"] == pytest.approx(2 * each["max_concurrency"])  # the key kept
    text = " ".join(output(monkeypatch, capsys, 200, ["plan", *argv]).split())
    assert "Capacity per replica (1 GPU) for requests of 40,960 tokens" in text
    assert f"maximum concurrency {each['max_concurrency']:.2f}x" in text
    assert f"Deployment of 2 GPUs (2 replicas, each with its own KV cache): maximum concurrency " \
           f"{2 * each['max_concurrency']:.2f}x" in text
    one = plan_json(capsys, ["deepseek-v3", "--gpu", "H200", "--tp", "8"])
    assert one["deployment"]["max_concurrency"] == one["capacity"]["max_concurrency"]
    argv = ["plan", "deepseek-v3", "--gpu", "H200", "--tp", "8"]
    assert "Deployment of" not in output(monkeypatch, capsys, 200, argv)


def test_more_tensor_parallelism_keeps_the_replicas_and_counts_the_gpus_it_adds(capsys):
    """With 2 replicas of 1 GPU, tensor parallel 2 is 2 replicas of 2: 4 GPUs, 2 more; its effect is what a plan of
    exactly that deployment gives."""
    argv = ["qwen3-30b-a3b", "--gpu", "H100-80GB", "--gpus", "2", "--expert-parallel"]
    recs = [r for r in plan_json(capsys, argv)["recommendations"] if "tp" in r["parameters"]]
    assert recs
    for rec in recs:
        tp = rec["parameters"]["tp"]
        assert rec["parameters"]["gpus"] == 2 * tp and rec["more_gpus"] == 2 * tp - 2
        assert rec["note"] == f"2 replicas of {tp} GPUs" and rec["cost"] == f"{2 * tp - 2} more GPUs"
        alone = plan_json(capsys, [*argv[:3], "--gpus", str(2 * tp), "--tp", str(tp), "--expert-parallel"])
        assert rec["effect"].startswith(f"{alone['deployment']['max_concurrency']:.2f}x requests")
    single = plan_json(capsys, ["llama-3.1-8b", "--gpu", "L4"])["recommendations"]
    assert {"parameters": {"tp": 2}, "more_gpus": 1} in [{k: r[k] for k in ("parameters", "more_gpus")}
                                                         for r in single]


def test_advice_that_makes_a_multi_replica_deployment_fit_says_per_replica_and_in_all(capsys):
    """DeepSeek-V3 on two H200s does not fit; the larger tensor parallel size offered keeps 2 replicas, and its
    effect gives one replica's requests and the deployment's, each what a plan of exactly that deployment gives."""
    argv = ["deepseek-v3", "--gpu", "H200", "--gpus", "2", "--expert-parallel"]
    recs = [r for r in plan_json(capsys, argv)["recommendations"] if r["parameters"].get("tp")]
    assert recs
    for rec in recs:
        tp, gpus = rec["parameters"]["tp"], rec["parameters"]["gpus"]
        alone = plan_json(capsys, [*argv[:3], "--gpus", str(gpus), "--tp", str(tp), "--expert-parallel"])
        each, total = alone["capacity"]["max_concurrency"], alone["deployment"]["max_concurrency"]
        assert f"{each:.2f}x requests of" in rec["effect"] and f"per replica, {total:.2f}x in all" in rec["effect"]


@pytest.mark.parametrize("log, stated", [
    ("vllm-0.19-llm-d-planner-mixtral-8x7b-tp2.log", {"tensor", "pipeline"}),  # tensor_parallel_size=2, pipeline 1
    ("vllm-0.4-issue-5248-deepseek-coder-6.7b-tp2.log", {"tensor"}),  # tp 2 stated, pp not
    ("vllm-issue-12330-llama-3-8b-a100-40gb.log", set()),  # neither stated
])
def test_check_log_suggests_no_parallel_size_the_log_states(capsys, log, stated):
    """Checked against the wrong model (qwen2.5-32b) so that the rows differ and causes are sought: a tensor or
    pipeline parallel size is offered as a cause only where the log does not state it."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "data" / "logs" / log
    assert main(["check-log", str(path), "--model", "qwen2.5-32b", "--json"]) == 1
    causes = json.loads(capsys.readouterr().out)["likely_causes"]
    offered = {kind for kind in ("tensor", "pipeline") for c in causes if c.startswith(f"{kind} parallel size")}
    assert not offered & stated, causes
    if not stated:
        assert "tensor" in offered, causes  # where the log is silent, a rank's budget stays a likely cause
