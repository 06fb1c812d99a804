"""How a simulated verification's accepted drafts are had: drawn at random (seeded) from the per-position rates, the
expected count carried, or a recorded run's counts replayed. Expected values are worked out by hand from the rates
(the probability that at least the first i + 1 drafts are accepted is the product of the rates up to i)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import run_to_end

import kvbudget
from kvbudget.engines.scheduling.seq import SchedulerConfig, Step
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.specdecode import SpecScheduler
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.run import setup_for, simulate
from kvbudget.speculative import AcceptanceDraw, Replayed, SpecMethod, Speculative

TEN_MS = TimeModel.fitted(overhead=0.01, per_context=0.0, per_token=0.0, basis="ten ms a step (test)")


def _config(budget: int = 2048, max_len: int = 8192) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=2000, block_size=16, max_num_seqs=64, max_num_batched_tokens=budget,
                           max_model_len=max_len, prefix_caching=False)


def _run(sched: SpecScheduler) -> list[Step]:
    return run_to_end(sched)


def _spec(k: int, rates: tuple[float, ...], seed: int = 0, **kw: object) -> Speculative:
    return Speculative(method=SpecMethod.NGRAM, num_tokens=k, acceptance=rates, seed=seed, **kw)  # type: ignore[arg-type]


def test_drawn_counts_follow_the_chain_of_rates() -> None:
    # k = 2 at 0.8 then 0.5: at least one accepted 0.8, both 0.8 x 0.5 = 0.4; so none 0.2, one 0.4, two 0.4, and
    # the mean 0.8 + 0.4 = 1.2 (the expected-value model's). 40,000 draws: each share within 0.01 (over 4 standard
    # errors: sqrt(0.4 x 0.6 / 40,000) = 0.0024)
    sched = SpecScheduler(_config(), _spec(2, (0.8, 0.5)))
    draws = [sched._drawn(None, 2) for _ in range(40_000)]  # type: ignore[arg-type]
    shares = {a: n / len(draws) for a, n in Counter(draws).items()}
    assert shares[0] == pytest.approx(0.2, abs=0.01)
    assert shares[1] == pytest.approx(0.4, abs=0.01)
    assert shares[2] == pytest.approx(0.4, abs=0.01)
    assert sum(draws) / len(draws) == pytest.approx(1.2, abs=0.015)
    assert _spec(2, (0.8, 0.5)).expected_accepted(2) == pytest.approx(1.2)
    # one draft of the two scheduled (the budget cut the other): accepted with 0.8
    one = [sched._drawn(None, 1) for _ in range(20_000)]  # type: ignore[arg-type]
    assert set(one) == {0, 1} and sum(one) / len(one) == pytest.approx(0.8, abs=0.012)


def test_mean_acceptance_over_a_run_is_the_expected_value() -> None:
    # 40 requests of 600 tokens out, k = 3 at 0.7 a position: a verification accepts 0.7 + 0.49 + 0.343 = 1.533
    # drafts on average (a little fewer where the last verification is cut by the request's end)
    sched = SpecScheduler(_config(), _spec(3, (0.7,), seed=5))
    for _ in range(40):
        sched.add(Request(arrival=0.0, prompt_tokens=20, output_tokens=600))
    _run(sched)
    t = sched.spec_totals()
    assert t.verified > 8000
    assert t.accepted / t.verified == pytest.approx(0.7 + 0.49 + 0.343, abs=0.04)


def _outcome(spec: Speculative) -> tuple[tuple[int, ...], tuple[int, int, int]]:
    sched = SpecScheduler(_config(), spec)
    for i in range(6):
        sched.add(Request(arrival=0.0, prompt_tokens=30 + i, output_tokens=80))
    steps = _run(sched)
    t = sched.spec_totals()
    return tuple(s.tokens for s in steps), (t.drafted, t.accepted, t.verified)


def test_same_seed_same_run_another_seed_another() -> None:
    assert _outcome(_spec(3, (0.6,), seed=7)) == _outcome(_spec(3, (0.6,), seed=7))
    assert _outcome(_spec(3, (0.6,), seed=7)) != _outcome(_spec(3, (0.6,), seed=8))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), st.integers(1, 4), st.integers(2, 60),
       st.integers(0, 2**64 - 1))
def test_drawn_counts_stay_within_the_drafts(rates: list[float], k: int, out: int, seed: int) -> None:
    sched = SpecScheduler(_config(), _spec(k, tuple(rates[:k]), seed=seed))
    seq = sched.add(Request(arrival=0.0, prompt_tokens=7, output_tokens=out))
    steps = _run(sched)
    t = sched.spec_totals()
    assert 0 <= t.accepted <= t.drafted <= k * t.verified
    assert seq.out == out and len(steps) <= out


def test_drawn_acceptance_spreads_the_latencies() -> None:
    # 30 identical requests one at a time (each alone on the engine, 10 ms a step), k = 3 at 0.6: with the
    # expected count every request takes the same steps, so TPOT has no spread; drawn, requests differ (p99 above
    # the mean) while the mean stays close to the expected model's
    model = kvbudget.load_model("llama-3.1-8b")
    requests = [Request(arrival=10.0 * i, prompt_tokens=50, output_tokens=200) for i in range(30)]

    def tpot(draw: AcceptanceDraw) -> tuple[float, float]:
        spec = _spec(3, (0.6,), draw=draw)
        sim = simulate(model, iter(requests), setup=setup_for(model, kv_memory=1 << 30, max_model_len=4096,
                                                              time_model=TEN_MS, speculative=spec))
        assert sim.tpot is not None
        return sim.tpot.mean, sim.tpot.p99

    mean, p99 = tpot(AcceptanceDraw.EXPECTED)
    assert p99 == pytest.approx(mean, rel=1e-9)
    drawn_mean, drawn_p99 = tpot(AcceptanceDraw.DRAWN)
    assert drawn_p99 > 1.05 * drawn_mean
    assert drawn_mean == pytest.approx(mean, rel=0.1)


def test_replayed_drafts_by_hand() -> None:
    # prompt 10, 9 out, k = 3; the run proposed 2, 0, 3, 3 drafts after the steps that sampled and accepted 1, 2, 3:
    # the prefill (10 tokens) samples 1; 1 + 2 tokens, 1 accepted: out 3; no drafts: 1 token, out 4; 1 + 3, 2
    # accepted: out 7; 1 + 3, 3 accepted: 7 + 4 capped at 9
    spec = _spec(3, (), replayed=Replayed(proposed=((2, 0, 3, 3),), accepted=((1, 2, 3),)))
    sched = SpecScheduler(_config(), spec)
    seq = sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    steps = _run(sched)
    assert [s.tokens for s in steps] == [10, 3, 1, 4, 4]
    assert [s.drafted for s in steps] == [0, 2, 0, 3, 3]
    t = sched.spec_totals()
    assert (t.drafted, t.accepted, t.verified) == (8, 6, 3) and seq.out == 9


def test_replay_that_runs_out_or_does_not_fit_is_refused() -> None:
    short = _spec(3, (), replayed=Replayed(proposed=((3,),), accepted=((0,),)))
    sched = SpecScheduler(_config(), short)
    sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    with pytest.raises(KVBudgetError) as e:
        _run(sched)
    assert e.value.param == "replayed" and "no more drafts proposed for request 0" in str(e.value)
    # 3 accepted where max_model_len 13 let only 1 of the 3 proposed drafts be verified (10 computed, tokens up to
    # position 12: the next token and 1 draft): the schedules differ
    cut = _spec(3, (), replayed=Replayed(proposed=((3, 3),), accepted=((3,),)))
    sched = SpecScheduler(_config(max_len=13), cut)
    sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=9))
    with pytest.raises(KVBudgetError) as e:
        _run(sched)
    assert e.value.param == "replayed" and "accepted 3 drafts" in str(e.value)


def test_replayed_from_recorder_records() -> None:
    records = [{"start": True}, {"add": "a", "prompt": [1], "max_tokens": 4}, {"step": [["a", 1]]},
               {"proposed": {"a": 3}}, {"add": "b", "prompt": [2], "max_tokens": 4},
               {"step": [["a", 4], ["b", 1]], "drafts": {"a": 3}}, {"verified": {"a": [3, 2]}},
               {"proposed": {"a": 1, "b": 0}}]
    assert Replayed.from_records(records) == Replayed(proposed=((3, 1), (0,)), accepted=((2,), ()))
    for bad in ([{"proposed": {"z": 3}}], [{"add": "a"}, {"verified": {"a": 3}}], ["step"]):
        with pytest.raises(KVBudgetError) as e:
            Replayed.from_records(bad)  # type: ignore[arg-type]
        assert e.value.param == "replayed" and "record" in str(e.value)
    with pytest.raises(KVBudgetError) as e:
        Replayed(proposed=((65,),), accepted=((),))
    assert e.value.param == "replayed"
    with pytest.raises(KVBudgetError) as e:
        Replayed(proposed=((),), accepted=())
    assert e.value.param == "replayed"


def test_seed_out_of_range_is_refused() -> None:
    with pytest.raises(KVBudgetError) as e:
        _spec(1, (0.5,), seed=-1)
    assert e.value.param == "seed" and "0 to 18,446,744,073,709,551,615" in str(e.value)
    assert "seed 4" in _spec(1, (0.5,), seed=4).draw_source
    assert "no spread" in _spec(1, (0.5,), draw=AcceptanceDraw.EXPECTED).draw_source


def test_one_token_to_compute_is_padded_with_placeholder_drafts() -> None:
    # vLLM 0.32 pads a waiting request with one token to compute to 1 + k with k placeholder drafts (never
    # accepted) while a running request that is not a prefill chunk is scheduled: A (prompt 10) decodes with 3
    # drafts, all accepted; B (a prompt of one token) arrives after A's prefill and takes 1 + 3 tokens, its 3
    # placeholders rejected: it keeps 1 computed token and samples 1
    sched = SpecScheduler(_config(), _spec(3, (1.0,)))
    a = sched.add(Request(arrival=0.0, prompt_tokens=10, output_tokens=20))
    sched.update(sched.schedule())
    b = sched.add(Request(arrival=0.0, prompt_tokens=1, output_tokens=5))
    step = sched.schedule()
    assert [(s.uid, n) for s, n in step.scheduled] == [(a.uid, 4), (b.uid, 4)]
    assert step.drafted == 6 and step.tokens == 8
    sched.update(step)
    assert (b.computed, b.out, b.drafts) == (1, 1, 3) and a.out == 5
    t = sched.spec_totals()
    assert (t.drafted, t.accepted, t.verified) == (6, 3, 2)


def test_no_padding_alone_or_beside_a_prefill_chunk() -> None:
    # alone (no running request scheduled, nothing cached): one token
    sched = SpecScheduler(_config(), _spec(3, (1.0,)))
    sched.add(Request(arrival=0.0, prompt_tokens=1, output_tokens=5))
    assert [n for _, n in sched.schedule().scheduled] == [1]
    # beside A still in its prefill (chunks of 8 in a budget of 8 tokens, then 3 of its 11 left and 5 for B):
    # B is not padded
    sched = SpecScheduler(_config(budget=8), _spec(3, (1.0,)))
    sched.add(Request(arrival=0.0, prompt_tokens=11, output_tokens=5))
    sched.update(sched.schedule())
    b = sched.add(Request(arrival=0.0, prompt_tokens=1, output_tokens=5))
    step = sched.schedule()
    assert [n for _, n in step.scheduled] == [3, 1] and b.drafts == 0
    # padding that does not fit the budget stops admission: A verifies 1 + 3 of a budget of 6, B's 4 do not fit
    sched = SpecScheduler(_config(budget=6), _spec(3, (1.0,)))
    sched.add(Request(arrival=0.0, prompt_tokens=6, output_tokens=20))
    sched.update(sched.schedule())
    sched.add(Request(arrival=0.0, prompt_tokens=1, output_tokens=5))
    assert [n for _, n in sched.schedule().scheduled] == [4]


def test_the_commands_seed_the_draw() -> None:
    # simulate's --seed (the synthetic workload's) seeds the acceptance draw too; recommend's the same
    from kvbudget.commands.options import SpeculativeKnobs
    from kvbudget.commands.recommend import RecommendRequest, _speculatives
    from kvbudget.commands.simulate import SimulateRequest, simulation_ask

    model = kvbudget.load_model("llama-3.1-8b")
    knobs = SpeculativeKnobs(speculative="ngram", num_speculative_tokens="3")
    ask = simulation_ask(SimulateRequest(model="llama-3.1-8b", seed="7", speculative=knobs), model)
    assert ask.speculative is not None and ask.speculative.seed == 7
    assert ask.speculative.draw is AcceptanceDraw.DRAWN
    with pytest.raises(KVBudgetError) as e:
        simulation_ask(SimulateRequest(model="llama-3.1-8b", seed="-1", speculative=knobs), model)
    assert e.value.param == "seed"
    found = _speculatives(RecommendRequest(model="llama-3.1-8b", speculative="ngram", seed="9"), (0, 2))
    assert found[0] is None and found[1] is not None and found[1].seed == 9
