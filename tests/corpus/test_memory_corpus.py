"""`kvbudget plan`'s memory stack against real vLLM and SGLang start-ups (tests/data/memory/vllm.json and
sglang.json): the fitted figures come from the 'fit' cases alone, and the 'check' cases, never fitted on, hold the
error bounds the accuracy page states."""

from __future__ import annotations

import argparse
import hashlib
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
from kvbudget.errors import KVBudgetError
from kvbudget.gpus import find_gpu
from kvbudget.model.params import activation_widths
from kvbudget.units import GIB

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_memory import (  # noqa: E402
    all_cases,
    by_keys,
    check_groups,
    era,
    error,
    family,
    load_case_model,
    percentile_90,
    predict,
    predict_sglang,
    predict_stated,
    release_of,
)

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


# The wider corpus (tests/data/memory/wide.json): other GPU families and releases, split by a rule set before any
# case was predicted (README.md), and the targets per release era and GPU family over every corpus's check
# cases (benchmarks/bench_memory.py --by era,family prints the same table).
WIDE_DOC = json.loads((ROOT / "tests" / "data" / "memory" / "wide.json").read_text())
WIDE = WIDE_DOC["cases"]


def test_every_wide_case_says_where_it_comes_from():
    assert len({c["id"] for c in WIDE}) == len(WIDE)
    assert not {c["id"] for c in WIDE} & {c["id"] for c in CASES + SGLANG}
    for case in WIDE:
        assert case["engine"] in ("vllm", "sglang") and case["role"] in ("fit", "check"), case["id"]
        assert case["source"].startswith("https://") and case["licence"], case["id"]
        assert ("model" in case) != ("config" in case), case["id"]
        assert set(case["logged"]) <= {"weights_gib", "activation_gib", "non_torch_gib", "kv_gib", "kv_tokens",
                                       "gpu_blocks", "refused"}, case["id"]
        assert {"kv_gib", "kv_tokens"} & set(case["logged"]), case["id"]  # a figure the error is taken on
        assert isinstance(case.get("unpredicted", ""), str), case["id"]


def test_the_wide_roles_follow_the_rule_written_before_any_error():
    """fit when the SHA-256 of the source URL is divisible by 3, else check (README.md); the rule looks at where a
    case was published, never at its error, so no role can follow an error."""
    assert "sha256" in WIDE_DOC["role_rule"]
    for case in WIDE:
        digest = int(hashlib.sha256(case["source"].encode()).hexdigest(), 16)
        assert case["role"] == ("fit" if digest % 3 == 0 else "check"), case["id"]


def test_every_wide_case_the_plan_cannot_predict_says_why():
    """A case the plan refuses is marked 'unpredicted' in the data (and counted by the bench), never dropped."""
    for case in WIDE:
        if "unpredicted" not in case:
            assert "unpredicted" not in predict_stated(case), case["id"]


def test_the_gemma_4_case_stays_unpredicted_while_its_release_is_refused():
    """Its weights are counted now (issue 55 item 5); the plan still refuses Gemma 4 before vLLM 0.26 (its unequal
    pages): when that changes this fails: drop the case's 'unpredicted' note."""
    case = next(c for c in WIDE if c["model"] == "gemma-4-26b-a4b")
    assert "0.26" in case["unpredicted"]
    with pytest.raises(KVBudgetError, match="0.26"):
        kvbudget.plan(kvbudget.load_model(case["model"]), gpu=case["gpu"], tp=case["tp"],
                      max_model_len=case["max_model_len"], utilization=case["utilization"],
                      options=EngineOptions(engine_version=release_of(case)), recommend=False)


def test_the_accuracy_table_groups_by_era_and_family():
    assert by_keys("era,family") == ("era", "family") and by_keys("family") == ("family",)
    for bad in ("gpu", "era,era", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--by takes era, family or both"):
            by_keys(bad)
    assert [era({"engine": "vllm", "release": r}) for r in ("0.6", "0.7", "0.8", "0.10", "0.11", "0.19", "0.20",
                                                           "0.26", "0.27", "0.34")] == [
        "vLLM V0 (to 0.7)", "vLLM V0 (to 0.7)", "vLLM 0.8-0.10", "vLLM 0.8-0.10", "vLLM 0.11-0.19",
        "vLLM 0.11-0.19", "vLLM 0.20-0.26", "vLLM 0.20-0.26", "vLLM 0.27-0.34", "vLLM 0.27-0.34"]
    assert era({"engine": "sglang", "release": "0.4.9"}) == "SGLang 0.4"
    assert [family({"gpu": g}) for g in ("A100-40GB", "L40S", "RTX-3090", "GH200", "B200", "MI300X", "T4")] == [
        "A100", "L4 / L40S / A10G", "GeForce (RTX 3090 / 4090 / 5090)", "Hopper (H100, H200, GH200)",
        "Blackwell (B200, GB200, GB10)", "AMD Instinct", "other"]
    assert percentile_90([0.01 * i for i in range(1, 11)]) == 0.09  # the 9th of 10, as the bounds above take it


# Groups that miss a target today, with what was measured and its cause as far as the logs split it. strict: when
# the terms helper's work meets a target, the xfail turns into a failure and its entry comes out of this table.
MISSES = {
    ("vLLM V0 (to 0.7)", "A100"): "median/p90/optimistic +73.1% on 1 case (vllm-12330, A100-40GB): V0's profiling "
                                  "peak, the known activation gap of vllm.json",
    ("vLLM V0 (to 0.7)", "GeForce (RTX 3090 / 4090 / 5090)"): "median 2.77%, p90 3.21%, most optimistic +3.21% on 2 "
                                  "cases: the RTX 3090's V0 activation gap (+3.2%); the RTX 4090's total, 23.99 GiB in "
                                  "the catalog (nvidia-smi) where torch saw 23.55 (vllm-13061, +2.3%)",
    ("vLLM V0 (to 0.7)", "L4 / L40S / A10G"): "+26.5% on 1 case (Llama-3.1-8B on a 24 GB OCI card, 0.7, refused "
                                  "at 131,072): torch saw 22.07 GiB, the catalog's A10 has only its nominal 24 (share "
                                  "21.60 GiB planned, 19.86 logged); the terms agree within 0.5 GiB",
    ("vLLM V0 (to 0.7)", "Hopper (H100, H200, GH200)"): "+17.1% on 1 case (phi-4 GPTQ at a 0.15 share): activation "
                                  "0.31 GiB planned, 0.94 logged (V0's profiling peak)",
    ("vLLM 0.8-0.10", "Hopper (H100, H200, GH200)"): "+22.3% on 1 case (Qwen3-235B-A22B-FP8, TP 4, 0.9.2 with the "
                                  "LMCache connector): unattributed, the issue prints the budget only",
    ("vLLM 0.8-0.10", "A100"): "median 3.03%, p90 15.1% (pessimistic), most optimistic +2.29% on 6 cases "
                               "(dennislee22, 0.10.1.1): Qwen2-7B at shares 0.25 and 0.5, TP 1 and 2: the logs leave "
                               "0.5-0.6 GiB for activation and non-torch (the share of ~79.2 GiB less weights and "
                               "budget), the plan 1.55 GiB (-15.1% at 0.25, -9.1% at TP 2); gpt-oss-120b TP 4 +2.3%: "
                               "weights 15.21 GiB planned, 17.22 logged (MXFP4 on Ampere)",
    ("SGLang 0.5", "AMD Instinct"): "+19.4% on 1 case (Kimi-K2.5 on 8 x MI355X, SGLang 0.5.8 on ROCm): the log's "
                                    "weights and pool take 0.826 of the 283.56 GiB SGLang saw, the plan's 0.5.3 rule "
                                    "0.908 of the nominal 288; weights 67.90 GiB planned, 73.58 logged (the count puts "
                                    "the bfloat16 attention of its int4 checkpoint at 4 bits)",
    ("vLLM 0.11-0.19", "Hopper (H100, H200, GH200)"): "median 0.21%, p90 1.22%, but +301.9% optimistic on one case "
                                    "of 37 (gpt-oss-120b at 0.95 with max_num_batched_tokens 1,024, vllm-27508): a "
                                    "1.71 GiB budget left beside MXFP4 weights vLLM 0.11-0.14 loads as 64.38 GiB "
                                    "on Hopper (vllm#33155), the count 60.73: the gap vllm.json names for gpt-oss",
    ("vLLM 0.11-0.19", "A100"): "+4.3% on 1 case (gpt-oss-20b, 0.19): weights 12.82 GiB planned, 13.72 logged (MXFP4 "
                                "on Ampere), and the A100's total, the nominal 80 GiB (no torch figure in the catalog)",
    ("vLLM 0.20-0.26", "L4 / L40S / A10G"): "median and p90 5.39% (pessimistic) on 1 case (aws-samples L40S TP 4): the "
                                            "gap vllm.json names (CUDA graphs, PCIe non-torch, the L40S total)",
    ("SGLang 0.4", "Hopper (H100, H200, GH200)"): "median 3.97%, p90 and most optimistic +7.58% on 2 cases: "
                                  "Qwen3-235B-A22B-FP8 at TP 4 and mem_fraction_static 0.93 (vllm-21348), "
                                  "unattributed (the issue prints the pool only)",
}
GROUPS, UNPREDICTED = check_groups(all_cases(), ("era", "family"))


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xfail(strict=True, reason=MISSES[g]))
                                   if g in MISSES else g for g in sorted(GROUPS)], ids=" / ".join)
def test_the_targets_per_era_and_family(group):
    """Issue 55's targets on the check cases of each release era and GPU family: median |error| within 1%, 90th
    percentile within 3%, never more than 2% optimistic."""
    found = GROUPS[group]
    sizes = [abs(e) for e, _ in found]
    assert statistics.median(sizes) <= 0.01 and percentile_90(sizes) <= 0.03, found
    assert max(found)[0] <= 0.02, max(found)


def test_the_misses_are_groups_the_corpus_has():
    assert set(MISSES) <= set(GROUPS)


def test_the_rtx_5090_total_is_the_one_torch_reports():
    """vLLM's start-up log on an RTX 5090 printed 'total_gpu_memory (31.37GiB)' (github.com/g0t4/examples): the
    share is taken of that, not of the nominal 32 GB."""
    card = find_gpu("RTX-5090")
    assert card.memory_bytes == int(31.37 * GIB)
