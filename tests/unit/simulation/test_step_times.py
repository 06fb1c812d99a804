"""Step times fitted on public per-kernel measurements (kvbudget.simulation.steptimes): the fits reproduce their
measurements, a step is the sum of its kernels, the model transfers to GPUs without measurements (labelled), and
real vLLM runs it was never fitted on come out within the documented error (benchmarks/data/served)."""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from simkit import LLAMA

import kvbudget
from kvbudget.engines.scheduling.seq import Seq, attended_pairs, commit
from kvbudget.engines.scheduling.workload import Request
from kvbudget.gpus import find_gpu
from kvbudget.simulation import setup_for, simulate, steptimes

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def test_each_gpus_fits_reproduce_the_measurements_they_were_fitted_on():
    """Median relative error of every kernel fit over its own rows, per GPU: projections and decode attention
    (the bulk of a decode step) within 10%, every kind within 25%; and no fit beats its datasheet."""
    for gpu in steptimes.fitted_gpus():
        fit = steptimes.gpu_fit(gpu)
        card = find_gpu(gpu)
        assert fit is not None and "gemm" in fit.ops
        for name, op in fit.ops.items():
            assert op.rows > 20, (gpu, name)
            assert op.median_error < (0.10 if name in ("gemm", "decode_attention") else 0.25), (gpu, name, op)
        gemm = fit.ops["gemm"]
        assert 0.5 * card.bandwidth_bytes_per_s < gemm.bandwidth <= card.bandwidth_bytes_per_s, gpu
        assert 0.3 * card.half_tflops * 1e12 < gemm.throughput <= card.half_tflops * 1e12, gpu
        if "decode_attention" in fit.ops:
            assert fit.ops["decode_attention"].bandwidth <= card.bandwidth_bytes_per_s, gpu
        for tp, reduce in fit.all_reduce.items():
            assert reduce.median_error < 0.10 and reduce.fixed > 0, (gpu, tp)


def _measured(rows: list[dict], layer: str, tokens: int) -> float:
    (t,) = [float(r["time_us"]) for r in rows if r["layer"] == layer and int(r["tokens"]) == tokens]
    return t * 1e-6


def test_a_decode_step_is_the_sum_of_its_measured_kernels():
    """Llama-3.1-8B on an RTX 4090, 32 sequences decoding at 1,024 tokens each: the step the model gives against
    the profile's own kernel times added up by hand (32 layers of two norms, four projections, the activation,
    the rotary embedding and attention; the embedding, final norm, LM head and sampler once)."""
    text = (resources.files("kvbudget") / "data" / "steptimes" / "rtx-4090.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(text.splitlines()))
    b, kv = 32, 512
    layer = (2 * _measured(rows, "layernorm", b) + sum(_measured(rows, op, b) for op in (
        "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "act_fn", "rotary_emb")))
    (attention,) = [float(r["time_us"]) * 1e-6 for r in rows if r["op"] == "attention" and int(r["seqs"]) == b
                    and int(r["tokens"]) == b and int(r["bytes"]) == 2 * 2 * 1024 * b * (kv + 1)]
    by_hand = 32 * (layer + attention) + sum(_measured(rows, op, n) for op, n in (
        ("embedding", b), ("final_layernorm", b), ("lm_head", b), ("sampler", b)))
    tm = setup_for(LLAMA, gpu="RTX-4090", max_model_len=4096).time_model
    assert tm.step_seconds(b, b * (kv + 1)) == pytest.approx(by_hand, rel=0.10)
    assert tm.basis == "kernels measured on RTX-4090 (vLLM 0.19)"


def test_gpus_without_measurements_take_the_measured_gpus_efficiencies_and_say_so():
    l4 = setup_for(LLAMA, gpu="L4", max_model_len=4096).time_model
    assert l4.basis == "kernel efficiencies of RTX-4090, RTX-PRO-6000, H100-80GB on L4's datasheet (estimate)"
    h100 = setup_for(LLAMA, gpu="H100", max_model_len=4096).time_model
    assert h100.basis == ("kernels measured on H100-80GB (vLLM V0); norms, sampler, attention from RTX-4090, "
                          "RTX-PRO-6000")
    # L4's projections read weights at the measured GPUs' mean fraction of their datasheet bandwidth, of its 300 GB/s
    fits = [(steptimes.gpu_fit(g).ops["gemm"].bandwidth, find_gpu(g).bandwidth_bytes_per_s)
            for g in steptimes.fitted_gpus()]
    share = sum(f / d for f, d in fits) / len(fits)
    assert 0.8 < share < 0.95
    assert l4.weights / h100.weights == pytest.approx(fits[2][0] / (share * 300e9), rel=1e-9)
    # a card kvbudget knows only by its memory has no peaks to transfer to: calibrate, or name a GPU
    with pytest.raises(kvbudget.KVBudgetError, match="needs a GPU from the catalog"):
        setup_for(LLAMA, gpu_memory=24 << 30, max_model_len=4096)


def test_pcie_all_reduce_is_a_labelled_estimate_and_nvlink_is_measured():
    qwen = kvbudget.load_model("qwen3-32b")
    pcie = setup_for(qwen, gpu="RTX-PRO-6000", tp=2, max_model_len=4096).time_model
    assert pcie.basis.endswith("; all-reduce from the interconnect's datasheet (estimate)")
    nvlink = setup_for(qwen, gpu="H100", tp=2, max_model_len=4096).time_model
    assert "all-reduce" not in nvlink.basis


def test_a_mixture_of_experts_reads_the_experts_its_tokens_route_to():
    """Mixtral (8 experts, 2 a token): one token reads 2 of 8 experts' weights, two tokens 1 - (3/4)^2 = 7/16 of
    them, 64 tokens all but (3/4)^64 of them; the rest of the weights every step."""
    tm = setup_for(kvbudget.load_model("mixtral-8x7b"), gpu="H100", tp=2, max_model_len=4096).time_model
    assert tm.expert_share == pytest.approx(0.25)
    assert tm.weights_read(1) - tm.weights == pytest.approx(tm.experts / 4)
    assert tm.weights_read(2) - tm.weights == pytest.approx(tm.experts * 7 / 16)
    assert tm.weights_read(64) == pytest.approx(tm.weights + tm.experts, rel=1e-6)
    assert tm.experts > 5 * tm.weights  # (Mixtral's weights are mostly experts)
    dense = setup_for(LLAMA, gpu="H100", max_model_len=4096).time_model
    assert dense.experts == 0 and dense.weights_read(1) == dense.weights_read(64) == dense.weights


def test_attended_pairs_count_causal_attention():
    """Two requests: 100 prompt tokens from scratch (100 x 101 / 2 pairs), and one decode token after 40 (41)."""
    a = Seq(0, Request(arrival=0, prompt_tokens=100, output_tokens=5))
    b = Seq(1, Request(arrival=0, prompt_tokens=40, output_tokens=5))
    b.computed = 40
    scheduled = [(a, 100), (b, 1)]
    assert commit(scheduled) == (101, 141)
    assert attended_pairs(scheduled) == 100 * 101 // 2 + 41


@pytest.fixture(scope="module")
def served():
    sys.path.insert(0, str(BENCHMARKS))
    import served as module

    yield module
    sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("run_id", ["rtx-4090-llama-3.1-8b", "20260218-141024-mixtral-8x7b-v0-1-tp2-roleplay",
                                    "20260217-203421-llama-2-70b-hf-tp4-codegen"])
def test_real_runs_never_fitted_on_come_out_within_the_targets(served, run_id):
    """Held-out real vLLM runs, uncalibrated: mean TPOT and end-to-end latency within 15%; TTFT within 25% where
    it was measured at the engine (the H100 runs measured it at the client: HTTP and tokenizing are not in the
    engine, see the accuracy page)."""
    (run,) = [r for r in served.runs() if r["id"] == run_id]
    for case in served.replay(run):
        assert abs(case.error("tpot")) < 0.15 and abs(case.error("e2e")) < 0.15, case
        if "requests_file" in run:
            assert abs(case.error("ttft")) < 0.25, case


def test_calibration_recovers_a_known_law_and_predicts_another_run(tmp_path):
    """A run served under the H100 kernel model with its fixed costs x 1.5, the rest x 0.9 and 20 ms a request
    outside the engine: calibrating the plain kernel model on it finds the latency outside the engine and
    predicts a second run within 5%. (The two factors trade off against each other where a step's fixed part
    is small: their product, not each, is what such a run pins down.)"""
    from kvbudget.engines.scheduling.workload import exponential_lengths, synthetic
    from kvbudget.simulation.fit import calibrate_requests

    base = setup_for(LLAMA, gpu="H100", max_model_len=8192)
    truth = replace(base, time_model=base.time_model.scaled(1.5, 0.9, "truth", 0.020))

    def run(seed: int) -> tuple[list[Request], list[tuple[float, float | None]]]:
        requests = list(synthetic(12, 400, exponential_lengths(600, 150, 4000), seed=seed))
        seen: dict[str, tuple[float, float | None]] = {}
        simulate(LLAMA, iter(requests), setup=truth, on_finish=lambda r, t, p, e: seen.__setitem__(r.id, (t, p)))
        return requests, [seen[r.id] for r in requests]

    from kvbudget.simulation.fit import BenchRun

    requests, measured = run(1)
    fitted = calibrate_requests(LLAMA, BenchRun(tuple(requests), tuple(measured), 0), base)
    assert "calibrated on 400 benchmark requests" in fitted.basis
    assert fitted.request_latency == pytest.approx(0.020, rel=0.15)
    plain = simulate(LLAMA, iter(requests), setup=base)
    other, real = run(2)
    ours = simulate(LLAMA, iter(other), setup=replace(base, time_model=fitted))
    ttft, tpot = [t for t, _ in real], [p for _, p in real if p is not None]
    assert ours.ttft is not None and ours.tpot is not None and plain.ttft is not None
    assert ours.ttft.mean == pytest.approx(sum(ttft) / len(ttft), rel=0.05)
    assert ours.tpot.mean == pytest.approx(sum(tpot) / len(tpot), rel=0.05)
    assert plain.ttft.mean < 0.7 * sum(ttft) / len(ttft)  # (uncalibrated, the 20 ms are missing)


def test_the_gpu_catalog_says_what_each_gpus_step_times_rest_on(capsys):
    import json

    from kvbudget.cli import main

    assert main(["gpus", "--json"]) == 0
    basis = {g["name"]: g["step_times"] for g in json.loads(capsys.readouterr().out)}
    assert basis["RTX-4090"] == basis["RTX-PRO-6000"] == "measured (vLLM 0.19)"
    assert basis["H100-80GB"] == "measured (vLLM V0)"
    assert basis["L4"] == basis["MI355X"] == "transferred (estimate)"
    assert set(steptimes.fitted_gpus()) == {g for g, b in basis.items() if b.startswith("measured")}


def test_a_picture_calls_kernel_model_times_estimates_and_calibrated_times_calibrated():
    from kvbudget.plot import times_are

    assert times_are(setup_for(LLAMA, gpu="H100", max_model_len=4096).time_model.basis) == "estimates"
    assert times_are(setup_for(LLAMA, gpu="L4", max_model_len=4096).time_model.basis) == "estimates"
    assert times_are("calibrated on 58 measured steps") == "calibrated"
    assert times_are("kernels measured on H100-80GB (vLLM V0); calibrated on 300 benchmark requests") == "calibrated"
