"""Calibrating the time model on measured runs: recorder logs, benchmark results and latency histograms."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from simkit import LLAMA, cli

from kvbudget.engines.scheduling.workload import exponential_lengths, read_trace, synthetic
from kvbudget.simulation.run import Percentiles, simulate


def _recorder_log(path: Path, law) -> None:
    """A log as kvbudget.simulation.recorder writes it, its steps taking law(tokens, context) seconds."""
    t, lines = 100.0, ['{"start": true}', '{"add": "a", "prompt": [1], "max_tokens": 5}']
    for i in range(60):
        tokens, context = (1 + (i % 7) * 40, 300 + 97 * i) if i % 3 else (8, 50 + i)
        lines.append(json.dumps({"step": [["a", tokens]], "preempted": [], "t": t, "tokens": tokens,
                                 "context": context, "free": 1, "usage": 0.5}))
        if i == 30:
            lines.append('{"add": "b", "prompt": [1], "max_tokens": 5}')  # idle time may follow: not a step time
            t += 50
        t += law(tokens, context)
    path.write_text("\n".join(lines) + "\n")

def test_calibration_recovers_a_known_step_time_law(tmp_path, capsys):
    from kvbudget.engines.scheduling.timing import read_measured_steps
    from kvbudget.simulation import setup_for

    log = tmp_path / "steps.jsonl"
    _recorder_log(log, lambda tokens, context: 0.004 + 2e-6 * context)
    steps = read_measured_steps(log)
    assert len(steps) == 58  # 60 steps, less the last (no next start) and the one before the arrival
    setup = setup_for(LLAMA, kv_memory=2**31, max_model_len=8192, measured=steps)
    for context in (100, 5000, 40000):
        assert setup.time_model.step_seconds(1, context) == pytest.approx(0.004 + 2e-6 * context, rel=1e-6)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--kv-memory", "2GiB", "--max-model-len", "8192",
                         "--rate", "1", "--requests", "20", "--calibrate", str(log), "--json")
    assert code == 0, err
    assert json.loads(out)["setup"]["time_model"]["basis"] == "calibrated on 58 measured steps"

def _bench_file(path: Path, setup, seed: int) -> None:
    """A `vllm bench serve --save-detailed` result for requests served under `setup`'s time model."""
    rows: list = []
    simulate(LLAMA, synthetic(3, 300, exponential_lengths(600, 150, 8000), seed=seed), setup=setup,
             on_finish=lambda r, ttft, tpot, e2e: rows.append((r, ttft, tpot)))
    path.write_text(json.dumps({
        "start_times": [1000 + r.arrival for r, _, _ in rows], "input_lens": [r.prompt_tokens for r, _, _ in rows],
        "output_lens": [r.output_tokens for r, _, _ in rows], "ttfts": [t for _, t, _ in rows],
        "itls": [[p] * (r.output_tokens - 1) if p else [] for r, _, p in rows], "errors": [""] * len(rows)}))

def test_calibration_on_a_benchmark_runs_requests_predicts_another_run(tmp_path, capsys):
    """Fit on one run's measured TTFT / inter-token latencies, predict a run of other requests: the step time
    behind both is a known law the fit never sees."""
    from kvbudget.simulation import TimeModel, setup_for
    from kvbudget.simulation.fit import calibrate_requests, initial_model, read_bench_result

    truth = replace(setup_for(LLAMA, gpu="L4", max_model_len=8192),
                    time_model=TimeModel(weights=0.0, per_context=3e-7, per_token=6e-5, overhead=0.006, bound="sum",
                                         basis="truth"))
    _bench_file(tmp_path / "fit.json", truth, seed=1)
    _bench_file(tmp_path / "other.json", truth, seed=2)
    bench = read_bench_result(tmp_path / "fit.json")
    fitted = calibrate_requests(LLAMA, bench, replace(truth, time_model=initial_model(bench)))
    assert fitted.basis == "calibrated on 300 benchmark requests"
    other = read_bench_result(tmp_path / "other.json")
    ours = simulate(LLAMA, iter(other.requests), setup=replace(truth, time_model=fitted))
    ttft, tpot = Percentiles.of(other.ttft), Percentiles.of(other.tpot)
    assert ours.ttft.p50 == pytest.approx(ttft.p50, rel=0.05) and ours.ttft.p90 == pytest.approx(ttft.p90, rel=0.05)
    assert ours.tpot.p50 == pytest.approx(tpot.p50, rel=0.05)
    # the fixed and the per-context parts trade off against each other: the tail of TPOT is matched loosely
    assert ours.tpot.p90 == pytest.approx(tpot.p90, rel=0.3)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate",
                         "2", "--requests", "50", "--calibrate", str(tmp_path / "fit.json"), "--json")
    assert code == 0, err
    assert "calibrated on 300 benchmark requests" in json.loads(out)["setup"]["time_model"]["basis"]

# vLLM 0.32's histogram buckets (vllm/v1/metrics/buckets.py): TTFT, and inter-token latency (which the
# per-request time per output token uses too)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)

ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)

def _metrics_file(path: Path, trace: Path, setup, seed: int) -> None:
    """The trace a server served (our JSONL), and its /metrics afterwards: vLLM's two latency histograms."""
    rows: list = []
    requests = list(synthetic(3, 300, exponential_lengths(600, 150, 8000), seed=seed))
    trace.write_text("".join(json.dumps({"arrival": r.arrival, "prompt_tokens": r.prompt_tokens,
                                         "output_tokens": r.output_tokens}) + "\n" for r in requests))
    simulate(LLAMA, iter(requests), setup=setup, on_finish=lambda r, ttft, tpot, e2e: rows.append((ttft, tpot)))
    lines = []
    for metric, buckets, values in (("vllm:time_to_first_token_seconds", TTFT_BUCKETS, [t for t, _ in rows]),
                                    ("vllm:request_time_per_output_token_seconds", ITL_BUCKETS,
                                     [p or 0.0 for _, p in rows])):
        lines.append(f"# TYPE {metric} histogram")
        for le in (*buckets, "+Inf"):
            count = sum(1 for v in values if le == "+Inf" or v <= le)
            lines.append(f'{metric}_bucket{{engine="0",le="{le}",model_name="llama"}} {float(count)}')
        lines.append(f'{metric}_count{{engine="0",model_name="llama"}} {float(len(values))}')
        lines.append(f'{metric}_sum{{engine="0",model_name="llama"}} {sum(values)}')
    path.write_text("\n".join(lines) + "\n")

def test_calibration_on_vllm_latency_histograms_predicts_another_run(tmp_path, capsys):
    """vLLM's /metrics after serving a known trace: the TTFT and per-request TPOT histograms (vLLM's own buckets;
    TPOT's first is 10 ms wide, so below it only the exact mean, _sum / _count, says anything) fit the step
    time."""
    from kvbudget.simulation import TimeModel, setup_for
    from kvbudget.simulation.fit import calibrate_requests, initial_model, read_calibration

    truth = replace(setup_for(LLAMA, gpu="L4", max_model_len=8192),
                    time_model=TimeModel(weights=0.0, per_context=3e-7, per_token=6e-5, overhead=0.006, bound="sum",
                                         basis="truth"))
    _metrics_file(tmp_path / "fit.prom", tmp_path / "fit.jsonl", truth, seed=1)
    _metrics_file(tmp_path / "other.prom", tmp_path / "other.jsonl", truth, seed=2)
    bench = read_calibration(tmp_path / "fit.prom", lambda: read_trace(tmp_path / "fit.jsonl"))
    fitted = calibrate_requests(LLAMA, bench, replace(truth, time_model=initial_model(bench)))
    other = read_calibration(tmp_path / "other.prom", lambda: read_trace(tmp_path / "other.jsonl"))
    measured = [], []
    simulate(LLAMA, iter(other.requests), setup=truth,
             on_finish=lambda r, ttft, tpot, e2e: (measured[0].append(ttft), measured[1].append(tpot)))
    ours = simulate(LLAMA, iter(other.requests), setup=replace(truth, time_model=fitted))
    ttft, tpot = Percentiles.of(tuple(measured[0])), Percentiles.of(tuple(t for t in measured[1] if t))
    ratios = (ours.ttft.p50 / ttft.p50, ours.ttft.p90 / ttft.p90, ours.tpot.p50 / tpot.p50, ours.tpot.p90 / tpot.p90)
    assert ours.ttft.p50 == pytest.approx(ttft.p50, rel=0.15) and ours.ttft.p90 == pytest.approx(ttft.p90, rel=0.15)
    assert ours.tpot.p50 == pytest.approx(tpot.p50, rel=0.15) and ours.tpot.p90 == pytest.approx(tpot.p90, rel=0.3)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--trace",
                         str(tmp_path / "fit.jsonl"), "--calibrate", str(tmp_path / "fit.prom"), "--json")
    assert code == 0, err
    assert "calibrated on 300 benchmark requests" in json.loads(out)["setup"]["time_model"]["basis"]
    for argv, message in ((["--rate", "2"], "give the trace the server served (--trace FILE)"),
                          (["--trace", str(tmp_path / "other.jsonl"), "--slice", "0:100"],
                           "counts 300 requests, the trace has 100")):
        code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192",
                             "--calibrate", str(tmp_path / "fit.prom"), *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    print("fitted / true, TTFT p50 p90, TPOT p50 p90:", *(f"{r:.3f}" for r in ratios))


def test_a_calibration_is_saved_by_name_and_reused(tmp_path, capsys, monkeypatch):
    """--save-calibration keeps the fitted step time; --calibration NAME gives the same simulation without the
    measurements; another GPU or model is refused, as is a name that is not one, before any work."""
    monkeypatch.setenv("KVBUDGET_CALIBRATIONS", str(tmp_path / "kept"))
    log = tmp_path / "steps.jsonl"
    _recorder_log(log, lambda tokens, context: 0.004 + 2e-6 * context)
    base = ("simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate", "1", "--requests", "20",
            "--json")
    code, fitted, err = cli(capsys, *base, "--calibrate", str(log), "--save-calibration", "l4-llama")
    assert code == 0 and "kept/l4-llama.json (--save-calibration)" in err
    saved = json.loads((tmp_path / "kept" / "l4-llama.json").read_text())
    assert saved["gpu"] == "L4" and saved["model"] == "llama-3.1-8b" and saved["source"] == str(log)
    code, reused, err = cli(capsys, *base, "--calibration", "l4-llama")
    assert code == 0 and json.loads(reused) == json.loads(fitted)
    for argv, message in ((("--gpu", "H100"), "fitted for GPU L4, not H100-80GB"),
                          (("--calibration", "nope"), "no such calibration"),
                          (("--calibrate", str(log), "--save-calibration", "../x"), "--save-calibration '../x'"),
                          (("--save-calibration", "x"), "--save-calibration goes with --calibrate"),
                          (("--calibrate", str(log)), "give one of them")):
        extra = argv if argv[0] != "--gpu" else (*argv, "--calibration", "l4-llama")
        if argv[0] == "--calibrate" and "--save-calibration" not in argv:
            extra = (*argv, "--calibration", "l4-llama")
        code, out, err = cli(capsys, *base, *extra)
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, (argv, err)


def test_saving_a_calibration_again_replaces_it_says_so_and_leaves_nothing_else(tmp_path, capsys, monkeypatch):
    """Saving under a name again is how a calibration is updated: said on stderr ("replaced"), the file's mode
    kept, no `NAME.tmp` left; a folder that cannot hold it is refused before the fit."""
    import stat

    kept = tmp_path / "kept"
    monkeypatch.setenv("KVBUDGET_CALIBRATIONS", str(kept))
    log = tmp_path / "steps.jsonl"
    _recorder_log(log, lambda tokens, context: 0.004 + 2e-6 * context)
    base = ("simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate", "1", "--requests", "20",
            "--json", "--calibrate", str(log), "--save-calibration", "l4")
    code, _, err = cli(capsys, *base)
    assert code == 0 and f"kvbudget: wrote {kept / 'l4.json'} (--save-calibration)" in err
    (kept / "l4.json").chmod(0o600)
    code, _, err = cli(capsys, *base)
    assert code == 0 and f"kvbudget: replaced {kept / 'l4.json'} (--save-calibration)" in err
    assert {p.name for p in kept.iterdir()} == {"l4.json"} and stat.S_IMODE((kept / "l4.json").stat().st_mode) == 0o600
    (tmp_path / "plain").write_text("")
    monkeypatch.setenv("KVBUDGET_CALIBRATIONS", str(tmp_path / "plain" / "kept"))
    import kvbudget.simulation.fit as fit

    monkeypatch.setattr(fit, "read_calibration", lambda *a: pytest.fail("the fit started"))
    code, out, err = cli(capsys, *base)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("kvbudget: error: --save-calibration")


STEP = '{"step": [["a", 8]], "t": 1.0, "tokens": 8, "context": 50}\n'


@pytest.mark.parametrize("content, words", [
    ('{"start_times": [' + "9" * 5000 + "]}\n", ":1: invalid JSON: a number of over 4,300 digits"),
    (STEP + '{"step": [["a", 8]], "t": 2.0, "tokens": 1e400, "context": 50}\n', ":2: a step without tokens"),
    (STEP + '{"step": [["a", 8]], "t": 1e400, "tokens": 8, "context": 50}\n', ":2: a step without tokens"),
])
def test_a_hostile_calibration_file_is_one_line_naming_its_line(tmp_path, content, words):
    """A 5,000-digit number (a ValueError from the JSON parser) or an infinite count in a step (an OverflowError)
    escaped the calibration readers; an infinite time was taken as a step."""
    from kvbudget.errors import KVBudgetError
    from kvbudget.simulation.fit import read_calibration

    path = tmp_path / "run.json"
    path.write_text(content)
    with pytest.raises(KVBudgetError) as e:
        read_calibration(path)
    assert str(e.value).startswith(f"{path}{words}") and e.value.param == "calibrate", str(e.value)


def test_a_recorder_log_is_read_line_by_line_within_bounds(tmp_path):
    """A recorder log (over 16 MiB: not read whole) with a line of 64 MiB without end (a binary file; 1 GB reads
    the same) is refused after its first 16 MiB; bytes that are not text are named by their line."""
    import time
    import tracemalloc

    from kvbudget.errors import KVBudgetError
    from kvbudget.simulation.fit import read_calibration

    path = tmp_path / "steps.jsonl"
    with open(path, "wb") as fh:
        fh.write(STEP.encode())
        fh.truncate(fh.tell() + (64 << 20))  # sparse
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KVBudgetError, match="steps.jsonl:2: a line longer than 16,777,216 bytes"):
            read_calibration(path)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 40 << 20 and time.perf_counter() - start < 5
    path.write_bytes(STEP.encode() * 300 + b'{"step": "\xff"}\n' + b" " * (17 << 20))
    with pytest.raises(KVBudgetError, match="steps.jsonl:301: not UTF-8 text"):
        read_calibration(path)
