"""Fleets: replicas of a deployment (or of several pools) behind a router, each replica the single-replica
simulator step for step.

    >>> fleet = simulate_fleet(model, read_trace("azure-conv-2023"), [Pool(name="main", setup=s, replicas=4)],
    ...                        router="least-requests")
    >>> fleet.ttft.p99, [r.routed for r in fleet.replicas]

Every replica is the `_Run` clock loop of `simulate`, advanced to each arrival; the router sees the fleet as a real
router does at that instant (its own count of requests in flight, the usage gauge as last scraped) and picks one
replica; the request is added there. A replica's schedule is exactly that of `simulate` over the requests routed to
it (tests replay them), whatever the other replicas do.
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from kvbudget import validate
from kvbudget.engines.scheduling.setup import Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.percentiles import Percentiles
from kvbudget.simulation.run import SAMPLE_INTERVAL_S, Sample, Simulation, _Run

MAX_REPLICAS = 4096  # replicas in one fleet: each holds its scheduler's state (a few MB at most)
LEAST_KV_REFRESH_S = 0.05  # the usage gauge's scrape interval a least-kv router reads (GIE's metrics refresh)


@dataclass(frozen=True, kw_only=True)
class Pool:
    """`replicas` copies of one deployment (its `Setup`: engine, GPU, TP, scheduler settings)."""

    name: str
    setup: Setup
    replicas: int = 1


class Replica:
    """One replica in the fleet: its clock loop and what a router can know of it."""

    def __init__(self, index: int, pool: Pool, run: _Run) -> None:
        self.index, self.pool, self.run = index, pool, run
        self.routed = 0  # requests the router sent here
        self._done = 0  # of them, completed by the router's clock (a pointer into run.finished_at)
        self._sample = 0  # the timeline sample the gauge shows (a pointer into run.timeline)
        self._quiet = -math.inf  # no request here finishes before this (while none is added): run.no_finish_before

    def advance(self, now: float) -> None:
        """The replica's clock loop up to `now` (the first step ending at or past it)."""
        self.run.advance(now)
        self._quiet = -math.inf

    def in_flight(self, now: float) -> int:
        """Requests routed here and not yet answered at `now`, as the router counts its own outstanding requests
        (the replica advanced only as far as a request could have finished by then)."""
        if now >= self._quiet:
            self._quiet = self.run.finishes_by(now)
        ends = self.run.finished_at
        done = self._done
        while done < len(ends) and ends[done] <= now:
            done += 1
        self._done = done
        return self.routed - done - len(self.run.sched.failed)

    def gauge(self, now: float) -> Sample:
        """The engine's gauges (KV usage, running, waiting) as a scrape at `now` last read them: the state the first
        step at or past the latest scrape instant left (the replica's timeline, sampled at the scrape interval);
        an idle replica's own state."""
        self.advance(now)
        run = self.run
        if run.t <= now and not run.sched.has_work():
            return Sample(now, run.sched.usage(), 0, 0)
        line = run.timeline
        i = self._sample
        while i + 1 < len(line) and line[i + 1].time <= now:
            i += 1
        self._sample = i
        if not line or line[i].time > now:
            return Sample(now, 0.0, 0, 0)
        return line[i]


@runtime_checkable
class Router(Protocol):
    """Picks the replica a request goes to. `replicas` are the fleet's, each advanced to `now` (the request's
    arrival); the answer is an index into them. A router that reads the replicas only through `in_flight` and
    `gauge` (which bring a replica up to `now` themselves, where it matters) may say so with a true `lazy`
    attribute: the fleet then advances only the replica chosen (the built-in routers do)."""

    @property
    def name(self) -> str: ...

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int: ...


def _least(replicas: Sequence[Replica], key: Callable[[Replica], Any]) -> int:
    """The replica with the smallest key; ties to the lowest index (as a stable sort would)."""
    return min(replicas, key=lambda r: (key(r), r.index)).index


def _fewest_in_flight(replicas: Sequence[Replica], now: float) -> int:
    """`_least` by requests in flight, in a plain loop (every arrival asks every replica)."""
    best, pick = math.inf, -1
    for r in replicas:
        n = r.in_flight(now)
        if n < best or (n == best and r.index < pick):
            best, pick = n, r.index
    return pick


@dataclass
class RoundRobin:
    name: str = "round-robin"
    turn: int = 0
    lazy: ClassVar[bool] = True

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        i = self.turn % len(replicas)
        self.turn += 1
        return replicas[i].index


@dataclass(frozen=True)
class LeastRequests:
    """The replica with the fewest requests in flight by the router's own count (Envoy's least_request with all
    replicas as choices, Ray Serve's power-of-two over the whole fleet)."""

    name: str = "least-requests"
    lazy: ClassVar[bool] = True

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        return _fewest_in_flight(replicas, now)


@dataclass(frozen=True)
class LeastKV:
    """The replica whose KV usage gauge read lowest at the last scrape (`refresh` seconds apart), its waiting
    requests breaking ties (then the lowest index), as the Gateway API Inference Extension's KV-cache scorer reads
    the engines' metrics: between scrapes every request reads the same gauges (the herd a stale gauge makes)."""

    refresh: float = LEAST_KV_REFRESH_S
    name: str = "least-kv"
    lazy: ClassVar[bool] = True

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        def key(r: Replica) -> tuple[float, int]:
            g = r.gauge(now)
            return (g.usage, g.waiting)

        return _least(replicas, key)


@dataclass(frozen=True)
class Session:
    """Affinity: every request of a session to the same replica (a hash of the session's name over the replicas,
    as a consistent-hash load balancer keys on a header); requests without a session by least requests."""

    name: str = "session"
    lazy: ClassVar[bool] = True

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        if not request.session:
            return _fewest_in_flight(replicas, now)
        return replicas[zlib.crc32(request.session.encode()) % len(replicas)].index


@dataclass(frozen=True)
class Length:
    """Pools by prompt length (the guide's advice: route by context length to pools sized for it): a prompt of at
    most `bounds[k]` tokens goes to pool k, longer ones to the last pool; within a pool, least requests."""

    bounds: tuple[int, ...]
    name: str = "length"
    lazy: ClassVar[bool] = True

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        pools: dict[str, list[Replica]] = {}
        for r in replicas:
            pools.setdefault(r.pool.name, []).append(r)
        order = list(pools)
        k = next((i for i, b in enumerate(self.bounds) if request.prompt_tokens <= b), len(self.bounds))
        return _fewest_in_flight(pools[order[k]], now)


ROUTERS = ("round-robin", "least-requests", "least-kv", "session", "length")


def parse_router(text: str, pools: Sequence[Pool] = ()) -> Router:
    """A router by name: round-robin, least-requests, least-kv[:SECONDS] (the gauge's refresh), session,
    length:T1,T2,... (one bound fewer than the pools)."""
    name, _, arg = text.strip().partition(":")
    if name == "least-kv":
        return LeastKV(_read(arg, text, float, "seconds") if arg else LEAST_KV_REFRESH_S)
    if name == "length":
        bounds = tuple(int(_read(b, text, int, "tokens")) for b in arg.split(",")) if arg else ()
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise KVBudgetError(f"router {text}: give length:T1,T2,... with rising prompt-length bounds, one fewer "
                                "than the pools, e.g. length:2048", param="router")
        if pools and len(bounds) != len(pools) - 1:
            raise KVBudgetError(f"router {text}: {len(bounds)} bounds make {len(bounds) + 1} pools by length; the "
                                f"fleet has {len(pools)} pools", param="router")
        return Length(bounds)
    built = {"round-robin": RoundRobin, "least-requests": LeastRequests, "session": Session}
    if name in built and not arg:
        return built[name]()
    raise KVBudgetError(f"router {text}: name one of {', '.join(ROUTERS)} (least-kv:SECONDS sets the gauge's "
                        "refresh; length:T1,T2,... the prompt-length bounds)", param="router")


def _read(text: str, router: str, kind: type, unit: str) -> float:
    """A router's number (seconds, a float; tokens, a whole number), checked."""
    try:
        value = kind(text.strip())
    except ValueError:
        value = None
    if value is None or not (0 < value <= (validate.MAX_SECONDS if kind is float else validate.MAX_COUNT)):
        raise KVBudgetError(f"router {router}: {validate.shown(text)} is not a number of {unit} above 0",
                            param="router")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class FleetReplica:
    """One replica's part of a fleet's run: which pool, how many requests the router sent, its own simulation."""

    index: int
    pool: str
    routed: int
    simulation: Simulation

    def to_dict(self) -> dict[str, Any]:
        s = self.simulation
        return {"index": self.index, "pool": self.pool, "routed": self.routed, "completed": s.completed,
                "duration_s": s.duration_s, "steps": s.steps,
                "ttft_s": s.ttft.__dict__ if s.ttft else None, "tpot_s": s.tpot.__dict__ if s.tpot else None,
                "e2e_s": s.e2e.__dict__ if s.e2e else None, "preemptions": s.preemptions,
                "prefix_hit_rate": s.prefix_hit_rate, "peak_usage": s.peak_usage, "mean_usage": s.mean_usage,
                "peak_running": s.peak_running, "peak_waiting": s.peak_waiting,
                "output_tokens": s.output_tokens, "prompt_tokens": s.prompt_tokens}


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

    def metric(self, name: str) -> float | None:
        from kvbudget.simulation.percentiles import check_metric

        kind, stat = check_metric(name)
        pct = {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}[kind]
        return None if pct is None else float(getattr(pct, stat))

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "completed": self.completed, "duration_s": self.duration_s,
            "ttft_s": self.ttft.__dict__ if self.ttft else None, "tpot_s": self.tpot.__dict__ if self.tpot else None,
            "e2e_s": self.e2e.__dict__ if self.e2e else None, "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "preemptions": self.preemptions,
            "fleet": {"router": self.router,
                      "pools": [{"name": p.name, "replicas": p.replicas, "setup": p.setup.to_dict()}
                                for p in self.pools],
                      "replicas": [r.to_dict() for r in self.replicas]}}


def _router(router: Router | str, pools: Sequence[Pool]) -> Router:
    if isinstance(router, str):
        return parse_router(router, pools)
    if not isinstance(router, Router):
        raise KVBudgetError(f"router {router!r}: give a name or an object with `name` and `choose(request, "
                            "replicas, now)`", param="router")
    return router


def check_pools(pools: Sequence[Pool]) -> None:
    """One line naming what is wrong with a fleet's pools, before any simulation starts."""
    if not pools:
        raise KVBudgetError("fleet: give at least one pool of replicas", param="replicas")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise KVBudgetError(f"fleet: pool names must differ ({', '.join(names)})", param="replicas")
    for p in pools:
        validate.count(p.replicas, "replicas", 1, MAX_REPLICAS)
    total = sum(p.replicas for p in pools)
    if total > MAX_REPLICAS:
        raise KVBudgetError(f"replicas: {total:,} in all, over the {MAX_REPLICAS:,} a fleet may have",
                            param="replicas")


def simulate_fleet(model: Any, workload: Iterable[Request], pools: Sequence[Pool], router: Router | str =
                   "round-robin", *, fast: bool = True, sample_interval: float = SAMPLE_INTERVAL_S,
                   progress: Callable[[int], None] | None = None, check: Callable[[], None] | None = None,
                   on_route: Callable[[Request, int], None] | None = None) -> FleetSimulation:
    """Run `workload` through a fleet: `pools` of replicas (each a `Setup`, as `setup_for` gives) behind `router`
    (a name, see `parse_router`, or a `Router`). `on_route(request, replica index)` is called for each request
    routed. `check` as `simulate`'s. `model` is the model the setups were made for (kept for symmetry with
    `simulate`)."""
    check_pools(pools)
    chosen = _router(router, pools)
    validate.number(sample_interval, "sample_interval", 0.0, validate.MAX_SECONDS)
    interval = min(sample_interval, chosen.refresh) if isinstance(chosen, LeastKV) and chosen.refresh else \
        sample_interval
    replicas: list[Replica] = []
    for pool in pools:
        for _ in range(pool.replicas):
            run = _Run(pool.setup, pool.setup.simulator.scheduler(pool.setup), None, fast, interval, None, None,
                       check=check)
            replicas.append(Replica(len(replicas), pool, run))
    lazy = getattr(chosen, "lazy", False) is True
    requests = 0
    for r in workload:
        now = r.arrival
        if not lazy:
            for rep in replicas:
                rep.advance(now)
        i = chosen.choose(r, replicas, now)
        if not (isinstance(i, int) and 0 <= i < len(replicas)):
            raise KVBudgetError(f"router {chosen.name}: chose replica {i!r} of {len(replicas)}", param="router")
        rep = replicas[i]
        rep.routed += 1
        if on_route is not None:
            on_route(r, i)
        rep.advance(now)
        rep.run.offer(r)
        requests += 1
        if progress is not None and requests % 1000 == 0:
            progress(requests)
    for rep in replicas:
        rep.run.advance(math.inf)
    return _result(chosen.name, pools, replicas, requests)


def _result(router: str, pools: Sequence[Pool], replicas: Sequence[Replica], requests: int) -> FleetSimulation:
    sims = [rep.run.result() for rep in replicas]
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
        replicas=tuple(FleetReplica(index=rep.index, pool=rep.pool.name, routed=rep.routed, simulation=s)
                       for rep, s in zip(replicas, sims, strict=True)),
        requests=requests, completed=completed, duration_s=duration, ttft=merged("ttft_sorted"),
        tpot=merged("tpot_sorted"), e2e=merged("e2e_sorted"),
        requests_per_s=completed / duration if duration else 0.0,
        output_tokens_per_s=output / duration if duration else 0.0,
        prompt_tokens=sum(s.prompt_tokens for s in sims), output_tokens=output,
        preemptions=sum(s.preemptions for s in sims))
