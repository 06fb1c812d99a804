"""`kvbudget plan`'s memory stack against real vLLM and SGLang start-ups (tests/data/memory/vllm.json and
sglang.json): the fitted figures come from the 'fit' cases alone, and the 'check' cases, never fitted on, hold the
error bounds the accuracy page states."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm import memory
from kvbudget.engines.vllm.releases import Release, batch_defaults, release
from kvbudget.gpus import find_gpu
from kvbudget.model.params import activation_widths
from kvbudget.units import GIB

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_memory import error, load_case_model, predict, predict_sglang, release_of  # noqa: E402

CASES = json.loads((ROOT / "tests" / "data" / "memory" / "vllm.json").read_text())["cases"]
CHECK = [c for c in CASES if c["role"] == "check"]


def test_every_case_says_where_it_comes_from():
    assert len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["role"] in ("fit", "check") and case["engine"] == "vllm", case["id"]
        assert case["source"].startswith("https://") and case["licence"], case["id"]
        assert ("model" in case) != ("config" in case), case["id"]
        assert set(case["logged"]) <= {"weights_gib", "activation_gib", "non_torch_gib", "kv_gib", "refused",
                                       "encoder_images"}
        # "kv": a gap in the budget the log does not split into terms
        assert "known" not in case or case["known"]["term"] in ("weights", "activation", "kv")


def _era(case: dict, table: dict) -> tuple[int, int]:
    version = release_of(case)
    return max(start for start in table if version >= start)


def test_the_fitted_figures_come_from_the_fit_cases_alone():
    """Per era: the bytes per logit are the largest of the era's one-GPU fit cases' logged peaks, rounded up; the
    non-torch figures (one GPU, tensor parallel) their largest, rounded up to 0.01 GiB and one more. Every era
    has a fit case for each figure."""
    per_logit: dict[tuple[int, int], list[float]] = {}
    non_torch: dict[tuple[tuple[int, int], bool], list[float]] = {}
    for case in (c for c in CASES if c["role"] == "fit"):
        model = load_case_model(case)
        mnbt, seqs = batch_defaults(find_gpu(case["gpu"]).memory_bytes, case["gpu"],
                                rel=Release(release_of(case)))
        rows = min(mnbt, seqs)
        logged = case["logged"]["activation_gib"] * GIB / (rows * activation_widths(model).vocab)
        if case["tp"] == 1:  # with tensor parallelism the peak holds more than the sampler (one case: +1.5%)
            per_logit.setdefault(_era(case, memory.LOGIT_BYTES), []).append(logged)
        non_torch.setdefault((_era(case, memory.NON_TORCH), case["tp"] > 1), []).append(case["logged"]["non_torch_gib"])
    assert {era: math.ceil(max(v)) for era, v in per_logit.items()} == memory.LOGIT_BYTES
    assert {(era, parallel): int((max(v) + 0.01) * GIB) for (era, parallel), v in non_torch.items()} == {
        (era, parallel): figures[parallel] for era, figures in memory.NON_TORCH.items() for parallel in (False, True)}


@pytest.mark.parametrize("case", [c for c in CHECK if "known" not in c and c["logged"].get("kv_gib", 0) > 0],
                         ids=lambda c: c["id"])
def test_the_kv_budget_is_within_three_percent(case):
    """Every check case without a named gap: within the issue's 90th-percentile target, 3%."""
    got = predict(case)
    assert not got["refused"]
    assert abs(error(case, got)) <= 0.03, (got["kv"], case["logged"]["kv_gib"])


def test_the_v1_check_cases_meet_the_targets():
    """vLLM V1's budget over the check cases: median |error| within 1%, 90th percentile within 3%, and never more
    than 3% optimistic except where the corpus names the gap (the accuracy page states the figures)."""
    v1 = [c for c in CHECK if release_of(c) >= (0, 8) and c["logged"].get("kv_gib", 0) > 0]
    errors = sorted(abs(error(c, predict(c))) for c in v1)
    assert len(v1) >= 30
    assert statistics.median(errors) <= 0.01
    assert errors[math.ceil(0.9 * len(errors)) - 1] <= 0.03
    assert max(error(c, predict(c)) for c in v1 if "known" not in c) <= 0.03


@pytest.mark.parametrize("case", [c for c in CASES if "refused" in c["logged"]], ids=lambda c: c["id"])
def test_a_refused_start_is_predicted(case):
    assert predict(case)["refused"]


@pytest.mark.parametrize("case", [c for c in CHECK if "known" in c], ids=lambda c: c["id"])
def test_the_known_gaps_are_still_what_the_corpus_says(case):
    """Each gap the corpus names is in the term it names (gpt-oss's weights: vLLM's MXFP4 layout on Hopper; vLLM
    V0's profiling pass): kvbudget is more than 4% off there. When that is modelled this fails: drop the case's
    'known' note and the gap from the accuracy page."""
    term = case["known"]["term"]
    got = predict(case)[term]
    logged = case["logged"][f"{term}_gib"]
    assert abs(got / logged - 1) > 0.04, (got, logged)


def test_the_fit_cases_are_reproduced():
    for case in (c for c in CASES if c["role"] == "fit"):
        assert abs(error(case, predict(case))) <= 0.005, case["id"]


def test_the_plan_names_the_fit_it_uses():
    p = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), gpu="H100-80GB")
    notes = {t.key: t.text() for t in p.stack}
    newest = release(EngineOptions())
    assert f"fit: {memory.logit_bytes(newest)} bytes per logit" in notes["activation"]
    assert "as torch reports it" in notes["gpu"] and "fit" in notes["overhead"]


def test_the_plan_states_the_measured_range():
    """The range the plan prints beside vLLM V1's budget is the one the V1 check cases give."""
    errors = [error(c, predict(c)) for c in CHECK if release_of(c) >= (0, 8)
              and c["logged"].get("kv_gib", 0) > 0]
    errors = [e for e in errors if e is not None]
    assert memory.CHECKED == (f"against {len(errors)} real V1 start-ups: {min(errors):+.1%} to {max(errors):+.1%} "
                              "(accuracy page)").replace("+-", "-")


SGLANG = json.loads((ROOT / "tests" / "data" / "memory" / "sglang.json").read_text())["cases"]
LOGS = ROOT / "tests" / "data" / "logs"


@pytest.mark.parametrize("case", SGLANG, ids=lambda c: c["id"])
def test_sglangs_pool_against_real_start_ups(case):
    """Check cases: the plan's pool within 2% of what SGLang allocated (its default fraction for the release and
    the model, the memory in use before loading, the weights); the fit case's gap is its weights, as it says."""
    tokens, weights = predict_sglang(case)
    error = tokens / case["logged"]["tokens"] - 1
    assert (LOGS / case["log"]).is_file() and case["source"].startswith("https://")
    if case["role"] == "check":
        assert abs(error) <= 0.02, (tokens, case["logged"]["tokens"])
    else:
        assert case["known"]["term"] == "weights" and abs(weights / case["logged"]["weights_gib"] - 1) > 0.01


@pytest.mark.parametrize("case", [c for c in CASES if "encoder_images" in c["logged"]], ids=lambda c: c["id"])
def test_the_encoder_is_profiled_with_as_many_images_as_the_log_says(case):
    """vLLM prints how many dummy images of the largest size it profiled the vision encoder with; the plan's
    count (the encoder budget rule of 0.19's source) is the same, and its encoder pass stays below the text pass's
    planned peak, as every one of these logs shows (the logged peak is within 0.15 GiB of the text pass's)."""
    rel = Release(release_of(case))
    mnbt, seqs = batch_defaults(find_gpu(case["gpu"]).memory_bytes, case["gpu"], rel=rel)
    images, peak, held, _ = memory.encoder_profile(load_case_model(case), mnbt, seqs, case["max_model_len"],
                                                   case["tp"])
    assert images == case["logged"]["encoder_images"]
    assert 0 < held < peak < predict(case)["activation"] * GIB


def test_vllm_rotary_tables_worked_by_hand():
    """From vLLM's get_rope: one table per distinct setting of positions x rotated dims in 16 bits."""
    tables = {n: memory.rotary_tables(kvbudget.load_model(n)) for n in ("gemma-3-4b", "llama-4-scout", "gpt-oss-20b",
                                                                        "phi-3.5-mini", "deepseek-v2-lite", "opt-13b")}
    assert tables["gemma-3-4b"][0] == (131072 * 8 + 131072) * 256 * 2  # global (linear x8) and local tables
    assert tables["llama-4-scout"][0] == 10485760 * 128 * 2 == 2.5 * GIB  # llama3 scaling: max positions
    assert tables["gpt-oss-20b"][0] == 4096 * 32 * 64 * 2  # YaRN: original x factor
    assert tables["phi-3.5-mini"][0] == (4096 + 131072) * 96 * 2  # LongRoPE: short and long tables
    assert tables["deepseek-v2-lite"][0] == 4096 * 40 * 64 * 2  # DeepSeek YaRN over the rope dims of MLA
    assert tables["opt-13b"] is None  # learned positions
