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
