"""The simulation loop: the time model it needs, requests it refuses, the guard in the loop, latency over time, running
many."""

from __future__ import annotations

import itertools

import pytest
from simkit import AZURE, LLAMA, TRACES, cli

from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.simulation.run import simulate


def test_a_time_model_is_needed(capsys, tmp_path):
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--kv-memory", "1GiB", "--max-model-len", "4096",
                       "--rate", "1")
    assert code == 2 and "--calibrate" in err
    bad = tmp_path / "steps.jsonl"
    bad.write_text('{"step": [], "t": 1}\n')
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--kv-memory", "1GiB", "--rate", "1", "--calibrate",
                       str(bad))
    assert code == 2 and f"{bad}:1: a step without tokens" in err

def test_a_request_that_can_never_be_scheduled_is_an_error_not_a_hang():
    """Without chunked prefill (the contiguous baselines) a prompt longer than a step's token budget never runs."""
    with pytest.raises(KVBudgetError, match="can never be scheduled"):
        simulate(LLAMA, iter([Request(arrival=0, prompt_tokens=3000, output_tokens=5)]), gpu="H100", max_model_len=8192,
                 max_num_batched_tokens=2048,
                 allocator="contiguous-oracle")

def test_the_guard_in_the_loop_is_the_guards_own_admission(tmp_path):
    """With the guard in front, overload turns into 503s and caps instead of queues and preemptions; its YAML's
    thresholds are the ones acting (a higher reject threshold rejects less); every forwarded request completes."""
    import yaml

    from kvbudget.guard.config import guard_config_yaml
    from kvbudget.planner import plan

    budget = 4_770_519_777  # an L4's budget under the flat activation estimate: the regime this scenario explores
    p = plan(LLAMA, gpu="L4", max_model_len=8192, kv_memory=budget)
    config = yaml.safe_load(guard_config_yaml(p))
    trace = lambda: rescale(read_trace(AZURE), count=1500)  # noqa: E731
    # the roofline over an L4's datasheet peaks: the load regime this scenario explores (steps this slow)
    from kvbudget.engines.scheduling.timing import TimeModel
    from kvbudget.gpus import find_gpu

    l4 = find_gpu("L4")
    roofline = TimeModel.roofline(p.weights.active_bytes, p.estimate.bytes_per_token, 2 * p.weights.active_params,
                                  l4.bandwidth_bytes_per_s, l4.half_tflops * 1e12)
    settings = {"gpu": "L4", "max_model_len": 8192, "prefix_caching": False, "kv_memory": budget,
                "time_model": roofline}
    bare = simulate(LLAMA, trace(), **settings)
    guarded = simulate(LLAMA, trace(), guard_config=config, **settings)
    g = guarded.guard
    assert g is not None and bare.guard is None
    assert sum(g.forwarded.values()) + g.rejected == guarded.requests == bare.requests
    assert guarded.completed == sum(g.forwarded.values())
    assert g.rejected > 0 and g.capped > 0 and g.forwarded[2] > 0
    assert guarded.preemptions < bare.preemptions and guarded.peak_waiting < bare.peak_waiting
    looser = dict(config, levels=[dict(lv, threshold=t) for lv, t in zip(config["levels"], (0.8, 0.9, 0.99),
                                                                          strict=True)])
    assert simulate(LLAMA, trace(), guard_config=looser, **settings).guard.rejected < g.rejected

def test_latency_over_time_partitions_the_completions():
    """The latency timeline cuts the run into equal windows of completions: every completed request is in exactly
    one, and the windows' extremes are the run's."""
    from kvbudget.simulation.percentiles import LATENCY_WINDOWS

    r = simulate(LLAMA, rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=800), gpu="L4",
                 max_model_len=16384)
    windows = r.latency_timeline
    assert len(windows) == LATENCY_WINDOWS
    assert sum(w.completed for w in windows) == r.completed
    assert windows[0].start == 0 and abs(windows[-1].end - r.duration_s) < 1e-9
    assert all(a.end == b.start for a, b in itertools.pairwise(windows))
    assert max(w.e2e.max for w in windows if w.e2e) == r.e2e.max
    assert max(w.ttft.max for w in windows if w.ttft) == r.ttft.max
    assert min(w.ttft.p50 for w in windows if w.ttft) <= r.ttft.p50 <= max(w.ttft.p50 for w in windows if w.ttft)
    assert r.to_dict()["latency_timeline"][0]["completed"] == windows[0].completed

def test_run_all_keeps_order_and_reports_progress():
    from kvbudget.simulation.parallel import run_all

    for backend in ("serial", "process"):
        seen: list[tuple[int, int]] = []
        out = run_all(divmod, [(17, 5), (9, 2), (100, 7)], backend, lambda done, total, seen=seen: seen.append(
            (done, total)))
        assert out == [(3, 2), (4, 1), (14, 2)]
        assert seen == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(KVBudgetError, match="backend 'ray=': choose process"):
        run_all(divmod, [(1, 1)], "ray=")


@pytest.mark.parametrize("knobs", [{}, {"max_num_seqs": 16}, {"enforce_eager": True},
                                   {"max_num_seqs": 64, "enforce_eager": True, "utilization": 0.8},
                                   {"lora": (4, 64), "entry_point": "llm"}])
def test_simulate_takes_the_plans_budget_with_the_same_knobs(knobs):
    """One stack: what simulate gives vLLM's KV cache is plan's budget for the same settings (the sampler's rows
    follow --max-num-seqs in both, --enforce-eager drops the CUDA graphs in both)."""
    from kvbudget import EngineOptions, plan
    from kvbudget.simulation.run import setup_for

    utilization = knobs.get("utilization")
    lora, entry = knobs.get("lora"), knobs.get("entry_point", "server")
    options = EngineOptions(max_num_seqs=knobs.get("max_num_seqs"), enforce_eager=bool(knobs.get("enforce_eager")),
                            entry_point=entry, enable_lora=lora is not None, max_loras=lora[0] if lora else 1,
                            max_lora_rank=lora[1] if lora else 16)
    planned = plan(LLAMA, gpu="H100-80GB", max_model_len=8192, options=options, utilization=utilization,
                   recommend=False)
    setup = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, max_num_seqs=knobs.get("max_num_seqs"),
                      enforce_eager=bool(knobs.get("enforce_eager")), utilization=utilization, lora=lora,
                      entry_point=entry)
    assert setup.kv_memory_bytes == planned.kv_memory_bytes
    assert setup.max_num_seqs == (knobs.get("max_num_seqs") or 1024)


class Stop(Exception):
    pass


def test_check_is_called_by_turns_of_the_loop_not_by_requests():
    """Ten long requests (no progress call: that comes per 1,000 requests) still call `check` every CHECK_EVERY
    steps, and an exception from it ends the run there."""
    from kvbudget.simulation.run import CHECK_EVERY

    work = [Request(arrival=i * 0.01, prompt_tokens=100, output_tokens=4000) for i in range(10)]
    calls = []
    sim = simulate(LLAMA, iter(work), gpu="H100", max_model_len=8192, fast=False, check=lambda: calls.append(1))
    assert sim.completed == 10 and sim.steps > 4000
    assert sim.steps // CHECK_EVERY <= len(calls) <= sim.steps // CHECK_EVERY + sim.steps // 10  # a turn per step
    turns = []

    def stop_third() -> None:
        turns.append(1)
        if len(turns) == 3:
            raise Stop

    with pytest.raises(Stop):
        simulate(LLAMA, iter(work), gpu="H100", max_model_len=8192, fast=False, check=stop_third)
    assert len(turns) == 3
