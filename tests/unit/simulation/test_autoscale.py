"""Autoscaling in the fleet's loop and the fleet's front door. Every step takes 1/64 s exactly (a constant time
model), so when each request runs, waits and ends is counted by hand: a request of output O runs O steps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import LLAMA, close

from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.simulation.autoscale import Autoscale, Gauge, Scaler, Signal, parse_autoscale, read_load_bandwidth
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.front import parse_flow_control
from kvbudget.simulation.run import setup_for, simulate

STEP = 1 / 64  # seconds, every step
CLOCK = TimeModel(weights=0.0, per_context=0.0, per_token=0.0, overhead=STEP, bound="sum", basis="a test's clock")
TWO = replace(setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30, max_num_seqs=2),
              time_model=CLOCK)  # two requests run at once, the rest wait
ONE = replace(TWO, max_num_seqs=1)


def req(at: float, output: int, i: int) -> Request:
    return Request(arrival=at, prompt_tokens=64, output_tokens=output, id=str(i))


def replay(fleet, sent: dict[int, list[Request]]) -> None:
    """Each replica's schedule is a single run of what it was sent (its seconds to rounding)."""
    for rep in fleet.replicas:
        mine = sent.get(rep.index, [])
        if mine:
            alone = simulate(LLAMA, mine, setup=rep.simulation.setup)
            got = rep.simulation
            assert close((got.steps, got.completed, got.duration_s, got.e2e_sorted, got.ttft_sorted),
                         (alone.steps, alone.completed, alone.duration_s, alone.e2e_sorted, alone.ttft_sorted))


def step_load() -> list[Request]:
    """Four requests of 1,024 output tokens at 0 (two run, two wait: 1,024 steps = 16 s each round), then one of
    256 at 29 s (4 s)."""
    return [req(0.0, 1024, i) for i in range(4)] + [req(29.0, 256, 4)]


def test_a_step_load_scales_out_after_the_interval_and_cold_start_and_back_in_when_it_falls():
    """Queue signal, target 1 waiting request per replica, every 10 s, window 10 s; cold start 4e9 bytes at 1e9
    bytes/s + 1 s = 5 s. At 10 s two wait on replica 0: ceil(2 / 1) = 2 replicas, the second serving at 15 s.
    At 20 s none wait (the second round runs), but 10 s ago 2 were asked for: stay. At 30 s: 1; the newest replica
    drains (it holds the request sent at 29 s, the first replica's were all sent before 15 s) and finishes it at
    33 s; the first replica's second round ends at 32 s."""
    policy = Autoscale(signal=Signal.QUEUE, min_replicas=1, max_replicas=2, interval=10.0, target=1.0, window=10.0,
                       load_bandwidth=1e9, startup=1.0)
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(LLAMA, step_load(), [Pool(name="m", setup=TWO, gpus=2, weight_bytes=4_000_000_000)],
                           "least-requests", autoscale=policy,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    scale = fleet.autoscale
    assert scale is not None and scale.cold_start_s == {"m": 5.0}
    assert [(d.time, d.replicas, d.desired, d.signal) for d in scale.decisions] == \
        [(10.0, 1, 2, 2.0), (20.0, 2, 2, 0.0), (30.0, 2, 1, 0.0)]
    assert scale.timeline == ((0.0, 1, 0), (10.0, 1, 1), (15.0, 2, 0), (30.0, 1, 0))
    assert (scale.started, scale.removed, scale.decided) == (1, 1, 3)
    assert [r.id for r in sent[0]] == ["0", "1", "2", "3"] and [r.id for r in sent[1]] == ["4"]
    first, second = fleet.replicas
    assert (first.started_s, first.ready_s, first.drained_s, first.stopped_s) == (0.0, 0.0, None, 33.0)
    assert (second.started_s, second.ready_s, second.drained_s, second.stopped_s) == (10.0, 15.0, 30.0, 33.0)
    assert first.simulation.duration_s == 32.0 and second.simulation.completed == 1  # the drained one finished
    assert fleet.completed == 5 and fleet.duration_s == 33.0
    # GPU-hours: 2 GPUs each, the first up 33 s, the second from its start at 10 s to 33 s
    assert fleet.gpu_hours == pytest.approx(2 * (33 + 23) / 3600)
    cost = fleet.cost(2.0)
    tokens = 5 * 64 + 4 * 1024 + 256
    assert cost.run == pytest.approx(2.0 * 112 / 3600)
    assert cost.per_million_tokens == pytest.approx(2.0 * 112 / 3600 / tokens * 1e6)
    assert cost.gpus == 4  # at its largest, 2 replicas of 2 GPUs
    replay(fleet, sent)
    out = fleet.to_dict()["fleet"]["autoscale"]
    assert out["replicas"][2] == {"time": 15.0, "serving": 2, "starting": 0} and out["removed"] == 1


def test_a_fleet_without_an_autoscaler_pays_for_every_gpu_for_the_whole_run():
    """Two replicas of 2 GPUs; one request of 64 output tokens: 64 steps, 1 s; 4 GPU-seconds."""
    fleet = simulate_fleet(LLAMA, [req(0.0, 64, 0)], [Pool(name="m", setup=TWO, replicas=2, gpus=2)])
    assert fleet.duration_s == 1.0 and fleet.gpu_hours == 4 / 3600 and fleet.autoscale is None
    assert fleet.cost(3.6).run == pytest.approx(0.004) and fleet.cost(3.6).gpus == 4


def test_one_pool_of_several_scales_and_the_others_stay():
    """Pools by prompt length: short prompts to pool a (one replica, left alone), the step load's (200 tokens) to
    pool b, scaled as in the single pool's step load: out at 10 s, serving at 15 s, drained at 30 s."""
    load = [replace(r, prompt_tokens=200) for r in step_load()] + [req(1.0, 64, 9)]
    load.sort(key=lambda r: r.arrival)
    policy = Autoscale(signal=Signal.QUEUE, max_replicas=2, interval=10.0, target=1.0, window=10.0,
                       load_bandwidth=1e9, startup=1.0, pool="b")
    sent: dict[int, list[Request]] = {}
    pools = [Pool(name="a", setup=TWO, weight_bytes=0), Pool(name="b", setup=TWO, weight_bytes=4_000_000_000)]
    fleet = simulate_fleet(LLAMA, load, pools, "length:100", autoscale=policy,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    scale = fleet.autoscale
    assert scale is not None and scale.cold_start_s == {"b": 5.0}
    assert scale.timeline == ((0.0, 1, 0), (10.0, 1, 1), (15.0, 2, 0), (30.0, 1, 0))
    assert [r.pool for r in fleet.replicas] == ["a", "b", "b"] and fleet.replicas[0].drained_s is None
    assert [r.id for r in sent[0]] == ["9"] and [r.id for r in sent[2]] == ["4"]
    assert fleet.cost(1.0).gpus == 3  # a's one and b's two at the most
    replay(fleet, sent)


def test_a_cold_start_is_the_weights_over_the_bandwidth_plus_the_start_up():
    policy = parse_autoscale("kv", load_bandwidth=2e9, startup=30.0)
    assert policy.cold_start(16_000_000_000) == 8.0 + 30.0
    default = parse_autoscale("kv")  # a 25 Gbit/s link: 3.125e9 bytes/s, and 60 s
    assert default.cold_start(3_125_000_000) == 1.0 + 60.0
    assert parse_autoscale("dynamo:startup=90s", load_bandwidth=read_load_bandwidth("12.5")).cold_start(25e9) == \
        2.0 + 90.0
    # without the pool's bytes, the model's weights on one GPU (bf16 Llama-3.1-8B: the planner's figure)
    from kvbudget.planner import plan

    weights = plan(LLAMA, gpu="H100-80GB", max_model_len=8192).to_dict()["weights_bytes"]
    fleet = simulate_fleet(LLAMA, [req(0.0, 8, 0)], [Pool(name="m", setup=TWO)], autoscale=policy)
    assert fleet.autoscale is not None and fleet.autoscale.cold_start_s["m"] == weights / 2e9 + 30.0


def test_a_replica_starting_takes_no_request_until_it_is_ready():
    """A replica asked for at 10 s with a 5 s cold start: the requests at 12 s all go to the first."""
    policy = Autoscale(signal=Signal.QUEUE, max_replicas=2, interval=10.0, target=1.0, load_bandwidth=1e9,
                       startup=1.0)
    load = step_load()[:4] + [req(12.0 + i * 0.5, 8, 10 + i) for i in range(4)] + [req(16.0, 8, 20)]
    sent: dict[int, list[Request]] = {}
    simulate_fleet(LLAMA, load, [Pool(name="m", setup=TWO, weight_bytes=4_000_000_000)], "least-requests",
                   autoscale=policy, on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert [r.id for r in sent[0]] == ["0", "1", "2", "3", "10", "11", "12", "13"] and [r.id for r in sent[1]] == ["20"]


def gauges(*usages: float, capacity: int = 10_000) -> list[Gauge]:
    return [Gauge(u, 0, 0, capacity) for u in usages]


def test_llm_d_scales_by_its_token_supply_and_demand():
    """Supply 0.8 x 10,000 tokens per replica; demand the tokens in use. Two at 0.8: demand 16,000 against
    16,000 / 0.85 = 18,823.5 needed: 2,823.5 short, one replica more. Two at 0.2: 4,000 / 0.70 = 5,714.3 leaves
    10,285.7 of 16,000 spare, a whole replica: one fewer (not while one starts). Two at 0.5: neither."""
    llmd = Scaler(parse_autoscale("llm-d:max=8"))
    assert llmd.decide(60.0, gauges(0.8, 0.8), 0, 0, 0).desired == 3
    assert llmd.decide(120.0, gauges(0.2, 0.2), 0, 0, 0).desired == 1
    assert llmd.decide(180.0, gauges(0.2, 0.2), 1, 0, 0).desired == 3
    assert llmd.decide(240.0, gauges(0.5, 0.5), 0, 0, 0).desired == 2
    # a waiting request's prompt and output tokens and what the gateway holds count as demand: 8,000 in use
    # + 4,000 held = 12,000 > 0.85 x 8,000 supply of one replica: ceil((14,117.6 - 8,000) / 8,000) = 1 more
    assert llmd.decide(300.0, gauges(0.8), 0, 3, 4000).desired == 2


def test_dynamo_averages_its_samples_and_moves_one_worker():
    dynamo = Scaler(parse_autoscale("dynamo:max=3"))
    for u in (0.95, 0.9, 0.92):  # mean 0.9233 > 0.9
        dynamo.sample(0.0, gauges(u))
    assert dynamo.decide(180.0, gauges(0.1), 0, 0, 0).desired == 2
    for u in (0.3, 0.6):  # mean 0.45 < 0.5
        dynamo.sample(0.0, gauges(u, u))
    assert dynamo.decide(360.0, gauges(0.1, 0.1), 0, 0, 0).desired == 1
    dynamo.sample(0.0, gauges(0.99, 0.99, 0.99))
    assert dynamo.decide(540.0, gauges(0.1, 0.1, 0.1), 0, 0, 0).desired == 3  # at its max


def test_kv_keeps_the_hpas_tolerance_and_scale_up_limit():
    """Target 0.5: usages summing to 1.05 over two replicas is 5% off the target: no change; 1.2 (20%) asks
    ceil(1.2 / 0.5) = 3."""
    kv = Scaler(parse_autoscale("kv:target=0.5,max=4"))
    assert kv.decide(15.0, gauges(0.5, 0.55), 0, 0, 0).desired == 2
    assert kv.decide(30.0, gauges(0.6, 0.6), 0, 0, 0).desired == 3
    # one replica at 1.0 asks ceil(1.0 / 0.1) = 10, but the HPA adds at most max(4 pods, 100%) a period: 5
    assert Scaler(parse_autoscale("kv:target=0.1,max=16")).decide(15.0, gauges(1.0), 0, 0, 0).desired == 5


def test_the_flow_control_queue_holds_to_its_bound_and_refuses_past_its_ttl():
    """One request runs at a time (640 steps: 10 s); one arrives every 0.1 s. GIE's detector reads the pool
    saturated once 5 wait: the first six are sent (the sixth finds 4 waiting), the next three are held (the
    queue's bound), the tenth is refused (429). With a TTL of 2 s the three held expire (429 while the pool has a
    replica: llm-d-router v0.10, #2047); with v0.10's default of 60 s they are sent together when the first request
    ends at 10 s and the gauge, scraped every 0.05 s, shows 4 waiting (10.1 s)."""
    load = [req(i * 0.1, 640, i) for i in range(10)]
    pools = [Pool(name="m", setup=ONE)]
    sent: dict[int, list[Request]] = {}
    ttl = simulate_fleet(LLAMA, load, pools, flow_control="max=3,ttl=2s",
                         on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert ttl.front is not None
    assert ttl.front.refused == {"queue-full": 1, "ttl": 3} and ttl.front.held == 0 and ttl.front.peak_queue == 3
    assert [r.id for r in sent[0]] == ["0", "1", "2", "3", "4", "5"] and ttl.completed == 6 and ttl.refused == 4
    assert ttl.to_dict()["fleet"]["front"]["status"] == {"queue-full": 429, "ttl": 429}
    sent.clear()
    held = simulate_fleet(LLAMA, load, pools, flow_control=parse_flow_control("max=3"),
                          on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert held.front is not None and held.front.refused == {"queue-full": 1} and held.completed == 9
    assert [r.id for r in sent[0]] == [str(i) for i in range(9)]
    assert [r.arrival for r in sent[0][6:]] == pytest.approx([10.1] * 3)  # sent on when the pool freed up
    assert held.front.wait is not None and held.front.wait.max == pytest.approx(10.1 - 0.6)
    replay(held, sent)


def test_gies_shedding_at_the_front_reads_the_fleets_gauges():
    """The flow-control test's load with GIE's saturation shedding instead of a queue: the first six are sent, the
    rest find five waiting (the mean over the one replica) and are shed (429)."""
    load = [req(i * 0.1, 640, i) for i in range(10)]
    fleet = simulate_fleet(LLAMA, load, [Pool(name="m", setup=ONE)], admission="gie")
    assert fleet.front is not None and fleet.front.refused == {"admission": 4} and fleet.completed == 6
    assert fleet.front.admission == "gie" and fleet.to_dict()["fleet"]["front"]["status"] == {"admission": 429}


def test_an_admission_policy_decides_at_the_fleets_front():
    """A concurrency limit of 3 at the gateway: of 6 requests at once, 3 are sent, 3 refused (429)."""
    load = [req(0.0, 64, i) for i in range(6)]
    fleet = simulate_fleet(LLAMA, load, [Pool(name="m", setup=TWO, replicas=2)], admission="concurrency:3")
    assert fleet.front is not None and fleet.front.refused == {"admission": 3} and fleet.completed == 3
    assert fleet.to_dict()["fleet"]["front"]["status"] == {"admission": 429}
    later = simulate_fleet(LLAMA, load + [req(5.0, 8, 9)], [Pool(name="m", setup=TWO, replicas=2)],
                           admission="concurrency:3")
    assert later.completed == 4  # the hold released when the first three were answered


@pytest.mark.parametrize("text, says", [
    ("fast", "name one of kv, queue, llm-d, dynamo"),
    ("kv:min=0", "'min=0' must be a whole number from 1"),
    ("kv:min=3,max=2", "'max=2' must be a whole number from 3"),
    ("kv:target=1.5", "'target=1.5' must be a number above 0 up to 1"),
    ("queue:target=0", "'target=0.0' must be a number above 0"),
    ("kv:up=0.9", "'up=0.9' is not key=value with a key of interval, max, min, pool, startup, target, window"),
    ("dynamo:up=0.5,down=0.9", "down=0.9 must be below up=0.5"),
    ("kv:interval=0", "'interval=0.0' must be a number above 0"),
    ("kv:interval=soon", "interval='soon' is not a number"),
    ("kv:min=1,min=2", "min given twice"),
    ("kv:max", "'max' is not key=value"),
    ("llm-d:startup=-5", "'startup=-5.0' must be a number from 0"),
])
def test_bad_policies_are_refused_in_one_line(text, says):
    with pytest.raises(KVBudgetError, match=says) as err:
        parse_autoscale(text)
    assert err.value.param == "autoscale" and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["0", "fast", "-3", "inf", "5000"])
def test_a_bad_load_bandwidth_is_refused_in_one_line(text):
    with pytest.raises(KVBudgetError, match=f"load_bandwidth: '{text}' must be a number above 0 up to 1,000") as err:
        read_load_bandwidth(text)
    assert err.value.param == "load_bandwidth"


def test_flow_control_takes_llm_d_router_v0_10s_defaults():
    """v0.10 bounds a priority band's queue at 5,000 requests (registry/config.go) and a request's wait at 60 s
    (controller/config.go); `defaultRequestTTL: 0s` turns the wait's bound off."""
    assert (parse_flow_control("ttl=5").max_requests, parse_flow_control("ttl=5").ttl) == (5000, 5.0)
    assert (parse_flow_control("max=7").max_requests, parse_flow_control("max=7").ttl) == (7, 60.0)
    assert parse_flow_control("max=7,ttl=0s").ttl is None


def test_llm_d_at_the_front_queues_with_its_defaults_and_says_429_past_the_ttl():
    """`admission="llm-d"`: the router's flow control with v0.10's bounds, no policy of its own. The flow-control
    test's load, one every 0.1 s for 10 s of one request at a time, held within 60 s: none refused."""
    load = [req(i * 0.1, 640, i) for i in range(10)]
    fleet = simulate_fleet(LLAMA, load, [Pool(name="m", setup=ONE)], admission="llm-d")
    assert fleet.front is not None and fleet.front.admission == "llm-d" and fleet.front.refused == {}
    assert fleet.front.to_dict()["flow_control"] == {"max_requests": 5000, "ttl_s": 60.0, "refresh_s": 0.05}
    assert fleet.completed == 10 and fleet.front.held == 4


def test_a_ttl_past_with_no_replica_serving_is_a_503():
    from kvbudget.simulation.front import FlowControl, FrontDoor

    door = FrontDoor(None, None, [ONE], FlowControl(max_requests=5, ttl=1.0))
    assert door.arrive(req(0.0, 8, 0), []) is None  # no replica serving: saturated, held
    door.dispatch(0.5, lambda: [], lambda r, release: None)
    assert door.refused == {}
    door.dispatch(1.0, lambda: [], lambda r, release: None)
    report = door.report()
    assert report is not None and report.refused == {"ttl-no-endpoints": 1}
    assert report.status("ttl-no-endpoints") == 503 and report.status("ttl") == 429


@pytest.mark.parametrize("text, says", [
    ("max=0", "'max=0' must be a whole number from 1"),
    ("", "give max=N, ttl=SECONDS or both"),
    ("max=10,ttl=-1", "'ttl=-1.0' must be a number from 0"),
    ("max=x", "max='x' is not a whole number"),
    ("max=1,depth=2", r"write \[max=N\]"),
])
def test_bad_flow_control_is_refused_in_one_line(text, says):
    with pytest.raises(KVBudgetError, match=says) as err:
        parse_flow_control(text)
    assert err.value.param == "flow_control" and "\n" not in str(err.value)


def test_bad_fleets_for_an_autoscaler_are_refused_before_any_run():
    def never():
        raise AssertionError("the workload was read")
        yield

    with pytest.raises(KVBudgetError, match="pool m starts with 3 replicas, outside min 1 to max 2") as err:
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO, replicas=3)], autoscale="kv:max=2")
    assert err.value.param == "autoscale"
    with pytest.raises(KVBudgetError, match="'max=5000' must be a whole number from 1 to 4,096"):
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO)], autoscale="kv:max=5000")
    two = [Pool(name="a", setup=TWO), Pool(name="b", setup=TWO)]
    with pytest.raises(KVBudgetError, match="name the pool it scales, pool=NAME \\(the fleet has a, b\\)"):
        simulate_fleet(LLAMA, never(), two, autoscale="kv")
    with pytest.raises(KVBudgetError, match="pool='c' is not one of the fleet's pools \\(a, b\\)"):
        simulate_fleet(LLAMA, never(), two, autoscale="kv:pool=c")
    with pytest.raises(KVBudgetError, match="up to 4,097 replicas in all, over the 4,096"):
        simulate_fleet(LLAMA, never(), [Pool(name="a", setup=TWO, replicas=2), Pool(name="b", setup=TWO)],
                       autoscale="kv:pool=a,max=4096")
    with pytest.raises(KVBudgetError, match="load_bandwidth: 0 must be a number above 0") as err:
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO)], autoscale=Autoscale(load_bandwidth=0))
    assert err.value.param == "load_bandwidth"
    with pytest.raises(KVBudgetError, match="gpus: GPUs per replica must be a positive integer, got -1"):
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO, gpus=-1)])
    with pytest.raises(KVBudgetError, match="weight_bytes: -1 must be a whole number of bytes"):
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO, weight_bytes=-1)])
    with pytest.raises(KVBudgetError, match="flow_control"):
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO)], flow_control="max=0")
    with pytest.raises(KVBudgetError, match="admission 'fifo'"):
        simulate_fleet(LLAMA, never(), [Pool(name="m", setup=TWO)], admission="fifo")


def test_vllms_own_queue_limits_answer_503_before_the_engine_sees_the_request():
    """--max-num-queued-reqs 3: of five requests at once the fourth and fifth find 3 unfinished (503); at 10 s all
    are done and one more is taken. --max-num-queued-tokens 150 (prompts of 64, one runs at a time): the fourth at
    0 s finds 192 prompt tokens in prefill (refused), at 0.5 s the first has its first token: 128, taken; then
    192 again, refused."""
    load = [req(0.0, 64, i) for i in range(5)] + [req(10.0, 8, 5)]
    sent: dict[int, list[Request]] = {}
    reqs = simulate_fleet(LLAMA, load, [Pool(name="m", setup=ONE, max_num_queued_reqs=3)],
                          on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert reqs.front is not None and reqs.front.refused == {"max_num_queued_reqs": 2} and reqs.completed == 4
    assert [r.id for r in sent[0]] == ["0", "1", "2", "5"] and reqs.replicas[0].routed == 4
    assert reqs.to_dict()["fleet"]["front"]["status"] == {"max_num_queued_reqs": 503}
    replay(reqs, sent)
    tokens = simulate_fleet(LLAMA, [req(0.0, 64, i) for i in range(4)] + [req(0.5, 8, 4), req(0.5, 8, 5)],
                            [Pool(name="m", setup=ONE, max_num_queued_tokens=150)])
    assert tokens.front is not None and tokens.front.refused == {"max_num_queued_tokens": 2}
    assert tokens.completed == 4


def test_queue_limits_are_refused_where_the_engine_has_none_or_the_value_is_bad():
    sglang = replace(setup_for(LLAMA, engine="sglang", gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30),
                     time_model=CLOCK)
    with pytest.raises(KVBudgetError, match="max_num_queued_reqs: a limit of vLLM's API server \\(from 0.29\\); "
                                            "sglang has none") as err:
        simulate_fleet(LLAMA, [], [Pool(name="m", setup=sglang, max_num_queued_reqs=4)])
    assert err.value.param == "max_num_queued_reqs"
    with pytest.raises(KVBudgetError, match="max_num_queued_tokens: 0 must be a whole number from 1"):
        simulate_fleet(LLAMA, [], [Pool(name="m", setup=ONE, max_num_queued_tokens=0)])


def burst_then_lull() -> list[Request]:
    """The Azure conversation trace's first 500 requests 8 times as fast, then one small request every 2 s."""
    from test_fleet import azure

    burst = azure(500)
    end = burst[-1].arrival
    return burst + [Request(arrival=end + 2.0 * (i + 1), prompt_tokens=200, output_tokens=50, id=f"t{i}")
                    for i in range(60)]


@pytest.mark.parametrize("policy", ["kv:max=4,target=0.3,interval=5s,window=10s,startup=2s",
                                    "queue:max=4,target=2,interval=5s,window=10s,startup=2s",
                                    "llm-d:max=4,interval=5s,startup=2s", "dynamo:max=4,interval=20s,startup=2s"])
def test_replicas_that_come_and_go_each_run_exactly_as_alone(policy):
    """Scaled out in the burst and in during the lull, behind a queue at the gateway: each replica's schedule is
    still a single run of what it was sent, and the fast path changes nothing."""
    from test_fleet import SMALL

    pools = [Pool(name="m", setup=SMALL, weight_bytes=10**9)]
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(LLAMA, burst_then_lull(), pools, "least-kv", autoscale=policy, flow_control="max=100",
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    scale = fleet.autoscale
    assert scale is not None and scale.started >= 1 and scale.removed >= 1 and len(sent) >= 2
    assert fleet.completed + fleet.refused == fleet.requests == 560
    replay(fleet, sent)
    slow = simulate_fleet(LLAMA, burst_then_lull(), pools, "least-kv", autoscale=policy, flow_control="max=100",
                          fast=False)
    assert close([r.simulation.e2e_sorted for r in slow.replicas], [r.simulation.e2e_sorted for r in fleet.replicas])
    assert slow.autoscale is not None and slow.autoscale.timeline == scale.timeline


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 60.0), st.integers(1, 600), st.integers(1, 3000)), min_size=1, max_size=40),
       st.sampled_from(["kv:max=3,target=0.3,interval=4s,window=8s,startup=1s",
                        "queue:max=3,target=1,interval=3s,window=3s,startup=0s", "llm-d:max=3,interval=5s,startup=2s",
                        "dynamo:min=2,max=3,interval=20s,startup=1s"]),
       st.sampled_from([None, "max=3", "max=5,ttl=2s"]), st.sampled_from([None, 4]),
       st.sampled_from(["least-requests", "round-robin", "least-kv", "prefix", "prefix-approx", "session"]))
def test_any_load_keeps_the_fleets_books(load, policy, flow, queued, router):
    """Whatever arrives: every request is answered or refused once, the count stays within the policy's bounds,
    each replica runs exactly as alone, and the GPU-hours are the replicas' spans."""
    requests = sorted((Request(arrival=round(t, 3), prompt_tokens=p, output_tokens=o, id=str(i), session=f"s{i % 3}")
                       for i, (t, o, p) in enumerate(load)), key=lambda r: r.arrival)
    lo = 2 if policy.startswith("dynamo") else 1
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(LLAMA, requests, [Pool(name="m", setup=TWO, replicas=lo, weight_bytes=10**9,
                                                  max_num_queued_reqs=queued)],
                           router, autoscale=policy, flow_control=flow,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    assert fleet.completed + fleet.refused == fleet.requests == len(requests)
    assert sum(len(v) for v in sent.values()) == fleet.completed
    scale = fleet.autoscale
    assert scale is not None and all(lo <= s + n and s >= 1 and s + n <= 3 for _, s, n in scale.timeline)
    for rep in fleet.replicas:
        assert all(r.arrival >= rep.ready_s for r in sent.get(rep.index, []))
        assert rep.drained_s is None or all(r.arrival <= rep.drained_s for r in sent.get(rep.index, []))
    spans = sum(rep.stopped_s - rep.started_s for rep in fleet.replicas)
    assert fleet.gpu_hours == pytest.approx(spans / 3600)
    replay(fleet, sent)


@pytest.mark.parametrize("given, param, says", [
    ({"autoscale": "kv"}, "autoscale", "autoscale: name the pool it scales, pool=NAME (the fleet has p, d)"),
    ({"autoscale": "kv:pool=x"}, "autoscale", "autoscale: pool='x' is not one of the fleet's pools (p, d)"),
    ({"max_num_queued_reqs": 4}, "max_num_queued_reqs",
     "max_num_queued_reqs: not with disaggregated prefill and decode pools yet")])
def test_bad_autoscalers_and_limits_of_disaggregated_pools_are_refused_in_one_line(given, param, says):
    from kvbudget.engines.scheduling.setup import Role

    limits = {k: v for k, v in given.items() if k.startswith("max_")}
    pools = [Pool(name="p", setup=TWO, role=Role.PREFILL, **limits), Pool(name="d", setup=TWO, role=Role.DECODE)]
    with pytest.raises(KVBudgetError) as err:
        simulate_fleet(LLAMA, [req(0.0, 8, 0)], pools, kv_link="nvlink",
                       **{k: v for k, v in given.items() if k not in limits})
    assert str(err.value) == says and err.value.param == param
