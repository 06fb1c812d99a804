"""kvbudget's vLLM KV budget beside NVIDIA aiconfigurator's, on every case of the memory corpus aiconfigurator
can express, in one run. Prints figures; asserts nothing.

    python3 -m venv .venv-aic && . .venv-aic/bin/activate
    pip install aiconfigurator . && python benchmarks/bench_aiconfigurator.py

aiconfigurator is installed in the benchmark's own environment, as its users would (it is not a dependency of
kvbudget). Its `estimate_kv_cache` (aiconfigurator_core.sdk.memory) takes the model's config.json, a system from
its catalog, the backend (vllm, at the one version its database holds for that system), max_num_tokens and
max_batch_size (here vLLM's defaults for the GPU, as kvbudget uses them), the memory fraction (of the total, as
vLLM's gpu_memory_utilization) and the tensor parallel size. A case it cannot express (a GPU outside its
catalog, a model its builder refuses) is listed as such. Errors are (predicted - logged) / logged, positive when
optimistic; the summary is over the cases both express.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import CORPUS, error, load_case_model, predict, release_of

from kvbudget.engines.vllm.releases import Release, batch_defaults
from kvbudget.gpus import find_gpu
from kvbudget.units import GIB

SYSTEMS = {"H100-80GB": "h100_sxm"}  # kvbudget's GPU -> aiconfigurator's system (the others are not in its catalog)


def aiconfigurator_kv(case: dict[str, Any], folder: Path) -> float | str:
    """aiconfigurator's KV budget for the case (GiB), or why it cannot express it."""
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    system = SYSTEMS.get(case["gpu"])
    if system is None:
        return f"no {case['gpu']} in its catalog"
    folder = folder / case["id"]  # a folder per case: aiconfigurator caches what it read by path
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_case_model(case).config))
    mnbt, seqs = batch_defaults(find_gpu(case["gpu"]).memory_bytes, case["gpu"],
                                rel=Release(release_of(case)))
    try:
        got = estimate_kv_cache(str(folder), system, "vllm", "current", max_num_tokens=mnbt, max_batch_size=seqs,
                                memory_fraction_kind="of_total", memory_fraction_value=case["utilization"],
                                tp_size=case["tp"])
    except ValueError as exc:
        return f"refused: {str(exc).splitlines()[0][:60]}"
    return float(got["total_kv_size_bytes"]) / GIB


def main() -> None:
    cases = [c for c in json.loads(CORPUS.read_text())["cases"] if c["logged"].get("kv_gib", 0) > 0]
    print(f"{'case':38} {'role':5} {'logged':>7} {'kvbudget':>9} {'error':>7} {'aiconfigurator':>14} {'error':>7}")
    both: list[tuple[float, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            ours = predict(case)
            ours_err = error(case, ours)
            theirs = aiconfigurator_kv(case, Path(tmp))
            logged = case["logged"]["kv_gib"]
            theirs_text = f"{theirs:14.2f} {theirs / logged - 1:+7.1%}" if isinstance(theirs, float) else theirs
            ours_text = f"{ours['kv']:9.2f} {ours_err:+7.1%}" if ours_err is not None else f"{'refused':>9} {'':7}"
            print(f"{case['id']:38} {case['role']:5} {logged:7.2f} {ours_text} {theirs_text}")
            if isinstance(theirs, float) and ours_err is not None:
                both.append((abs(ours_err), abs(theirs / logged - 1), case["id"], case["role"]))
    print()
    for label, rows in (("cases both express", both), ("of them check cases (nothing fitted on)",
                                                        [r for r in both if r[3] == "check"])):
        if not rows:
            print(f"{label}: none")
            continue
        closer = sum(a <= b for a, b, _, _ in rows)
        print(f"{label}: {len(rows)}; median |error| kvbudget {statistics.median(r[0] for r in rows):.2%}, "
              f"aiconfigurator {statistics.median(r[1] for r in rows):.2%}; kvbudget closer or equal on {closer} of "
              f"{len(rows)}" + ("" if closer == len(rows) else ": not on " + ", ".join(
                  i for a, b, i, _ in rows if a > b)))


if __name__ == "__main__":
    main()
