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
import random
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from kvbudget import validate
from kvbudget.engines.scheduling.seq import Seq
from kvbudget.engines.scheduling.setup import Disagg, Role, Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.interconnects import KVLink
from kvbudget.simulation.disagg import Handover, KVTransfer, resolve_link
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


# Prefix-cache-aware routing, as llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, now llm-d-router, at
# 520af47, May 2026) scores it: each replica gets a weighted sum of scores in [0, 1] and the highest wins, ties at
# random (picker/maxscore/picker.go shuffles, then sorts stably). The scores:
# - precise prefix (scorer/preciseprefixcache): the longest run of the prompt's blocks, from its first, that the
#   replica's KV events report held (llm-d/llm-d-kv-cache-manager v0.4.0, pkg/kvcache/kvblock_scorer.go
#   `LongestPrefixScorer`, GPU tier weight 1; a host tier's blocks, weight 0.8 in pkg/kvcache/backend.go, are not
#   counted here), over the prompt's blocks (utils.go `absoluteScoredPods`; v0.8.0 normalized by min-max instead);
# - approximate prefix (requestcontrol/dataproducer/approximateprefix, from GIE's `prefix` plugin): the router's own
#   memory of which block hashes it sent where, an LRU per replica that never hears of evictions;
# - kv-cache-utilization (1 - the usage gauge) and queue (min-max of the waiting gauge) from the scraped metrics.
PRECISE_WEIGHTS = (2.0, 1.0, 1.0)  # prefix, kv usage, queue: deploy/config/epp-precise-prefix-cache-config.yaml
APPROX_WEIGHTS = (3.0, 2.0, 2.0)  # ... the chart's default profile: config/charts/epplib/templates/_config.yaml
APPROX_BLOCK_TOKENS = 16  # approximateprefix/types.go defaultBlockSizeTokens (autoTune reads vLLM's block size)
APPROX_MAX_BLOCKS = 256  # ... defaultMaxPrefixBlocks: blocks hashed per prompt
APPROX_LRU_ENTRIES = 31_250  # ... defaultLRUCapacityPerServer (autoTune reads the replica's GPU blocks instead)
APPROX_MAX_ENTRIES = 1 << 22  # block hashes a replica's LRU may be given: 67M tokens in blocks of 16, past any GPU's
#                               KV cache; about half a GB of the router's memory per replica at most


def _check_weights(weights: tuple[float, float, float]) -> None:
    """A scorer's three weights (prefix, KV usage, queue): numbers from 0, not all 0."""
    if len(weights) != 3 or not any(validate.number(w, "router", 0.0, 1e6, above=False) for w in weights):
        raise KVBudgetError(f"router: weights {validate.shown(weights)} must be three numbers from 0 (prefix, KV "
                            "usage, queue), not all 0", param="router")


def _pick(replicas: Sequence[Replica], prefix: Sequence[float], weights: tuple[float, float, float], now: float,
          rng: random.Random) -> int:
    """The replica with the highest weighted score (prefix, 1 - KV usage, queue by min-max of the waiting gauge, as
    last scraped), ties at random."""
    gauges = [r.gauge(now) for r in replicas]
    low, high = min(g.waiting for g in gauges), max(g.waiting for g in gauges)
    wp, wk, wq = weights
    scores = [wp * p + wk * (1 - g.usage) + wq * (1.0 if high == low else (high - g.waiting) / (high - low))
              for p, g in zip(prefix, gauges, strict=True)]
    best = max(scores)
    return rng.choice([r for r, s in zip(replicas, scores, strict=True) if s == best]).index


@dataclass(kw_only=True)
class PrefixAware:
    """llm-d's precise prefix-cache scorer with its load scorers: a replica's prefix score is the share of the
    prompt's blocks its cache holds from the first on, as its KV events report them (the engine's own lookup,
    `Queues.cached_prefix`, which changes nothing). The view is the cache after the replica's latest schedule():
    vLLM (v1/core/sched/scheduler.py `update_from_output`, main at 00024d3) publishes a step's events when the
    step is done, so a step still running at the arrival shows up to one step early; the events' transit over
    ZMQ to the indexer is not counted."""

    refresh: float = LEAST_KV_REFRESH_S
    seed: int = 0
    weights: tuple[float, float, float] = PRECISE_WEIGHTS  # prefix, KV usage, queue
    name: str = "prefix"

    def __post_init__(self) -> None:
        validate.number(self.refresh, "router", 0.0, validate.MAX_SECONDS)
        _check_weights(self.weights)
        self.rng = random.Random(self.seed)

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        prefix = []
        for r in replicas:
            bs = r.run.sched.cfg.block_size
            total = request.prompt_tokens // bs
            prefix.append(min(r.run.sched.cached_prefix(request) // bs / total, 1.0) if total else 0.0)
        return _pick(replicas, prefix, self.weights, now, self.rng)


@dataclass(kw_only=True)
class ApproxPrefix:
    """GIE's approximate prefix plugin with the chart's load scorers: the prompt's first blocks (at most 256, the
    last one partial) hashed as a chain; a replica's prefix score is how many of the leading blocks that some
    replica was sent it was sent, over the blocks; the chosen replica records the hashes in its LRU of `entries`
    (0: the replica's GPU blocks, as GIE's autoTune reads them; 31,250 where the engine reports none), which forgets
    the oldest and never hears of the engine's evictions."""

    entries: int = 0
    refresh: float = LEAST_KV_REFRESH_S
    seed: int = 0
    weights: tuple[float, float, float] = APPROX_WEIGHTS  # prefix, KV usage, queue
    block: int = 0  # tokens a hash covers (0: the engine's block size, as GIE's autoTune reads it)
    name: str = "prefix-approx"

    def __post_init__(self) -> None:
        if not (type(self.entries) is int and 0 <= self.entries <= APPROX_MAX_ENTRIES):
            raise KVBudgetError(f"router {self.name}: entries {validate.shown(self.entries)} must be a whole number "
                                f"of LRU entries per replica from 0 (the replica's GPU blocks) to "
                                f"{APPROX_MAX_ENTRIES:,}", param="router")
        validate.number(self.refresh, "router", 0.0, validate.MAX_SECONDS)
        _check_weights(self.weights)
        validate.count(self.block, "router", 0, validate.MAX_COUNT)
        self.rng = random.Random(self.seed)
        self.lru: dict[int, OrderedDict[int, None]] = {}  # replica -> its block hashes, oldest first
        self.where: dict[int, set[int]] = {}  # block hash -> the replicas it was sent to (and not forgotten)
        self.sent = 0

    def hashes(self, request: Request, block: int) -> list[int]:
        """The prompt's block hashes as GIE chains them: equal for two prompts up to a block exactly where their
        tokens agree up to its end (`Seq.key`'s relation); a block past the shared pieces is the request's own."""
        self.sent += 1
        seq = Seq(self.sent, request)
        return [seq.key(j, block) for j in range(min(-(-request.prompt_tokens // block), APPROX_MAX_BLOCKS))]

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        cfg = replicas[0].run.sched.cfg
        block = self.block or (cfg.block_size if cfg.block_size > 1 else APPROX_BLOCK_TOKENS)
        hashes = self.hashes(request, block)
        matched = dict.fromkeys((r.index for r in replicas), 0)
        for h in hashes:
            holders = self.where.get(h)
            if not holders:
                break
            for i in holders:
                if i in matched:
                    matched[i] += 1
        prefix = [matched[r.index] / len(hashes) if hashes else 0.0 for r in replicas]
        chosen = _pick(replicas, prefix, self.weights, now, self.rng)
        self._record(hashes, chosen, replicas)
        return chosen

    def _record(self, hashes: list[int], chosen: int, replicas: Sequence[Replica]) -> None:
        lru = self.lru.get(chosen)
        if lru is None:
            lru = self.lru[chosen] = OrderedDict()
        cfg = next(r for r in replicas if r.index == chosen).run.sched.cfg
        room = self.entries or (min(cfg.num_blocks, APPROX_MAX_ENTRIES) if cfg.block_size > 1 else APPROX_LRU_ENTRIES)
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > room:
                    old, _ = lru.popitem(last=False)
                    self.where[old].discard(chosen)
                    if not self.where[old]:
                        del self.where[old]
            self.where.setdefault(h, set()).add(chosen)


ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix", "prefix-approx", "session", "length")


def parse_router(text: str, pools: Sequence[Pool] = ()) -> Router:
    """A router by name: round-robin, least-requests, least-kv[:SECONDS] (the gauge's refresh), prefix (precise,
    from the replicas' KV events), prefix-approx[:N] (the router's memory, N block hashes per replica), session,
    length:T1,T2,... (one bound fewer than the pools)."""
    name, _, arg = text.strip().partition(":")
    if name == "prefix-approx":
        return ApproxPrefix(entries=int(_read(arg, text, int, "LRU entries", APPROX_MAX_ENTRIES)) if arg else 0)
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
    built = {"round-robin": RoundRobin, "least-requests": LeastRequests, "session": Session, "prefix": PrefixAware}
    if name in built and not arg:
        return built[name]()
    raise KVBudgetError(f"router {text}: name one of {', '.join(ROUTERS)} (least-kv:SECONDS sets the gauge's "
                        "refresh; prefix-approx:N the LRU entries per replica; length:T1,T2,... the prompt-length "
                        "bounds)", param="router")


def _read(text: str, router: str, kind: type, unit: str, most: float | None = None) -> float:
    """A router's number (seconds, a float; tokens, a whole number), checked (at most `most`, else the kind's
    limit)."""
    most = most or (validate.MAX_SECONDS if kind is float else validate.MAX_COUNT)
    try:
        value = kind(text.strip())
    except ValueError:
        value = None
    if value is None or not (0 < value <= most):
        raise KVBudgetError(f"router {router}: {validate.shown(text)} is not a number of {unit} above 0 "
                            f"(at most {most:,})", param="router")
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
    kv_transfer: KVTransfer | None = None  # disaggregated prefill and decode: what crossed the link

    def metric(self, name: str) -> float | None:
        from kvbudget.simulation.percentiles import check_metric

        kind, stat = check_metric(name)
        pct = {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}[kind]
        return None if pct is None else float(getattr(pct, stat))

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
                   on_transfer: Callable[[Request, float, float], None] | None = None,
                   on_step: Callable[..., None] | None = None,
                   on_finish: Callable[..., None] | None = None) -> FleetSimulation:
    """Run `workload` through a fleet: `pools` of replicas (each a `Setup`, as `setup_for` gives) behind `router`
    (a name, see `parse_router`, or a `Router`). `on_route(request, replica index)` is called for each request
    routed; `on_step` and `on_finish` as `simulate`'s, with the replica's index first. `check` as `simulate`'s.
    `model` is the model the setups were made for (kept for symmetry with `simulate`).

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
    link = resolve_link(kv_link, pools, disagg)
    sides = ([p for p in pools if p.role is Role.PREFILL], [p for p in pools if p.role is Role.DECODE]) \
        if disagg else (list(pools), [])
    routers = [_router(router, side) for side in sides if side]
    validate.number(sample_interval, "sample_interval", 0.0, validate.MAX_SECONDS)
    interval = sample_interval
    for chosen in routers:  # a router that reads the gauges: the timeline is its scrapes
        refresh = getattr(chosen, "refresh", 0.0)
        interval = min(interval, refresh) if refresh else interval
    used = list(pools) if link is None else \
        [replace(p, setup=replace(p.setup, disagg=Disagg(role=p.role, link=link))) for p in pools]
    replicas: list[Replica] = []
    for pool in used:  # (each scheduler built before any runs: a setup it refuses is refused first)
        for _ in range(pool.replicas):
            i = len(replicas)
            run = _Run(pool.setup, pool.setup.simulator.scheduler(pool.setup), None, fast, interval,
                       _of(i, on_step), None, on_finish=_of(i, on_finish), check=check)
            replicas.append(Replica(len(replicas), pool, run))
    chosen = routers[0]
    if link is not None:
        handover = Handover(replicas, chosen, routers[1], _route, on_route, on_transfer)
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


def _of(index: int, hook: Callable[..., None] | None) -> Callable[..., None] | None:
    """A per-replica hook: `hook` called with the replica's index first."""
    return None if hook is None else lambda *args: hook(index, *args)


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
