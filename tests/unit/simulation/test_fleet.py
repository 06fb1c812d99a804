"""Fleets: replicas behind a router. Each replica's schedule equals a single-replica run of the requests routed to
it, step for step, whichever router sent them; the routers do what their names say."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import AZURE, LLAMA, close

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.simulation.fleet import Pool, parse_router, simulate_fleet
from kvbudget.simulation.run import setup_for, simulate

SMALL = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30)  # ~16k tokens: queues form
BIG = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=6 << 30, max_num_seqs=64)


def azure(n: int = 800, scale: float = 8.0) -> list[Request]:
    """The Azure conversation trace's first n requests, `scale` times as fast (enough load to preempt), each
    request given one of 7 sessions."""
    out = []
    for i, r in enumerate(rescale(read_trace(AZURE), scale, 0, n)):
        out.append(replace(r, prompt_tokens=min(r.prompt_tokens, 6000), session=f"s{i % 7}"))
    return out


def replay(router: str, pools: list[Pool], requests: list[Request], fast: bool = True) -> None:
    """Run the fleet, then each replica alone on what it was sent: the same schedule (its seconds to rounding)."""
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(LLAMA, requests, pools, router, fast=fast,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert sum(r.routed for r in fleet.replicas) == len(requests) == fleet.requests
    assert fleet.completed == len(requests)
    used = 0
    for rep in fleet.replicas:
        mine = sent.get(rep.index, [])
        assert rep.routed == len(mine)
        if not mine:
            continue
        used += 1
        alone = simulate(LLAMA, mine, setup=rep.simulation.setup, fast=fast)
        got = rep.simulation
        assert close((got.steps, got.completed, got.preemptions, got.duration_s),
                     (alone.steps, alone.completed, alone.preemptions, alone.duration_s))
        assert close(got.ttft_sorted, alone.ttft_sorted) and close(got.e2e_sorted, alone.e2e_sorted)
        assert close(got.tpot_sorted, alone.tpot_sorted)
        assert close((got.peak_usage, got.mean_usage, got.peak_waiting),
                     (alone.peak_usage, alone.mean_usage, alone.peak_waiting))
    assert used > 1


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv", "least-kv:0.5", "session"])
def test_each_replica_runs_exactly_as_alone(router):
    replay(router, [Pool(name="main", setup=SMALL, replicas=4)], azure())


def test_pools_by_length_run_exactly_as_alone_and_split_by_prompt():
    requests = azure(600)
    sent: dict[int, list[Request]] = {}
    pools = [Pool(name="short", setup=SMALL, replicas=2), Pool(name="long", setup=BIG, replicas=1)]
    fleet = simulate_fleet(LLAMA, requests, pools, "length:1024",
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert all(r.prompt_tokens <= 1024 for i in (0, 1) for r in sent.get(i, []))
    assert all(r.prompt_tokens > 1024 for r in sent[2])
    assert [r.pool for r in fleet.replicas] == ["short", "short", "long"]
    replay("length:1024", pools, requests)


def test_the_fast_path_changes_nothing_in_a_fleet():
    pools = [Pool(name="main", setup=SMALL, replicas=3)]
    fast = simulate_fleet(LLAMA, azure(300), pools, "least-requests")
    slow = simulate_fleet(LLAMA, azure(300), pools, "least-requests", fast=False)
    for a, b in zip(fast.replicas, slow.replicas, strict=True):
        assert close(a.simulation.e2e_sorted, b.simulation.e2e_sorted) and a.routed == b.routed
    replay("least-requests", pools, azure(300), fast=False)


def test_least_kv_reads_the_same_scrapes_on_the_fast_path():
    """The fast path computes only the scrapes a read can still show (those a later one in the same run would make
    stale are never read); the reference records every one, step by step: the same routes and schedules."""
    pools = [Pool(name="main", setup=SMALL, replicas=3)]
    for router in ("least-kv", "least-kv:0.01"):
        sent: dict[bool, list[int]] = {True: [], False: []}
        fast, slow = (simulate_fleet(LLAMA, azure(300), pools, router, fast=f,
                                     on_route=lambda r, i, got=sent[f]: got.append(i)) for f in (True, False))
        assert sent[True] == sent[False] and len(set(sent[True])) == 3
        for a, b in zip(fast.replicas, slow.replicas, strict=True):
            assert close(a.simulation.e2e_sorted, b.simulation.e2e_sorted)


def test_one_replica_is_simulate():
    requests = azure(300)
    fleet = simulate_fleet(LLAMA, requests, [Pool(name="one", setup=SMALL)], "round-robin")
    alone = simulate(LLAMA, requests, setup=SMALL)
    assert close((fleet.e2e, fleet.ttft, fleet.duration_s), (alone.e2e, alone.ttft, alone.duration_s))


def test_round_robin_deals_in_turn_and_session_keeps_a_session_together():
    sent: dict[int, list[Request]] = {}
    simulate_fleet(LLAMA, azure(40), [Pool(name="m", setup=SMALL, replicas=4)], "round-robin",
                   on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert [len(sent[i]) for i in range(4)] == [10, 10, 10, 10]
    assert [r.id for r in sent[1]] == [r.id for r in azure(40)][1::4]
    sent.clear()
    simulate_fleet(LLAMA, azure(200), [Pool(name="m", setup=SMALL, replicas=4)], "session",
                   on_route=lambda r, i: sent.setdefault(i, []).append(r))
    homes: dict[str, set[int]] = {}
    for i, rs in sent.items():
        for r in rs:
            homes.setdefault(r.session, set()).add(i)
    assert len(homes) == 7 and all(len(h) == 1 for h in homes.values())


def test_least_requests_beats_round_robin_on_skewed_work():
    """Every fourth request is long: round-robin piles them on one replica; counting what is in flight spreads
    them, so the tail is shorter."""
    requests = [Request(arrival=i * 0.05, prompt_tokens=3000 if i % 4 == 0 else 100,
                        output_tokens=800 if i % 4 == 0 else 20, id=str(i)) for i in range(400)]
    pools = [Pool(name="m", setup=SMALL, replicas=4)]
    rr = simulate_fleet(LLAMA, requests, pools, "round-robin")
    least = simulate_fleet(LLAMA, requests, pools, "least-requests")
    assert least.e2e.p99 < rr.e2e.p99 * 0.9
    work = [r.simulation.output_tokens for r in rr.replicas]
    assert work[0] > 3 * max(work[1:])  # every long request on the first replica
    spread = [r.simulation.output_tokens for r in least.replicas]
    assert max(spread) < 2 * min(spread)


def test_least_kv_reads_a_stale_gauge():
    """With a gauge refreshed every 10 s, a burst in one second all reads the same (empty) gauges, so every
    request goes to the first replica; refreshed each 10 ms, the burst spreads."""
    burst = [Request(arrival=1.0 + i * 0.01, prompt_tokens=2000, output_tokens=200, id=str(i)) for i in range(40)]
    pools = [Pool(name="m", setup=SMALL, replicas=4)]
    stale = simulate_fleet(LLAMA, burst, pools, "least-kv:10")
    fresh = simulate_fleet(LLAMA, burst, pools, "least-kv:0.01")
    assert stale.replicas[0].routed > 20
    assert max(r.routed for r in fresh.replicas) < 20


@pytest.mark.parametrize("text, says", [
    ("fastest", "name one of round-robin"),
    ("least-kv:0", "not a number of seconds above 0"),
    ("least-kv:soon", "not a number of seconds"),
    ("length:", "rising prompt-length bounds"),
    ("length:4096,1024", "rising prompt-length bounds"),
    ("length:1024,2048", "2 bounds make 3 pools by length; the fleet has 2 pools"),
    ("round-robin:3", "name one of"),
])
def test_bad_routers_are_refused_in_one_line(text, says):
    pools = [Pool(name="a", setup=SMALL), Pool(name="b", setup=SMALL)]
    with pytest.raises(KVBudgetError, match=says) as err:
        parse_router(text, pools)
    assert err.value.param == "router" and "\n" not in str(err.value)


def test_bad_fleets_are_refused_before_any_run():
    with pytest.raises(KVBudgetError, match="at least one pool"):
        simulate_fleet(LLAMA, azure(5), [], "round-robin")
    with pytest.raises(KVBudgetError, match="replicas: 0 must be a whole number from 1"):
        simulate_fleet(LLAMA, azure(5), [Pool(name="a", setup=SMALL, replicas=0)], "round-robin")
    with pytest.raises(KVBudgetError, match="pool names must differ"):
        simulate_fleet(LLAMA, azure(5), [Pool(name="a", setup=SMALL), Pool(name="a", setup=BIG)], "round-robin")
    with pytest.raises(KVBudgetError, match="over the 4,096"):
        simulate_fleet(LLAMA, azure(5), [Pool(name="a", setup=SMALL, replicas=4000),
                                         Pool(name="b", setup=SMALL, replicas=100)], "round-robin")


class Eager:
    """A router through the protocol alone (no `lazy`): the fleet advances every replica to each arrival."""

    def __init__(self, router):
        self.inner, self.name = router, router.name
        self.refresh = getattr(router, "refresh", None)  # (the gauge scraped as often as for the router itself)

    def choose(self, request, replicas, now):
        return self.inner.choose(request, replicas, now)


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv", "session", "length:1024"])
def test_advancing_only_what_a_router_reads_changes_nothing(router):
    """The built-in routers advance only the replica chosen (and, reading a replica, that one where it matters):
    the same requests to the same replicas and the same simulations (to rounding) as with every replica advanced to
    every arrival; and far fewer decode runs cut short by arrivals meant for other replicas."""
    from unittest import mock

    from kvbudget.simulation.run import _Run

    pools = [Pool(name="short", setup=SMALL, replicas=3), Pool(name="long", setup=BIG, replicas=2)]
    requests = azure(500, scale=4.0)
    runs = []
    for chosen in (parse_router(router, pools), Eager(parse_router(router, pools))):
        sent: dict[int, list[str]] = {}
        with mock.patch.object(_Run, "decode_run", side_effect=_Run.decode_run, autospec=True) as runs_taken:
            fleet = simulate_fleet(LLAMA, requests, pools, chosen, sample_interval=0.05,  # (least-kv's refresh)
                                   on_route=lambda r, i, sent=sent: sent.setdefault(i, []).append(r.id))
        runs.append((sent, [replace(rep.simulation, fast_steps=0) for rep in fleet.replicas],
                     runs_taken.call_count))
    (lazy_sent, lazy_sims, lazy_runs), (eager_sent, eager_sims, eager_runs) = runs
    assert lazy_sent == eager_sent and close(lazy_sims, eager_sims)
    # (least-kv reads every gauge: a replica is advanced to the latest scrape at or before the arrival, and only
    # where the lowest usage read so far does not already beat the least it can show)
    assert lazy_runs <= eager_runs * (0.7 if router == "least-kv" else 0.6)


@pytest.mark.parametrize("bound", ["max", "sum"])
def test_least_requests_counts_exactly_with_every_part_of_the_time_model(bound):
    """A replica is left behind only while none of its requests can finish (the pure decode steps ahead at their
    shortest): with every part of a step's time non-zero the counts, and so the routes, are those of every replica
    advanced to every arrival."""
    from kvbudget.engines.scheduling.timing import TimeModel

    tm = TimeModel(weights=0.004, per_context=1e-8, per_token=2e-5, overhead=0.0015, bound=bound, token_cost=3e-6,
                   context_cost=2e-7, pair_cost=1e-10, seq_cost=5e-7, request_latency=0.02, pace=0.006,
                   pace_per_seq=1e-4, experts=0.003, expert_share=0.25, basis="every part")
    pools = [Pool(name="m", setup=replace(SMALL, time_model=tm), replicas=4)]
    routes = []
    for chosen in (parse_router("least-requests"), Eager(parse_router("least-requests"))):
        sent: list[int] = []
        fleet = simulate_fleet(LLAMA, azure(400, scale=6.0), pools, chosen,
                               on_route=lambda r, i, sent=sent: sent.append(i))
        routes.append((sent, [rep.simulation.e2e_sorted for rep in fleet.replicas]))
    assert routes[0] == routes[1] and len(set(routes[0][0])) == 4


def test_a_fleets_inputs_and_result_cross_processes():
    """Pools, routers, requests and the result pickle (a sweep sends them to other cores or a Ray cluster), and
    the fleet run from the copies is the same."""
    import pickle

    pools = [Pool(name="short", setup=SMALL, replicas=2), Pool(name="long", setup=BIG, replicas=1)]
    requests = azure(120)
    for name in ("round-robin", "least-requests", "least-kv:0.5", "session", "length:1024", "prefix",
                 "prefix-approx"):
        router = parse_router(name, pools)
        fleet = simulate_fleet(LLAMA, requests, pools, router)
        again = simulate_fleet(LLAMA, *pickle.loads(pickle.dumps((requests, pools, parse_router(name, pools)))))
        assert pickle.loads(pickle.dumps(fleet)) == fleet == again


GEMMA = kvbudget.load_model("gemma-2-9b")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.04), st.integers(1, 700), st.integers(1, 120), st.sampled_from([1, 1, 2])),
                min_size=20, max_size=80),
       st.integers(12, 120), st.integers(1, 16), st.sampled_from([64, 256, 2048]), st.integers(2, 4),
       st.sampled_from(["least-requests", "round-robin", "session", "least-kv", "least-kv:0.01"]),
       st.sampled_from([None, 40, 100]))
def test_lazy_routers_equal_eager_ones_under_any_load(gaps, blocks, seqs, budget, replicas, router, window):
    """Tight pools (queues, preemptions, n > 1 samples; a sliding-window hybrid, whose windows free blocks within
    a run): a lazy router's routes and every replica's run are those of every replica advanced to every
    arrival."""
    t, requests = 0.0, []
    for i, (gap, prompt, out, n) in enumerate(gaps):
        t += gap
        requests.append(Request(arrival=t, prompt_tokens=prompt, output_tokens=out, n=1 if window else n,
                                id=str(i), session=f"s{i % 3}"))
    model = LLAMA if window is None else replace(GEMMA, layers=tuple(
        replace(spec, window=window) if hasattr(spec, "window") else spec for spec in GEMMA.layers))
    base = setup_for(model, gpu="H100", max_model_len=1024, block_size=16, prefix_caching=window is None)
    pools = [Pool(name="m", setup=replace(base, num_blocks=blocks * (3 if window else 1), max_num_seqs=seqs,
                                          max_num_batched_tokens=budget), replicas=replicas)]
    runs = []
    for chosen in (parse_router(router), Eager(parse_router(router))):
        sent: list[int] = []
        try:
            fleet = simulate_fleet(model, requests, pools, chosen, on_route=lambda r, i, sent=sent: sent.append(i))
            runs.append((sent, [replace(rep.simulation, fast_steps=0) for rep in fleet.replicas]))
        except KVBudgetError as e:  # a prompt the pool cannot hold: refused both ways (the request named is the
            runs.append((e.param, []))  # first found, on whichever replica is advanced first)
    assert close(runs[0], runs[1])
