"""The error band beside every simulated latency: classed by what the GPU's step times rest on, sized on public
runs never fitted on (benchmarks/latency_bands.py -> src/kvbudget/data/latency_bands.json), judged leaving one
GPU out, printed, in the JSON and on the picture; a calibrated time model carries none."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from simkit import LLAMA, cli

from kvbudget import KVBudgetError
from kvbudget.cli.simulate import band_line
from kvbudget.engines.scheduling.workload import exponential_lengths, synthetic
from kvbudget.gpus import find_gpu
from kvbudget.simulation import bands, setup_for, simulate, steptimes
from kvbudget.simulation.bands import Basis

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
DATA = json.loads((resources.files("kvbudget") / "data" / "latency_bands.json").read_text(encoding="utf-8"))
CASES = [bands.CaseError.from_dict(c) for c in DATA["cases"]]


@pytest.mark.parametrize(("gpu", "basis"), [
    ("H100-80GB", Basis.MEASURED), ("A100-80GB", Basis.MEASURED), ("H200", Basis.MEASURED),
    ("RTX-4090", Basis.MEASURED), ("L40S", Basis.MEASURED),
    ("A100-40GB", Basis.SAME_ARCHITECTURE),  # compute capability 8.0, as the measured A100 80GB
    ("L4", Basis.SAME_ARCHITECTURE),  # 8.9, as the RTX 4090 and the L40S
    ("RTX-5090", Basis.SAME_ARCHITECTURE),  # 12.0, as the RTX PRO 6000
    ("A10G", Basis.ACROSS_ARCHITECTURES),  # 8.6: no 8.6 card is measured
    ("T4", Basis.ACROSS_ARCHITECTURES), ("MI300X", Basis.ACROSS_ARCHITECTURES)])
def test_each_gpu_is_classed_by_what_its_step_times_rest_on(gpu, basis):
    kernels = steptimes.kernels_for(find_gpu(gpu))
    assert kernels is not None and kernels.basis is basis


def test_leaving_a_gpu_out_reclasses_it():
    """The H100 without its own measurements takes the H200's (both 9.0), without the H200's too another
    architecture's; the RTX PRO 6000 (12.0) has no measured sibling."""
    h100 = find_gpu("H100-80GB")
    assert steptimes.kernels_for(h100, without=("H100-80GB",)).basis is Basis.SAME_ARCHITECTURE
    assert steptimes.kernels_for(h100, without=("H100-80GB", "H200")).basis is Basis.ACROSS_ARCHITECTURES
    assert steptimes.kernels_for(find_gpu("RTX-PRO-6000"), without=("RTX-PRO-6000",)).basis \
        is Basis.ACROSS_ARCHITECTURES


def case(gpu, basis, e, metric="tpot", architecture=""):
    return bands.CaseError(run=f"{gpu}{e}", gpu=gpu, architecture=architecture, basis=basis, tp=1,
                           errors={metric: e})


def test_the_band_spans_every_run_and_too_few_runs_or_gpus_take_the_wider_bases():
    """Hand-made: 12 measured runs of two GPUs (-10% .. +100%), 3 transferred within an architecture (+50%, +60%,
    -30%), 10 across architectures of one GPU."""
    cases = [case("a", Basis.MEASURED, e / 10) for e in range(-1, 5)]
    cases += [case("b", Basis.MEASURED, e / 10) for e in (0, 2, 4, 6, 8, 10)]
    cases += [case("c", Basis.SAME_ARCHITECTURE, e) for e in (0.5, 0.6, -0.3)]
    cases += [case("d", Basis.ACROSS_ARCHITECTURES, e / 100) for e in range(10)]
    measured = bands.band(cases, Basis.MEASURED, "tpot")
    assert (measured.lower, measured.upper, measured.runs, measured.gpus, measured.widened) \
        == (pytest.approx(-0.1), pytest.approx(1.0), 12, ("a", "b"), False)
    # without b: 6 runs of one GPU, too few: the wider bases' join (c's and d's): -30% to +60%
    alone = bands.band(cases, Basis.MEASURED, "tpot", leave_out={"b"})
    assert alone.widened and alone.runs == 19 and alone.gpus == ("a", "c", "d")
    assert (alone.lower, alone.upper) == (pytest.approx(-0.3), pytest.approx(0.6))
    within = bands.band(cases, Basis.SAME_ARCHITECTURE, "tpot")
    assert within.widened and within.runs == 13 and (within.lower, within.upper) == (-0.3, 0.6)
    # across: 10 runs, but of one GPU; nothing wider: unknown
    assert bands.band(cases, Basis.ACROSS_ARCHITECTURES, "tpot") is None
    assert bands.band(cases, Basis.MEASURED, "ttft") is None  # no run measured it


def test_coverage_counts_each_run_against_the_band_without_its_gpu():
    cases = [case(g, Basis.MEASURED, e) for g, errors in (("a", (0.0, 0.1, 0.2, 0.3, 0.4)),
                                                           ("b", (0.1, 0.2, 0.3, 0.35, 0.9)),
                                                           ("c", (0.05, 0.15, 0.25, 0.35, 0.45)))
             for e in errors]
    # a's against b and c's 0.05..0.9: 0.0 out; b's against 0.0..0.45: 0.9 out; c's against 0.0..0.9: all in
    assert bands.coverage(cases, Basis.MEASURED, "tpot") == (13, 15)


def test_across_architectures_a_run_is_judged_without_its_architectures_runs():
    """Two GPUs of one architecture agree (+100% .. +104% each), two of others are -10% .. +30%: leaving only the
    GPU out each of the two would be inside the other's band; leaving the architecture out, neither is."""
    cases = [case(g, Basis.ACROSS_ARCHITECTURES, 1.0 + e / 100, architecture="8.0") for g in ("a40", "a80")
             for e in range(5)]
    cases += [case(g, Basis.ACROSS_ARCHITECTURES, e / 10, architecture=arch)
              for g, arch in (("h", "9.0"), ("r", "12.0")) for e in range(-1, 4)]
    assert bands.left_out(cases, Basis.ACROSS_ARCHITECTURES, "compute capability 8.0") == {"a40", "a80"}
    assert bands.coverage(cases, Basis.ACROSS_ARCHITECTURES, "tpot") == (10, 20)  # h's and r's inside
    whole = bands.bands(cases)[Basis.ACROSS_ARCHITECTURES.value]["tpot"]
    assert whole["leave_one_out"] == {"inside": 10, "runs": 20, "by": "architecture"}
    # a measured basis leaves the GPU out only: a40 and a80 judge each other (with h and r: -10% .. +104%)
    measured = [replace(c, basis=Basis.MEASURED) for c in cases]
    assert bands.coverage(measured, Basis.MEASURED, "tpot") == (20, 20)


@pytest.fixture(scope="module")
def script():
    sys.path[:0] = [str(BENCHMARKS)]
    import latency_bands

    yield latency_bands
    del sys.path[:1]


def test_the_band_file_is_what_its_cases_give(script):
    """The bands in the file follow from its cases by the rule (the cases themselves: next test); every case is
    of a held-out run."""
    import served

    assert DATA["min_runs"] == bands.MIN_RUNS and DATA["min_gpus"] == bands.MIN_GPUS
    assert json.loads(json.dumps(bands.bands(CASES))) == DATA["bands"]
    runs = {r["id"]: r for r in served.runs()}
    for c in CASES:
        assert runs[c.run.split("#")[0]]["split"] == "validate"  # never fitted on
        assert c.architecture == (find_gpu(c.gpu).compute_capability or "")
    assert DATA["engines"] == sorted({r["engine"].split()[0].lower() for r in runs.values()}) == ["vllm"]


@pytest.mark.parametrize(("run_id", "measured_sibling"), [("a100-qwen2-7b-test4-03", False),  # no other 8.0
                                                          ("gpustack-glm-4.x-h200-random-128", True)])  # the H100
def test_the_cases_are_the_replayed_runs(script, run_id, measured_sibling):
    """A few runs replayed as the script does, once per basis: the same errors as the file records."""
    import served

    (run,) = [r for r in served.runs() if r["id"] == run_id]
    replayed = []
    for without in script.left_out(run["gpu"]):
        basis = steptimes.kernels_for(find_gpu(run["gpu"]), without=without).basis
        replayed += [script.case_error(c, basis).to_dict() for c in script.replay(run, without)
                     if basis.value not in {r["basis"] for r in replayed}]
    assert [r["basis"] for r in replayed] == [b.value for b in Basis
                                              if measured_sibling or b is not Basis.SAME_ARCHITECTURE]
    assert replayed == [c for c in DATA["cases"] if c["run"].split("#")[0] == run_id]


def outside_own_gpu(metric: str, basis: Basis) -> tuple[int, int]:
    """Leaving one GPU out (across architectures: one architecture), counted here from the recorded runs (not
    from the code under test): each run of `basis` against the lowest to the highest error of the other GPUs'
    runs of its basis, the wider bases' runs joining while there are fewer than 10 runs or 2 GPUs."""
    order = list(Basis)
    key = "architecture" if basis is Basis.ACROSS_ARCHITECTURES else "gpu"
    cases = [c for c in DATA["cases"] if metric in c]
    mine = [c for c in cases if c["basis"] == basis.value]
    inside = 0
    for unit in {c[key] for c in mine}:
        for wider in range(order.index(basis), len(order)):
            pool = {b.value for b in order[order.index(basis):wider + 1]}
            others = [o for o in cases if o["basis"] in pool and o[key] != unit]
            if len(others) >= 10 and len({o["gpu"] for o in others}) >= 2:
                low, high = min(o[metric] for o in others), max(o[metric] for o in others)
                inside += sum(low <= c[metric] <= high for c in mine if c[key] == unit)
                break
    return inside, len(mine)


def key_of(basis: Basis) -> str:
    return "architecture" if basis is Basis.ACROSS_ARCHITECTURES else "GPU"


# (basis, metric) whose leave-one-GPU-out coverage is short of 80% today, and why (strict: when a better time
# model and `latency_bands.py --write` bring them to 80%, these turn to failures, to be moved out of here)
SHORT = {
    (Basis.MEASURED, "ttft"): "the A100 at TP 2: half its runs' TTFT shorter than simulated (to -87%), every other "
                              "GPU's longer (from +4%)",
    (Basis.SAME_ARCHITECTURE, "tpot"): "the A100 40GB at TP 2 runs 2.8-3.8 times as slow as simulated from the A100 "
                                       "80GB's kernels, beyond the other GPUs' runs",
    (Basis.ACROSS_ARCHITECTURES, "ttft"): "without the A100s' runs the band starts at -12%: 22 of the 64 A100 runs "
                                          "have a TTFT shorter still (to -91%)",
}


@pytest.mark.parametrize(("basis", "metric"), [(b, m) for b in Basis for m in bands.METRICS])
def test_the_true_value_lies_in_the_band_for_80_percent_of_runs_leaving_one_gpu_out(request, basis, metric):
    """Each recorded run against the band sized without any run of its GPU, counted by the test; the file's and
    simulate's count is the same (the recorded errors are the replayed runs': the test above and
    `latency_bands.py --check`)."""
    inside, runs = outside_own_gpu(metric, basis)
    assert DATA["bands"][basis.value][metric]["leave_one_out"] == {"inside": inside, "runs": runs,
                                                                   "by": key_of(basis)}
    if (basis, metric) in SHORT:
        request.applymarker(pytest.mark.xfail(reason=SHORT[basis, metric], strict=True))
    assert runs and inside >= 0.8 * runs, f"{inside} of {runs}"


@pytest.mark.parametrize(("gpu", "basis"), [("H100", Basis.MEASURED), ("L4", Basis.SAME_ARCHITECTURE),
                                             ("MI300X", Basis.ACROSS_ARCHITECTURES)])
def test_simulate_prints_and_writes_the_band(capsys, gpu, basis):
    argv = ("simulate", "llama-3.1-8b", "--gpu", gpu, "--rate", "2", "--requests", "30", "--max-model-len", "8192")
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    file = DATA["bands"][basis.value]
    for key, metric in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e")):
        assert {"p50", "p90", "p99", "mean", "max"} <= set(data[key])  # every key kept
        assert data[key]["band"] == file[metric]
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    text = " ".join(out.split())
    assert "true means likely: TTFT " in text and f"({basis.value} basis;" in text
    low = data["tpot_s"]["mean"] * (1 + file["tpot"]["lower"])
    assert f"TPOT {low * 1000:.3g}ms-" in text
    # where a band held under 80% of the runs leaving their GPU out, it says so (the worst of the three)
    held = [(file[m]["leave_one_out"]["inside"], file[m]["leave_one_out"]["runs"]) for m in bands.METRICS]
    short = [(inside, runs) for inside, runs in held if inside < 0.8 * runs]
    assert ("held only" in text) == bool(short)
    if short:
        inside, runs = min(short, key=lambda s: s[0] / s[1])
        assert f"sized without their {key_of(basis)}, " in text and f"held only {inside} of {runs}" in text


def test_a_widened_band_says_whose_runs_joined(monkeypatch):
    """A band sized with the wider bases' runs says so beside the figures, and the held-out count is per metric."""
    widened = {"lower": -0.5, "upper": 1.0, "basis": Basis.MEASURED.value, "runs": 12, "gpus": ["a", "b"],
               "widened": True, "leave_one_out": {"inside": 9, "runs": 10, "by": "GPU"}}
    doc = {"engines": ["vllm"], "bands": {Basis.MEASURED.value: {"ttft": widened, "tpot": widened, "e2e": None}}}
    monkeypatch.setattr(bands, "_data", lambda: doc)
    sim = simulate(LLAMA, synthetic(2, 10, exponential_lengths(300, 50, 2000), seed=1), gpu="H100",
                   max_model_len=8192)
    line = " ".join(band_line(sim).split())
    low, high = sim.tpot.mean * 0.5 * 1000, sim.tpot.mean * 2 * 1000
    assert f"TPOT {low:.3g}ms-{high:.3g}ms" in line and "E2E" not in line
    assert "(measured basis; where all 12 held-out runs of 2 GPUs lay, too few of its own: the wider bases' joined)" \
        in line  # 9 of 10 held: no "held only"
    assert sim.to_dict()["e2e_s"]["band"] is None and sim.to_dict()["tpot_s"]["band"] == widened


def test_a_calibrated_time_model_carries_no_band():
    """A kernel model scaled by a calibration is judged by no held-out runs: unknown, in the JSON and printed."""
    kernels = setup_for(LLAMA, gpu="H100", max_model_len=8192).time_model
    assert kernels.band_basis == Basis.MEASURED.value
    calibrated = kernels.scaled(1.2, 0.9, "calibrated on 1 benchmark run", 0.02)
    sim = simulate(LLAMA, synthetic(2, 20, exponential_lengths(300, 50, 2000), seed=1), gpu="H100",
                   max_model_len=8192, time_model=calibrated)
    assert bands.band_for(sim.setup, "tpot") is None
    assert sim.to_dict()["tpot_s"]["band"] is None and sim.to_dict()["ttft_s"]["band"] is None
    assert band_line(sim).startswith("true means: error band unknown")


def test_a_basis_no_runs_judge_is_refused_in_one_line():
    kernels = setup_for(LLAMA, gpu="H100", max_model_len=8192).time_model
    with pytest.raises(KVBudgetError, match="time_model.band_basis 'guessed': not a basis") as e:
        bands.band_for(setup_for(LLAMA, gpu="H100", max_model_len=8192,
                                 time_model=replace(kernels, band_basis="guessed")), "tpot")
    assert e.value.param == "time_model"


@pytest.mark.parametrize("argv", [("--engine", "llamacpp"), ("--engine", "sglang"), ("--allocator", "contiguous-max")])
def test_engines_no_held_out_runs_judge_carry_no_band(capsys, argv):
    """The held-out runs are all vLLM's with its paged allocator: other engines' (and the baselines') times, on
    the same kernels, carry no band."""
    base = ("simulate", "llama-3.1-8b", "--gpu", "H100", "--rate", "2", "--requests", "10", "--max-model-len", "8192")
    code, out, err = cli(capsys, *base, *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["setup"]["time_model"]["band_basis"] == Basis.MEASURED.value
    assert data["tpot_s"]["band"] is None and data["e2e_s"]["band"] is None
    code, out, err = cli(capsys, *base, *argv)
    assert "error band unknown (no held-out runs judge" in " ".join(out.split())
