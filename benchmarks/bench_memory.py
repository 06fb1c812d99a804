"""How close `kvbudget plan`'s memory stack comes to what real vLLM start-ups logged. Prints figures; asserts
nothing (tests/corpus/test_memory_corpus.py holds the bounds).

    python benchmarks/bench_memory.py [--corpus tests/data/memory/vllm.json]
    python benchmarks/bench_memory.py --by era,family
    python benchmarks/bench_memory.py --write-bands

Then the SGLang start-ups of tests/data/memory/sglang.json: the pool SGLang allocated beside the plan's.

`--by era,family` (either or both) predicts every case of the three corpora (vllm.json, sglang.json and the wider
wide.json) with the settings each case states, and prints, per release era and GPU family, the median |error|, the
90th percentile and the most optimistic error over the CHECK cases alone; then the eras and GPU families the issue
asks for that have no check case, and the cases the plan cannot predict (an input it lacks) with the reason. The
error is that of the KV budget in GiB where the log states it, else of the token count the engine printed.
`--write-bands` writes the same groups' errors to src/kvbudget/data/budget_bands.json, the bands `plan` carries
(kvbudget.budgetbands): run it whenever the memory model or the corpus changes.

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
from kvbudget import budgetbands
from kvbudget.choices import EntryPoint
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.gpus import find_gpu
from kvbudget.planner import NoKVBudget
from kvbudget.units import GIB

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "memory" / "vllm.json"
SGLANG_CORPUS = CORPUS.with_name("sglang.json")
WIDE_CORPUS = CORPUS.with_name("wide.json")
TERMS = (("weights", "weights_gib"), ("activation", "activation_gib"), ("overhead", "non_torch_gib"),
         ("kv", "kv_gib"))


def load_case_model(case: dict[str, Any]) -> kvbudget.ModelSpec:
    """The case's model: a catalog name or a config, with a quantization block and a vision tower added where the
    case gives them."""
    if "config" in case:
        config = copy.deepcopy(case["config"])
    else:
        config = copy.deepcopy(kvbudget.load_model(case["model"]).config)
    for block in ("quantization_config", "vision_config"):
        if block in case:
            config[block] = case[block]
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


def by_keys(text: str) -> tuple[str, ...]:
    """--by's value: era and/or family, comma-separated."""
    keys = tuple(k.strip() for k in text.split(","))
    if not keys or any(k not in ("era", "family") for k in keys) or len(set(keys)) != len(keys):
        raise argparse.ArgumentTypeError(f"--by takes era, family or both, comma-separated (got {text!r})")
    return keys


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


# GPU families the accuracy table reports (issue 55: the cards users have): kvbudget.budgetbands.gpu_family for a
# catalog card; the corpus's cards outside the catalog (their cases are unpredicted) by name.
OFF_CATALOG = {"GB10": budgetbands.BLACKWELL, "Arc-Pro-B70": budgetbands.XPU}
FAMILIES = budgetbands.FAMILIES
# Release eras the table reports: each engine's (vLLM's by the start-up arithmetic they share, SGLang's by minor
# release), from its package (engines/vllm/releases.py, engines/sglang/releases.py BUDGET_ERAS).
def budget_eras(name: str) -> tuple[str, ...]:
    engine = get_engine(name)
    assert isinstance(engine, budgetbands.ChecksBudget)
    return engine.budget_eras


VLLM_ERAS, SGLANG_ERAS = budget_eras("vllm"), budget_eras("sglang")


def family(case: dict[str, Any]) -> str:
    """The case's GPU family ("other" for a card in none of FAMILIES)."""
    if case["gpu"] in OFF_CATALOG:
        return OFF_CATALOG[case["gpu"]]
    return budgetbands.gpu_family(find_gpu(case["gpu"]))


def era(case: dict[str, Any]) -> str:
    """The case's release era, as its engine names it."""
    version = tuple(int(x) for x in case["release"].split("."))
    engine = get_engine(case["engine"])
    assert isinstance(engine, budgetbands.ChecksBudget)
    return engine.budget_era(EngineOptions(engine_version=version))


def predict_stated(case: dict[str, Any]) -> dict[str, Any]:
    """The plan for a case of any corpus with every setting it states (share, batch limits, eager mode, KV dtype,
    block size, expert parallelism, server or LLM class):
    its terms (GiB), the token count the engine would print, and whether it predicts a refusal; or, where the plan
    lacks an input, {"unpredicted": why}."""
    if "unpredicted" in case:
        return {"unpredicted": case["unpredicted"]}
    version = tuple(int(x) for x in case["release"].split("."))
    options = EngineOptions(engine_version=version if case["engine"] == "sglang" else version[:2],
                            max_num_seqs=case.get("max_num_seqs"),
                            max_num_batched_tokens=case.get("max_num_batched_tokens"),
                            enforce_eager=case.get("enforce_eager", False), block_size=case.get("block_size"),
                            flashinfer_sampler=case.get("flashinfer_sampler", False),
                            entry_point=EntryPoint(case.get("entry_point", "server")))
    try:
        p = kvbudget.plan(load_case_model(case), engine=case["engine"], gpu=case["gpu"], tp=case["tp"],
                          max_model_len=case["max_model_len"], utilization=case.get("utilization"),
                          kv_dtype=case.get("kv_dtype", "auto"), options=options, recommend=False,
                          expert_parallel=case.get("expert_parallel", False))
    except NoKVBudget as exc:
        return {**{t.key: t.bytes / GIB for t in exc.answer.stack}, "tokens": 0, "refused": True}
    except KVBudgetError as exc:
        return {"unpredicted": f"the plan refuses the case's inputs: {exc}"}
    stack = {t.key: t.bytes / GIB for t in p.stack}
    return {**stack, "tokens": p.capacity.kv_cache_tokens, "refused": not p.capacity.fits}


def stated_error(case: dict[str, Any], got: dict[str, Any]) -> float | None:
    """The error (positive: optimistic) of the KV budget where the log states one in GiB, else (or where the case
    says `compare_on: kv_tokens`, with its reason) of the token count the engine printed; None where neither can be
    compared."""
    logged = case["logged"]
    if logged.get("kv_gib", 0) > 0 and "kv" in got and case.get("compare_on") != "kv_tokens":
        return float(got["kv"] / logged["kv_gib"] - 1)
    tokens = logged.get("kv_tokens") or logged.get("tokens", 0)  # sglang.json names SGLang's #tokens "tokens"
    if tokens > 0 and got.get("tokens"):
        return float(got["tokens"] / tokens - 1)
    return None


def all_cases() -> list[dict[str, Any]]:
    """Every case of the three corpora: vllm.json, sglang.json, wide.json."""
    return [case for corpus in (CORPUS, SGLANG_CORPUS, WIDE_CORPUS)
            for case in json.loads(corpus.read_text())["cases"]]


def percentile_90(values: list[float]) -> float:
    """The 90th percentile as the test bounds take it: the ceil(0.9 n)-th smallest."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


def check_groups(cases: list[dict[str, Any]], keys: tuple[str, ...], show: bool = False
                 ) -> tuple[dict[tuple[str, ...], list[tuple[float, str]]], list[tuple[str, str]]]:
    """The check cases' errors, (error, id), grouped by `keys` (era, family), and the cases the plan cannot predict,
    (id, why); with `show`, a line per case as it goes."""
    key_of = {"era": era, "family": family}
    groups: dict[tuple[str, ...], list[tuple[float, str]]] = {}
    unpredicted = []
    for case in cases:
        got = predict_stated(case)
        err = None if "unpredicted" in got else stated_error(case, got)
        if show:
            shown = "unpredicted" if "unpredicted" in got else ("-" if err is None else f"{err:+.1%}")
            print(f"{case['id']:48} {case['role']:5} {era(case):18} {family(case):34} {shown:>8}")
        if "unpredicted" in got:
            unpredicted.append((case["id"], got["unpredicted"]))
        elif case["role"] == "check" and err is not None:
            groups.setdefault(tuple(key_of[k](case) for k in keys), []).append((err, case["id"]))
    return groups, unpredicted


def accuracy_table(cases: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Per group of `keys` (era, family): the check cases' median |error|, 90th percentile and most optimistic
    error, against the issue's targets (1%, 3%, +2%); then what no check case covers and what is unpredicted."""
    print(f"{'case':48} {'role':5} {'era':18} {'family':34} {'error':>8}")
    groups, unpredicted = check_groups(cases, keys, show=True)
    print("\nCHECK cases only; targets: median |error| <= 1%, 90th percentile <= 3%, most optimistic <= +2%")
    print(f"{' / '.join(keys):60} {'n':>3} {'median':>8} {'p90':>8} {'optimistic':>11}  misses")
    for group, found in sorted(groups.items()):
        sizes = [abs(e) for e, _ in found]
        median, p90, optimistic = statistics.median(sizes), percentile_90(sizes), max(found)
        largest = max(found, key=lambda found_case: abs(found_case[0]))
        misses = [name for name, miss in (("median", median > 0.01), ("p90", p90 > 0.03),
                                          ("optimistic", optimistic[0] > 0.02)) if miss]
        print(f"{' / '.join(group):60} {len(found):>3} {median:>8.2%} {p90:>8.2%} {optimistic[0]:>+11.2%}  "
              + (", ".join(misses) + f" (largest: {largest[0]:+.1%} {largest[1]})" if misses else "met"))
    covered = {k: {g[keys.index(k)] for g in groups} for k in keys}
    if "era" in keys:
        eras = [*VLLM_ERAS, *SGLANG_ERAS]
        print("eras with no check case: " + (", ".join(e for e in eras if e not in covered["era"]) or "none"))
    if "family" in keys:
        print("GPU families with no check case: "
              + (", ".join(f for f in FAMILIES if f not in covered["family"]) or "none"))
    print(f"unpredicted: {len(unpredicted)}")
    for name, why in unpredicted:
        print(f"  {name}: {why}")


BANDS = Path(__file__).resolve().parents[1] / "src" / "kvbudget" / "data" / "budget_bands.json"
BANDS_ABOUT = (
    "The KV budget's error band per release era and GPU family, for kvbudget.budgetbands (which picks a plan's band "
    "from these by the rule written there). Measured on the CHECK cases only of tests/data/memory/vllm.json, "
    "sglang.json and wide.json (fit cases never enter; the split is recorded in those files). A case's error is "
    "planned / logged - 1 of the KV budget in GiB where the log states it, else of the token count the engine "
    "printed (positive: the plan was optimistic). share_low, share_high: the most pessimistic and most optimistic "
    "error in bytes as a fraction of the plan's engine share (planned - logged budget, over gpu_memory_utilization x "
    "the GPU's memory or the engine's like figure), what a plan's band applies, since the errors come from terms that "
    "do not grow with the budget; budget_low, budget_high: the same relative to the logged budget; median_abs, "
    "p90_abs: of |error relative to the budget| (the 90th percentile as the ceil(0.9 n)-th smallest), as "
    "`bench_memory.py --by era,family` prints them; case_ids: the check cases. Written by `python "
    "benchmarks/bench_memory.py --write-bands`; regenerate it whenever the memory model or the corpus changes: "
    "tests/corpus/test_memory_corpus.py fails while this file differs from what the script computes now.")


def share_error(got: dict[str, Any], err: float) -> float:
    """The KV budget's error (`err`, relative to the logged budget) as a fraction of the engine's share of the GPU:
    planned minus logged budget over the planned share. The errors come from terms that do not grow with the budget
    (weights, the profiling peak, other memory), so this is what carries over to another model's budget: 5 GiB
    too many is +300% of a 1.65 GiB budget and 7% of a 75 GiB share."""
    return float(got["kv"] * err / (1 + err) / got["share"])


def band_table(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The bands file's content: per era and family with a check case, its errors (rounded to 0.01%): of the
    engine's share (what kvbudget.budgetbands applies) and of the logged budget (the accuracy table's)."""
    groups, _ = check_groups(cases, ("era", "family"))
    by_id = {c["id"]: c for c in cases}
    bands = []
    for (group_era, group_family), found in sorted(groups.items()):
        errors = [e for e, _ in found]
        of_share = [share_error(predict_stated(by_id[name]), e) for e, name in found]
        sizes = [abs(e) for e in errors]
        bands.append({"era": group_era, "family": group_family, "cases": len(found),
                      "share_low": round(min(of_share), 4), "share_high": round(max(of_share), 4),
                      "budget_low": round(min(errors), 4), "budget_high": round(max(errors), 4),
                      "median_abs": round(statistics.median(sizes), 4), "p90_abs": round(percentile_90(sizes), 4),
                      "case_ids": sorted(name for _, name in found)})
    return {"about": BANDS_ABOUT, "bands": bands}


def bands_text(cases: list[dict[str, Any]]) -> str:
    """The bands file as written (JSON, two-space indent, a newline at the end)."""
    return json.dumps(band_table(cases), indent=2) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--by", type=by_keys, default=None, metavar="era,family",
                        help="the accuracy table over every corpus's check cases, grouped by era and/or family")
    parser.add_argument("--write-bands", action="store_true",
                        help=f"write the per era and family error bands of the check cases to {BANDS.name}")
    args = parser.parse_args()
    if args.write_bands:
        BANDS.write_text(bands_text(all_cases()), encoding="utf-8")
        print(f"wrote {BANDS}")
        return
    if args.by:
        accuracy_table(all_cases(), args.by)
        return
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
