"""A fleet's pools and replicas, and the routers that pick the replica each request goes to: a replica as a router
sees it (its own count of requests in flight, the engine's gauges as last scraped, its prefix cache as its KV
events report it). `Router` is the protocol a user can add to; the built-in ones are plain implementations of it."""

from __future__ import annotations

import math
import random
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from kvbudget import validate
from kvbudget.engines.scheduling.seq import Seq
from kvbudget.engines.scheduling.setup import LimitsQueue, Role, Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.run import Sample, Simulation, _Run

LEAST_KV_REFRESH_S = 0.05  # the usage gauge's scrape interval a least-kv router reads (GIE's metrics refresh)


@dataclass(frozen=True, kw_only=True)
class Pool:
    """`replicas` copies of one deployment (its `Setup`: engine, GPU, TP, scheduler settings), each doing all of a
    request (`Role.BOTH`) or one side of disaggregated prefill and decode."""

    name: str
    setup: Setup
    replicas: int = 1
    role: Role = Role.BOTH
    gpus: int = 0  # GPUs per replica (tp x pp), for GPU-hours; 0: the setup's (the engine's tp x pp)
    weight_bytes: int | None = None  # bytes each GPU loads at a cold start (None: counted from the model)
    # the engine's own admission in its API server (vLLM's --max-num-queued-reqs / --max-num-queued-tokens, 503)
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.gpus == 0:
            object.__setattr__(self, "gpus", self.setup.gpus)

    def refusal(self, run: _Run, n: int) -> str | None:
        """The engine limit a request of `n` samples sent to a replica of this pool is refused by (None: none)."""
        if self.max_num_queued_reqs is None and self.max_num_queued_tokens is None:
            return None
        simulator, sched = self.setup.simulator, run.sched
        assert isinstance(simulator, LimitsQueue)  # (check_pools)
        return simulator.queue_refusal(self.max_num_queued_reqs, self.max_num_queued_tokens,
                                       [*sched.waiting, *sched.running], n)


class Replica:
    """One replica in the fleet: its clock loop and what a router can know of it."""

    def __init__(self, index: int, pool: Pool, run: _Run) -> None:
        self.index, self.pool, self.run = index, pool, run
        self.started = self.ready = 0.0  # when it was asked for, and when it took requests (its cold start over)
        self.drained: float | None = None  # when it stopped taking requests (an autoscaler's scale-in)
        self.final: Simulation | None = None  # a drained replica's result once it has answered its last request
        self.routed = 0  # requests the router sent here
        self._done = 0  # of them, completed by the router's clock (a pointer into run.finished_at)
        self._quiet = -math.inf  # no request here finishes before this (while none is added): run.no_finish_before
        self._read: tuple[float, float, int, int] | None = None  # the scrape last read, and as a Sample
        self._shown = Sample(0.0, 0.0, 0, 0)

    def retire(self) -> None:
        """A drained replica with nothing left to do: its result kept, its scheduler let go (a run that scales in
        and out for a day holds only the replicas up at once)."""
        self.final = self.run.result()
        del self.run

    def serving(self, now: float) -> bool:
        """Whether it takes requests at `now`: started and not draining."""
        return self.ready <= now and self.drained is None

    def advance(self, now: float) -> None:
        """The replica's clock loop up to `now` (the first step ending at or past it)."""
        self.run.advance(now)
        self._quiet = -math.inf

    def took(self) -> None:
        """A request routed here: counted, and what was known of the next finish here forgotten (the new request
        may finish first)."""
        self.routed += 1
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
        step at or past the latest scrape instant left (the run's scrapes, kept apart from its timeline); an idle
        replica's own state. `now` never goes back from one read to the next.

        The replica goes only as far as that scrape: to the step that crossed the latest scrape instant at or before
        `now` (no later one can show at `now`), and on to `now` only where it could have answered its last request
        by then (an idle replica shows its own state)."""
        run = self.run
        self.advance(_instant(now, run.scrape))
        if run.t < now and run.sched.has_work() and run.no_finish_before() <= now:
            self.advance(now)
        kept = run.scrapes
        while len(kept) > 1 and kept[1][0] <= now:
            kept.popleft()
        run.read_at = now
        if run.t <= now and not run.sched.has_work():
            return Sample(now, run.sched.usage(), 0, 0)
        if not kept or kept[0][0] > now:
            return Sample(now, 0.0, 0, 0)
        if kept[0] is not self._read:  # (each scrape made a Sample once, when first read)
            self._read, self._shown = kept[0], Sample(*kept[0])
        return self._shown

    def floor(self, now: float) -> tuple[float, int]:
        """At most the (KV usage, waiting) `gauge(now)` shows, without advancing the replica where that would take
        steps: where its steps up to that scrape are pure decode steps that outlast `now` (no request can finish by
        then), they only take blocks (no hybrid groups, whose windows free some) and leave the queue as it is, so
        the scrape shows at least its state now, or a scrape it keeps; (0, 0) where that cannot be told."""
        run = self.run
        sched = run.sched
        if run.t >= _instant(now, run.scrape) or not sched.has_work():
            g = self.gauge(now)  # (nothing to advance)
            return g.usage, g.waiting
        kept = run.scrapes
        while len(kept) > 1 and kept[1][0] <= now:  # (as `gauge` drops them: never shown again)
            kept.popleft()
        run.read_at = now
        if sched.hybrid or not kept or kept[0][0] > now:
            return 0.0, 0
        if self._quiet <= now:  # (as `in_flight` keeps it: good until the replica moves or takes a request)
            self._quiet = run.no_finish_before()
            if self._quiet <= now:
                return 0.0, 0
        free, usable = sched.free_blocks()
        return min((1.0 - free / usable, len(sched.waiting)), *((usage, waiting) for _, usage, _, waiting in kept))


def _instant(now: float, refresh: float) -> float:
    """The latest scrape instant (a whole number of `refresh` seconds, as `_Run.sampled` counts them) at or before
    `now` (`now` itself where nothing is scraped)."""
    if refresh == math.inf:
        return now
    return min(math.floor(now / refresh) * refresh, now)


@runtime_checkable
class Router(Protocol):
    """Picks the replica a request goes to. `replicas` are the fleet's, each advanced to `now` (the request's
    arrival); the answer is an index into them. A router that reads the replicas only through `in_flight` and
    `gauge` (which bring a replica up to `now` themselves, where it matters) may say so with a true `lazy`
    attribute: the fleet then advances only the replica chosen (the built-in routers but the prefix ones do)."""

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
        if len(replicas) == 1:  # (nothing to compare)
            return replicas[0].index
        # the gauges read from the lowest they can show up: a replica that cannot show less than the lowest read is
        # not read (nor advanced to `now`): the same choice as reading every one
        best: tuple[float, int, int] | None = None
        for low, i, r in sorted(((r.floor(now), r.index, r) for r in replicas), key=lambda x: (x[0], x[1])):
            if best is not None and (*low, i) > best:
                break
            g = r.gauge(now)
            if best is None or (g.usage, g.waiting, i) < best:
                best = (g.usage, g.waiting, i)
        assert best is not None
        return best[2]


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


def _router(router: Router | str, pools: Sequence[Pool]) -> Router:
    if isinstance(router, str):
        return parse_router(router, pools)
    if not isinstance(router, Router):
        raise KVBudgetError(f"router {router!r}: give a name or an object with `name` and `choose(request, "
                            "replicas, now)`", param="router")
    return router


def _chosen(chosen: Router, r: Request, replicas: Sequence[Replica], now: float) -> Replica:
    """The replica `chosen` picks among `replicas` for `r`, checked."""
    i = chosen.choose(r, replicas, now)
    rep = next((x for x in replicas if x.index == i), None) if isinstance(i, int) else None
    if rep is None:
        raise KVBudgetError(f"router {chosen.name}: chose replica {i!r}, not one of the "
                            f"{len(replicas)} it was offered", param="router")
    return rep


def _sent(rep: Replica, r: Request, on_route: Callable[[Request, int], None] | None) -> Replica:
    """A request sent to `rep`: counted and reported."""
    rep.took()
    if on_route is not None:
        on_route(r, rep.index)
    return rep


def _route(chosen: Router, r: Request, replicas: Sequence[Replica], now: float,
           on_route: Callable[[Request, int], None] | None) -> Replica:
    """The replica `chosen` picks among `replicas` for `r`, counted and reported."""
    return _sent(_chosen(chosen, r, replicas, now), r, on_route)
