"""The error band beside every simulated latency: classed by what the GPU's step times rest on, sized on public
runs never fitted on (benchmarks/latency_bands.py -> src/kvbudget/data/latency_bands.json), judged leaving one
GPU out, printed, in the JSON and on the picture; a calibrated time model carries none."""

from __future__ import annotations

import json
import statistics
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
    ("H100-80GB", Basis.MEASURED), ("RTX-4090", Basis.MEASURED),
    ("H200", Basis.SAME_GENERATION),  # Hopper, as the measured H100
    ("L40S", Basis.SAME_GENERATION),  # Ada Lovelace, as the measured RTX 4090
    ("B200", Basis.SAME_GENERATION),  # Blackwell, as the measured RTX PRO 6000
    ("A100-80GB", Basis.ACROSS_GENERATIONS),  # Ampere: no Ampere card is measured
    ("T4", Basis.ACROSS_GENERATIONS), ("MI300X", Basis.ACROSS_GENERATIONS)])
def test_each_gpu_is_classed_by_what_its_step_times_rest_on(gpu, basis):
    kernels = steptimes.kernels_for(find_gpu(gpu))
    assert kernels is not None and kernels.basis is basis


def test_leaving_a_gpu_out_reclasses_it():
    """The H200 without the H100's measurements has no Hopper donor; the H100 without its own is transferred."""
    assert steptimes.kernels_for(find_gpu("H200"), without=("H100-80GB",)).basis is Basis.ACROSS_GENERATIONS
    assert steptimes.kernels_for(find_gpu("H100-80GB"), without=("H100-80GB",)).basis is Basis.ACROSS_GENERATIONS


def test_quantile_is_the_linear_one():
    values = [0.3, -0.1, 0.05, 0.8, 0.2, 0.0, 0.4, 1.5, -0.2, 0.1, 0.6]
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    assert bands.quantile(values, 0.1) == pytest.approx(deciles[0])
    assert bands.quantile(values, 0.9) == pytest.approx(deciles[-1])


def test_few_runs_widen_over_the_wider_basis_and_none_is_unknown():
    """Hand-made: 3 measured runs (errors +10%, -20%, +50%) and 10 transferred ones (-10% .. +80%)."""
    def case(gpu, basis, e):
        return bands.CaseError(run=f"{gpu}{e}", gpu=gpu, basis=basis, errors={"tpot": e})

    cases = [case("a", Basis.MEASURED, e) for e in (0.1, -0.2, 0.5)]
    cases += [case("b", Basis.ACROSS_GENERATIONS, e / 10) for e in range(-1, 9)]
    measured = bands.band(cases, Basis.MEASURED, "tpot")
    # +50% is a factor 1.5: as far down is 1 / 1.5 - 1 = -33%; the transferred band reaches +71% (its 90th pct.)
    assert measured.widened and measured.lower == pytest.approx(1 / 1.5 - 1)
    assert measured.upper == pytest.approx(0.71) and measured.runs == 13
    assert bands.band(cases, Basis.MEASURED, "tpot", leave_out="b").lower == pytest.approx(1 / 1.5 - 1)
    assert bands.band(cases, Basis.ACROSS_GENERATIONS, "tpot", leave_out="b") is None


def test_the_band_file_is_what_its_cases_give():
    """The bands in the file follow from its cases by the rule (the cases themselves: next test)."""
    assert DATA["quantiles"] == list(bands.QUANTILES) and DATA["min_runs"] == bands.MIN_RUNS
    assert json.loads(json.dumps(bands.bands(CASES))) == DATA["bands"]
    runs = {r["id"]: r for r in json.loads((BENCHMARKS / "data" / "served" / "runs.json").read_text())["runs"]}
    for c in CASES:
        assert runs[c.run.split("#")[0]]["split"] == "validate"  # never fitted on
    assert DATA["engines"] == sorted({r["engine"].split()[0].lower() for r in runs.values()}) == ["vllm"]


@pytest.fixture(scope="module")
def script():
    sys.path[:0] = [str(BENCHMARKS)]
    import latency_bands

    yield latency_bands
    del sys.path[:1]


@pytest.mark.parametrize("run_id", ["a100-qwen2-7b-test4-03", "a100-qwen2-7b-test2-05", "rtx-4090-llama-3.1-8b"])
def test_the_cases_are_the_replayed_runs(script, run_id):
    """A few runs replayed as the script does: the same basis and the same errors as the file records."""
    import served

    (run,) = [r for r in served.runs() if r["id"] == run_id]
    basis = served.default_time_model(run).band_basis
    replayed = [script.case_error(c, basis).to_dict() for c in served.replay(run)]
    recorded = [c for c in DATA["cases"] if c["run"].split("#")[0] == run_id and c["basis"] == basis]
    assert replayed == recorded


# (basis, metric) whose leave-one-GPU-out coverage is short of 80% today, and why (the target: met when
# the per-operation data for these GPUs lands and the script is rerun; then these xfails turn to failures)
SHORT = {
    (Basis.SAME_GENERATION, "ttft"): "one GPU (H200, 8 runs): left out, the across-generations band is used",
    (Basis.SAME_GENERATION, "e2e"): "one GPU (H200, 8 runs): left out, the across-generations band is used",
    **{(Basis.ACROSS_GENERATIONS, m): "two GPUs disagree: the A100 runs up to 3.2 times as slow as simulated, "
       "the H100 transferred from the RTX cards within 12%; each left out is judged by the other"
       for m in bands.METRICS},
}


@pytest.mark.parametrize(("basis", "metric"), [(b, m) for b in Basis for m in bands.METRICS])
def test_the_true_value_lies_in_the_band_for_80_percent_of_runs_leaving_one_gpu_out(request, basis, metric):
    """Each recorded run against the band sized without any run of its GPU (the recorded errors are the replayed
    runs': the test above and `latency_bands.py --check`)."""
    if (basis, metric) in SHORT:
        request.applymarker(pytest.mark.xfail(reason=SHORT[basis, metric], strict=True))
    mine = [c for c in CASES if c.basis is basis]
    inside = 0
    for c in mine:
        b = bands.band(CASES, basis, metric, leave_out=c.gpu)
        assert c.gpu not in b.gpus  # its own GPU never sizes its band
        inside += b.lower <= c.errors[metric] <= b.upper
    assert mine and inside >= 0.8 * len(mine), f"{inside} of {len(mine)}"


@pytest.mark.parametrize(("gpu", "basis"), [("H100", Basis.MEASURED), ("H200", Basis.SAME_GENERATION),
                                             ("A100-80GB", Basis.ACROSS_GENERATIONS)])
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
    # where the band did not carry to a GPU left out, it says so (the A100's: TPOT held 6 of 76)
    assert ("held only" in text) == (basis is not Basis.MEASURED)


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
