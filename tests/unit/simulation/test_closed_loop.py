"""`max_concurrency`: clients in a closed loop, as `vllm bench serve --max-concurrency` sends requests."""

from __future__ import annotations

import pytest
from simkit import LLAMA, cli

from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, exponential_lengths, synthetic
from kvbudget.simulation.run import simulate

SAME = dict(gpu="H100-80GB", max_model_len=8192)


def burst(n: int) -> list[Request]:
    return [Request(arrival=0.0, prompt_tokens=500, output_tokens=64) for _ in range(n)]


def test_one_client_sends_each_request_when_the_last_one_ends():
    """One client: every request runs alone, so each takes what a lone request takes, and the run lasts n of them
    (the engine's clock: less the first request's time outside the engine, spent before the clock starts)."""
    alone = simulate(LLAMA, burst(1), **SAME)
    loop = simulate(LLAMA, burst(12), max_concurrency=1, **SAME)
    assert loop.completed == 12 and loop.peak_running == 1
    assert loop.e2e.max == pytest.approx(alone.e2e.mean, rel=1e-9)
    assert loop.ttft.max == pytest.approx(alone.ttft.mean, rel=1e-9)
    outside = alone.setup.time_model.outside_seconds(500)
    assert outside > 0  # (vLLM's host costs: parsing, tokenizing)
    assert loop.duration_s == pytest.approx(12 * alone.e2e.mean - outside, rel=1e-9)


def test_n_clients_keep_n_in_flight_and_latency_counts_from_sending():
    """Four clients over 40 requests sent at once: never more than 4 running and no request waits in the engine's
    queue (its TTFT is a prefill, not minutes of queueing); the open burst queues."""
    loop = simulate(LLAMA, burst(40), max_concurrency=4, **SAME)
    burst_all = simulate(LLAMA, burst(40), **SAME)
    assert loop.peak_running == 4 and loop.peak_waiting <= 4
    assert loop.ttft.max < burst_all.ttft.max / 3
    assert loop.duration_s > burst_all.duration_s  # four at a time use the GPU less well than forty


def test_as_many_clients_as_requests_is_the_open_loop():
    a = simulate(LLAMA, burst(30), max_concurrency=30, **SAME)
    b = simulate(LLAMA, burst(30), **SAME)
    assert (a.duration_s, a.ttft, a.e2e, a.steps) == (b.duration_s, b.ttft, b.e2e, b.steps)


def test_a_request_arriving_after_its_client_is_free_keeps_its_arrival():
    """At a low rate the clients are idle when each request comes: the same run as without them."""
    lengths = exponential_lengths(200, 50, 4000)
    a = simulate(LLAMA, synthetic(0.2, 50, lengths), max_concurrency=8, **SAME)
    b = simulate(LLAMA, synthetic(0.2, 50, lengths), **SAME)
    assert (a.duration_s, a.ttft, a.e2e) == (b.duration_s, b.ttft, b.e2e)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 2_000_000])
def test_max_concurrency_is_a_positive_whole_number(bad):
    with pytest.raises(KVBudgetError, match="max_concurrency"):
        simulate(LLAMA, burst(2), max_concurrency=bad, **SAME)


def test_the_cli_refuses_a_bad_concurrency_before_loading_the_model(capsys):
    code, _, err = cli(capsys, "simulate", "no-such-model", "--rate", "1", "--max-concurrency", "0")
    assert code == 2 and "--max-concurrency" in err and "no-such-model" not in err
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192",
                       "--rate", "50", "--requests", "40", "--max-concurrency", "3", "--json")
    assert code == 0 and '"peak_running": 3' in out and '"clients": 3' in out
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192",
                       "--rate", "50", "--requests", "40", "--max-concurrency", "3")
    assert code == 0 and "40 requests from 3 clients in a closed loop" in " ".join(out.split())
