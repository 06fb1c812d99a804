"""Writes src/kvbudget/data/latency_bands.json: the error band `simulate` prints beside each latency.

Replays every public run in benchmarks/data/served/ (all "split": "validate", never fitted on) as served.py does,
with the default time model, and the runs of the measured GPUs again with that GPU's own measurements left out
(bench_step_times.transferred_cases: its kernels transferred from the others). Each case is classed by the basis
its time model names (steptimes.kernels_for -> bands.basis_of, so after new per-operation data lands a rerun
reclasses the runs); the bands per basis and metric are then computed by kvbudget.simulation.bands (10th to 90th
percentile of (real - simulated) / simulated of mean TTFT, TPOT and E2E; judged leaving one GPU out).
Takes about a minute and a half.

    python benchmarks/latency_bands.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import served
from bench_step_times import transferred_cases

from kvbudget.gpus import find_gpu
from kvbudget.simulation import bands, steptimes

OUT = Path(__file__).resolve().parents[1] / "src" / "kvbudget" / "data" / "latency_bands.json"
ABOUT = ("Error bands on simulate's latencies (kvbudget.simulation.bands), written by benchmarks/latency_bands.py. "
         "'engines': the engines the runs were served by (simulations of others carry no band). "
         "'cases': every public run of benchmarks/data/served/runs.json (all split 'validate': never fitted on; "
         "the step times are fitted only on src/kvbudget/data/steptimes/) compared, one load stage a case, with "
         "(real - simulated) / simulated of mean TTFT, TPOT and end-to-end latency; the measured GPUs' runs "
         "appear twice: with their own kernels (measured) and with them left out (transferred). 'bands': per "
         "basis and metric the 10th and 90th percentile of those errors over the basis' runs (with fewer "
         "than min_runs runs widened: their largest error as a factor either way, and at least the next wider "
         "basis' band: measured, within a generation, across generations), and in each its 'leave_one_gpu_out': "
         "how many of the basis' runs lie inside the band sized without any run of their own GPU. Sources and licences "
         "of the runs: benchmarks/data/served/README.md.")


def case_error(case: served.Case, band_basis: str) -> bands.CaseError:
    return bands.CaseError(run=case.run if not case.stage else f"{case.run}#{case.stage}", gpu=case.gpu,
                           basis=bands.Basis(band_basis),
                           errors={m: round(case.real[m]["mean"] / case.simulated[m]["mean"] - 1, 6)
                                   for m in bands.METRICS})


def cases() -> list[bands.CaseError]:
    """Every compared case, default time model and measured GPUs left out, classed by its time model."""
    out = []
    for run in served.runs():
        basis = served.default_time_model(run).band_basis
        out += [case_error(c, basis) for c in served.replay(run) if not c.excluded and basis]
    for c in transferred_cases(skip=()):
        kernels = steptimes.kernels_for(find_gpu(c.gpu), without=(c.gpu,))
        if not c.excluded and kernels is not None:
            out.append(case_error(c, kernels.basis.value))
    return out


def document(found: list[bands.CaseError]) -> dict[str, Any]:
    return {"about": ABOUT, "engines": sorted({served.settings(run)["engine"] for run in served.runs()}),
            "quantiles": list(bands.QUANTILES), "min_runs": bands.MIN_RUNS,
            "bands": bands.bands(found), "cases": [c.to_dict() for c in found]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args()
    text = json.dumps(document(cases()), indent=1) + "\n"
    if args.check:
        same = OUT.read_text(encoding="utf-8") == text
        print("latency_bands.json is up to date" if same else "latency_bands.json differs: rerun without --check")
        raise SystemExit(0 if same else 1)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
