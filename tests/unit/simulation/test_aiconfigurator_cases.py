"""benchmarks/data/aiconfigurator/cases.json, aiconfigurator's choices for the side-by-side: well formed, each case
the command it came from, each choice within the case's GPUs and meeting its targets as aiconfigurator predicted
them, and every model and GPU one kvbudget knows (aiconfigurator itself is not needed)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from kvbudget import catalog
from kvbudget.gpus import find_gpu

DATA = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "aiconfigurator"
DOC = json.loads((DATA / "cases.json").read_text(encoding="utf-8"))
GPUS = {"h100_sxm": "H100-80GB", "h200_sxm": "H200"}
MODELS = {"meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
          "Qwen/Qwen3-32B": "qwen3-32b"}
CASES = {c["id"]: c for c in DOC["cases"]}


def test_the_file_names_its_source_licence_version_and_split():
    assert DOC["aiconfigurator_version"].startswith("aiconfigurator ")
    assert "Apache-2.0" in DOC["licence"] and DOC["split"].startswith("validate")
    assert (DATA / "README.md").exists()
    assert len(CASES) == len(DOC["cases"]) >= 6
    assert {c["model"] for c in DOC["cases"]} >= {"meta-llama/Meta-Llama-3.1-8B", "Qwen/Qwen3-32B"}
    assert {c["system"] for c in DOC["cases"]} == {"h100_sxm", "h200_sxm"}


@pytest.mark.parametrize("cid", sorted(CASES))
def test_each_case_is_the_command_it_came_from(cid):
    case = CASES[cid]
    words = shlex.split(case["command"])
    assert words[:3] == ["aiconfigurator", "cli", "default"]
    flag = dict(zip(words[3::2], words[4::2]))
    assert flag["--model-path"] == case["model"] and flag["--system"] == case["system"]
    assert flag["--backend"] == "vllm" and int(flag["--total-gpus"]) == case["total_gpus"]
    assert (int(flag["--isl"]), int(flag["--osl"])) == (case["isl"], case["osl"])
    assert (float(flag["--ttft"]), float(flag["--tpot"])) == (case["ttft_ms"], case["tpot_ms"])
    assert MODELS[case["model"]] in {e.name for e in catalog.entries()}
    assert find_gpu(GPUS[case["system"]]).name == GPUS[case["system"]]


@pytest.mark.parametrize("cid", sorted(CASES))
def test_each_choice_fits_the_gpus_and_meets_the_targets_it_predicts(cid):
    case = CASES[cid]
    agg, disagg = case["agg"], case["disagg"]
    assert agg or disagg
    for chosen in (c for c in (agg, disagg) if c):
        row = chosen["row"]
        assert (row["isl"], row["osl"]) == (case["isl"], case["osl"])
        assert 0 < row["ttft"] <= case["ttft_ms"] and 0 < row["tpot"] <= case["tpot_ms"]
        assert row["tokens/s/gpu"] > 0 and row["request_rate"] > 0
        # output tokens/s is the request rate times OSL, per GPU of the whole deployment
        assert row["tokens/s"] == pytest.approx(row["request_rate"] * case["osl"], rel=0.01)
        for engine in chosen["engines"]:
            assert engine["tp"] >= 1 and engine["pp"] >= 1 and engine["max_num_seqs"] >= 1
            assert engine["max_num_batched_tokens"] >= 1
            assert engine["aiconfigurator_kv"]["tokens"] > 0
    if agg:
        (engine,) = agg["engines"]
        assert engine["mode"] == "agg" and engine["tp"] * engine["pp"] == agg["row"]["num_total_gpus"]
        assert agg["row"]["bs"] <= engine["max_num_seqs"]
    if disagg:
        row = disagg["row"]
        pre, dec = disagg["engines"]
        assert (pre["mode"], dec["mode"]) == ("prefill", "decode")
        gpus = row["(p)workers"] * pre["tp"] * pre["pp"] + row["(d)workers"] * dec["tp"] * dec["pp"]
        assert gpus == row["num_total_gpus"] <= case["total_gpus"]
        assert row["(d)bs"] <= dec["max_num_seqs"]


def _script():
    """benchmarks/vs_aiconfigurator.py as a module (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vs_aiconfigurator", DATA.parents[1] / "vs_aiconfigurator.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cid", sorted(CASES))
def test_kvbudgets_own_choice_was_asked_the_case_at_aiconfigurators_rate(cid):
    case = CASES[cid]
    own = case["kvbudget"]
    asked = own["asked"]
    # aiconfigurator's answer is the mode of the higher tokens/s/GPU; its aggregated row is one replica of
    # num_total_gpus GPUs, so the 8 GPUs serve 8 / num_total_gpus times its rate; its disaggregated row is the 8
    mode = "agg" if (case["disagg"] is None or case["agg"]["row"]["tokens/s/gpu"] >=
                     case["disagg"]["row"]["tokens/s/gpu"]) else "disagg"
    row = case[mode]["row"]
    per = case["total_gpus"] / row["num_total_gpus"] if mode == "agg" else 1
    assert asked["aiconfigurator_mode"] == mode
    assert asked["rate"] == pytest.approx(row["request_rate"] * per, rel=1e-4)
    assert asked["slo_s"] == {"ttft_mean": case["ttft_ms"] / 1000, "tpot_mean": case["tpot_ms"] / 1000}
    assert asked["gpu"] == GPUS[case["system"]] and asked["max_gpus"] == case["total_gpus"]
    assert asked["max_model_len"] == case["isl"] + case["osl"] and asked["requests"] >= row["concurrency"]
    assert own["candidates"]["simulated"] >= 1 and own["kvbudget_version"]


@pytest.mark.parametrize("cid", sorted(CASES))
def test_kvbudgets_own_choice_fits_the_case_and_meets_its_targets_as_simulated(cid):
    case = CASES[cid]
    own = case["kvbudget"]
    c = own["candidate"]
    assert c is not None, own.get("binding")
    assert c["gpu"] == GPUS[case["system"]] and c["kv_dtype"] == "auto"
    shape = c["prefill_replicas"] + c["decode_replicas"] if c["disaggregated"] else c["replicas"]
    assert c["gpus"] == shape * c["tp"] * c["pp"] <= case["total_gpus"]
    assert own["values_s"]["ttft_mean"] <= case["ttft_ms"] / 1000
    assert own["values_s"]["tpot_mean"] <= case["tpot_ms"] / 1000


@pytest.mark.parametrize("cid", sorted(CASES))
def test_aiconfigurator_was_asked_about_kvbudgets_choice_as_it_is(cid):
    case = CASES[cid]
    own = case["kvbudget"]
    est = own["aiconfigurator_estimate"]
    c, ask = own["candidate"], est["asked"]
    assert (ask["model_path"], ask["system_name"], ask["isl"], ask["osl"]) == (case["model"], case["system"],
                                                                             case["isl"], case["osl"])
    assert ask["mode"] == ("disagg" if c["disaggregated"] else "agg") and ask["tp_size"] == c["tp"]
    if c["disaggregated"]:
        assert (ask["prefill_num_workers"], ask["decode_num_workers"]) == (c["prefill_replicas"],
                                                                            c["decode_replicas"])
    assert est["ttft_ms"] > 0 and est["tpot_ms"] > 0 and est["request_rate"] > 0


def test_the_batch_aiconfigurator_is_asked_is_the_choices_concurrency():
    script = _script()
    case = {"model": "m", "system": "h100_sxm", "vllm": "0.24.0", "isl": 1000, "osl": 100}
    values = {"e2e_p50": 4.0, "ttft_mean": 0.5}
    agg = {"candidate": {"tp": 2, "pp": 1, "replicas": 4, "disaggregated": False}, "values_s": values,
           "asked": {"rate": 10.0}}
    # 10 requests/s over 4 replicas, each request 4 s in flight: 10 in flight per replica
    assert script.estimate_ask(case, agg)["batch_size"] == 10
    split = {"candidate": {"tp": 1, "pp": 1, "prefill_replicas": 2, "decode_replicas": 5, "disaggregated": True},
             "values_s": values, "asked": {"rate": 10.0}}
    ask = script.estimate_ask(case, split)
    # a decode replica holds a request from its first token to its last: 2 req/s x 3.5 s = 7
    assert (ask["decode_batch_size"], ask["prefill_batch_size"], ask["mode"]) == (7, 1, "disagg")


def test_the_accuracy_page_shows_the_table_of_the_data_file():
    page = (DATA.parents[2] / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert "\n".join(_script().own_table(DOC)) in page
