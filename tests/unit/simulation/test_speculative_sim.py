"""Speculative decoding in the simulator: vLLM's drafts scheduled with each running request's next token, the
drafter's lookahead slots, the rejected tokens rolled back, the acceptance model and the drafter's time. Every
expected value below is worked out by hand from vLLM 0.32's rules (engines/vllm/specdecode.py names them)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import run_to_end

import kvbudget
from kvbudget.engines.scheduling.seq import SchedulerConfig, Step
from kvbudget.engines.scheduling.setup import Drafting
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.specdecode import SpecScheduler
from kvbudget.errors import KVBudgetError
from kvbudget.simulation import parse_sweep
from kvbudget.simulation.run import setup_for, simulate
from kvbudget.simulation.search import ask_with
from kvbudget.speculative import DEFAULT_ACCEPTANCE, AcceptanceDraw, SpecMethod, Speculative

TEN_MS = TimeModel.fitted(overhead=0.01, per_context=0.0, per_token=0.0, basis="ten ms a step (test)")


def _config(blocks: int = 100, block_size: int = 16, budget: int = 2048, seqs: int = 64,
            caching: bool = False) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=blocks, block_size=block_size, max_num_seqs=seqs,
                           max_num_batched_tokens=budget, max_model_len=4096, prefix_caching=caching)


def _spec(method: SpecMethod = SpecMethod.NGRAM, k: int = 3, rates: tuple[float, ...] = (1.0,),
          draw: AcceptanceDraw = AcceptanceDraw.DRAWN) -> Speculative:
    draft = kvbudget.load_model("llama-3.2-1b") if method.needs_draft_model else None
    return Speculative(method=method, num_tokens=k, acceptance=rates, draft=draft, draw=draw)


def _run(sched: SpecScheduler) -> list[Step]:
    return run_to_end(sched)


def test_full_acceptance_gives_k_plus_one_tokens_a_step() -> None:
    # prompt 10, 9 tokens out, k = 3, every draft accepted: the prefill samples 1 (and drafts 3); each verification
    # of 1 + 3 tokens gives 4: 1 + 4 + 4 = 9 in 3 steps of 10, 4 and 4 tokens
    sched = SpecScheduler(_config(), _spec(k=3, rates=(1.0,)))
    sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    steps = _run(sched)
    assert [s.tokens for s in steps] == [10, 4, 4]
    assert [s.drafted for s in steps] == [0, 3, 3]
    t = sched.spec_totals()
    assert (t.drafted, t.accepted, t.verified) == (6, 6, 2)
    assert t.mean_acceptance_length == 4.0


def test_no_acceptance_gives_one_token_a_step() -> None:
    # acceptance 0: every verification of 1 + 3 tokens gives the one token after the (rejected) drafts: 1 + 8 steps
    sched = SpecScheduler(_config(), _spec(k=3, rates=(0.0,)))
    sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    steps = _run(sched)
    assert [s.tokens for s in steps] == [10] + [4] * 8
    t = sched.spec_totals()
    assert (t.drafted, t.accepted, t.verified) == (24, 0, 8)
    assert t.mean_acceptance_length == 1.0


def test_rejected_tokens_roll_back_computed_but_keep_their_slots() -> None:
    # prompt 14, k = 3, nothing accepted: the verification computes 14..17 (4 tokens: past the first block of 16,
    # so a second block is taken), then rolls back to 15 computed (14 + the one token); the block stays held
    sched = SpecScheduler(_config(), _spec(k=3, rates=(0.0,)))
    seq = sched.add(Request(arrival=0.0, prompt_tokens=14, output_tokens=5))
    sched.update(sched.schedule())
    assert (seq.computed, seq.out, seq.nblocks, seq.drafts) == (14, 1, 1, 3)
    step = sched.schedule()
    assert step.tokens == 4 and seq.computed == 18 and seq.nblocks == 2
    sched.update(step)
    assert (seq.computed, seq.out, seq.nblocks) == (15, 2, 2)


def test_output_past_the_end_is_dropped() -> None:
    # 3 tokens out, k = 3, all accepted: the prefill gives 1, the verification would give 4 but only 2 are wanted
    sched = SpecScheduler(_config(), _spec(k=3, rates=(1.0,)))
    seq = sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=3))
    steps = _run(sched)
    assert len(steps) == 2 and seq.out == 3 and seq.finished is not None


def test_lookahead_slots_limit_concurrency() -> None:
    # 4 usable blocks of 16 (and the null block); prompts of 13 tokens need one block each, but MTP with k = 4 asks
    # for 13 + 4 = 17 slots at admission (vLLM's num_lookahead_tokens): two blocks each, so two requests fit, not four
    # (n-gram lookup writes no KV ahead: all four)
    def admitted(method: SpecMethod) -> int:
        sched = SpecScheduler(_config(blocks=5), _spec(method, k=4))
        for _ in range(4):
            sched.add(Request(arrival=0.0, prompt_tokens=13, output_tokens=4))
        return len(sched.schedule().scheduled)

    assert admitted(SpecMethod.MTP) == 2
    assert admitted(SpecMethod.NGRAM) == 4


def test_draft_model_takes_an_input_slot_per_request() -> None:
    # max_num_batched_tokens 10, three requests of 2-token prompts; a draft model's drafting takes one more input
    # slot per scheduled request (max_num_new_slots_for_drafting): the prefills take 3 + 3 + 3, the verifications
    # of 1 + 2 tokens 4 + 4 of the budget, leaving 2 - 1 = 1 token for the third (its drafts dropped)
    sched = SpecScheduler(_config(budget=10), _spec(SpecMethod.DRAFT_MODEL, k=2))
    for _ in range(3):
        sched.add(Request(arrival=0.0, prompt_tokens=2, output_tokens=20))
    first = sched.schedule()
    assert [n for _, n in first.scheduled] == [2, 2, 2]
    sched.update(first)
    second = sched.schedule()
    assert [n for _, n in second.scheduled] == [3, 3, 1] and second.drafted == 4
    # n-gram lookup takes no slot: 3 + 3 + 3
    sched = SpecScheduler(_config(budget=10), _spec(SpecMethod.NGRAM, k=2))
    for _ in range(3):
        sched.add(Request(arrival=0.0, prompt_tokens=2, output_tokens=20))
    sched.update(sched.schedule())
    assert [n for _, n in sched.schedule().scheduled] == [3, 3, 3]


def test_eagle_gives_up_the_last_hit_block() -> None:
    # a shared prefix of 48 tokens (3 blocks) cached by the first request; the second finds 3 blocks, but EAGLE's
    # drafter needs the hidden states before the generation point: vLLM drops the last hit block, so it computes
    # 60 - 32 = 28 tokens (n-gram lookup keeps all 3 blocks: 60 - 48 = 12); the cache still holds the 3 blocks,
    # as its KV events say (what a prefix-aware router reads)
    def second(method: SpecMethod) -> tuple[int, int, int]:
        sched = SpecScheduler(_config(caching=True), _spec(method, k=2))
        shared = (("doc", 48),)
        sched.add(Request(arrival=0.0, prompt_tokens=60, output_tokens=2, prefix=shared))
        _run(sched)
        request = Request(arrival=0.0, prompt_tokens=60, output_tokens=2, prefix=shared)
        held = sched.cached_prefix(request)
        seq = sched.add(request)
        step = sched.schedule()
        return step.tokens, seq.hit_tokens, held

    assert second(SpecMethod.MTP) == (28, 32, 48)
    assert second(SpecMethod.NGRAM) == (12, 48, 48)


def test_preemption_drops_drafts() -> None:
    sched = SpecScheduler(_config(), _spec(k=3))
    seq = sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    sched.update(sched.schedule())
    assert seq.drafts == 3
    sched.running.remove(seq)
    sched._preempt(seq)
    assert seq.drafts == 0 and seq.computed == 0


def test_half_acceptance_alternates() -> None:
    # k = 1 at 0.5, expected acceptance: the expected 0.5 accepted a verification, carried: 1, 0, 1, 0 ... (the
    # mean exactly 0.5)
    sched = SpecScheduler(_config(), _spec(k=1, rates=(0.5,), draw=AcceptanceDraw.EXPECTED))
    sched.add(Request(arrival=0.0, prompt_tokens=4, output_tokens=1 + 3 * 10))
    _run(sched)
    t = sched.spec_totals()
    assert t.verified == 20 and t.accepted == 10  # 10 verifications of 2 tokens and 10 of 1: 30 after the first


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.integers(1, 4), st.integers(2, 60))
def test_acceptance_counts_stay_within_the_drafts(rates: list[float], k: int, out: int) -> None:
    rates = rates[:k]
    sched = SpecScheduler(_config(), _spec(k=k, rates=tuple(rates), draw=AcceptanceDraw.EXPECTED))
    seq = sched.add(Request(arrival=0.0, prompt_tokens=7, output_tokens=out))
    steps = _run(sched)
    t = sched.spec_totals()
    assert 0 <= t.accepted <= t.drafted <= k * t.verified
    assert seq.out == out and len(steps) <= out
    assert abs(seq.credit) <= 0.5 + 1e-9


def test_expected_accepted_by_hand() -> None:
    s = Speculative(method=SpecMethod.NGRAM, num_tokens=3, acceptance=(0.5, 0.4))
    assert s.rates() == (0.5, 0.4, 0.4)
    assert s.expected_accepted(3) == pytest.approx(0.5 + 0.2 + 0.08)
    assert s.with_tokens(0) is None
    assert s.with_tokens(1) == Speculative(method=SpecMethod.NGRAM, num_tokens=1, acceptance=(0.5,))
    assert "assumed" in Speculative(method=SpecMethod.MTP, num_tokens=1).acceptance_source
    assert set(DEFAULT_ACCEPTANCE) == set(SpecMethod)


def test_drafter_seconds_by_hand() -> None:
    # a drafter of 1 ms a step and 10 us a token, k = 3, after a step of 2 requests verifying 4 tokens each: its
    # first step over the 8 tokens (1.08 ms), then 2 of one token each (1.02 ms each)
    tm = TimeModel.fitted(overhead=1e-3, per_context=0.0, per_token=1e-5, basis="test")
    d = Drafting(spec=_spec(SpecMethod.MTP, k=3), time_model=tm, basis="test")
    step = Step(scheduled=((None, 4), (None, 4)), preempted=(), free_blocks=0, usage=0.0,  # type: ignore[arg-type]
                tokens=8, context=100)
    assert d.seconds(step) == pytest.approx(1.08e-3 + 2 * 1.02e-3)
    lookup = Drafting(spec=_spec(SpecMethod.NGRAM), time_model=None, cpu_per_seq=2e-5, basis="test")
    assert lookup.seconds(step) == pytest.approx(4e-5)


def test_simulate_counts_steps_and_time() -> None:
    # one request through the whole simulator: prompt 10, 9 out, k = 3, all accepted: 3 steps of 10 ms (the n-gram
    # drafter's 20 us a sequence a step beside them)
    model = kvbudget.load_model("llama-3.1-8b")
    setup = setup_for(model, kv_memory=1 << 30, max_model_len=4096, time_model=TEN_MS, speculative=_spec(k=3))
    sim = simulate(model, [Request(arrival=0.0, prompt_tokens=10, output_tokens=9)], setup=setup)
    assert sim.steps == 3
    assert sim.duration_s == pytest.approx(3 * (0.01 + 20e-6))
    assert sim.speculation is not None and sim.speculation.mean_acceptance_length == 4.0
    assert sim.to_dict()["speculation"]["accepted"] == 6
    assert sim.setup.to_dict()["drafting"]["acceptance_source"] == "given"
    plain = simulate(model, [Request(arrival=0.0, prompt_tokens=10, output_tokens=9)],
                     setup=setup_for(model, kv_memory=1 << 30, max_model_len=4096, time_model=TEN_MS))
    assert plain.steps == 9 and plain.speculation is None


def test_refused_where_not_simulated() -> None:
    model = kvbudget.load_model("llama-3.1-8b")
    common = {"kv_memory": 1 << 30, "max_model_len": 4096, "time_model": TEN_MS, "speculative": _spec()}
    with pytest.raises(KVBudgetError) as e:
        setup_for(model, engine="llamacpp", **common)
    assert e.value.param == "speculative"
    with pytest.raises(KVBudgetError) as e:
        setup_for(model, allocator="contiguous-max", **common)
    assert e.value.param == "speculative" and "contiguous" in str(e.value)


def test_sweep_of_speculative_tokens() -> None:
    combos = parse_sweep(["num-speculative-tokens=0,2"])
    assert combos == [{"num_speculative_tokens": 0}, {"num_speculative_tokens": 2}]
    model = kvbudget.load_model("llama-3.1-8b")
    from kvbudget.engines import get_engine
    from kvbudget.engines.scheduling.setup import SimulationAsk

    ask = SimulationAsk(model=model, engine=get_engine("vllm"), kv_memory=1 << 30, speculative=_spec(k=4))
    assert ask_with(ask, combos[0]).speculative is None
    assert ask_with(ask, combos[1]).speculative == _spec(k=2)
    with pytest.raises(KVBudgetError) as e:
        ask_with(SimulationAsk(model=model, engine=get_engine("vllm"), kv_memory=1 << 30), combos[1])
    assert e.value.param == "sweep"
    with pytest.raises(KVBudgetError) as e:
        ask_with(ask, {"num_speculative_tokens": 65})
    assert e.value.param == "sweep" and "0 (none) to 64" in str(e.value)


def test_command_runs_without_drafts_beside_and_says_so() -> None:
    # the command's run with speculative decoding also runs the workload without it: TPOT with and without; with
    # every draft accepted (k = 3) a 9-token answer takes 2 decode steps of 10 ms (plus the drafter's 20 us each)
    # after the first token, against 8 steps: TPOT (2 x 10.02 ms) / 8 and 10 ms
    from kvbudget.cli.simulate import speculation_lines
    from kvbudget.commands.simulate import SimulateRequest, run_prepared
    from kvbudget.engines import get_engine
    from kvbudget.engines.scheduling.setup import SimulationAsk

    model = kvbudget.load_model("llama-3.1-8b")
    found = SimulationAsk(model=model, engine=get_engine("vllm"), kv_memory=1 << 30, max_model_len=4096,
                          time_model=TEN_MS, speculative=_spec(k=3))
    sim = run_prepared(SimulateRequest(model="llama-3.1-8b"),
                       (lambda _: [Request(arrival=0.0, prompt_tokens=10, output_tokens=9)], found, 1.0))
    assert sim.tpot.mean == pytest.approx(2 * 0.01002 / 8)
    assert sim.tpot_without is not None and sim.tpot_without.mean == pytest.approx(0.01)
    assert sim.to_dict()["tpot_without_speculation_s"]["mean"] == pytest.approx(0.01)
    lines = speculation_lines(sim)
    assert "mean acceptance length 4.00" in lines[0] and "without it: mean 10.0 ms" in lines[0]
    assert lines[1] == ("acceptance per position: 1, 1, 1 (given); drawn at random for each verification from the "
                        "per-position rates (seed 0)")
    assert "assumption" in lines[2]


def test_draft_model_needs_a_catalog_gpu_for_its_time() -> None:
    # a KV budget and a given time model time the target; the draft model's own steps need a GPU's figures
    model = kvbudget.load_model("llama-3.1-8b")
    with pytest.raises(KVBudgetError) as e:
        setup_for(model, kv_memory=1 << 30, max_model_len=4096, time_model=TEN_MS,
                  speculative=_spec(SpecMethod.DRAFT_MODEL, k=2))
    assert e.value.param == "speculative" and "GPU" in str(e.value)


def test_draft_model_time_from_its_own_kernels() -> None:
    # the 1B drafter's step is shorter than the 8B target's on the same card (both from the kernel model)
    model = kvbudget.load_model("llama-3.1-8b")
    setup = setup_for(model, gpu="H100-80GB", max_model_len=4096, speculative=_spec(SpecMethod.DRAFT_MODEL, k=2))
    assert setup.drafting is not None and setup.drafting.time_model is not None
    assert setup.drafting.time_model.step_seconds(1, 1000) < setup.time_model.step_seconds(1, 1000)
    assert "llama-3.2-1b" in setup.drafting.basis


def test_conditional_rates_from_printed_acceptance() -> None:
    # vLLM prints "acceptance at token i" over all drafts: 0.8, 0.4, 0.1 are 0.8, then 0.4 / 0.8, then 0.1 / 0.4
    from kvbudget.speculative import conditional_rates

    assert conditional_rates((0.8, 0.4, 0.1)) == pytest.approx((0.8, 0.5, 0.25))
    assert conditional_rates((0.0, 0.0)) == (0.0, 0.0)
    with pytest.raises(KVBudgetError) as e:
        conditional_rates((0.5, 0.6))
    assert e.value.param == "acceptance"


def test_sweep_table_shows_the_acceptance_length(capsys: pytest.CaptureFixture[str]) -> None:
    # a sweep over the drafts a step: k = 0 runs without (its acceptance "-"), k = 2 with every draft accepted
    # gives 3 tokens a verification
    from kvbudget.cli.simulate import _sweep
    from kvbudget.commands.simulate import SimulateRequest, prepared

    ask = SimulateRequest(model="llama-3.1-8b", rate="2", requests="20", gpu="H100-80GB", max_model_len="4096",
                          backend="serial", sweep=["num-speculative-tokens=0,2"])
    _, found, _ = prepared(ask)
    from dataclasses import replace

    found = replace(found, speculative=_spec(k=2))
    assert _sweep(ask, found, parse_sweep(["num-speculative-tokens=0,2"])) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [(r[0], r[-1]) for r in rows] == [("0", "-"), ("2", "3.00")]
