"""aiconfigurator's silicon runs (benchmarks/data/served/silicon.json): extracted from its CSV as stated, marked as
validation data with their source, and replayed as a closed loop of clients."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXCERPT = ROOT / "tests" / "data" / "silicon" / "silicon_sample_excerpt.csv"
SOURCE = {"repo": "github:ai-dynamo/aiconfigurator", "path": "silicon_sample.csv", "commit": "095f58a"}


@pytest.fixture(scope="module")
def modules():
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "scripts")]
    import extract_silicon_runs
    import served

    yield served, extract_silicon_runs
    del sys.path[:2]


def test_the_excerpt_keeps_and_drops_rows_as_stated(modules):
    _, extract = modules
    data = extract.extract(EXCERPT.read_text(encoding="utf-8"), SOURCE)
    assert data["rows_read"] == 10
    dropped = {what.split(" (")[0]: n for what, n in data["dropped"].items() if n}
    assert dropped == {"vLLM": 1, "aggregated serving": 1, "attention data parallel 1": 1, "expert parallel 1": 1}
    by_id = {r["id"]: r for r in data["runs"]}
    assert len(by_id) == 6
    qwen = by_id["qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1"]
    # the CSV line: vllm 0.12.0, Qwen/Qwen3-32B, h100_sxm, no precision, 1024 x 128, batch 8, TP 2, TTFT
    # 154.2481599 ms, TPOT 18.0370482875 ms
    assert (qwen["gpu"], qwen["model"], qwen["weights"], qwen["tp"], qwen["release"]) == (
        "H100-80GB", "qwen3-32b", "bf16", 2, "0.12.0")
    assert (qwen["isl"], qwen["osl"], qwen["concurrency"]) == (1024, 128, 8)
    assert qwen["measured"] == pytest.approx({"ttft_s": 0.1542481599, "tpot_s": 0.0180370482875})
    assert qwen["split"] == "validate" and qwen["source"] == SOURCE
    weights = {r["hf_model"]: r["weights"] for r in data["runs"]}
    assert weights == {"Qwen/Qwen3-32B": "bf16", "openai/gpt-oss-120b": "mxfp4", "meta-llama/Llama-3.1-70B": "nvfp4",
                       "moonshotai/Kimi-K2.5": "int4", "MiniMaxAI/MiniMax-M2.5": "fp8",
                       "nvidia/Llama-3.1-8B-Instruct-FP8": "fp8"}
    releases = {r["hf_model"]: r["release"] for r in data["runs"]}
    assert releases["meta-llama/Llama-3.1-70B"] is None  # 2026-04-06.csv names no release for it
    assert releases["MiniMaxAI/MiniMax-M2.5"] == "nightly-5b8c30d62b754b57"


def test_every_shipped_row_is_validation_data_with_its_source(modules):
    data = json.loads((ROOT / "benchmarks" / "data" / "served" / "silicon.json").read_text(encoding="utf-8"))
    assert len(data["runs"]) > 1000
    for run in data["runs"]:
        assert run["split"] == "validate"
        assert run["source"]["repo"] == "github:ai-dynamo/aiconfigurator" and len(run["source"]["commit"]) == 40
        assert run["licence"].startswith("Apache-2.0")
        assert run["measured"]["ttft_s"] > 0 and run["measured"]["tpot_s"] > 0


def test_a_small_row_replays_to_finite_times(modules):
    served, _ = modules
    run = {"id": "small", "gpu": "H100-80GB", "model": "qwen3-32b", "weights": "bf16", "kv_dtype": "auto", "tp": 2,
           "release": "0.12.0", "isl": 1024, "osl": 128, "concurrency": 8,
           "measured": {"ttft_s": 0.3, "tpot_s": 0.02}}
    settings = served.silicon_settings(run)
    # aiconfigurator's vllm.rule: max_num_seqs 8, max_num_batched_tokens 8 + 1,024 + 1,500, max_model_len
    # 1,024 + 128 + 1,500; the release's rules
    assert (settings["engine"], settings["max_num_seqs"], settings["max_num_batched_tokens"],
            settings["max_model_len"]) == ("vllm@0.12", 8, 2532, 2652)
    assert served.silicon_settings({**run, "release": None})["engine"] == "vllm"  # none recorded: the newest
    case = served.replay_silicon(run, rounds=2)
    assert not case.excluded and case.basis
    for metric in ("ttft", "tpot", "e2e"):
        assert math.isfinite(case.simulated[metric]["mean"]) and case.simulated[metric]["mean"] > 0
    # eight clients of 1,024-token prompts: a TPOT of milliseconds, not of a lone request's or of seconds
    assert 0.005 < case.simulated["tpot"]["mean"] < 0.1


def test_later_rounds_stand_for_the_rest_of_aiperfs_twenty(modules):
    """One client: every request runs alone and alike, so the weighted mean is the same whatever the rounds
    replayed; and a row's rounds stay within the output-token budget, at least two."""
    served, _ = modules
    run = {"id": "one", "gpu": "H100-80GB", "model": "llama-3.1-8b", "weights": "fp8", "kv_dtype": "auto", "tp": 1,
           "release": "0.12.0", "isl": 512, "osl": 64, "concurrency": 1, "measured": {"ttft_s": 0.05, "tpot_s": 0.01}}
    two, five = served.replay_silicon(run, rounds=2), served.replay_silicon(run, rounds=5)
    for metric in ("ttft", "tpot"):
        assert two.simulated[metric]["mean"] == pytest.approx(five.simulated[metric]["mean"], rel=1e-9)
    assert served.silicon_rounds(run) == 20  # 20 x 64 tokens: well inside the budget
    big = {**run, "concurrency": 512, "osl": 8192}
    assert served.silicon_rounds(big) == 2  # 512 x 8,192 x 2 = 8.4M tokens: the floor, past the 8M budget
    assert served.silicon_rounds({**run, "concurrency": 128, "osl": 8192}) == 7  # 8M // 1,048,576


def test_prefix_caching_off_changes_no_figure_of_a_sliding_window_model(modules, monkeypatch):
    """The replay turns prefix caching off (the prompts share no prefix): gpt-oss's figures are the same with it on."""
    served, _ = modules
    run = {"id": "gpt-oss", "gpu": "H100-80GB", "model": "gpt-oss-120b", "weights": "mxfp4", "kv_dtype": "auto",
           "tp": 2, "release": "0.18.0", "isl": 1024, "osl": 200, "concurrency": 6,
           "measured": {"ttft_s": 0.1, "tpot_s": 0.01}}
    off = served.replay_silicon(run, rounds=3)
    settings = served.silicon_settings
    monkeypatch.setattr(served, "silicon_settings", lambda r: {**settings(r), "prefix_caching": True})
    on = served.replay_silicon(run, rounds=3)
    assert off.simulated == on.simulated


def test_weights_kvbudget_cannot_time_are_left_out_with_why(modules):
    served, _ = modules
    run = {"id": "fp4", "gpu": "B200", "model": "llama-3.1-70b", "weights": "nvfp4", "kv_dtype": "auto", "tp": 2,
           "release": None, "isl": 1024, "osl": 1024, "concurrency": 8, "measured": {"ttft_s": 0.2, "tpot_s": 0.01}}
    case = served.replay_silicon(run)
    assert "NVFP4" in case.excluded
