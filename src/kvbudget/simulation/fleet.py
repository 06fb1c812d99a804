"""Fleets: replicas of a deployment (or of several pools) behind a router, each replica the single-replica
simulator step for step.

    >>> fleet = simulate_fleet(model, read_trace("azure-conv-2023"), [Pool(name="main", setup=s, replicas=4)],
    ...                        router="least-requests")
    >>> fleet.ttft.p99, [r.routed for r in fleet.replicas]

Every replica is the `_Run` clock loop of `simulate`, advanced to each arrival; the router sees the fleet as a real
router does at that instant (its own count of requests in flight, the usage gauge as last scraped) and picks one
replica; the request is added there. A replica's schedule is exactly that of `simulate` over the requests routed to
it (tests replay them), whatever the other replicas do. Pools, replicas and routers are in `routing.py`; an
autoscaler (`autoscale.py`) adds and drains replicas as the run goes, and a front door (`front.py`) may refuse or
hold a request before any replica sees it.
"""

from __future__ import annotations

import copy
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvbudget import validate
from kvbudget.engines.scheduling.setup import Disagg, LimitsQueue, Role
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.interconnects import KVLink
from kvbudget.simulation.autoscale import (
    DYNAMO_SAMPLE_S,
    MAX_DECISIONS,
    Autoscale,
    AutoscaleReport,
    Decision,
    Gauge,
    Scaler,
    Signal,
    fleet_policy,
    replica_counts,
    weight_bytes,
)
from kvbudget.simulation.cost import Cost, gpu_hours_cost
from kvbudget.simulation.disagg import Handover, KVTransfer, resolve_link
from kvbudget.simulation.front import FlowControl, FrontDoor, FrontReport
from kvbudget.simulation.percentiles import Percentiles, metric_of
from kvbudget.simulation.routing import (
    APPROX_MAX_ENTRIES,
    LEAST_KV_REFRESH_S,
    ROUTERS,
    ApproxPrefix,
    LeastKV,
    LeastRequests,
    Length,
    Pool,
    PrefixAware,
    Replica,
    RoundRobin,
    Router,
    Session,
    _chosen,
    _route,
    _router,
    _sent,
    parse_router,
)
from kvbudget.simulation.run import SAMPLE_INTERVAL_S, Simulation, _Run

__all__ = [
    "APPROX_MAX_ENTRIES",
    "LEAST_KV_REFRESH_S",
    "MAX_REPLICAS",
    "ROUTERS",
    "ApproxPrefix",
    "FleetReplica",
    "FleetSimulation",
    "LeastKV",
    "LeastRequests",
    "Length",
    "Pool",
    "PrefixAware",
    "Replica",
    "RoundRobin",
    "Router",
    "Session",
    "check_pools",
    "parse_router",
    "simulate_fleet",
]

MAX_REPLICAS = 4096  # replicas in one fleet: each holds its scheduler's state (a few MB at most)


@dataclass(frozen=True, kw_only=True)
class FleetReplica:
    """One replica's part of a fleet's run: which pool, how many requests the router sent, its own simulation."""

    index: int
    pool: str
    routed: int
    simulation: Simulation
    started_s: float = 0.0  # when it was asked for (0: from the start)
    ready_s: float = 0.0  # when it took requests, its cold start over
    drained_s: float | None = None  # when it stopped taking requests
    stopped_s: float = 0.0  # when it was given back: its last request answered after draining, or the run's end
    role: Role = Role.BOTH

    def to_dict(self) -> dict[str, Any]:
        s = self.simulation
        return {"index": self.index, "pool": self.pool, "role": self.role.value, "routed": self.routed,
                "started_s": self.started_s,
                "ready_s": self.ready_s, "drained_s": self.drained_s, "stopped_s": self.stopped_s,
                "completed": s.completed,
                "duration_s": s.duration_s, "steps": s.steps,
                "ttft_s": s.ttft.__dict__ if s.ttft else None, "tpot_s": s.tpot.__dict__ if s.tpot else None,
                "e2e_s": s.e2e.__dict__ if s.e2e else None, "preemptions": s.preemptions,
                "prefix_hit_rate": s.prefix_hit_rate, "peak_usage": s.peak_usage, "mean_usage": s.mean_usage,
                "peak_running": s.peak_running, "peak_waiting": s.peak_waiting,
                "output_tokens": s.output_tokens, "prompt_tokens": s.prompt_tokens,
                "timeline": [x.__dict__ for x in s.timeline]}


@dataclass(frozen=True, kw_only=True)
class FleetSimulation:
    """A fleet's run: every replica's simulation, and the latencies over all requests."""

    router: str
    pools: tuple[Pool, ...]
    replicas: tuple[FleetReplica, ...]
    requests: int
    completed: int
    duration_s: float
    ttft: Percentiles | None
    tpot: Percentiles | None
    e2e: Percentiles | None
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    gpu_hours: float = 0.0  # each replica's GPUs for the time it was up, starting included
    autoscale: AutoscaleReport | None = None
    front: FrontReport | None = None
    kv_transfer: KVTransfer | None = None  # disaggregated prefill and decode: what crossed the link

    @property
    def refused(self) -> int:
        """Requests the fleet's front door refused (any reason)."""
        return sum(self.front.refused.values()) if self.front else 0

    def cost(self, price_per_gpu_hour: float) -> Cost:
        """What the run cost at a price per GPU-hour: its GPU-hours, per unit served."""
        gpus = sum(r.gpus * r.replicas for r in self.pools)
        if self.autoscale is not None:  # the scaled pool at its largest
            pool = next(p for p in self.pools if p.name == self.autoscale.policy.pool)
            gpus += pool.gpus * (max(s + n for _, s, n in self.autoscale.timeline) - pool.replicas)
        return gpu_hours_cost(self.gpu_hours, self.duration_s, self.prompt_tokens, self.output_tokens,
                              self.completed, price_per_gpu_hour, gpus)

    def metric(self, name: str) -> float | None:
        """A latency figure by name: ttft|tpot|e2e _ p50|p90|p99|mean|max (seconds)."""
        return metric_of(name, self.ttft, self.tpot, self.e2e)

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens served from the replicas' prefix caches over those looked up, fleet-wide."""
        sims = [r.simulation for r in self.replicas]
        queried = sum(s.prefix_queried_tokens for s in sims)
        return sum(s.prefix_hit_tokens for s in sims) / queried if queried else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "completed": self.completed, "duration_s": self.duration_s,
            "ttft_s": self.ttft.__dict__ if self.ttft else None, "tpot_s": self.tpot.__dict__ if self.tpot else None,
            "e2e_s": self.e2e.__dict__ if self.e2e else None, "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "preemptions": self.preemptions, "gpu_hours": self.gpu_hours,
            "fleet": {"router": self.router,
                      "pools": [{"name": p.name, "replicas": p.replicas, "role": p.role.value, "gpus": p.gpus,
                                 "setup": p.setup.to_dict()} for p in self.pools],
                      "replicas": [r.to_dict() for r in self.replicas],
                      "kv_transfer": self.kv_transfer.to_dict() if self.kv_transfer else None,
                      "autoscale": self.autoscale.to_dict() if self.autoscale else None,
                      "front": self.front.to_dict() if self.front else None}}


def check_pools(pools: Sequence[Pool]) -> None:
    """One line naming what is wrong with a fleet's pools, before any simulation starts."""
    if not pools:
        raise KVBudgetError("fleet: give at least one pool of replicas", param="replicas")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise KVBudgetError(f"fleet: pool names must differ ({', '.join(names)})", param="replicas")
    for p in pools:
        validate.count(p.replicas, "replicas", 1, MAX_REPLICAS)
        validate.positive(p.gpus, "gpus", "GPUs per replica")
        if p.weight_bytes is not None:
            validate.size(p.weight_bytes, "weight_bytes", 0)
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            if getattr(p, name) is not None:
                validate.count(getattr(p, name), name, 1)
                if not isinstance(p.setup.simulator, LimitsQueue):
                    raise KVBudgetError(f"{name}: a limit of vLLM's API server (from 0.29); {p.setup.engine} has "
                                        "none", param=name)
    total = sum(p.replicas for p in pools)
    if total > MAX_REPLICAS:
        raise KVBudgetError(f"replicas: {total:,} in all, over the {MAX_REPLICAS:,} a fleet may have",
                            param="replicas")
    roles = {p.role for p in pools}
    if roles != {Role.BOTH}:
        if roles != {Role.PREFILL, Role.DECODE}:
            missing = "decode" if Role.DECODE not in roles else "prefill"
            raise KVBudgetError(f"{missing}_replicas: a disaggregated fleet needs prefill and decode pools, and no "
                                f"pool doing both; give {named('prefill_replicas')} and {named('decode_replicas')}",
                                param=f"{missing}_replicas")
        for p in pools:
            why = p.setup.simulator.disaggregation(p.setup)
            if why is not None:
                raise KVBudgetError(f"{p.role.value}_replicas: pool {p.name}: {why}",
                                    param=f"{p.role.value}_replicas")


def simulate_fleet(model: Any, workload: Iterable[Request], pools: Sequence[Pool], router: Router | str =
                   "round-robin", *, fast: bool = True, sample_interval: float = SAMPLE_INTERVAL_S,
                   progress: Callable[[int], None] | None = None, check: Callable[[], None] | None = None,
                   on_route: Callable[[Request, int], None] | None = None,
                   on_step: Callable[..., None] | None = None, on_finish: Callable[..., None] | None = None,
                   autoscale: Autoscale | str | None = None, admission: str | None = None, guard_config: Any = None,
                   guard_poll_interval: float = 1.0, flow_control: FlowControl | str | None = None,
                   kv_link: KVLink | str | None = None,
                   on_transfer: Callable[[Request, float, float], None] | None = None) -> FleetSimulation:
    """Run `workload` through a fleet: `pools` of replicas (each a `Setup`, as `setup_for` gives) behind `router`
    (a name, see `parse_router`, or a `Router`). `on_route(request, replica index)` is called for each request
    routed, as the replica receives it; `on_step` and `on_finish` as `simulate`'s, with the replica's index first.
    `check` as `simulate`'s. `model` is the model the setups were made for (its weights give a cold start where a
    pool does not).

    `autoscale` (an `Autoscale`, or its text: see `parse_autoscale`) scales one pool (its `pool`, the fleet's only
    one by default) between its bounds, starting from the pool's `replicas`; `admission` (a policy of
    simulation/guarded.py, `guard_config` for kvbudget's guard, scraping every `guard_poll_interval` seconds)
    decides each arrival at the fleet's front on the serving replicas' mean gauges; `flow_control` (a
    `FlowControl`, or `max=N,ttl=S`) holds requests at the gateway while the pool is saturated.

    Disaggregated prefill and decode: pools of `Role.PREFILL` and `Role.DECODE` (none of `Role.BOTH`) and the
    `kv_link` between them (a `KVLink`, or a name or rate, see `interconnects.kv_link`). Each request goes to a
    prefill replica (the router among the prefill pools) with one output token; when that finishes, to a decode
    replica (the router among the decode pools, at that instant) which reads its prompt's KV over the link and
    generates its output, as vLLM's NIXL connector does (engines/vllm/disagg.py); the prefill replica holds the
    request's blocks until that read is done. The latencies are the client's: from the arrival at the prefill side
    to the decode side's tokens. `on_route` sees both routings: the prefill request (output 1) and the decode
    request (arriving when its prefill finished); `on_transfer(decode request, start, end)` each read. The
    autoscaler scales one side's pool (its `pool`); the front door stands before the prefill side (it reads the
    prefill replicas' gauges; an admission policy holds a request until the decode side has answered it)."""
    check_pools(pools)
    disagg = any(p.role is not Role.BOTH for p in pools)
    link = resolve_link(kv_link, pools, disagg)
    if link is not None:
        for p in pools:
            for param in ("max_num_queued_reqs", "max_num_queued_tokens"):
                if getattr(p, param) is not None:
                    raise KVBudgetError(f"{param}: not with disaggregated prefill and decode pools yet",
                                        param=param)
        # the pools as they run: each side's setup knows its role and the link
        pools = [replace(p, setup=replace(p.setup, disagg=Disagg(role=p.role, link=link))) for p in pools]
    front_pools = [p for p in pools if p.role is not Role.DECODE]  # those the front door and router send to
    chosen = _router(router, front_pools)
    # each side its own router: a router object keeps state (a turn, a memory of hashes), so the decode side's is a
    # fresh copy of it
    back = None if link is None else _router(router if isinstance(router, str) else copy.deepcopy(router),
                                             [p for p in pools if p.role is Role.DECODE])
    validate.number(sample_interval, "sample_interval", 0.0, validate.MAX_SECONDS)
    policy = fleet_policy(autoscale, pools, MAX_REPLICAS)
    validate.number(guard_poll_interval, "guard_poll_interval", 0.0, validate.MAX_SECONDS)
    front = FrontDoor(admission, guard_config, [p.setup for p in front_pools for _ in range(p.replicas)],
                      flow_control, any(p.max_num_queued_reqs is not None or p.max_num_queued_tokens is not None
                                        for p in pools), guard_poll_interval)
    scrape = _scrape(sample_interval, getattr(chosen, "refresh", 0.0), getattr(back, "refresh", 0.0),
                     front.refresh or 0.0)
    scaled = next((p for p in pools if policy and p.name == policy.pool), None)
    cold = {scaled.name: policy.cold_start(weight_bytes(model, scaled))} if policy and scaled else {}
    hooks, interval = (on_step, on_finish), (sample_interval, scrape)
    fleet = _Fleet(pools, chosen, fast, interval, check, on_route, front, scaled, hooks) if link is None or \
        back is None else _Disagg(pools, (chosen, back), link, fast, interval, check, (on_route, on_transfer), front,
                                  scaled, hooks)
    decisions = fleet.run(workload, policy, cold, progress)
    return fleet.result(chosen.name, policy, decisions, cold)


class _Fleet:
    """The replicas and their front door, advanced together."""

    def __init__(self, pools: Sequence[Pool], router: Router, fast: bool, interval: tuple[float, float],
                 check: Callable[[], None] | None, on_route: Callable[[Request, int], None] | None,
                 front: FrontDoor, scaled: Pool | None = None,
                 hooks: tuple[Callable[..., None] | None, Callable[..., None] | None] = (None, None)) -> None:
        self.router, self.fast, self.interval, self.check, self.on_route = router, fast, interval, check, on_route
        self.front, self.scaled = front, scaled  # the pool an autoscaler scales
        self.hooks = hooks  # simulate's on_step and on_finish, each called with the replica's index first
        self.replicas: list[Replica] = []  # every replica of the run, by index
        self.live: list[Replica] = []  # those not retired
        # a router that reads the replicas only through in_flight and gauge, and nothing else reading them (no
        # front door or autoscaler, no hook per step): only the replica chosen is advanced to each arrival, the
        # others as the router reads them (the same schedules, to the bit: tests/unit/simulation/test_fleet.py)
        self.lazy = getattr(router, "lazy", False) is True and not front.active and scaled is None and \
            hooks == (None, None)
        for pool in pools:
            for _ in range(pool.replicas):
                self.add(pool, 0.0, 0.0)
        self.fixed = tuple(self.live)
        self.arrived = self.decided = 0

    def add(self, pool: Pool, now: float, ready: float) -> None:
        i = len(self.replicas)
        on_step, on_finish = self.hooks
        run = _Run(pool.setup, pool.setup.simulator.scheduler(pool.setup), None, self.fast, self.interval[0],
                   _of(i, on_step), None, on_finish=_of(i, on_finish), check=self.check, scrape=self.interval[1])
        rep = Replica(i, pool, run)
        rep.started, rep.ready = now, ready
        self.replicas.append(rep)
        self.live.append(rep)

    def advance(self, until: float) -> None:
        if self.lazy and until < math.inf:
            return
        done = False
        for rep in self.live:
            rep.run.advance(until)
            if rep.drained is not None and not rep.run.sched.has_work():
                rep.retire()
                done = True
        if done:
            self.live = [r for r in self.live if r.final is None]

    def busy(self) -> bool:
        return any(rep.run.sched.has_work() for rep in self.live)

    def serving(self, now: float) -> Sequence[Replica]:
        if self.scaled is None:  # (no autoscaler: every replica serves from the start to the end)
            return self.fixed
        return [r for r in self.live if r.serving(now)]

    def mine(self) -> list[Replica]:
        """The scaled pool's replicas not drained."""
        return [r for r in self.live if r.pool is self.scaled and r.drained is None]

    def starting(self, now: float) -> int:
        return sum(1 for r in self.mine() if r.ready > now)

    def scraped(self, now: float) -> list[tuple[float, int]]:
        """The serving replicas' (KV usage, waiting) as last scraped."""
        return [(g.usage, g.waiting) for g in (r.gauge(now) for r in self.serving(now))]

    def gauges(self, now: float) -> list[Gauge]:
        """What an autoscaler reads of each serving replica of its pool."""
        out = []
        for r in self.mine():
            if not r.serving(now):
                continue
            g = r.gauge(now)
            tokens = sum(q.request.prompt_tokens + q.request.output_tokens for q in r.run.sched.waiting)
            out.append(Gauge(g.usage, g.waiting, tokens, r.pool.setup.token_slots))
        return out

    def scale(self, desired: int, now: float, cold: float) -> None:
        """Replicas added (taking requests after `cold` seconds) or drained, newest first, those still starting
        before those serving (as a ReplicaSet removes pods not ready before ready ones, the youngest first)."""
        up = self.mine()
        if desired > len(up):
            assert self.scaled is not None
            for _ in range(desired - len(up)):
                self.add(self.scaled, now, now + cold)
            return
        order = sorted(up, key=lambda r: (r.ready <= now, -r.started, -r.index))
        for r in order[:len(up) - desired]:
            r.drained = now

    def arrive(self, r: Request) -> None:
        self.arrived += 1
        routed = self.front.arrive(r, () if self.lazy else self.scraped(r.arrival))
        if routed is not None:
            self.route(*routed, r.arrival)

    def dispatch(self, now: float) -> None:
        self.front.dispatch(now, lambda: self.scraped(now), lambda r, release: self.route(r, release, now))

    def route(self, r: Request, release: Callable[[], None] | None, now: float) -> None:
        rep = _chosen(self.router, r, self.serving(now), now)
        rep.advance(now)  # (where the router left it behind)
        reason = rep.pool.refusal(rep.run, r.n)
        if reason is not None:  # answered 503 by the engine's API server: the engine never sees it
            self.front.refuse(reason, release)
            return
        _sent(rep, r, self.on_route).run.offer(r, release)

    def start(self, policy: Autoscale | None, cold: dict[str, float]) -> None:
        """The autoscaler's clock and state for a run."""
        self.policy, self.cold = policy, cold
        self.scaler = Scaler(policy, prefill=self.scaled is not None and self.scaled.role is Role.PREFILL) \
            if policy else None
        self.decisions: list[Decision] = []
        self.next_decision = policy.interval if policy and policy.interval else math.inf
        self.next_sample = DYNAMO_SAMPLE_S if policy and policy.signal is Signal.DYNAMO else math.inf
        self.tick = math.inf  # the gateway queue's next tick, as the clock last asked

    def next_event(self, now: float) -> float:
        """The next tick of the gateway's queue, or decision or sample of the autoscaler, after `now`."""
        self.tick = self.front.next_tick(now)
        return min(self.tick, self.next_decision, self.next_sample)

    def at(self, now: float) -> None:
        """The autoscaler's sample and decision due at `now`, then the gateway's tick."""
        scaler, policy = self.scaler, self.policy
        # the gateway's queue waits for the side it sends to (not a decode pool)
        queue = self.front.queue if self.scaled is None or self.scaled.role is not Role.DECODE else ()
        if now == self.next_sample and scaler is not None:
            scaler.sample(now, self.gauges(now), len(queue))
            self.next_sample += DYNAMO_SAMPLE_S
        if now == self.next_decision and scaler is not None and policy is not None:
            decision = scaler.decide(now, self.gauges(now), self.starting(now), len(queue),
                                     sum(r.prompt_tokens + r.output_tokens for r, _ in queue))
            self.decided += 1
            if len(self.decisions) < MAX_DECISIONS:
                self.decisions.append(decision)
            self.scale(decision.desired, now, next(iter(self.cold.values())))
            self.next_decision += policy.interval or math.inf
        if now == self.tick:
            self.dispatch(now)

    def run(self, workload: Iterable[Request], policy: Autoscale | None, cold: dict[str, float],
            progress: Callable[[int], None] | None) -> list[Decision]:
        """The fleet's clock: each arrival, each tick of the gateway's queue, each decision (and sample) of the
        autoscaler, in time order; the decisions taken."""
        self.start(policy, cold)
        arrivals = iter(workload)
        pending = next(arrivals, None)
        now = 0.0
        while True:
            event = self.next_event(now)
            arrival = pending.arrival if pending is not None else math.inf
            if pending is None and self.tick == math.inf and not self.busy():
                break
            now = min(arrival, event)
            if now == math.inf:
                break
            self.advance(now)
            if pending is None and not self.front.queue and not self.busy():
                break  # the last request answered: no decision after the run
            self.at(now)
            if now == arrival and pending is not None:
                self.arrive(pending)
                if progress is not None and self.arrived % 1000 == 0:
                    progress(self.arrived)
                pending = next(arrivals, None)
        self.advance(math.inf)
        return self.decisions

    def done_at(self, rep: Replica, sim: Simulation) -> float:
        """When a replica had done all it was asked (a drained one is given back then)."""
        return sim.duration_s

    def result(self, router: str, policy: Autoscale | None, decisions: list[Decision],
               cold: dict[str, float]) -> FleetSimulation:
        replicas = self.replicas
        sims = [rep.final or rep.run.result() for rep in replicas]
        end = max((s.duration_s for s in sims), default=0.0)
        spans = [(rep.started, rep.ready, rep.drained, end if rep.drained is None else
                  max(rep.drained, min(self.done_at(rep, sim), end))) for rep, sim in zip(replicas, sims, strict=True)]
        gpu_hours = sum(rep.pool.gpus * max(stop - start, 0.0)
                        for rep, (start, _, _, stop) in zip(replicas, spans, strict=True)) / 3600
        own = [span for rep, span in zip(replicas, spans, strict=True) if rep.pool is self.scaled]
        report = None if policy is None else AutoscaleReport(
            policy=policy, timeline=replica_counts(own), decisions=tuple(decisions),
            started=sum(1 for rep in replicas if rep.started > 0),
            removed=sum(1 for rep in replicas if rep.drained is not None), cold_start_s=cold, gpu_hours=gpu_hours,
            decided=self.decided)
        return _result(router, tuple({rep.pool.name: rep.pool for rep in replicas}.values()), replicas, sims,
                       self.arrived, spans, gpu_hours, report, self.front.report())


class _Disagg(_Fleet):
    """A fleet of prefill and decode pools (simulate_fleet's docstring): the Handover's clock (simulation/disagg.py),
    with _Fleet's front door before the prefill side and its autoscaler on the pool it scales."""

    def __init__(self, pools: Sequence[Pool], routers: tuple[Router, Router], link: KVLink, fast: bool,
                 interval: tuple[float, float], check: Callable[[], None] | None,
                 reports: tuple[Callable[[Request, int], None] | None, Callable[[Request, float, float], None] | None],
                 front: FrontDoor, scaled: Pool | None,
                 hooks: tuple[Callable[..., None] | None, Callable[..., None] | None]) -> None:
        self.link = link
        self.handover = Handover(*routers, _route, *reports, hooks[1])
        super().__init__(pools, routers[0], fast, interval, check, reports[0], front, scaled, hooks)

    def add(self, pool: Pool, now: float, ready: float) -> None:
        super().add(pool, now, ready)
        self.handover.add(self.replicas[-1])

    def scraped(self, now: float) -> list[tuple[float, int]]:
        """The serving prefill replicas' (KV usage, waiting) as last scraped: what the front door reads."""
        return [(g.usage, g.waiting) for g in (r.gauge(now) for r in self.serving(now)
                                                if r.pool.role is Role.PREFILL)]

    def route(self, r: Request, release: Callable[[], None] | None, now: float) -> None:
        self.handover.send(r, release, now)

    def due(self) -> float:
        return self.next_event(self.now)

    def arrive(self, r: Request) -> None:
        self.now = r.arrival  # (the gateway's next tick counts from here)
        super().arrive(r)

    def at(self, now: float) -> None:
        self.now = now
        super().at(now)
        if self.handover.retire():
            self.live = [r for r in self.live if r.final is None]

    def holds(self) -> bool:
        return bool(self.front.queue)

    def waits_for_decode(self) -> bool:
        return self.front.active  # (its holds are let go when the decode side answers)

    def done_at(self, rep: Replica, sim: Simulation) -> float:
        """A prefill replica holds a request's KV until the decode side has read it."""
        return max(sim.duration_s, self.handover.freed.get(rep.index, 0.0))

    def run(self, workload: Iterable[Request], policy: Autoscale | None, cold: dict[str, float],
            progress: Callable[[int], None] | None) -> list[Decision]:
        self.start(policy, cold)
        self.now = 0.0
        self.handover.run(workload, progress, self)
        return self.decisions

    def result(self, router: str, policy: Autoscale | None, decisions: list[Decision],
               cold: dict[str, float]) -> FleetSimulation:
        return self.handover.result(super().result(router, policy, decisions, cold), self.link)


def _scrape(sample_interval: float, *refreshes: float | None) -> float:
    """How often the replicas' gauges are scraped: the shortest refresh of whatever reads them (a router, a front
    door), else at the timeline's sampling instants (what an autoscaler and a router of one's own read). The scrapes
    are kept apart from the timeline, which keeps `sample_interval`."""
    return min((r for r in refreshes if r), default=sample_interval)


def _of(index: int, hook: Callable[..., None] | None) -> Callable[..., None] | None:
    """A per-replica hook: `hook` called with the replica's index first."""
    return None if hook is None else lambda *args: hook(index, *args)


def _result(router: str, pools: Sequence[Pool], replicas: Sequence[Replica], sims: Sequence[Simulation],
            requests: int, spans: Sequence[tuple[float, float, float | None, float]], gpu_hours: float,
            autoscale: AutoscaleReport | None, front: FrontReport | None) -> FleetSimulation:
    duration = max((s.duration_s for s in sims), default=0.0)

    def merged(field: str) -> Percentiles | None:
        values = array("d")
        for s in sims:
            values.extend(getattr(s, field))
        return Percentiles.of(values)

    completed = sum(s.completed for s in sims)
    output = sum(s.output_tokens for s in sims)
    return FleetSimulation(
        router=router, pools=tuple(pools),
        replicas=tuple(FleetReplica(index=rep.index, pool=rep.pool.name, routed=rep.routed, simulation=s,
                                    started_s=start, ready_s=ready, drained_s=drained, stopped_s=stop,
                                    role=rep.pool.role)
                       for rep, s, (start, ready, drained, stop) in zip(replicas, sims, spans, strict=True)),
        requests=requests, completed=completed, duration_s=duration, ttft=merged("ttft_sorted"),
        tpot=merged("tpot_sorted"), e2e=merged("e2e_sorted"),
        requests_per_s=completed / duration if duration else 0.0,
        output_tokens_per_s=output / duration if duration else 0.0,
        prompt_tokens=sum(s.prompt_tokens for s in sims), output_tokens=output,
        preemptions=sum(s.preemptions for s in sims), gpu_hours=gpu_hours, autoscale=autoscale, front=front)
