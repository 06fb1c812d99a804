"""The admission policies compared with the guard (simulation/guarded.py): each decides as its source says."""

from __future__ import annotations

import pytest

from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.simulation.guarded import ConcurrencyLimit, SaturationShedding, admission_policy
from kvbudget.simulation.run import simulate

R = Request(arrival=0.0, prompt_tokens=100, output_tokens=10)


@pytest.mark.parametrize("usage, waiting, saturated", [(0.79, 4, False), (0.8, 0, True), (0.1, 5, True)])
def test_gie_sheds_at_five_waiting_or_80_percent(usage, waiting, saturated):
    gie = SaturationShedding()
    gie.observe(0.0, usage, waiting)
    assert (gie.admit(R, 0.0) is None) == saturated


def test_gie_reads_its_metrics_every_50_ms():
    gie = SaturationShedding()
    gie.observe(0.0, 0.9, 0)
    gie.observe(0.03, 0.1, 0)  # not due yet: still saturated
    assert gie.admit(R, 0.03) is None
    gie.observe(0.05, 0.1, 0)
    assert gie.admit(R, 0.05) is not None
    assert (gie.report().rejected, gie.report().forwarded[0], gie.report().policy) == (1, 1, "gie")


def test_a_concurrency_limit_frees_a_place_when_a_request_ends():
    limit = ConcurrencyLimit(2)
    first, second = limit.admit(R, 0.0), limit.admit(R, 0.0)
    assert first is not None and second is not None and limit.admit(R, 0.0) is None
    first[1]()
    assert limit.admit(R, 0.0) is not None
    assert limit.report().rejected == 1


def test_each_policy_refuses_with_its_status():
    """The router's shedding and a concurrency limit answer 429 (ResourceExhausted), kvbudget's guard 503."""
    shed = SaturationShedding()
    shed.observe(0.0, 0.9, 0)
    shed.admit(R, 0.0)
    assert shed.report().to_dict()["status"] == 429 and ConcurrencyLimit(1).report().status == 429


def test_llm_d_needs_a_fleets_front():
    with pytest.raises(KVBudgetError, match="admission llm-d: flow control is a queue at a fleet's front") as err:
        admission_policy("llm-d", None, None, None)
    assert err.value.param == "admission"


@pytest.mark.parametrize("name", ["bogus", "concurrency:0", "concurrency:x"])
def test_unknown_policies_are_refused(name):
    with pytest.raises(KVBudgetError, match="choose one of none, gie"):
        admission_policy(name, None, None, None)


def test_shedding_reacts_late_and_the_guard_predicts():
    """Sixty long requests 10 ms apart on a small pool: alone, vLLM admits them all and preempts; the saturation
    detector sheds once usage reaches 0.8 or five wait, but the arrivals before its gauge moves are in already, so
    some are still preempted; the guard counts what each admitted request will hold and preempts nothing."""
    model = load_model("llama-3.1-8b")
    burst = [Request(arrival=i * 0.01, prompt_tokens=2000, output_tokens=800) for i in range(60)]
    kw = dict(gpu="H100-80GB", kv_memory=40_000 * 131072, max_model_len=4096)
    alone, shed, guard = (simulate(model, burst, admission=a, **kw) for a in ("none", "gie", "kvbudget"))
    assert alone.guard is None and alone.preemptions > shed.preemptions > guard.preemptions == 0
    for sim in (shed, guard):
        assert sim.guard.rejected > 0 and sim.completed + sim.guard.rejected == 60


def test_max_waiting_sheds_when_the_engine_computes_slower_than_requests_arrive():
    """Prompts of 4,000 tokens every 10 ms, faster than one H100 prefills them: the guard's levels shed only once
    the requests queued in the engine are predicted to fill the KV cache (dozens of them, seconds of prefill);
    with max_waiting 5 it reads the engine's queue at each scrape and refuses while five wait, so those it admits
    wait far less."""
    model = load_model("llama-3.1-8b")
    burst = [Request(arrival=i * 0.01, prompt_tokens=4000, output_tokens=20) for i in range(400)]
    kw = dict(gpu="H100-80GB", kv_memory=60 * 2**30, max_model_len=16384, guard_poll_interval=0.1)
    levels = simulate(model, burst, admission="kvbudget", **kw)
    queue = simulate(model, burst, admission="kvbudget", guard_config={"max_waiting": 5}, **kw)
    assert levels.preemptions == queue.preemptions == 0
    assert queue.guard.rejected > levels.guard.rejected and queue.completed + queue.guard.rejected == 400
    assert queue.metric("ttft_p99") < levels.metric("ttft_p99") / 3


def test_the_summary_and_the_json_say_the_status_of_the_rejections(capsys):
    import json

    from simkit import AZURE, cli

    run = ("simulate", "llama-3.1-8b", "--gpu", "H100", "--kv-memory", "2GiB", "--max-model-len", "8192", "--trace",
           AZURE, "--slice", "0:300", "--rate-scale", "6", "--admission", "gie")
    code, out, err = cli(capsys, *run)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("admission (gie)"))
    assert line.endswith(" (429)") and ", rejected " in line
    code, out, err = cli(capsys, *run, "--json")
    guard = json.loads(out)["guard"]
    assert code == 0 and guard["rejected"] > 0 and guard["status"] == 429
