"""`--calibrate` on the result block `vllm bench serve` prints, as people paste it: the reader on real blocks
pasted in public issues (tests/data/bench/, sources in its README), its refusals, and a round trip (a run
simulated under a known time model, printed as vLLM prints it, fitted from a wrong time model)."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from simkit import LLAMA, cli

from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.fit import calibrate_summaries, read_calibration
from kvbudget.simulation.run import simulate
from kvbudget.simulation.summary import BenchSummary

BENCH = Path(__file__).parents[2] / "data" / "bench"


def _row(label: str, value: object) -> str:
    """A row as vllm/benchmarks/serve.py prints it: "{:<40} {:<10}" (floats "{:<10.2f}")."""
    return "{:<40} {:<10}".format(label, f"{value:.2f}" if isinstance(value, float) else value)


def _block(sim, n: int, prompt: int, output: int, rate: float | None = None) -> str:
    """The block vllm bench serve prints for a run (the metrics kvbudget simulated for it)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="), _row("Successful requests:", n),
             _row("Failed requests:", 0)]
    if rate is not None:
        lines.append(_row("Request rate configured (RPS):", rate))
    lines += [_row("Benchmark duration (s):", sim.duration_s), _row("Total input tokens:", n * prompt),
              _row("Total generated tokens:", n * output), _row("Request throughput (req/s):", n / sim.duration_s)]
    for title, name, p in (("Time to First Token", "TTFT", sim.ttft),
                           ("Time per Output Token (excl. 1st token)", "TPOT", sim.tpot)):
        lines += ["{s:{c}^{n}}".format(s=title, n=50, c="-"), _row(f"Mean {name} (ms):", p.mean * 1000),
                  _row(f"Median {name} (ms):", p.p50 * 1000), _row(f"P99 {name} (ms):", p.p99 * 1000)]
    return "\n".join([*lines, "=" * 50]) + "\n"


def _run(rate: float | None, n: int, prompt: int, output: int, seed: int) -> list[Request]:
    """Requests as vllm bench serve sends them: fixed lengths, Poisson at `rate` (None: all at once)."""
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        out.append(Request(arrival=t, prompt_tokens=prompt, output_tokens=output, id=str(i)))
        t += rng.expovariate(rate) if rate else 0.0
    return out


def test_a_printed_block_calibrates_a_wrong_time_model_to_the_truths_means(tmp_path):
    """A run simulated under a known time model (the L4 kernel model, its fixed costs x 1.6 and the rest x 1.3:
    not a point of the fit's own family), all 100 requests sent at once (vLLM's default), printed as vLLM prints
    it inside an issue's text with Windows line endings; calibrating the unscaled model on the block alone
    predicts a run at another load (Poisson, 2 req/s) within 5% of the truth's mean TTFT, TPOT and E2E."""
    from kvbudget.simulation import setup_for

    wrong = setup_for(LLAMA, gpu="L4", max_model_len=8192)
    truth = replace(wrong, time_model=wrong.time_model.scaled(1.6, 1.3, "truth", 0.0))
    path = tmp_path / "issue.txt"
    sim = simulate(LLAMA, iter(_run(None, 100, 600, 100, seed=7)), setup=truth)
    path.write_bytes(("I ran vllm bench serve on an L4:\n\n" + _block(sim, 100, 600, 100) + "\nAny ideas?\n")
                     .replace("\n", "\r\n").encode())
    runs = read_calibration(path)
    assert isinstance(runs, tuple) and len(runs) == 1
    assert (runs[0].rate, runs[0].prompt_mean, runs[0].output_mean, runs[0].line) == (math.inf, 600, 100, 3)
    fitted = calibrate_summaries(LLAMA, runs, wrong)
    assert "calibrated on the mean TTFT and TPOT of 1 printed benchmark result" in fitted.basis
    assert "one run fits these two" in fitted.basis and fitted.request_latency == 0.0
    assert "may not be the one measured" not in fitted.basis
    other = _run(2.0, 300, 600, 100, seed=11)
    ours = simulate(LLAMA, iter(other), setup=replace(wrong, time_model=fitted))
    real = simulate(LLAMA, iter(other), setup=truth)
    before = simulate(LLAMA, iter(other), setup=wrong)
    assert abs(before.tpot.mean / real.tpot.mean - 1) > 0.2  # the wrong model was far off
    for got, want in ((ours.ttft, real.ttft), (ours.tpot, real.tpot), (ours.e2e, real.e2e)):
        assert got.mean == pytest.approx(want.mean, rel=0.05)


def test_two_blocks_at_other_loads_also_fit_the_time_outside_the_engine(tmp_path, capsys):
    """Two runs in one file, all at once and at a light 0.5 req/s (where a request's time outside the engine is a
    large part of its TTFT), fit a third number: that time (the truth's: 40 ms). The CLI says what it fitted in
    the JSON's time-model basis."""
    from kvbudget.simulation import setup_for

    wrong = setup_for(LLAMA, gpu="L4", max_model_len=8192)
    truth = replace(wrong, time_model=wrong.time_model.scaled(1.0, 1.3, "truth", 0.04))
    text = "".join(_block(simulate(LLAMA, iter(_run(rate, n, 600, 100, seed=7)), setup=truth), n, 600, 100, rate)
                   for rate, n in ((None, 60), (0.5, 60)))
    (tmp_path / "runs.txt").write_text(text)
    runs = read_calibration(tmp_path / "runs.txt")
    fitted = calibrate_summaries(LLAMA, runs, wrong)
    assert "of 2 printed benchmark results" in fitted.basis and "Poisson at 0.5 req/s" in fitted.basis
    assert fitted.request_latency == pytest.approx(0.04, rel=0.25)  # 33.7 ms found
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate",
                         "1", "--requests", "20", "--calibrate", str(tmp_path / "runs.txt"), "--json")
    assert code == 0, err
    assert "of 2 printed benchmark results (reading x" in json.loads(out)["setup"]["time_model"]["basis"]


@pytest.mark.parametrize("name, expected", [
    ("pr18566-sharegpt.txt", dict(completed=1000, failed=0, duration=30.85, input_tokens=229711,
                                  output_tokens=203068, ttft=9.62613, tpot=0.07786, rate=math.inf, concurrency=None)),
    ("pr33743-gemma3.txt", dict(completed=16, failed=0, duration=20.87, input_tokens=16368, output_tokens=5600,
                                ttft=2.63355, tpot=0.05178, rate=math.inf, concurrency=None)),
    ("pr31826-tp2-concurrency8.txt", dict(completed=1000, failed=0, duration=162.21, input_tokens=215312,
                                          output_tokens=199033, ttft=0.03087, tpot=0.00635, rate=math.inf,
                                          concurrency=8)),
    ("issue9722-concurrency30.txt", dict(completed=100, failed=0, duration=82.97, input_tokens=77700,
                                         output_tokens=603, ttft=18.85401, tpot=0.87524, rate=math.inf,
                                         concurrency=30)),
])
def test_real_pasted_blocks_are_read(name, expected):
    """Blocks pasted in vLLM's threads (several releases; sources in tests/data/bench/README.md): every figure
    the fit uses, and the concurrency printed above an old block's header."""
    (run,) = read_calibration(BENCH / name)
    for field, value in expected.items():
        assert getattr(run, field) == pytest.approx(value), field


def test_a_concurrency_capped_run_is_rebuilt_as_its_closed_loop_steady_state():
    """--max-concurrency 8 over 1,000 requests: the first 8 at once, the rest at the measured throughput."""
    (run,) = read_calibration(BENCH / "pr31826-tp2-concurrency8.txt")
    requests = run.requests()
    assert [r.arrival for r in requests[:9]] == [0.0] * 8 + [pytest.approx(0.16221)]
    assert requests[-1].arrival == pytest.approx(162.21 * 992 / 1000)
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(215, 199)}
    assert "the first 8 at once, the rest at the measured 6.16 req/s" in run.arrivals()


BLOCK = (BENCH / "pr33743-gemma3.txt").read_text()


@pytest.mark.parametrize("text, words", [
    (BLOCK.replace("Mean TPOT (ms):", "Mean T.P.O.T:"), ":2: not a whole `vllm bench serve` result block: no Mean "
                                                        "TPOT (ms) line"),
    ("\n".join(BLOCK.splitlines()[:8]), "no Mean TTFT (ms), Mean TPOT (ms) line"),
    ("Mean TTFT (ms): 12\n", ":1: not a whole `vllm bench serve` result block: no Successful requests, Benchmark "
                             "duration (s), Total input tokens, Total generated tokens, Mean TPOT (ms) line"),
    (BLOCK.replace("Successful requests:                     16", "Successful requests: 16.5"),
     "Successful requests 16.5: expected a whole number from 1 to 20,000"),
    (BLOCK.replace("Successful requests:                     16", "Successful requests: 0"),
     "Successful requests 0: expected a whole number from 1 to 20,000"),
    (BLOCK.replace("Successful requests:                     16", "Successful requests: 25000"),
     "Successful requests 25000: expected a whole number from 1 to 20,000"),
    (BLOCK.replace("20.87", "nan"), "Benchmark duration (s) 'nan': expected a number of 0 or more"),
    (BLOCK.replace("20.87", "9" * 400), "Benchmark duration (s) '9999999999"),
    (BLOCK.replace("20.87", "inf"), "Benchmark duration (s) 'inf': expected a number of 0 or more"),
    (BLOCK.replace("Successful requests:                     16", "Successful requests: inf"),
     "Successful requests 'inf': expected a number of 0 or more"),
    (BLOCK.replace("Failed requests:                         0", "Request rate configured (RPS): -1"),
     "Request rate configured (RPS) '-1': expected a number of 0 or more"),
    (BLOCK.replace("Mean TTFT (ms):                          2633.55", "Mean TTFT (ms): 0"),
     "Mean TTFT (ms) 0: a run this block rebuilds needs it above 0"),
    (BLOCK.replace("Mean TPOT (ms):                          51.78", "Mean TPOT (ms): 0.00"),
     "Mean TPOT (ms) 0 with 350 output tokens"),
    (BLOCK * 17, "17 result blocks; at most 16"),
])
def test_what_is_not_a_readable_block_is_refused_in_one_line(tmp_path, text, words):
    path = tmp_path / "bench.txt"
    path.write_text(text)
    with pytest.raises(KVBudgetError) as e:
        read_calibration(path)
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.param == "calibrate", str(e.value)


def test_the_cli_refuses_a_broken_block_in_one_line_before_any_fit(tmp_path, capsys):
    path = tmp_path / "bench.txt"
    path.write_text(BLOCK.replace("Total input tokens", "Input tokens"))
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--calibrate", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--calibrate" in err and "no Total input tokens line" in err, err


def test_a_summary_keeps_what_it_was_read_as():
    run = BenchSummary(line=1, completed=3, failed=0, duration=1.0, input_tokens=10, output_tokens=3, ttft=0.1,
                       tpot=0.0, rate=2.0, concurrency=None)
    assert (run.prompt_mean, run.output_mean, run.arrivals()) == (3, 1, "Poisson at 2 req/s")


def test_each_block_takes_only_its_own_rate_and_concurrency(tmp_path):
    """A rate configured for one run is not the next block's (vLLM prints no rate line for --request-rate inf);
    the rate printed above an old block is that block's, the latest one before it."""
    new = BLOCK.replace("Failed requests:                         0",
                        "Failed requests:                         0\nRequest rate configured (RPS):           2.00")
    old = (BENCH / "issue9722-concurrency30.txt").read_text()
    path = tmp_path / "runs.txt"
    path.write_text(new + "\nnext:\n" + BLOCK + "Traffic request rate: 5\n" + old.replace("inf", "1.5"))
    first, second, third = read_calibration(path)
    assert (first.rate, second.rate, third.rate) == (2.0, math.inf, 1.5)
    assert (first.concurrency, second.concurrency, third.concurrency) == (None, None, 30)
    assert (first.line, second.line, third.line) == (2, 30, 57)


def test_without_a_workload_the_measured_run_is_replayed_with_the_fitted_times(tmp_path, capsys):
    """`simulate MODEL --calibrate block.txt` (no --rate, --trace or --request-log) replays the run the first block
    rebuilds, with the times fitted to it: its mean TTFT and TPOT come back as the block printed them."""
    from kvbudget.simulation import setup_for

    wrong = setup_for(LLAMA, gpu="L4", max_model_len=8192)
    truth = replace(wrong, time_model=wrong.time_model.scaled(1.6, 1.3, "truth", 0.0))
    sim = simulate(LLAMA, iter(_run(None, 40, 500, 80, seed=1)), setup=truth)
    (tmp_path / "block.txt").write_text(_block(sim, 40, 500, 80))
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192",
                         "--calibrate", str(tmp_path / "block.txt"), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["completed"] == 40
    assert result["ttft_s"]["mean"] == pytest.approx(sim.ttft.mean, rel=0.03)
    assert result["tpot_s"]["mean"] == pytest.approx(sim.tpot.mean, rel=0.03)
    (tmp_path / "steps.jsonl").write_text('{"start": true}\n')
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--calibrate",
                         str(tmp_path / "steps.jsonl"))
    assert code == 2 and "give --trace FILE, --request-log FILE or --rate N" in err, err


def test_a_fit_far_from_the_kernel_model_says_the_rebuilt_run_may_be_wrong(tmp_path):
    """A ShareGPT run (lengths that varied, pasted in vLLM PR 18566) rebuilt with every request of the mean
    lengths fits a scale over 5x from the H100 kernel model's: the basis says the rebuilt run may be wrong."""
    from kvbudget.simulation import setup_for

    runs = read_calibration(BENCH / "pr18566-sharegpt.txt")
    fitted = calibrate_summaries(LLAMA, runs, setup_for(LLAMA, gpu="H100"))
    assert "the run rebuilt may not be the one measured (lengths that varied" in fitted.basis, fitted.basis
