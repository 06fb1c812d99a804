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

import heapq
import itertools
import math
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from kvbudget import validate
from kvbudget.engines.scheduling.setup import Disagg, Role, Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.interconnects import KVLink
from kvbudget.interconnects import kv_link as parse_link
from kvbudget.simulation.percentiles import Percentiles
from kvbudget.simulation.run import SAMPLE_INTERVAL_S, Sample, Simulation, _Run

MAX_REPLICAS = 4096  # replicas in one fleet: each holds its scheduler's state (a few MB at most)
LEAST_KV_REFRESH_S = 0.05  # the usage gauge's scrape interval a least-kv router reads (GIE's metrics refresh)


@dataclass(frozen=True, kw_only=True)
class Pool:
    """`replicas` copies of one deployment (its `Setup`: engine, GPU, TP, scheduler settings), each doing all of a
    request (`Role.BOTH`) or one side of disaggregated prefill and decode."""

    name: str
    setup: Setup
    replicas: int = 1
    role: Role = Role.BOTH


class Replica:
    """One replica in the fleet: its clock loop and what a router can know of it."""

    def __init__(self, index: int, pool: Pool, run: _Run) -> None:
        self.index, self.pool, self.run = index, pool, run
        self.routed = 0  # requests the router sent here
        self._done = 0  # of them, completed by the router's clock (a pointer into run.finished_at)
        self._sample = 0  # the timeline sample the gauge shows (a pointer into run.timeline)

    def in_flight(self, now: float) -> int:
        """Requests routed here and not yet answered at `now`, as the router counts its own outstanding requests."""
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
    arrival); the answer is an index into them."""

    @property
    def name(self) -> str: ...

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int: ...


def _least(replicas: Sequence[Replica], key: Callable[[Replica], Any]) -> int:
    """The replica with the smallest key; ties to the lowest index (as a stable sort would)."""
    return min(replicas, key=lambda r: (key(r), r.index)).index


@dataclass
class RoundRobin:
    name: str = "round-robin"
    turn: int = 0

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        i = self.turn % len(replicas)
        self.turn += 1
        return replicas[i].index


@dataclass(frozen=True)
class LeastRequests:
    """The replica with the fewest requests in flight by the router's own count (Envoy's least_request with all
    replicas as choices, Ray Serve's power-of-two over the whole fleet)."""

    name: str = "least-requests"

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        return _least(replicas, lambda r: r.in_flight(now))


@dataclass(frozen=True)
class LeastKV:
    """The replica whose KV usage gauge read lowest at the last scrape (`refresh` seconds apart), its waiting
    requests breaking ties (then the lowest index), as the Gateway API Inference Extension's KV-cache scorer reads
    the engines' metrics: between scrapes every request reads the same gauges (the herd a stale gauge makes)."""

    refresh: float = LEAST_KV_REFRESH_S
    name: str = "least-kv"

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

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        if not request.session:
            return _least(replicas, lambda r: r.in_flight(now))
        return replicas[zlib.crc32(request.session.encode()) % len(replicas)].index


@dataclass(frozen=True)
class Length:
    """Pools by prompt length (the guide's advice: route by context length to pools sized for it): a prompt of at
    most `bounds[k]` tokens goes to pool k, longer ones to the last pool; within a pool, least requests."""

    bounds: tuple[int, ...]
    name: str = "length"

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        pools: dict[str, list[Replica]] = {}
        for r in replicas:
            pools.setdefault(r.pool.name, []).append(r)
        order = list(pools)
        k = next((i for i, b in enumerate(self.bounds) if request.prompt_tokens <= b), len(self.bounds))
        return _least(pools[order[k]], lambda r: r.in_flight(now))


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
    role: Role = Role.BOTH

    def to_dict(self) -> dict[str, Any]:
        s = self.simulation
        return {"index": self.index, "pool": self.pool, "role": self.role.value, "routed": self.routed,
                "completed": s.completed, "duration_s": s.duration_s, "steps": s.steps,
                "ttft_s": s.ttft.__dict__ if s.ttft else None, "tpot_s": s.tpot.__dict__ if s.tpot else None,
                "e2e_s": s.e2e.__dict__ if s.e2e else None, "preemptions": s.preemptions,
                "prefix_hit_rate": s.prefix_hit_rate, "peak_usage": s.peak_usage, "mean_usage": s.mean_usage,
                "peak_running": s.peak_running, "peak_waiting": s.peak_waiting,
                "output_tokens": s.output_tokens, "prompt_tokens": s.prompt_tokens}


@dataclass(frozen=True, kw_only=True)
class KVTransfer:
    """What crossed the link of a disaggregated fleet: the prefilled requests' KV the decode side read (`bytes`
    over every GPU of a replica, `bytes_per_gpu` one GPU's shard, which sets the time), the seconds the reads took
    (summed, and the mean), and the seconds requests waited at a decode replica for room before their read could
    start (summed, and the longest)."""

    link: KVLink
    count: int
    bytes: int
    bytes_per_gpu: int
    seconds: float
    wait_s: float
    max_wait_s: float

    @property
    def mean_seconds(self) -> float:
        return self.seconds / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"link": self.link.to_dict(), "count": self.count, "bytes": self.bytes,
                "bytes_per_gpu": self.bytes_per_gpu, "seconds": self.seconds, "mean_seconds": self.mean_seconds,
                "wait_s": self.wait_s, "max_wait_s": self.max_wait_s}


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
    kv_transfer: KVTransfer | None = None  # disaggregated prefill and decode: what crossed the link

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
                      "pools": [{"name": p.name, "replicas": p.replicas, "role": p.role.value,
                                 "setup": p.setup.to_dict()} for p in self.pools],
                      "replicas": [r.to_dict() for r in self.replicas],
                      "kv_transfer": self.kv_transfer.to_dict() if self.kv_transfer else None}}


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
                   "round-robin", *, kv_link: KVLink | str | None = None, fast: bool = True,
                   sample_interval: float = SAMPLE_INTERVAL_S, progress: Callable[[int], None] | None = None,
                   check: Callable[[], None] | None = None, on_route: Callable[[Request, int], None] | None = None,
                   on_transfer: Callable[[Request, float, float], None] | None = None) -> FleetSimulation:
    """Run `workload` through a fleet: `pools` of replicas (each a `Setup`, as `setup_for` gives) behind `router`
    (a name, see `parse_router`, or a `Router`). `on_route(request, replica index)` is called for each request
    routed. `check` as `simulate`'s. `model` is the model the setups were made for (kept for symmetry with
    `simulate`).

    Disaggregated prefill and decode: pools of `Role.PREFILL` and `Role.DECODE` (none of `Role.BOTH`) and the
    `kv_link` between them (a `KVLink`, or a name or rate, see `interconnects.kv_link`). Each request goes to a
    prefill replica (the router among the prefill pools) with one output token; when that finishes, to a decode
    replica (the router among the decode pools, at that instant) which reads its prompt's KV over the link and
    generates its output, as vLLM's NIXL connector does (engines/vllm/disagg.py); the prefill replica holds the
    request's blocks until that read is done. The latencies are the client's: from the arrival at the prefill side
    to the decode side's tokens. `on_route` sees both routings: the prefill request (output 1) and the decode
    request (arriving when its prefill finished); `on_transfer(decode request, start, end)` each read."""
    check_pools(pools)
    disagg = any(p.role is not Role.BOTH for p in pools)
    link = _link(kv_link, pools, disagg)
    sides = ([p for p in pools if p.role is Role.PREFILL], [p for p in pools if p.role is Role.DECODE]) \
        if disagg else (list(pools), [])
    routers = [_router(router, side) for side in sides if side]
    validate.number(sample_interval, "sample_interval", 0.0, validate.MAX_SECONDS)
    interval = sample_interval
    for chosen in routers:
        if isinstance(chosen, LeastKV) and chosen.refresh:
            interval = min(interval, chosen.refresh)
    used = list(pools) if link is None else \
        [replace(p, setup=replace(p.setup, disagg=Disagg(role=p.role, link=link))) for p in pools]
    replicas: list[Replica] = []
    for pool in used:  # (each scheduler built before any runs: a setup it refuses is refused first)
        for _ in range(pool.replicas):
            run = _Run(pool.setup, pool.setup.simulator.scheduler(pool.setup), None, fast, interval, None, None,
                       check=check)
            replicas.append(Replica(len(replicas), pool, run))
    chosen = routers[0]
    if link is not None:
        handover = _Handover(replicas, chosen, routers[1], on_route, on_transfer)
        requests = handover.run(workload, progress)
        return handover.result(_result(chosen.name, used, replicas, requests), link)
    requests = 0
    for r in workload:
        for rep in replicas:
            rep.run.advance(r.arrival)
        _route(chosen, r, replicas, r.arrival, on_route).run.offer(r)
        requests += 1
        if progress is not None and requests % 1000 == 0:
            progress(requests)
    for rep in replicas:
        rep.run.advance(math.inf)
    return _result(chosen.name, pools, replicas, requests)


def _route(chosen: Router, r: Request, replicas: Sequence[Replica], now: float,
           on_route: Callable[[Request, int], None] | None) -> Replica:
    """The replica `chosen` picks among `replicas` for `r`, counted and reported."""
    i = chosen.choose(r, replicas, now)
    rep = next((x for x in replicas if x.index == i), None) if isinstance(i, int) else None
    if rep is None:
        raise KVBudgetError(f"router {chosen.name}: chose replica {i!r}, not one of the "
                            f"{len(replicas)} it was offered", param="router")
    rep.routed += 1
    if on_route is not None:
        on_route(r, i)
    return rep


def _link(kv_link: KVLink | str | None, pools: Sequence[Pool], disagg: bool) -> KVLink | None:
    if not disagg:
        if kv_link is not None:
            raise KVBudgetError(f"kv_link: goes with prefill and decode pools ({named('prefill_replicas')} and "
                                f"{named('decode_replicas')})", param="kv_link")
        return None
    if kv_link is None:
        raise KVBudgetError("kv_link: a disaggregated fleet moves each prompt's KV over a link; name it (nvlink, "
                            "infiniband, roce, pcie, tcp) or give its rate (25GB/s)", param="kv_link")
    if isinstance(kv_link, KVLink):
        return kv_link
    from kvbudget.gpus import find_gpu

    def card(name: str | None) -> Any:
        try:
            return find_gpu(name) if name else None
        except KVBudgetError:
            return None

    return parse_link(str(kv_link), [card(p.setup.gpu) for p in pools])


class _Handover:
    """A disaggregated fleet's run, one clock for all: the next thing to happen is always taken first (an arrival
    routed to a prefill replica; a finished prefill handed to a decode replica; else a turn of the replica whose
    clock is earliest, bounded by the next of the others), so a prefill replica learns when each of its
    requests' reads is done (and frees its held blocks then) before its clock passes that time, and a decode
    replica gets each request when its prefill finished. Ties: arrivals and hand-overs before turns, as a single
    run admits what arrived before its step. The client's latencies: the prefill side's end to end, then the
    decode side's."""

    def __init__(self, replicas: list[Replica], front: Router, back: Router,
                 on_route: Callable[[Request, int], None] | None,
                 on_transfer: Callable[[Request, float, float], None] | None) -> None:
        self.replicas = replicas
        self.prefill = [r for r in replicas if r.pool.role is Role.PREFILL]
        self.decode = [r for r in replicas if r.pool.role is Role.DECODE]
        self.front, self.back, self.on_route, self.on_transfer = front, back, on_route, on_transfer
        self.origin: dict[int, tuple[Request, Replica]] = {}  # id of a prefill request -> client's request, replica
        self.done: dict[int, list[tuple[Request, float]]] = {r.index: [] for r in self.prefill}  # (request, e2e)
        self.seen = dict.fromkeys(self.done, 0)  # prefill replica -> its finishes handed over
        self.handed: list[tuple[float, int, Request]] = []  # (prefill finished at, order, decode request): a heap
        self.order = itertools.count()
        self.before: dict[int, tuple[Request, float, Request, Replica]] = {}  # id of a decode request ->
        #                                     (it, the prefill's e2e, the prefill request, its replica)
        self.ttft, self.tpot, self.e2e = array("d"), array("d"), array("d")
        for rep in self.prefill:
            rep.run.on_finish = lambda r, _ttft, _tpot, e2e, mine=self.done[rep.index]: mine.append((r, e2e))
        for rep in self.decode:
            rep.run.on_finish = self.answered
            rep.run.sched.on_read = self.read  # type: ignore[attr-defined]

    def answered(self, r: Request, ttft: float, tpot: float | None, e2e: float) -> None:
        _, earlier, _, _ = self.before.pop(id(r))
        self.ttft.append(earlier + ttft)
        self.e2e.append(earlier + e2e)
        if tpot is not None:
            self.tpot.append(tpot)

    def read(self, d: Request, start: float, done: float) -> None:
        """A decode replica starts reading `d`'s KV at `start`, done at `done`: the prefill side frees its blocks
        then."""
        _, _, p, rep = self.before[id(d)]
        rep.run.sched.release(p, done)  # type: ignore[attr-defined]
        if self.on_transfer is not None:
            self.on_transfer(d, start, done)

    def run(self, workload: Iterable[Request], progress: Callable[[int], None] | None) -> int:
        arrivals = iter(workload)
        pending = next(arrivals, None)
        requests = 0
        stuck: set[int] = set()  # replicas whose last turn could not move (a tie with the next event)
        while True:
            arrival = pending.arrival if pending is not None else math.inf
            handed = self.handed[0][0] if self.handed else math.inf
            busy = [r for r in self.replicas if r.index not in stuck and r.run.sched.has_work()]
            rep = min(busy, key=lambda r: (r.run.t, r.index), default=None)
            first = rep.run.t if rep is not None else math.inf
            if handed <= arrival and handed <= first:
                if handed == math.inf:
                    assert not any(r.run.sched.has_work() for r in self.replicas)
                    return requests
                end, _, d = heapq.heappop(self.handed)
                _route(self.back, d, self.decode, end, self.on_route).run.offer(d)
            elif arrival <= first:
                assert pending is not None
                self.arrive(pending, requests)
                requests += 1
                if progress is not None and requests % 1000 == 0:
                    progress(requests)
                pending = next(arrivals, None)
            else:
                assert rep is not None
                bound = min(arrival, handed, *(r.run.t for r in busy if r is not rep))
                t, steps = rep.run.t, rep.run.steps
                rep.run.step(bound)
                if rep.pool.role is Role.PREFILL:
                    self.collect(rep)
                if rep.run.t == t and rep.run.steps == steps:
                    stuck.add(rep.index)
                    continue
            stuck.clear()

    def arrive(self, r: Request, count: int) -> None:
        if r.n > 1 or r.beam_search:
            raise KVBudgetError(f"request {r.id or count + 1}: disaggregated serving is simulated for one "
                                "sequence a request (n 1, no beam search)", param="trace")
        p = Request(arrival=r.arrival, prompt_tokens=r.prompt_tokens, output_tokens=1, prefix=r.prefix, id=r.id,
                    max_tokens=1, session=r.session)
        rep = _route(self.front, p, self.prefill, r.arrival, self.on_route)
        self.origin[id(p)] = (r, rep)
        rep.run.offer(p)

    def collect(self, rep: Replica) -> None:
        """The prefills `rep` finished, to be handed to the decode side at their end."""
        ends, k = rep.run.finished_at, self.seen[rep.index]
        for (p, e2e), end in zip(self.done[rep.index][k:], ends[k:], strict=True):
            c, _ = self.origin.pop(id(p))
            d = Request(arrival=end, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens,
                        prefix=c.prefix, id=c.id, max_tokens=c.max_tokens, session=c.session)
            self.before[id(d)] = (d, e2e, p, rep)
            heapq.heappush(self.handed, (end, next(self.order), d))
        self.seen[rep.index] = len(ends)

    def result(self, out: FleetSimulation, link: KVLink) -> FleetSimulation:
        """The fleet's figures as the client sees them, and what crossed the link."""
        totals = [(rep.pool.setup.gpus, t) for rep in self.decode if (t := rep.run.sched.transfer_totals())]
        transfer = KVTransfer(link=link, count=sum(t.count for _, t in totals),
                              bytes=sum(g * t.bytes_per_gpu for g, t in totals),
                              bytes_per_gpu=sum(t.bytes_per_gpu for _, t in totals),
                              seconds=sum(t.seconds for _, t in totals), wait_s=sum(t.wait_s for _, t in totals),
                              max_wait_s=max((t.max_wait_s for _, t in totals), default=0.0))
        sims = [r.simulation for r in out.replicas if r.role is Role.DECODE]
        completed, output, duration = sum(s.completed for s in sims), sum(s.output_tokens for s in sims), \
            out.duration_s
        return replace(out, completed=completed, ttft=Percentiles.of(self.ttft), tpot=Percentiles.of(self.tpot),
                       e2e=Percentiles.of(self.e2e), requests_per_s=completed / duration if duration else 0.0,
                       output_tokens_per_s=output / duration if duration else 0.0, output_tokens=output,
                       prompt_tokens=sum(r.simulation.prompt_tokens for r in out.replicas if r.role is Role.PREFILL),
                       kv_transfer=transfer)


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
        replicas=tuple(FleetReplica(index=rep.index, pool=rep.pool.name, routed=rep.routed, simulation=s,
                                    role=rep.pool.role) for rep, s in zip(replicas, sims, strict=True)),
        requests=requests, completed=completed, duration_s=duration, ttft=merged("ttft_sorted"),
        tpot=merged("tpot_sorted"), e2e=merged("e2e_sorted"),
        requests_per_s=completed / duration if duration else 0.0,
        output_tokens_per_s=output / duration if duration else 0.0,
        prompt_tokens=sum(s.prompt_tokens for s in sims), output_tokens=output,
        preemptions=sum(s.preemptions for s in sims))
