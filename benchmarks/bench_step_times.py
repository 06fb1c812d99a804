"""How close `kvbudget simulate`'s latencies come to real vLLM runs it was never fitted on (benchmarks/data/served):
19 public runs (RTX 4090, RTX PRO 6000, H100; 1 to 4 GPUs; light load to overload), replayed with

1. the default time model (kernels fitted on public per-operation measurements, src/kvbudget/data/steptimes),
2. the roofline over datasheet peaks it replaces (same run, for comparison),
3. each GPU's kernels left out and transferred from the other GPUs (how well the model transfers),
4. calibrated on one run of the same GPU (two factors), then predicting that GPU's other runs.

Prints every case beside the targets: mean TPOT and end-to-end latency within 15%, mean TTFT within 25%
(uncalibrated); within 5% calibrated. Asserts nothing. Takes about a minute and a half (--quick: no
calibration).

    python benchmarks/bench_step_times.py [--quick] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import served

from kvbudget.simulation import steptimes
from kvbudget.simulation.fit import START_LATENCY_S, search

TARGETS = {"ttft": 0.25, "tpot": 0.15, "e2e": 0.15}
CALIBRATED_TARGET = 0.05
ANCHORS = ("published errors of other simulators against vLLM 0.15 on H100, A100 and L40S (the sim-to-real "
           "comparison, github:inference-sim/sim-to-real-accuracy-validation): BLIS ~10% median end-to-end, "
           "LLMServingSim ~19%, analytical estimators ~65%, Vidur over 1,000% on V1-era runs")


def label(c: served.Case) -> str:
    stage = f" stage {c.stage + 1}" if c.run[0].isdigit() else ""
    name = c.run.split("-", 2)[2] if c.run[0].isdigit() else c.run
    return f"{c.gpu} {name}{stage} @{c.rate:.1f}/s"


def table(cases: list[served.Case], title: str, markdown: bool) -> None:
    print(f"\n{title}")
    if markdown:
        print("| case | TP | load | TTFT mean real / sim | TPOT mean | E2E mean | TTFT p50 / p90 err | "
              "TPOT p50 / p90 err | E2E p50 / p90 err |")
        print("|---|---|---|---|---|---|---|---|---|")
    for c in cases:
        load = "saturated" if c.saturated else "not saturated"
        if c.excluded:
            print(f"| {label(c)} | {c.tp} | {load} | left out: {c.excluded} | | | | | |" if markdown else
                  f"  {label(c):58} left out: {c.excluded}")
            continue
        cells = [f"{c.real[m]['mean'] * (1000 if m == 'tpot' else 1):.3g} / "
                 f"{c.simulated[m]['mean'] * (1000 if m == 'tpot' else 1):.3g} ({c.error(m):+.0%})"
                 for m in ("ttft", "tpot", "e2e")]
        tails = [f"{c.error(m, 'p50'):+.0%} / {c.error(m, 'p90'):+.0%}" if "p50" in c.real[m] else "—"
                 for m in ("ttft", "tpot", "e2e")]
        if markdown:
            print(f"| {label(c)} | {c.tp} | {load} | {' | '.join(cells)} | {' | '.join(tails)} |")
        else:
            print(f"  {label(c):58} TTFT {cells[0]:26} TPOT(ms) {cells[1]:24} E2E {cells[2]:24}")


def summary(cases: list[served.Case], title: str, targets: dict[str, float]) -> dict[str, float]:
    kept = [c for c in cases if not c.excluded]
    out = {}
    print(f"\n{title}: {len(kept)} cases")
    for m in ("ttft", "tpot", "e2e"):
        errors = [abs(c.error(m)) for c in kept if not math.isnan(c.error(m))]
        within = sum(e <= targets[m] for e in errors)
        out[m] = statistics.median(errors)
        print(f"  mean {m.upper():4}: median |error| {statistics.median(errors):6.1%}, p90 "
              f"{sorted(errors)[int(0.9 * (len(errors) - 1))]:6.1%}, within {targets[m]:.0%}: {within}/{len(errors)}")
    return out


def by_group(cases: list[served.Case]) -> None:
    groups: dict[str, list[served.Case]] = {}
    for c in cases:
        if not c.excluded:
            groups.setdefault(f"{c.gpu} TP{c.tp} {'saturated' if c.saturated else 'not saturated'}", []).append(c)
    print("\nby GPU, TP and load (median |error| of the mean: TTFT / TPOT / E2E)")
    for key, cs in sorted(groups.items()):
        errs = [statistics.median(abs(c.error(m)) for c in cs) for m in ("ttft", "tpot", "e2e")]
        print(f"  {key:40} {len(cs):2} cases  {errs[0]:6.1%} {errs[1]:6.1%} {errs[2]:6.1%}")


def roofline_cases() -> list[served.Case]:
    saved = steptimes.kernels_for
    steptimes.kernels_for = lambda card, without=(): None  # type: ignore[assignment]
    try:
        return served.all_cases()
    finally:
        steptimes.kernels_for = saved  # type: ignore[assignment]


def transferred_cases() -> list[served.Case]:
    """The runs of each measured GPU, with that GPU's own measurements left out."""
    saved = steptimes.kernels_for
    out = []
    for run in served.measured_gpu_runs():
        if run["gpu"] == "H100-80GB":
            continue  # (the H100's own fit keeps too little to leave out: its attention and norms are transferred)
        steptimes.kernels_for = lambda card, without=(), gpu=run["gpu"]: saved(card, without=(gpu,))  # type: ignore
        try:
            out += served.replay(run)
        finally:
            steptimes.kernels_for = saved  # type: ignore[assignment]
    return out


def calibrated_cases() -> list[tuple[str, served.Case]]:
    """Per GPU with two runs or more: `calibrate_requests`' three parameters fitted on its first run's mean TTFT,
    TPOT and end-to-end latency (what the runs publish), applied to its other runs."""
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for run in served.measured_gpu_runs():
        by_gpu.setdefault(run["gpu"], []).append(run)
    out = []
    for gpu, runs in by_gpu.items():
        if len(runs) < 2:
            continue
        first = runs[0]
        base = served.default_time_model(first)

        def loss(p: list[float], first: dict[str, Any] = first, base: Any = base) -> float:
            cases = served.replay(first, base.scaled(p[0], p[1], "trial", p[2]))
            return sum(math.log(max(c.simulated[m]["mean"], 1e-9) / c.real[m]["mean"]) ** 2
                       for c in cases for m in ("ttft", "tpot", "e2e"))

        fixed, work, latency = search(loss, [1.0, 1.0, START_LATENCY_S])
        note = (f"{gpu}: calibrated on {first['id']} (fixed costs x {fixed:.2f}, the rest x {work:.2f}, "
                f"{latency * 1000:.1f} ms a request outside the engine)")
        for run in runs[1:]:
            model = served.default_time_model(run).scaled(fixed, work, "calibrated", latency)
            out += [(note, c) for c in served.replay(run, model)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="leave out the calibration (the slow part)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    cases = served.all_cases()
    table(cases, "uncalibrated: the default time model (kernels fitted on per-operation measurements)",
          args.markdown)
    summary(cases, "uncalibrated", TARGETS)
    by_group(cases)
    summary(roofline_cases(), "the roofline over datasheet peaks (the previous default), same runs", TARGETS)
    moved = transferred_cases()
    table(moved, "each GPU's own measurements left out: kernels transferred from the other GPUs", args.markdown)
    summary(moved, "transferred", TARGETS)
    if not args.quick:
        pairs = calibrated_cases()
        for note in dict.fromkeys(n for n, _ in pairs):
            print(f"\n{note}")
        table([c for _, c in pairs], "calibrated on one run of the same GPU, predicting its other runs",
              args.markdown)
        summary([c for _, c in pairs], "calibrated", dict.fromkeys(TARGETS, CALIBRATED_TARGET))
    print(f"\nanchors: {ANCHORS}")


if __name__ == "__main__":
    main()
