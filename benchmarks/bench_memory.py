"""How close `kvbudget plan`'s memory stack comes to what real vLLM start-ups logged. Prints figures; asserts
nothing (tests/corpus/test_memory_corpus.py holds the bounds).

    python benchmarks/bench_memory.py [--corpus tests/data/memory/vllm.json]

Then the SGLang start-ups of tests/data/memory/sglang.json: the pool SGLang allocated beside the plan's.

Each case of the corpus (a real start-up: settings, and the memory split vLLM printed) is planned with the same
engine release, GPU, tensor parallel size, max_model_len and gpu_memory_utilization. The table sets each term
beside the log's; the error of the KV budget is (predicted - logged) / logged, positive when the plan is
optimistic. 'fit' cases set the fitted figures (engines/vllm/memory.py) and are shown apart; the summary is over
the 'check' cases, which nothing was fitted on. A case vLLM refused is right when the plan predicts the refusal.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path
from typing import Any

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.planner import NoKVBudget
from kvbudget.units import GIB

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "memory" / "vllm.json"
SGLANG_CORPUS = CORPUS.with_name("sglang.json")
TERMS = (("weights", "weights_gib"), ("activation", "activation_gib"), ("overhead", "non_torch_gib"),
         ("kv", "kv_gib"))


def load_case_model(case: dict[str, Any]) -> kvbudget.ModelSpec:
    """The case's model: a catalog name or a config, with a quantization block added where the case gives one."""
    if "config" in case:
        config = copy.deepcopy(case["config"])
    else:
        config = copy.deepcopy(kvbudget.load_model(case["model"]).config)
    if "quantization_config" in case:
        config["quantization_config"] = case["quantization_config"]
    return kvbudget.load_model(config)


def release_of(case: dict[str, Any]) -> tuple[int, int]:
    """The case's vLLM release as (major, minor)."""
    major, minor = (int(x) for x in case["release"].split(".")[:2])
    return major, minor


def predict(case: dict[str, Any]) -> dict[str, Any]:
    """The plan's terms for a case (GiB), and whether it predicts vLLM's refusal."""
    options = EngineOptions(engine_version=release_of(case))
    try:
        p = kvbudget.plan(load_case_model(case), engine=case["engine"], gpu=case["gpu"], tp=case["tp"],
                          max_model_len=case["max_model_len"], utilization=case["utilization"], options=options,
                          recommend=False)
    except NoKVBudget as exc:
        stack = {t.key: t.bytes / GIB for t in exc.answer.stack}
        return {**stack, "refused": True}
    stack = {t.key: t.bytes / GIB for t in p.stack}
    return {**stack, "refused": not p.capacity.fits}


def error(case: dict[str, Any], predicted: dict[str, Any]) -> float | None:
    """The KV budget's relative error (positive: optimistic), where the log states a positive budget."""
    logged = case["logged"].get("kv_gib")
    if logged is None or logged <= 0 or predicted.get("refused"):
        return None
    return predicted["kv"] / logged - 1


def predict_sglang(case: dict[str, Any]) -> tuple[int, float]:
    """The plan's pool for an SGLang case (tokens as SGLang prints them) and its weights (GiB), at the case's
    release, GPU and tensor parallel size with SGLang's default mem_fraction_static."""
    options = EngineOptions(engine_version=tuple(int(x) for x in case["release"].split(".")))
    p = kvbudget.plan(kvbudget.load_model(case["model"]), engine="sglang", gpu=case["gpu"], tp=case["tp"],
                      max_model_len=case["max_model_len"], options=options, recommend=False)
    return p.capacity.kv_cache_tokens, {t.key: t.bytes for t in p.stack}["weights"] / GIB


def sglang_table() -> None:
    print(f"\n{'SGLang case':38} {'role':5} {'tokens log/plan':>22} {'weights log/plan':>18}  pool error")
    for case in json.loads(SGLANG_CORPUS.read_text())["cases"]:
        tokens, weights = predict_sglang(case)
        logged = case["logged"]
        print(f"{case['id']:38} {case['role']:5} {logged['tokens']:>10,} / {tokens:>9,} "
              f"{logged['weights_gib']:>8.2f} / {weights:>7.2f}  {tokens / logged['tokens'] - 1:+9.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    args = parser.parse_args()
    cases = json.loads(args.corpus.read_text())["cases"]
    print(f"{'case':38} {'role':5} " + " ".join(f"{k + ' log/plan':>20}" for k, _ in TERMS) + "  KV error  refusal")
    errors: dict[str, list[tuple[float, float, str]]] = {}
    refusals = []
    for case in cases:
        got = predict(case)
        logged = case["logged"]
        cells = []
        for key, field in TERMS:
            value = logged.get(field)
            cells.append(f"{'-' if value is None else f'{value:.2f}':>9} / {got.get(key, 0):>8.2f}")
        err = error(case, got)
        refused = "refused" in logged
        verdict = ("right" if got["refused"] == refused else "WRONG") if refused or got["refused"] else ""
        print(f"{case['id']:38} {case['role']:5} " + " ".join(f"{c:>20}" for c in cells)
              + f"  {'' if err is None else f'{err:+.1%}':>8}  {verdict}")
        if case["role"] == "check":
            era = "V1 (0.8 on)" if release_of(case) >= (0, 8) else "V0"
            if err is not None:
                errors.setdefault(era, []).append((abs(err), err, case["id"]))
            if refused or got["refused"]:
                refusals.append(got["refused"] == refused)
    print()
    for era, found in errors.items():
        values = sorted(e for e, _, _ in found)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        worst = max(found)
        optimistic = max(signed for _, signed, _ in found)
        print(f"vLLM {era}, check cases with a KV budget: {len(found)}; median |error| "
              f"{statistics.median(values):.2%} (target 1%), 90th percentile {p90:.2%} (target 3%), worst "
              f"{worst[1]:+.2%} ({worst[2]}), most optimistic {optimistic:+.2%} (target: at most +3%)")
    if refusals:
        print(f"refusals predicted: {sum(refusals)} of {len(refusals)}")
    sglang_table()

if __name__ == "__main__":
    main()
