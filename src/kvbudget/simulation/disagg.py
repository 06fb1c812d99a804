"""Disaggregated prefill and decode in a fleet (simulation/fleet.py): the fleet on one clock, the link the KV
crosses, and what crossed it. The engine's side of it (what a prefill replica holds, what a decode replica reads,
and when) is the engine's scheduler's: engines/vllm/disagg.py."""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeAlias

from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.interconnects import KVLink
from kvbudget.interconnects import kv_link as parse_link
from kvbudget.simulation.percentiles import Percentiles

# fleet.py's Replica, Router, Pool and FleetSimulation, named here without importing them (fleet.py imports this)
Replica: TypeAlias = Any
Router: TypeAlias = Any
Pool: TypeAlias = Any
FleetSimulation: TypeAlias = Any
# how a fleet routes a request among some of its replicas: (router, request, replicas, now, on_route) -> the one
Route = Callable[[Router, Request, Sequence[Replica], float, Callable[[Request, int], None] | None], Replica]


class Outside(Protocol):
    """What stands around a disaggregated fleet's clock (fleet.py's front door and autoscaler)."""

    def due(self) -> float: ...  # when its next tick or decision is (inf: none)

    def at(self, now: float) -> None: ...  # the events due at `now`

    def arrive(self, r: Request) -> None: ...  # a client's request at the fleet's front (Handover.send it on)

    def holds(self) -> bool: ...  # requests wait at the front

    def waits_for_decode(self) -> bool: ...  # what it decides at an arrival depends on what the decode side answered


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



def resolve_link(kv_link: KVLink | str | None, pools: Sequence[Pool], disagg: bool) -> KVLink | None:
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


class Handover:
    """A disaggregated fleet's run, one clock for all: the next thing to happen is always taken first (a tick of
    the gateway's queue or an autoscaler's decision; a finished prefill handed to a decode replica; an arrival at
    the front door, routed to a prefill replica; else a turn of the replica whose clock is earliest, bounded by
    the next of the others), so a prefill replica learns when each of its requests' reads is done (and frees its
    held blocks then) before its clock passes that time, and a decode replica gets each request when its prefill
    finished. Ties: in that order, arrivals and hand-overs before turns, as a single run admits what arrived
    before its step. The client's latencies: the prefill side's end to end, then the decode side's."""

    def __init__(self, front: Router, back: Router, route: Route,
                 on_route: Callable[[Request, int], None] | None,
                 on_transfer: Callable[[Request, float, float], None] | None,
                 on_finish: Callable[..., None] | None = None) -> None:
        self.route = route
        self.on_finish = on_finish  # (decode replica, the client's request, ttft, tpot, e2e) as the client sees them
        self.replicas: list[Replica] = []  # those not retired, prefill and decode
        self.prefill: list[Replica] = []
        self.decode: list[Replica] = []
        self.front, self.back, self.on_route, self.on_transfer = front, back, on_route, on_transfer
        # id of a prefill request -> the client's request, and the front door's hold on it (let go when answered)
        self.origin: dict[int, tuple[Request, Callable[[], None] | None]] = {}
        self.holds: dict[int, Callable[[], None]] = {}  # id of a decode request -> the front door's hold on it
        self.done: dict[int, list[tuple[Request, float]]] = {}  # prefill replica -> its (request, e2e) finished
        self.seen: dict[int, int] = {}  # prefill replica -> its finishes handed over
        self.holding: dict[int, int] = {}  # prefill replica -> requests whose KV it holds, not yet read
        self.freed: dict[int, float] = {}  # prefill replica -> when the last read of its KV was done
        self.handed: list[tuple[float, int, Request]] = []  # (prefill finished at, order, decode request): a heap
        self.order = itertools.count()
        self.before: dict[int, tuple[Request, float, Request, Replica]] = {}  # id of a decode request ->
        #                                     (it, the prefill's e2e, the prefill request, its replica)
        self.ttft, self.tpot, self.e2e = array("d"), array("d"), array("d")
        self.transfers: list[tuple[int, Any]] = []  # retired decode replicas' (GPUs, transfer totals)
        # prefill replica -> {decode replica: requests it handed there whose read has not started}
        self.unread: dict[int, dict[int, int]] = {}

    def add(self, rep: Replica) -> None:
        """A replica of either side joins (at the start, or an autoscaler's)."""
        self.replicas.append(rep)
        if rep.pool.role is Role.PREFILL:
            self.prefill.append(rep)
            self.done[rep.index], self.seen[rep.index], self.holding[rep.index] = [], 0, 0
            self.unread[rep.index] = {}
            rep.run.on_finish = lambda r, _ttft, _tpot, e2e, mine=self.done[rep.index]: mine.append((r, e2e))
        else:
            self.decode.append(rep)
            rep.run.on_finish = lambda r, ttft, tpot, e2e, i=rep.index: self.answered(r, ttft, tpot, e2e, i)
            rep.run.sched.on_read = lambda d, start, done, i=rep.index: self.read(d, start, done, i)

    def retire(self) -> bool:
        """Drained replicas with nothing left to do (a prefill one: no KV left for the decode side to read) let
        go; whether any was."""
        gone = [r for r in self.replicas if r.drained is not None and not r.run.sched.has_work() and
                not self.holding.get(r.index)]
        for rep in gone:
            if rep.pool.role is Role.DECODE and (t := rep.run.sched.transfer_totals()):
                self.transfers.append((rep.pool.setup.gpus, t))
            rep.retire()
        if gone:
            self.replicas, self.prefill, self.decode = ([r for r in x if r.final is None]
                                                        for x in (self.replicas, self.prefill, self.decode))
        return bool(gone)

    def answered(self, r: Request, ttft: float, tpot: float | None, e2e: float, replica: int = 0) -> None:
        _, earlier, p, _ = self.before.pop(id(r))
        self.ttft.append(earlier + ttft)
        self.e2e.append(earlier + e2e)
        if tpot is not None:
            self.tpot.append(tpot)
        if self.on_finish is not None:  # the client's request: sent when the prefill request was
            self.on_finish(replica, replace(r, arrival=p.arrival), earlier + ttft, tpot, earlier + e2e)

    def read(self, d: Request, start: float, done: float, decode: int) -> None:
        """Decode replica `decode` starts reading `d`'s KV at `start`, done at `done`: the prefill side frees its
        blocks then."""
        _, _, p, rep = self.before[id(d)]
        unread = self.unread[rep.index]
        unread[decode] -= 1
        if not unread[decode]:
            del unread[decode]
        rep.run.sched.release(p, done)
        self.holding[rep.index] -= 1
        self.freed[rep.index] = max(self.freed.get(rep.index, 0.0), done)
        if self.on_transfer is not None:
            self.on_transfer(d, start, done)

    def run(self, workload: Iterable[Request], progress: Callable[[int], None] | None, outside: Outside) -> int:
        """The requests of `workload` through the fleet; `outside` (the front door and its ticks, an autoscaler's
        decisions) takes each arrival and has its own events, taken first at a tie, each while every replica with
        work has its clock at or past it (so what it reads of them is what they show then).

        Each side goes only as far as what it must know: a decode replica up to the next instant a prefill could
        be handed to it (the next finish known, or the earliest a busy prefill replica, or the next arrival, could
        make), so its runs of decode steps are cut only there; a prefill replica up to the next instant the decode
        side could start reading KV it holds (a request handed over and not yet read: the decode replica's clock,
        or when it will be handed over), as a read takes some time after it starts. Arrivals and hand-overs go as
        soon as the side they go to has reached them, the prefill side first, so the decode side sees the prefills'
        ends as early as they are known."""
        arrivals = iter(workload)
        pending = next(arrivals, None)
        requests = 0
        lazy = getattr(self.back, "lazy", False) is True  # it reads the decode replicas only as far as it needs
        synced = outside.waits_for_decode()  # an arrival reads what the decode side answered by then
        stuck: set[int] = set()  # replicas whose last turn waited and could not move (for a load or a release)
        while True:
            arrival = pending.arrival if pending is not None else math.inf
            handed = self.handed[0][0] if self.handed else math.inf
            prefill, first_p = _busy(self.prefill)
            decode, first_d = _busy(self.decode)
            if handed == arrival == first_p == first_d == math.inf and not outside.holds():
                assert not any(r.run.sched.has_work() for r in self.replicas)
                return requests
            event = outside.due()
            if event <= min(handed, arrival, first_p, first_d):
                outside.at(event)
            elif handed < math.inf and handed <= min(arrival, first_p) and (lazy or handed <= first_d):
                self.hand(lazy)
            elif pending is not None and arrival <= first_p and (not synced or arrival <= first_d):
                self.arrive(pending, requests, outside)
                requests += 1
                if progress is not None and requests % 1000 == 0:
                    progress(requests)
                pending = next(arrivals, None)
            else:
                rep, bound = self.next_turn(prefill, decode, stuck, (arrival, handed, event))
                t, steps = rep.run.t, rep.run.steps
                rep.run.step(bound)
                if rep.pool.role is Role.PREFILL:
                    self.collect(rep)
                if rep.run.t == t and rep.run.steps == steps:
                    stuck.add(rep.index)
                    continue
            stuck.clear()

    def next_turn(self, prefill: list[Replica], decode: list[Replica], stuck: set[int],
                  events: tuple[float, float, float]) -> tuple[Replica, float]:
        """The replica to take a turn and how far it may go (its `turn`'s bound): a prefill replica while no KV it
        holds can be read before its clock, else a decode replica while no prefill can be handed to it before its
        clock. A replica that waits (for a load or a release) and could not move lets the others go on to the
        instant it waits for; where every one waits so, the earliest goes, as far as the others not waiting."""
        arrival, handed, event = events
        p = min((r for r in prefill if r.index not in stuck), key=lambda r: (r.run.t, r.index), default=None)
        if p is not None:
            # the earliest the decode side may start reading what it was handed (a waiting decode replica: at its
            # next load done, or when another prefill replica could hand it a request)
            others = min((r.run.t for r in prefill if r is not p), default=math.inf)
            unread = self.unread[p.index]
            freed = min((min(_wake(r), others) if r.index in stuck else r.run.t
                         for r in decode if r.index in unread), default=handed)
            freed = min(freed, handed)
            if p.run.t < min(arrival, event) and p.run.t <= freed:
                return p, min(arrival, event, freed)
        # a decode replica that has a prefill replica's KV to read first (the prefill side waits on it), else the
        # earliest
        reading = {i for unread in self.unread.values() for i in unread} if len(decode) > 1 else set()
        d = min((r for r in decode if r.index not in stuck), key=lambda r: (r.index not in reading, r.run.t, r.index),
                default=None)
        if d is not None:
            # the earliest a prefill can end: a waiting prefill replica's after its next release, which waits for a
            # read that another decode replica may start
            ends = min((min(_wake(r), handed, *(x.run.t for x in decode if x is not d and x.index in
                                                self.unread[r.index])) if r.index in stuck else r.run.t
                        for r in prefill), default=math.inf)
            if d.run.t < min(handed, event) and d.run.t <= min(ends, arrival):
                return d, min(handed, ends, arrival, event)
        going = [r for r in (*prefill, *decode) if r.index not in stuck]
        assert going, "every replica of a disaggregated fleet waits on another"
        rep = min(going, key=lambda r: (r.run.t, r.index))
        return rep, min(arrival, handed, event, *(r.run.t for r in going if r is not rep))

    def hand(self, lazy: bool) -> None:
        """The earliest prefill finished to a decode replica serving then."""
        end, _, r = heapq.heappop(self.handed)
        rep = self.route(self.back, r, [x for x in self.decode if x.serving(end)], end, self.on_route)
        if lazy:
            rep.advance(end)  # (where the router left it behind)
        unread = self.unread[self.before[id(r)][3].index]
        unread[rep.index] = unread.get(rep.index, 0) + 1
        rep.run.offer(r, self.holds.pop(id(r), None))

    def arrive(self, r: Request, before: int, outside: Outside) -> None:
        if r.n > 1 or r.beam_search:
            raise KVBudgetError(f"request {r.id or before + 1}: disaggregated serving is simulated for one sequence a "
                                "request (n 1, no beam search)", param="trace")
        outside.arrive(r)

    def send(self, r: Request, release: Callable[[], None] | None, now: float) -> None:
        """The client's request `r` to a prefill replica serving at `now` (`release`: the front door's hold on it,
        let go when the decode side has answered it)."""
        p = Request(arrival=r.arrival, prompt_tokens=r.prompt_tokens, output_tokens=1, prefix=r.prefix, id=r.id,
                    max_tokens=1, session=r.session)
        rep = self.route(self.front, p, [x for x in self.prefill if x.serving(now)], now, self.on_route)
        self.origin[id(p)] = (r, release)
        self.holding[rep.index] += 1
        rep.run.offer(p)

    def collect(self, rep: Replica) -> None:
        """The prefills `rep` finished, to be handed to the decode side at their end."""
        ends, k = rep.run.finished_at, self.seen[rep.index]
        for (p, e2e), end in zip(self.done[rep.index][k:], ends[k:], strict=True):
            c, release = self.origin.pop(id(p))
            d = Request(arrival=end, prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens,
                        prefix=c.prefix, id=c.id, max_tokens=c.max_tokens, session=c.session)
            self.before[id(d)] = (d, e2e, p, rep)
            if release is not None:
                self.holds[id(d)] = release
            heapq.heappush(self.handed, (end, next(self.order), d))
        self.seen[rep.index] = len(ends)

    def result(self, out: FleetSimulation, link: KVLink) -> FleetSimulation:
        """The fleet's figures as the client sees them, and what crossed the link."""
        totals = [*self.transfers,
                  *((rep.pool.setup.gpus, t) for rep in self.decode if (t := rep.run.sched.transfer_totals()))]
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


def _busy(replicas: list[Replica]) -> tuple[list[Replica], float]:
    """The replicas with work, and the earliest of their clocks (inf: none)."""
    busy, first = [], math.inf
    for r in replicas:
        run = r.run
        if run.sched.has_work():
            busy.append(r)
            if run.t < first:
                first = run.t
    return busy, first


def _wake(rep: Replica) -> float:
    """When a replica that waits (nothing it can schedule) next can: its next load or release done (inf: none)."""
    ready = rep.run.sched.next_ready()
    return math.inf if ready is None else ready
