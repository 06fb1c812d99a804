"""Autoscaling and the front door with disaggregated prefill and decode pools. As in test_autoscale.py every decode
step takes 1/64 s (a constant time model); a prefill replica's step takes 1/16 s a token (a 64-token prompt: 4 s);
the link reads a 64-token prompt's KV (4 blocks of 16 tokens, 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes =
128 KiB a token: 8 MiB) in 1/64 s. So when each request is prefilled, read, decoded and answered is counted by
hand; and each replica's schedule is a single run of what it was sent (test_disagg.each_alone)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import LLAMA
from test_autoscale import TWO
from test_disagg import each_alone

from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.interconnects import KVLink
from kvbudget.simulation.autoscale import Autoscale, Signal
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.front import FlowControl

STEP = 1 / 64
LINK = KVLink(name="test", latency=0.0, bandwidth=8 * 2**20 * 64)  # 8 MiB in 1/64 s
SLOW = TimeModel(weights=0.0, per_context=0.0, per_token=1 / 16, overhead=0.0, bound="sum", basis="a test's clock")
PREFILL = replace(TWO, max_num_seqs=1, time_model=SLOW)  # one prompt at a time, 4 s each
COLD = {"load_bandwidth": 1e9, "startup": 1.0}  # 4e9 bytes of weights: a 5 s cold start


def req(at: float, output: int, i: int) -> Request:
    return Request(arrival=at, prompt_tokens=64, output_tokens=output, id=str(i))


def run(requests, pools, **kw):
    """The fleet's run, with what each replica was sent and each read."""
    sent: dict[int, list[Request]] = {}
    reads: dict[str, tuple[float, float]] = {}
    fleet = simulate_fleet(LLAMA, requests, pools, "least-requests", kv_link=LINK,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r),
                           on_transfer=lambda d, start, end: reads.__setitem__(d.id, (start, end)), **kw)
    each_alone(fleet, sent, reads)
    return fleet, sent, reads


def test_a_decode_pool_scales_out_under_a_step_load_and_drains_back():
    """Four requests of 1,024 output tokens at 0, one of 256 at 29 s; one prefill replica of two seats at 1/64 s a
    step (TWO): 0 and 1 prefilled by 1/64 s, 2 and 3 by 2/64 s. The decode replica (two seats) reads 0 and 1 over
    [1/64, 2/64] and decodes them until 2/64 + 16 s; 2 and 3 wait for room (16 s each) and end at 3/64 + 32 s.
    Queue signal, target 1 a replica, every 10 s, window 10 s: at 10 s two wait: a second decode replica, asked
    for at 10 s, serving at 15 s. At 20 s none wait, but 2 were asked for 10 s ago: stay. Request 4 is prefilled at
    29 + 1/64 s and goes to the new replica (none in flight there), read by 29 + 2/64, done 4 s later. At 30 s: one;
    the newest drains, its request done at 33 + 2/64 s."""
    requests = [req(0.0, 1024, i) for i in range(4)] + [req(29.0, 256, 4)]
    policy = Autoscale(signal=Signal.QUEUE, min_replicas=1, max_replicas=2, interval=10.0, target=1.0, window=10.0,
                       pool="d", **COLD)
    pools = [Pool(name="p", setup=TWO, role=Role.PREFILL, gpus=1),
             Pool(name="d", setup=TWO, role=Role.DECODE, gpus=2, weight_bytes=4_000_000_000)]
    fleet, sent, reads = run(requests, pools, autoscale=policy)
    scale = fleet.autoscale
    assert scale is not None and scale.cold_start_s == {"d": 5.0}
    assert [(d.time, d.replicas, d.desired, d.signal) for d in scale.decisions] == \
        [(10.0, 1, 2, 2.0), (20.0, 2, 2, 0.0), (30.0, 2, 1, 0.0)]
    assert scale.timeline == ((0.0, 1, 0), (10.0, 1, 1), (15.0, 2, 0), (30.0, 1, 0))
    assert (scale.started, scale.removed) == (1, 1)
    end = 33 + 2 * STEP
    assert reads == {"0": (STEP, 2 * STEP), "1": (STEP, 2 * STEP), "2": (16 + 2 * STEP, 16 + 3 * STEP),
                     "3": (16 + 2 * STEP, 16 + 3 * STEP), "4": (29 + STEP, 29 + 2 * STEP)}
    prefill, first, second = fleet.replicas
    assert [r.id for r in sent[first.index]] == ["0", "1", "2", "3"] and [r.id for r in sent[second.index]] == ["4"]
    assert (second.started_s, second.ready_s, second.drained_s, second.stopped_s) == (10.0, 15.0, 30.0, end)
    assert (first.stopped_s, prefill.stopped_s) == (end, end) and first.simulation.duration_s == 32 + 3 * STEP
    assert fleet.completed == 5 and fleet.duration_s == end
    assert fleet.kv_transfer is not None and (fleet.kv_transfer.wait_s, fleet.kv_transfer.max_wait_s) == (32.0, 16.0)
    # the books: the prefill replica's 1 GPU and the first decode replica's 2 for the whole run, the second's 2
    # from 10 s
    assert fleet.gpu_hours == pytest.approx((1 * end + 2 * end + 2 * (end - 10)) / 3600)
    assert fleet.cost(1.0).gpus == 1 + 2 * 2  # at its largest
    # the client's latencies: arrival to the decode side's last token
    assert fleet.e2e is not None and fleet.e2e.max == 32 + 3 * STEP


def test_a_prefill_pool_is_scaled_by_its_queue():
    """Five requests at 0, one at 17 s, one at 35 s, 4 output tokens each; one prefill replica of one seat, 4 s a
    prompt: 0 over [0, 4], 1 [4, 8], 2 [8, 12], 3 [12, 16], 4 [16, 20]. At 10 s the gauges show what the step that
    ended at 8 s left, 2, 3 and 4 waiting: 3 replicas asked for, 2 at most; the second serving at 15 s; request 5
    goes there (the first has 4 in flight) over [17, 21]. At 20 s none wait (stay: 2 asked for 10 s ago); at 30 s
    one: the second, idle since 21 s, drains and is given back then. Request 6 is prefilled on the first over [35,
    39], read by 39 + 1/64 s and decoded in 4 steps: the run ends at 39 + 5/64 s."""
    requests = [req(0.0, 4, i) for i in range(5)] + [req(17.0, 4, 5), req(35.0, 4, 6)]
    policy = Autoscale(signal=Signal.QUEUE, min_replicas=1, max_replicas=2, interval=10.0, target=1.0, window=10.0,
                       pool="p", **COLD)
    pools = [Pool(name="p", setup=PREFILL, role=Role.PREFILL, gpus=1, weight_bytes=4_000_000_000),
             Pool(name="d", setup=TWO, role=Role.DECODE, gpus=2)]
    fleet, sent, reads = run(requests, pools, autoscale=policy)
    scale = fleet.autoscale
    assert scale is not None
    assert [(d.time, d.replicas, d.desired, d.signal) for d in scale.decisions] == \
        [(10.0, 1, 2, 3.0), (20.0, 2, 2, 0.0), (30.0, 2, 1, 0.0)]
    assert scale.timeline == ((0.0, 1, 0), (10.0, 1, 1), (15.0, 2, 0), (30.0, 1, 0))
    first, decode, second = fleet.replicas
    assert (first.role, decode.role, second.role) == (Role.PREFILL, Role.DECODE, Role.PREFILL)
    assert [r.id for r in sent[first.index]] == ["0", "1", "2", "3", "4", "6"]
    assert [(r.id, r.arrival) for r in sent[second.index]] == [("5", 17.0)]
    assert {k: v[0] for k, v in reads.items()} == {"0": 4.0, "1": 8.0, "2": 12.0, "3": 16.0, "4": 20.0, "5": 21.0,
                                                   "6": 39.0}
    end = 39 + 5 * STEP
    assert fleet.duration_s == end and fleet.completed == 7
    assert (second.started_s, second.ready_s, second.drained_s, second.stopped_s) == (10.0, 15.0, 30.0, 30.0)
    assert second.simulation.duration_s == 21.0
    assert fleet.gpu_hours == pytest.approx((1 * end + 2 * end + 1 * (30 - 10)) / 3600)
    # the client's time to first token: its prompt's wait and prefill, the read, the decode side's first step
    assert fleet.ttft is not None and fleet.ttft.max == 20 + 2 * STEP


def test_a_drained_prefill_replica_is_given_back_once_the_decode_side_has_read_its_kv():
    """As above, but two requests at 27 s: one to each prefill replica (a tie goes to the lower index), both over
    [27, 31]. At 30 s the second drains while prefilling; the decode side reads both over [31, 31 + 1/64]: the
    second prefill replica holds that KV until then, and is paid for until then."""
    requests = [req(0.0, 4, i) for i in range(5)] + [req(27.0, 4, 5), req(27.0, 4, 6), req(35.0, 4, 7)]
    policy = Autoscale(signal=Signal.QUEUE, min_replicas=1, max_replicas=2, interval=10.0, target=1.0, window=10.0,
                       pool="p", **COLD)
    pools = [Pool(name="p", setup=PREFILL, role=Role.PREFILL, gpus=1, weight_bytes=4_000_000_000),
             Pool(name="d", setup=TWO, role=Role.DECODE, gpus=2)]
    fleet, sent, reads = run(requests, pools, autoscale=policy)
    first, _, second = fleet.replicas
    assert [r.id for r in sent[second.index]] == ["6"] and reads["6"] == (31.0, 31 + STEP)
    assert second.simulation.duration_s == 31.0
    assert (second.started_s, second.ready_s, second.drained_s, second.stopped_s) == (10.0, 15.0, 30.0, 31 + STEP)
    end = 39 + 5 * STEP
    assert fleet.duration_s == end
    assert fleet.gpu_hours == pytest.approx((1 * end + 2 * end + 1 * (31 + STEP - 10)) / 3600)


def test_dynamo_scales_prefill_workers_by_their_queue_and_its_trend():
    """Dynamo's rule for prefill workers: six requests at 0.5 s, six at 10.5, six at 20.5; one prefill replica, 4 s
    a prompt (steps end at 4.5, 8.5, ...: k done after the one ending at 4k + 0.5, the next still waiting). The
    queue sampled every 10 s: at 10 s 6 - 2 = 4 wait, at 20 s 12 - 4 = 8, at 30 s 18 - 7 = 11: a mean of 23/3,
    above 5, and 11 + (11 - 4) x 3 = 32 ahead, above 5 too: one worker more (serving at 35 s). At 40, 50, 60 s:
    18 - 9 = 9, 18 - 12 = 6, 18 - 14 = 4 (the new worker gets no request: none arrives): a mean of 19/3, above 5,
    but 4 + (4 - 9) x 3 = -11 ahead: no change. The last prompt is done at 72.5 s: no decision at 90 s."""
    requests = [req(at, 4, 6 * b + i) for b, at in enumerate((0.5, 10.5, 20.5)) for i in range(6)]
    policy = Autoscale(signal=Signal.DYNAMO, min_replicas=1, max_replicas=3, interval=30.0, pool="p", **COLD)
    pools = [Pool(name="p", setup=PREFILL, role=Role.PREFILL, weight_bytes=4_000_000_000),
             Pool(name="d", setup=TWO, role=Role.DECODE)]
    fleet, sent, _ = run(requests, pools, autoscale=policy)
    scale = fleet.autoscale
    assert scale is not None
    assert [(d.time, d.replicas, d.desired) for d in scale.decisions] == [(30.0, 1, 2), (60.0, 2, 2)]
    assert [d.signal for d in scale.decisions] == [pytest.approx(23 / 3), pytest.approx(19 / 3)]
    assert scale.timeline == ((0.0, 1, 0), (30.0, 1, 1), (35.0, 2, 0))
    assert fleet.replicas[0].simulation.duration_s == 72.5 and fleet.duration_s == 72.5 + 5 * STEP


def test_dynamo_thresholds_of_kv_load_are_refused_for_prefill_workers():
    pools = [Pool(name="p", setup=TWO, role=Role.PREFILL), Pool(name="d", setup=TWO, role=Role.DECODE)]
    with pytest.raises(KVBudgetError, match=r"^autoscale dynamo: up and down are KV loads of decode workers; pool p "
                                            r"is prefill, scaled by its queue \(above 5, below 0.2 requests"):
        simulate_fleet(LLAMA, [req(0.0, 4, 0)], pools, kv_link=LINK, autoscale="dynamo:pool=p,up=0.8")
    fleet = simulate_fleet(LLAMA, [req(0.0, 4, 0)], pools, kv_link=LINK, autoscale="dynamo:pool=d,up=0.8")
    assert fleet.completed == 1


def test_the_front_door_refuses_before_the_prefill_side():
    """At most two requests in flight at the gateway (concurrency:2), each held until the decode side answers it:
    0 and 1 at 0 go in, 2 at 1 s is refused (429) and never reaches a prefill replica; 0 is answered at
    4 + 5/64 s (prefilled [0, 4], read, 4 decode steps), so 3 at 9 s goes in."""
    requests = [req(0.0, 4, 0), req(0.0, 4, 1), req(1.0, 4, 2), req(9.0, 4, 3)]
    pools = [Pool(name="p", setup=PREFILL, role=Role.PREFILL), Pool(name="d", setup=TWO, role=Role.DECODE)]
    fleet, sent, _ = run(requests, pools, admission="concurrency:2")
    assert fleet.front is not None and fleet.front.refused == {"admission": 1} and fleet.refused == 1
    assert fleet.front.status("admission") == 429
    prefilled = [r.id for rep in fleet.replicas if rep.role is Role.PREFILL for r in sent.get(rep.index, [])]
    assert prefilled == ["0", "1", "3"] and fleet.requests == 4 and fleet.completed == 3


def test_the_gateway_queue_holds_requests_before_the_prefill_side_and_sends_them_on():
    """Flow control before a saturated prefill side: what it holds is sent on (arriving at the prefill replica
    then), or evicted past its time-to-live, or refused when the queue is full; every request is answered once or
    refused once."""
    requests = [req(0.005 * i, 4, i) for i in range(40)]
    pools = [Pool(name="p", setup=replace(TWO, max_num_seqs=1), role=Role.PREFILL),
             Pool(name="d", setup=TWO, role=Role.DECODE)]
    fleet, sent, _ = run(requests, pools, flow_control=FlowControl(max_requests=3, ttl=0.5, refresh=0.01))
    front = fleet.front
    assert front is not None and front.held > 0 and front.peak_queue == 3
    assert fleet.completed + fleet.refused == fleet.requests == 40
    assert set(front.refused) <= {"queue-full", "ttl"} and front.refused["queue-full"] > 0
    prefilled = [r for rep in fleet.replicas if rep.role is Role.PREFILL for r in sent.get(rep.index, [])]
    assert len(prefilled) == fleet.completed
    late = [r for r in prefilled if r.arrival != requests[int(r.id)].arrival]  # sent on at a tick of the queue
    assert len(late) == front.held and all(round(r.arrival / 0.01, 6).is_integer() for r in late)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 40.0), st.integers(1, 200)), min_size=1, max_size=25),
       st.sampled_from(["p", "d"]), st.sampled_from([Signal.KV, Signal.QUEUE, Signal.LLMD, Signal.DYNAMO]),
       st.sampled_from([None, FlowControl(max_requests=4, ttl=5.0)]))
def test_any_scaled_side_runs_each_replica_as_alone_and_keeps_its_books(arrivals, side, signal, flow):
    requests = [req(at, out, i) for i, (at, out) in enumerate(sorted(arrivals))]
    policy = Autoscale(signal=signal, min_replicas=1, max_replicas=3, interval=2.0, pool=side, load_bandwidth=1e9,
                       startup=0.5)
    pools = [Pool(name="p", setup=replace(TWO, max_num_seqs=1), role=Role.PREFILL, weight_bytes=10**9),
             Pool(name="d", setup=replace(TWO, max_num_seqs=1), role=Role.DECODE, weight_bytes=10**9)]
    fleet, sent, _ = run(requests, pools, autoscale=policy, flow_control=flow)
    assert fleet.completed + fleet.refused == fleet.requests == len(requests)
    for rep in fleet.replicas:
        assert all(r.arrival >= rep.ready_s for r in sent.get(rep.index, []))
        assert rep.drained_s is None or all(r.arrival <= rep.drained_s for r in sent.get(rep.index, []))
    assert fleet.gpu_hours == pytest.approx(sum(r.stopped_s - r.started_s for r in fleet.replicas) / 3600)


def test_a_disaggregated_fleet_scales_from_the_command_line(capsys):
    from kvbudget.cli import main

    code = main(["simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192", "--trace",
                 "azure-conv-2023", "--slice", "0:40", "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--kv-link", "nvlink", "--autoscale", "queue:pool=decode,max=2,interval=5s", "--admission",
                 "concurrency:64", "--flow-control", "max=8,ttl=30s", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    fleet = json.loads(out)["fleet"]
    assert fleet["autoscale"]["policy"]["pool"] == "decode" and fleet["front"]["admission"] == "concurrency:64"


def test_the_command_line_takes_a_router_for_a_disaggregated_fleet(capsys):
    from kvbudget.cli import main

    code = main(["simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192", "--trace",
                 "azure-conv-2023", "--slice", "0:20", "--prefill-replicas", "2", "--decode-replicas", "1",
                 "--kv-link", "nvlink", "--router", "least-kv", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    import json

    assert json.loads(out.out)["fleet"]["router"] == "least-kv"


def test_an_autoscaler_of_a_pool_the_disaggregated_fleet_lacks_is_refused():
    pools = [Pool(name="p", setup=TWO, role=Role.PREFILL), Pool(name="d", setup=TWO, role=Role.DECODE)]
    with pytest.raises(KVBudgetError, match=r"^autoscale: pool='both' is not one of the fleet's pools \(p, d\)$"):
        simulate_fleet(LLAMA, [req(0.0, 4, 0)], pools, kv_link=LINK, autoscale="kv:pool=both")
