"""The simulator's fast path (runs of pure decode steps, windowed caching skips) gives the reference's answer, step for
step."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import LLAMA, TRACES, BlockByBlock, close

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.simulation.decoding import CLOSED_PER_SEQ, CLOSED_RUN
from kvbudget.simulation.run import simulate


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
        out.append(Request(arrival=t, prompt_tokens=prompt, output_tokens=draw(st.integers(1, 300)), prefix=prefix,
                           id=str(i), n=draw(st.sampled_from([1, 1, 2, 3]))))
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
    """Whether the fast path and the reference give the same steps and the same result: the fast path with its
    decode runs in a Python loop and with every run in numpy arrays, to the bit; with no hook per step (the runs in
    closed form where they may be long, else in the loop's own kernel), and with every run that can be in closed
    form, the same but for rounding (the same steps, counts and order; seconds within 1e-9)."""
    import importlib.util
    from unittest import mock

    arrays = importlib.util.find_spec("numpy") is not None
    if arrays:
        import numpy  # noqa: F401  (imported: the runs take it at once)
    runs = []
    for fast, array_run, hooked in ((False, 1, True), (True, 10**9, True), (True, 1, True) if arrays else
                                    (True, 10**9, True), (True, 10**9, False), (True, 10**9, False)):
        steps: list = []
        closed = len(runs) == 4  # every run in closed form that can be (else only the long ones)
        with mock.patch("kvbudget.simulation.decoding.ARRAY_RUN", array_run), \
                mock.patch("kvbudget.simulation.decoding.CLOSED_RUN", 0 if closed else CLOSED_RUN), \
                mock.patch("kvbudget.simulation.decoding.CLOSED_PER_SEQ", 0 if closed else CLOSED_PER_SEQ):
            result = simulate(model, iter(requests), setup=setup, fast=fast,
                              on_step=(lambda *a, steps=steps: steps.append(a)) if hooked else None)
        runs.append((replace(result, fast_steps=0), steps))
    return runs[0] == runs[1] == runs[2] and close(runs[3][0], runs[0][0]) and close(runs[4][0], runs[0][0])

def _setup(blocks, block_size, seqs, budget, max_len, caching, threshold=0):
    from kvbudget.simulation.run import setup_for

    base = setup_for(LLAMA, gpu="H100", max_model_len=max_len, block_size=block_size)
    return replace(base, num_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=budget,
                   prefix_caching=caching, long_prefill_token_threshold=threshold)

def test_fast_path_is_exact_with_every_part_of_the_time_model():
    """A time model with every part non-zero (the fitted kernels' added costs, a request's latency outside the
    engine, the experts a step routes to): the fast path's decode runs end on the same clock (to the bit in the loop
    and the arrays, to rounding in closed form), with the same results."""
    from kvbudget.engines.scheduling.timing import TimeModel

    requests = [r for r in rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=300)
                if r.prompt_tokens + r.output_tokens < 4000]
    tm = TimeModel(weights=0.004, per_context=1e-8, per_token=2e-5, overhead=0.0015, bound="max", token_cost=3e-6,
                   context_cost=2e-7, pair_cost=1e-10, seq_cost=5e-7, request_latency=0.02, experts=0.003,
                   expert_share=0.25, basis="every part")
    setup = replace(_setup(4000, 16, 64, 2048, 4096, True), time_model=tm)
    assert _both_ways(LLAMA, requests, setup)
    assert simulate(LLAMA, iter(requests), setup=setup).ttft.p50 > 0.02


def test_fast_path_is_exact_where_a_floor_on_the_step_holds_some_steps_of_a_run():
    """A pace (the frontend's floor on a step) between a run's first steps and its last, and one below them all:
    the numpy runs floor the short steps only where some are below it, the same floats as step by step (and the
    closed form the same steps at the pace)."""
    from kvbudget.engines.scheduling.timing import TimeModel

    requests = [r for r in rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=50)
                if r.prompt_tokens + r.output_tokens < 4000]
    for pace in (0.0062, 0.001):
        tm = TimeModel(weights=0.004, per_context=0.0, per_token=2e-5, overhead=0.0015, context_cost=2e-7,
                       pace=pace, basis="a floor")
        setup = replace(_setup(4000, 16, 64, 2048, 4096, True), time_model=tm)
        assert _both_ways(LLAMA, requests, setup)


def test_fast_path_runs_on_a_real_trace_and_keeps_memory_to_the_requests():
    r = simulate(LLAMA, rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=500), gpu="H100")
    assert r.completed == r.requests == 500
    assert r.fast_steps > r.steps / 2
    assert r.ttft is not None and r.ttft.p50 <= r.ttft.p90 <= r.ttft.p99 <= r.ttft.max

@settings(max_examples=40, deadline=None)
@given(workloads(chains=True), st.integers(20, 200), st.sampled_from([16, 32]), st.integers(1, 64),
       st.sampled_from([64, 256, 2048]), st.sampled_from([40, 100, 300]),
       st.sampled_from(["gemma-2-9b", "mistral-7b", "llama-4-scout"]))
def test_windowed_caching_skips_only_steps_that_change_nothing(requests, blocks, block_size, seqs, budget, window,
                                                               name):
    """With prefix caching on windowed models a running request's step skips allocation when no window lets a
    block go and no block is needed or fills (`_moves`); every step is the same as allocating every time."""
    from unittest import mock

    from kvbudget.engines.vllm.cached import CachedHybridScheduler
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
    assert close(runs[0], runs[1])

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
    assert close(runs[0], runs[1])
