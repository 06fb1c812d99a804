"""Writes src/kvbudget/data/latency_bands.json: the error band `simulate` prints beside each latency.

Replays every public run benchmarks/served.py reads (all "split": "validate", never fitted on) as served.py does,
up to three times: with the default time model, with the run's GPU's own kernel measurements left out, and with
those of every measured GPU of its architecture left out too, each classed by the basis its kernels then rest on
(steptimes.kernels_for -> bands.basis_of; one case per run and basis). So every measured GPU's runs also judge
the transfers, and after new per-operation data or a new time model lands, a rerun reclasses and resizes
everything. The bands per basis and metric are computed by kvbudget.simulation.bands (the lowest to the highest
(real - simulated) / simulated of mean TTFT, TPOT and E2E; judged leaving one GPU out, across architectures one
architecture). Prints how many runs the bands held so, by basis, GPU and tensor parallel size. Takes about two
minutes.

    python benchmarks/latency_bands.py [--write | --check]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import served

from kvbudget.gpus import find_gpu
from kvbudget.simulation import bands, steptimes

OUT = Path(__file__).resolve().parents[1] / "src" / "kvbudget" / "data" / "latency_bands.json"
ABOUT = ("Error bands on simulate's latencies (kvbudget.simulation.bands), written by "
         "`python benchmarks/latency_bands.py --write`. 'engines': the engines the runs were served by (simulations "
         "of others carry no band). 'cases': every public run benchmarks/served.py reads (all split 'validate': "
         "never fitted on; the step times are fitted only on src/kvbudget/data/steptimes/) compared, one load stage "
         "a case, with (real - simulated) / simulated of mean TTFT, TPOT and end-to-end latency; a run appears once "
         "per basis: with the default kernels, with its GPU's own measurements left out, and with its "
         "architecture's left out. 'bands': per basis and metric the lowest and the highest of those errors over the "
         "basis' runs (with fewer than min_runs runs or min_gpus GPUs the wider bases' runs join: measured, within "
         "an architecture, across architectures), and in each its 'leave_one_out': how many of the basis' runs "
         "lie inside the band sized without any run of their own GPU (across architectures: of their own "
         "architecture, by compute capability, the case's 'architecture'). Sources and licences of the runs: "
         "benchmarks/data/served/README.md.")


def case_error(case: served.Case, basis: bands.Basis) -> bands.CaseError:
    return bands.CaseError(run=case.run if not case.stage else f"{case.run}#{case.stage}", gpu=case.gpu,
                           architecture=find_gpu(case.gpu).compute_capability or "", basis=basis, tp=case.tp,
                           errors={m: round(case.real[m]["mean"] / case.simulated[m]["mean"] - 1, 6)
                                   for m in bands.METRICS if case.real.get(m, {}).get("mean")
                                   and case.simulated.get(m, {}).get("mean")})  # (a metric a run lacks: none)


def left_out(gpu: str) -> list[tuple[str, ...]]:
    """The measured GPUs to leave out for each replay of a run on `gpu`: none, its own, its architecture's."""
    arch = find_gpu(gpu).compute_capability
    same = [g for g in steptimes.fitted_gpus() if arch is not None and find_gpu(g).compute_capability == arch]
    return [(), (gpu,), tuple(dict.fromkeys([gpu, *same]))]


def replay(run: dict[str, Any], without: Sequence[str]) -> list[served.Case]:
    """The run replayed with `without`'s kernel measurements left out."""
    saved = steptimes.kernels_for
    steptimes.kernels_for = lambda card, without=(), gone=tuple(without): saved(  # type: ignore[assignment]
        card, without=(*gone, *without))
    try:
        return served.replay(run)
    finally:
        steptimes.kernels_for = saved  # type: ignore[assignment]


def cases() -> list[bands.CaseError]:
    """Every compared case, once per basis its run's kernels can rest on."""
    out = []
    for run in served.runs():
        seen = set()
        for without in left_out(run["gpu"]):
            kernels = steptimes.kernels_for(find_gpu(run["gpu"]), without=without)
            if kernels is None or kernels.basis in seen:
                continue
            seen.add(kernels.basis)
            out += [case_error(c, kernels.basis) for c in replay(run, without) if not c.excluded]
    return out


def document(found: list[bands.CaseError]) -> dict[str, Any]:
    engines = sorted({served.settings(run)["engine"].partition("@")[0] for run in served.runs()})
    return {"about": ABOUT, "engines": engines,
            "min_runs": bands.MIN_RUNS, "min_gpus": bands.MIN_GPUS,
            "bands": bands.bands(found), "cases": [c.to_dict() for c in found]}


def dumps(doc: dict[str, Any]) -> str:
    """The document as JSON, its cases one a line (thousands of them, as runs are added)."""
    cases = ",\n".join(f"  {json.dumps(c)}" for c in doc["cases"])
    return json.dumps({**doc, "cases": []}, indent=1).replace('"cases": []', f'"cases": [\n{cases}\n ]') + "\n"


def held_by_group(found: list[bands.CaseError]) -> list[str]:
    """Leaving one GPU (across architectures: one architecture) out, per basis, GPU and tensor parallel size: how
    many runs each metric's band held (a markdown table, as the accuracy page shows it)."""
    lines = ["| basis | GPU | TP | runs | " + " | ".join(f"{m.upper()} held" for m in bands.METRICS) + " |",
             "|---" * (4 + len(bands.METRICS)) + "|"]
    groups = sorted({(bands.BASES.index(c.basis), c.gpu, c.tp) for c in found})
    for at, gpu, tp in groups:
        basis = bands.BASES[at]
        mine = [c for c in found if (c.basis, c.gpu, c.tp) == (basis, gpu, tp)]
        gone = bands.left_out(found, basis, mine[0].unit(basis))
        cells = []
        for m in bands.METRICS:
            b = bands.band(found, basis, m, gone)
            cells.append(str(sum(b is not None and b.lower <= c.errors[m] <= b.upper for c in mine)))
        lines.append(f"| {basis.value} | {gpu} | {tp} | {len(mine)} | {' | '.join(cells)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the file (the default)")
    mode.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args()
    found = cases()
    print("\n".join(held_by_group(found)))
    text = dumps(document(found))
    if args.check:
        same = OUT.read_text(encoding="utf-8") == text
        print("latency_bands.json is up to date" if same else "latency_bands.json differs: rerun with --write")
        raise SystemExit(0 if same else 1)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
