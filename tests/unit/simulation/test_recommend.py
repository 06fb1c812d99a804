"""`recommend`: the search over deployments. The chosen one is checked against simulations run here through the
public API (simulate, simulate_fleet), not through the search's own runner; the brute force simulates every
candidate of a small space."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvbudget
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.setup import Role, SimulationAsk
from kvbudget.errors import KVBudgetError
from kvbudget.simulation import exponential_lengths, synthetic
from kvbudget.simulation.fleet import simulate_fleet
from kvbudget.simulation.recommend import (
    MAX_CANDIDATES,
    Candidate,
    Space,
    candidates,
    recommend,
    simulate_candidate,
)
from kvbudget.simulation.routing import Pool
from kvbudget.simulation.run import setup_of, simulate
from kvbudget.simulation.search import meets, parse_slo

PRICES = {"H100-80GB": 2.49, "L40S": 0.86}
SLO = "ttft_p99=1s,tpot_p99=40ms"


@pytest.fixture(scope="module")
def model():
    return kvbudget.load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def ask(model):
    return SimulationAsk(model=model, engine=get_engine("vllm"), max_model_len=8192)


@pytest.fixture(scope="module")
def traffic():
    return tuple(synthetic(20, 300, exponential_lengths(1000, 200), seed=1))


SMALL = Space(gpus=("H100", "L40S"), max_gpus=2, kv_dtypes=("auto",), tp=(1, 2))


def alone(ask, c: Candidate, traffic):
    """The candidate simulated here, without the search: one engine, or its fleet."""
    setup = setup_of(replace(ask, gpu=c.gpu, tp=c.tp, pp=c.pp, kv_dtype=c.kv_dtype, prefix_caching=c.prefix_caching,
                             max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
                             utilization=c.gpu_memory_utilization, offload_memory=c.offload_memory))
    if c.disaggregated:
        pools = [Pool(name="p", setup=setup, replicas=c.prefill_replicas, role=Role.PREFILL),
                 Pool(name="d", setup=setup, replicas=c.decode_replicas, role=Role.DECODE)]
        return simulate_fleet(ask.model, iter(traffic), pools, kv_link="infiniband")
    if c.replicas > 1:
        return simulate_fleet(ask.model, iter(traffic), [Pool(name="s", setup=setup, replicas=c.replicas)])
    return simulate(ask.model, iter(traffic), setup=setup)


def test_the_chosen_one_is_the_cheapest_that_meets_the_slo_brute_force(ask, traffic):
    slo = parse_slo(SLO)
    found = recommend(ask, traffic, slo, SMALL, PRICES, backend="serial")
    assert found.best is not None
    everything = {c: meets(alone(ask, c, traffic), slo) for c in candidates(SMALL)}
    assert len(everything) == 8  # 2 GPUs x (1 and 2 replicas, 1 prefill + 1 decode, TP 2)
    cheapest = min(PRICES[c.gpu] * c.gpus for c, ok in everything.items() if ok)
    assert everything[found.best.candidate]  # it meets the objectives when simulated alone
    assert found.best.price_per_hour == pytest.approx(cheapest)
    # the cheapest is not the cheapest candidate of the space: the search had to pass over some
    assert cheapest > min(PRICES[c.gpu] * c.gpus for c in everything)
    for t, why in found.runners_up:  # every runner-up's verdict as simulated alone
        assert t.met == everything[t.candidate], why


def test_nothing_costlier_than_a_winner_is_simulated_unless_asked(ask, traffic):
    slo = parse_slo(SLO)
    quick = recommend(ask, traffic, slo, SMALL, PRICES, backend="serial", batch=1)
    assert quick.best is not None
    assert all(t.price_per_hour <= quick.best.price_per_hour + 1e-9 for t in quick.tried)
    assert quick.skipped + len(quick.tried) == quick.listed
    full = recommend(ask, traffic, slo, SMALL, PRICES, backend="serial", exhaustive=True)
    assert len(full.tried) == full.listed and full.skipped == 0
    assert full.best == quick.best


def test_early_stop_gives_the_same_verdict(ask, traffic):
    """Ending a run once an objective is certainly missed changes no verdict (each candidate, with and without)."""
    slo = parse_slo("ttft_p90=300ms,tpot_p99=30ms")
    for c in candidates(SMALL):
        setup = setup_of(replace(ask, gpu=c.gpu, tp=c.tp))
        link = None
        if c.disaggregated:
            from kvbudget.interconnects import kv_link

            link = kv_link("infiniband")
        stopped = simulate_candidate(ask.model, traffic, c, setup, slo, "round-robin", link, stop=True)
        whole = simulate_candidate(ask.model, traffic, c, setup, slo, "round-robin", link, stop=False)
        assert bool(stopped.missed) == bool(whole.missed) == (not meets(alone(ask, c, traffic), slo))
        if stopped.stopped:  # what it says it missed, the whole run missed too
            assert stopped.missed[0].split(" ")[0] in " ".join(whole.missed)


def test_no_early_stop_for_requests_of_several_sequences(ask):
    """A percentile counts requests, the finish hook sequences: with n > 1 the run goes to its end."""
    from kvbudget.engines.scheduling.workload import Request

    traffic = [Request(arrival=i * 0.01, prompt_tokens=2000, output_tokens=50, n=2) for i in range(40)]
    c = Candidate(gpu="L40S")
    m = simulate_candidate(ask.model, traffic, c, setup_of(replace(ask, gpu="L40S")), parse_slo("ttft_p50=1ms"),
                           "round-robin", None, stop=True)
    assert m.missed and not m.stopped and m.values["ttft_p50"] is not None


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40), limit=st.floats(0.01, 2.0),
       stat=st.sampled_from(["p50", "p90", "p99", "max"]))
def test_the_stop_rule_matches_the_nearest_rank_percentile(values, limit, stat):
    from kvbudget.engines.scheduling.workload import Request
    from kvbudget.simulation.earlystop import EarlyStop, Missed
    from kvbudget.simulation.percentiles import Percentiles

    requests = [Request(arrival=0.0, prompt_tokens=1, output_tokens=2) for _ in values]
    stop = EarlyStop(requests, {f"ttft_{stat}": limit})
    fired = False
    try:
        for v in values:
            stop(None, v, None, v)
    except Missed:
        fired = True
    percentiles = Percentiles.of(tuple(values))
    assert percentiles is not None
    assert fired == (getattr(percentiles, stat) > limit)


def test_settings_that_cannot_start_are_pruned_and_really_fail(traffic):
    big = kvbudget.load_model("llama-3.1-70b")
    ask70 = SimulationAsk(model=big, engine=get_engine("vllm"), max_model_len=8192)
    space = Space(gpus=("L40S", "H100"), max_gpus=2, kv_dtypes=("auto",), tp=(1, 2), disaggregated=False)
    found = recommend(ask70, traffic, parse_slo("ttft_p99=100s"), space, PRICES, backend="serial", exhaustive=True)
    assert found.pruned, "70B on one L40S or one H100 cannot start"
    pruned = sum(p.candidates for p in found.pruned)
    assert pruned + len(found.tried) == found.listed
    tried = {t.candidate for t in found.tried}
    for c in candidates(space):
        if c in tried:
            continue
        with pytest.raises(KVBudgetError):  # the engine refuses it: the weights do not fit
            setup_of(replace(ask70, gpu=c.gpu, tp=c.tp))


def test_none_meets_says_what_binds_and_the_closest(ask, traffic):
    found = recommend(ask, traffic, parse_slo("ttft_p99=1ms"), SMALL, PRICES, backend="serial")
    assert found.best is None and len(found.tried) == found.listed
    assert found.binding.startswith("ttft_p99") and "closest:" in found.binding
    # runs cut short are run whole when none meets: every figure there, the closest the nearest by them
    assert all(not t.measured.stopped and t.measured.values["ttft_p99"] is not None for t in found.tried)
    assert found.closest is not None
    assert found.closest.measured.values["ttft_p99"] == min(t.measured.values["ttft_p99"] for t in found.tried)
    assert found.closest.candidate.label() in found.binding
    with pytest.raises(KVBudgetError, match="no candidate meets it") as err:
        found.deployment()
    assert err.value.param == "slo"


def test_the_deployment_is_the_winner(ask, traffic):
    found = recommend(ask, traffic, parse_slo(SLO), SMALL, PRICES, backend="serial")
    assert found.best is not None
    c, d = found.best.candidate, found.deployment()
    assert d.gpus == c.gpus and d.disaggregated == c.disaggregated and d.model == "meta-llama/Llama-3.1-8B"
    setup = found.setups[c.setting]
    for pool in d.pools:
        assert (pool.gpu, pool.tp, pool.max_num_seqs, pool.max_model_len) == (c.gpu, c.tp, setup.max_num_seqs, 8192)
        assert 0.5 < pool.gpu_memory_utilization <= 1.0


def test_kv_dtypes_other_than_the_models_ask_for_a_quality_check(ask, traffic):
    space = replace(SMALL, gpus=("H100",), kv_dtypes=("fp8",), tp=(1,), disaggregated=False, max_gpus=1)
    found = recommend(ask, traffic, parse_slo("ttft_p99=10s"), space, PRICES, backend="serial")
    assert found.best is not None and found.best.candidate.kv_dtype == "fp8"
    (check,) = found.quality_checks()
    assert "check quality on your data" in check and "kvbudget quality" in check and "--kv-dtype fp8" in check
    assert any("--kv-dtype fp8" in note for note in found.deployment().notes)


def test_latencies_carry_their_band(ask, traffic):
    found = recommend(ask, traffic, parse_slo(SLO), SMALL, PRICES, backend="serial")
    assert found.best is not None
    for name, band in found.best.bands.items():
        value = found.best.measured.values[name]
        assert band is not None and value is not None and band[0] <= value <= band[1]


def test_json_shape(ask, traffic):
    found = recommend(ask, traffic, parse_slo(SLO), SMALL, PRICES, backend="serial")
    out = json.loads(json.dumps(found.to_dict()))
    assert set(out) >= {"best", "front", "runners_up", "pruned", "candidates", "slo_s", "quality_checks"}
    assert out["candidates"]["listed"] == 8 and out["best"]["met"] is True
    assert all("why" in r for r in out["runners_up"])
    assert out["front"] and all(f["completed"] == f["requests"] for f in out["front"])


def test_a_process_pool_gives_the_same_answer(ask, traffic):
    slo = parse_slo(SLO)
    assert recommend(ask, traffic, slo, SMALL, PRICES, backend="process").best == \
        recommend(ask, traffic, slo, SMALL, PRICES, backend="serial").best


def test_the_slo_pickles_with_its_unit():
    slo = parse_slo("ttft_p99=2s,tpot_p99=50ms")
    back = pickle.loads(pickle.dumps(slo))
    assert back == slo and [v.unit for v in back.values()] == ["s", "ms"]


@pytest.mark.parametrize(("space", "param"), [
    (dict(gpus=()), "gpus"), (dict(gpus=("H100",), kv_dtypes=()), "kv_dtype"),
    (dict(gpus=("H100",), max_gpus=0), "max_gpus"), (dict(gpus=("H100",), max_gpus=65), "max_gpus"),
    (dict(gpus=("H100",), tp=(0,)), "tp"), (dict(gpus=("nonesuch",)), "gpu"),
    (dict(gpus=("H100",), gpu_memory_utilization=(1.5,)), "gpu_memory_utilization"),
])
def test_a_bad_space_is_refused_in_one_line(space, param):
    with pytest.raises(KVBudgetError) as err:
        Space(**space)
    assert err.value.param == param and "\n" not in str(err.value)


def test_a_space_with_nothing_in_it_or_too_much_is_refused():
    with pytest.raises(KVBudgetError, match="no candidate") as err:
        candidates(Space(gpus=("H100",), tp=(8,), max_gpus=4))
    assert err.value.param == "max_gpus"
    with pytest.raises(KVBudgetError, match=f"more than {MAX_CANDIDATES:,}"):
        candidates(Space(gpus=("H100", "L40S", "A100-80GB"), max_gpus=64, max_num_seqs=(64, 128, 256)))


def test_an_unpriced_gpu_is_refused_before_any_plan(ask, traffic):
    with pytest.raises(KVBudgetError, match="no price for L40S") as err:
        recommend(ask, traffic, parse_slo(SLO), SMALL, {"H100-80GB": 2.49}, backend="serial")
    assert err.value.param == "gpu_price"


def test_candidates_count_the_shapes():
    listed = candidates(Space(gpus=("H100",), max_gpus=4, tp=(1, 2), kv_dtypes=("auto",)))
    # TP 1: 4 co-located + (P, D) with P + D <= 4: 6; TP 2: 2 co-located + 1 split
    assert len(listed) == 13 and len(set(listed)) == 13
    assert all(c.gpus <= 4 for c in listed)


def test_the_front_is_every_candidate_no_other_beats(ask, traffic):
    """The front as its definition says, checked pair by pair over an exhaustive search."""
    found = recommend(ask, traffic, parse_slo("ttft_p99=2s,tpot_p99=60ms"), SMALL, PRICES, backend="serial",
                      exhaustive=True, early_stop=False)
    served = [t for t in found.tried if t.measured.completed == t.measured.requests]

    def key(t):
        m = t.measured
        return (-(m.prompt_tokens + m.output_tokens) / m.duration_s / t.candidate.gpus,
                max(m.values[n] / limit for n, limit in t.slo.items()), t.cost.per_million_tokens)

    def beaten(t):
        return any(all(a <= b for a, b in zip(key(o), key(t), strict=True)) and key(o) != key(t) for o in served)

    expected = [t for t in served if t is found.best or not beaten(t)]
    assert list(found.front) == expected and 1 < len(expected) < len(served)
