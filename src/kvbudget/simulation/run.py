"""`simulate`: a workload through an engine's scheduler and KV allocator, on a clock from the time model.

The memory comes from the planner (the same budget, blocks and block size `kvbudget plan` reports); the
scheduler decides each step exactly as the engine does; the time model says how long each step takes. Requests
are read from the workload as the clock reaches them, so a trace of any length streams through.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.seq import Queues, Seq, Step
from kvbudget.engines.scheduling.setup import Setup
from kvbudget.engines.scheduling.workload import MAX_CLIENTS, Request, samples

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.seq import SpecTotals
    from kvbudget.engines.tiers import OffloadTotals
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.simulation import bands, decoding
from kvbudget.simulation.beam import BeamSearch
from kvbudget.simulation.decoding import Sample
from kvbudget.simulation.guarded import Gatekeeper, GuardReport, admission_policy
from kvbudget.simulation.percentiles import LatencyWindow, Percentiles, latency_windows, metric_of

# (setups.py's, where most callers have long found them)
from kvbudget.simulation.setups import NO_GPU_MEMORY as NO_GPU_MEMORY
from kvbudget.simulation.setups import setup_for as setup_for
from kvbudget.simulation.setups import setup_of as setup_of

SAMPLE_INTERVAL_S = 1.0  # the timeline keeps one sample per second of simulated time by default
CHECK_EVERY = 256  # clock-loop turns between calls of `check` (a few ms of work at most; nothing measurable)


@dataclass(frozen=True)
class MemoryShares:
    """Where the KV cache's token slots went, averaged over the run's time (the PagedAttention paper's Fig. 2)."""

    token_states: float  # slots holding cached tokens
    reservation: float  # reserved for tokens a request will still generate (contiguous allocators)
    internal: float  # held but never to be filled (past a request's final length, or the rest of a block)
    other: float  # free: idle, or holes too small for the next reservation (external fragmentation)


@dataclass(frozen=True, kw_only=True)
class Simulation:
    setup: Setup
    requests: int
    completed: int
    duration_s: float
    steps: int
    ttft: Percentiles | None
    tpot: Percentiles | None
    e2e: Percentiles | None
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    peak_usage: float
    mean_usage: float  # time-weighted
    peak_running: int
    peak_waiting: int
    memory: MemoryShares
    timeline: tuple[Sample, ...]
    fast_steps: int  # steps taken by the fast path (decode runs)
    notes: tuple[str, ...] = field(default=())
    ttft_sorted: tuple[float, ...] = field(default=(), repr=False)  # every request's, for distributions
    e2e_sorted: tuple[float, ...] = field(default=(), repr=False)
    tpot_sorted: tuple[float, ...] = field(default=(), repr=False)
    guard: GuardReport | None = None  # what the guard in the loop did
    failed: int = 0  # requests the engine answered with an error (llama.cpp's unified cache when it overflows)
    latency_timeline: tuple[LatencyWindow, ...] = ()  # TTFT and end-to-end percentiles over the run
    offload: OffloadTotals | None = None  # what a host tier behind the prefix cache did (its scheduler's totals)
    clients: int | None = None  # a closed loop's clients in front (max_concurrency); None: requests as they arrive
    speculation: SpecTotals | None = None  # what speculative decoding did (setup.drafting: what it was asked)
    tpot_without: Percentiles | None = None  # the same workload's TPOT without speculative decoding, where run

    def metric(self, name: str) -> float | None:
        """A latency figure by name: ttft|tpot|e2e _ p50|p90|p99|mean|max (seconds)."""
        return metric_of(name, self.ttft, self.tpot, self.e2e)

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else None

    def to_dict(self) -> dict[str, Any]:
        def pct(p: Percentiles | None, kind: str) -> dict[str, Any] | None:
            return None if p is None else {**p.__dict__, "band": bands.as_dict(self.setup, kind)}

        return {
            "setup": self.setup.to_dict(), "requests": self.requests, "completed": self.completed,
            "duration_s": self.duration_s, "steps": self.steps, "ttft_s": pct(self.ttft, "ttft"),
            "tpot_s": pct(self.tpot, "tpot"), "e2e_s": pct(self.e2e, "e2e"),
            "requests_per_s": self.requests_per_s, "output_tokens_per_s": self.output_tokens_per_s,
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "preemptions": self.preemptions, "preempted_requests": self.preempted_requests,
            "recomputed_tokens": self.recomputed_tokens, "prefix_hit_tokens": self.prefix_hit_tokens,
            "prefix_queried_tokens": self.prefix_queried_tokens, "prefix_hit_rate": self.prefix_hit_rate,
            "peak_usage": self.peak_usage, "mean_usage": self.mean_usage, "peak_running": self.peak_running,
            "peak_waiting": self.peak_waiting, "memory": dict(self.memory.__dict__), "fast_steps": self.fast_steps,
            "failed": self.failed, "notes": list(self.notes), "guard": self.guard.to_dict() if self.guard else None,
            "timeline": [s.__dict__ for s in self.timeline],
            "latency_timeline": [w.to_dict() for w in self.latency_timeline],
            "offload": self.offload.to_dict() if self.offload is not None else None, "clients": self.clients,
            "speculation": self.speculation.to_dict() if self.speculation is not None else None,
            "tpot_without_speculation_s": pct(self.tpot_without, "tpot")}


def simulate(model: ModelSpec, workload: Iterable[Request], *, setup: Setup | None = None, fast: bool = True,
             sample_interval: float = SAMPLE_INTERVAL_S, on_step: Callable[[float, int, float, int, int], None]
             | None = None, progress: Callable[[int], None] | None = None, guard_config: dict[str, Any] | None = None,
             guard_poll_interval: float = 1.0, on_finish: Callable[[Request, float, float | None, float], None]
             | None = None, admission: str | None = None, check: Callable[[], None] | None = None,
             max_concurrency: int | None = None, **settings: Any) -> Simulation:
    """Run `workload` through vLLM's scheduler. `settings` are `setup_for`'s (engine, gpu, kv_memory, ...) unless
    a `setup` is given. `fast` takes runs of pure decode steps at once (the result is identical; see tests).
    `on_step(time, tokens, usage, running, waiting)` is called after every step (for a timeline file);
    `on_finish(request, ttft, tpot, e2e)` for every sequence that completes (tpot None for one output token).
    `guard_config` (a guard YAML as a dict, e.g. from `kvbudget plan --guard-config`) puts the guard's own
    admission in front of the engine: it decides every arrival, scraping the usage gauge every
    `guard_poll_interval` seconds; `admission` names another policy instead (simulation/guarded.py). `check()` is
    called every `CHECK_EVERY` turns of the clock loop, a few milliseconds apart, whatever the workload: it ends
    the run by raising (a deadline, a client gone, a server stopping). `max_concurrency`: that many clients in a
    closed loop (as `vllm bench serve --max-concurrency` sends): a request goes out when it has arrived and a
    client is free, its latencies counted from then."""
    validate.number(sample_interval, "sample_interval", 0.0, validate.MAX_SECONDS)
    validate.number(guard_poll_interval, "guard_poll_interval", 0.0, validate.MAX_SECONDS)
    s = setup or setup_for(model, **settings)
    sched = s.simulator.scheduler(s)
    guard = admission_policy(admission, guard_config, s, get_engine(s.engine), guard_poll_interval)
    if max_concurrency is not None:
        validate.count(max_concurrency, "max_concurrency", 1, MAX_CLIENTS)
    run = _Run(s, sched, workload, fast, sample_interval, on_step, progress, guard, on_finish, check, max_concurrency)
    return run.result()


class _Run:
    """The clock loop, with its running totals."""

    def __init__(self, setup: Setup, sched: Queues, workload: Iterable[Request] | None, fast: bool, interval: float,
                 on_step: Callable[..., None] | None,
                 progress: Callable[[int], None] | None, guard: Gatekeeper | None = None,
                 on_finish: Callable[..., None] | None = None, check: Callable[[], None] | None = None,
                 clients: int | None = None, scrape: float = math.inf):
        self.setup, self.sched, self.fast, self.guard = setup, sched, fast, guard
        # a closed loop's clients: when each is free to send (a heap; every one free from the start)
        self.clients: list[float] | None = None if clients is None else [-math.inf] * clients
        self.client_count = clients
        self.check = check or (lambda: None)
        self.turns = CHECK_EVERY  # clock-loop turns left before the next `check`
        self.releases: dict[int, Callable[[], None]] = {}  # the guard's hold on each admitted request
        self.families: dict[int, list[Any]] = {}  # child uid -> its request's [left, first token, finish, release]
        self.beams: dict[int, BeamSearch] = {}  # engine request uid -> the beam search it belongs to
        self.interval, self.on_step, self.progress, self.on_finish = interval, on_step, progress, on_finish
        self.tm = setup.time_model
        self.ttft, self.tpot, self.e2e = array("d"), array("d"), array("d")
        self.finished_at = array("d")  # each completed request's end, beside its ttft and e2e
        self.t = 0.0
        self.steps = self.fast_steps = 0
        self.requests = self.completed = self.prompt_tokens = self.output_tokens = 0
        self.preempted_requests = self.recomputed = 0
        self.usage_time = 0.0  # integral of usage over time
        self.slot_time = [0.0, 0.0, 0.0]  # integrals of token states, reservation, internal fragmentation
        self.peak_usage = 0.0
        self.peak_running = self.peak_waiting = 0
        self.timeline: list[Sample] = []
        self.next_line = 0.0  # the timeline's next sampling instant
        # a fleet's gauge scrapes, every `scrape` seconds, kept apart from the timeline: the state the first step at
        # or past each instant left, those a reader at `read_at` can no longer see dropped (Replica.gauge)
        self.scrape, self.next_scrape = scrape, 0.0 if scrape < math.inf else math.inf
        self.scrapes: deque[tuple[float, float, int, int]] = deque()  # (time, usage, running, waiting)
        self.read_at = -math.inf
        self.next_sample = 0.0  # the next instant of either
        if workload is not None:
            self.loop(iter(workload))

    def due(self, pending: Request | None) -> float:
        """When the pending request reaches the engine: its arrival, or when a client is free to send it and the
        time outside the engine has passed (parsing, tokenizing: TimeModel.outside_seconds)."""
        if pending is None or (self.clients is not None and not self.clients):
            return math.inf
        if self.clients is None:
            return pending.arrival
        return max(pending.arrival, self.clients[0] + self.tm.outside_seconds(pending.prompt_tokens))

    def free_client(self, now: float) -> None:
        """A request ended at `now` (answered, failed or refused): its client sends the next one then."""
        if self.clients is not None:
            heapq.heappush(self.clients, now)

    def admit(self, arrivals: Iterator[Request], pending: Request | None,
              release: Callable[[], None] | None = None) -> Request | None:
        while pending is not None and self.due(pending) <= self.t:
            if self.clients is not None:  # sent when its client was free, the latency counted from then
                pending = replace(pending, arrival=max(pending.arrival, heapq.heappop(self.clients)
                                                       + self.tm.outside_seconds(pending.prompt_tokens)))
            if pending.prompt_tokens + 1 > self.setup.max_model_len:
                raise KVBudgetError(f"request {pending.id or self.requests + 1}: a prompt of {pending.prompt_tokens} "
                                    f"tokens does not fit max_model_len {self.setup.max_model_len} (the engine "
                                    "rejects it); raise max_model_len or filter the trace", param="trace")
            self.requests += 1
            if self.guard is None:
                self.add(pending, release)  # (a fleet's offer: one request, `release` its hold)
            else:
                self.guard.observe(self.t, self.sched.usage(), len(self.sched.waiting))
                admitted = self.guard.admit(pending, self.t)
                if admitted is not None:
                    self.add(*admitted)
                else:
                    self.free_client(self.t)
            self.prompt_tokens += pending.prompt_tokens
            if self.progress is not None and self.requests % 1000 == 0:
                self.progress(self.requests)
            pending = next(arrivals, None)
        return pending

    def add(self, r: Request, release: Callable[[], None] | None = None) -> None:
        """The request to the scheduler: one sequence, or n > 1 children as vLLM's engine fans a request out
        (`samples`: added one after another, the prefix cache sharing the prompt). `release` (the guard's hold)
        runs when the request's last sequence finishes."""
        if r.n > 1 and not r.beam_search and self.sched.no_samples:
            raise KVBudgetError(f"request {r.id or self.requests}: n={r.n}: {self.sched.no_samples}; give n 1",
                                param="trace")
        if r.beam_search:
            if not self.sched.beam_search:
                raise KVBudgetError(f"request {r.id or self.requests}: beam search is simulated as vLLM's API layer "
                                    f"runs it, not on {self.setup.engine} ({self.setup.allocator})", param="trace")
            if r.prompt_tokens + r.output_tokens > self.setup.max_model_len:
                raise KVBudgetError(f"request {r.id or self.requests}: beam search to {r.output_tokens} tokens after a "
                                    f"prompt of {r.prompt_tokens} does not fit max_model_len "
                                    f"{self.setup.max_model_len}; raise max_model_len or filter the trace",
                                    param="trace")
            search = BeamSearch(r, self.requests, release)
            for child in search.requests(self.t):
                self.beams[self.sched.add(child).uid] = search
            return
        if r.n == 1:
            uid = self.sched.add(r).uid
            if release is not None:
                self.releases[uid] = release
            return
        family: list[Any] = [r.n, math.inf, 0.0, release]  # children left, first token, last finish, release
        for child in samples(r, self.requests):
            self.families[self.sched.add(child).uid] = family

    def loop(self, arrivals: Iterator[Request]) -> None:
        pending = next(arrivals, None)
        turns = CHECK_EVERY
        while True:
            turns -= 1
            if not turns:
                self.check()
                turns = CHECK_EVERY
            pending = self.admit(arrivals, pending)
            self.sched.clock = self.t
            if not self.sched.has_work():
                if pending is None:
                    return
                self.t = max(self.t, self.due(pending))
                continue
            self.turn(self.due(pending))

    def advance(self, until: float) -> None:
        """Steps while there is work and the clock is before `until` (a fleet's next arrival): the last step may
        end past it, as a real step would; an idle engine's clock waits where it is."""
        while self.t < until and self.sched.has_work():
            self.step(until)
        self.sched.clock = self.t

    def finishes_by(self, until: float) -> float:
        """`advance` as far as needed for every request that finishes by `until` to have finished (what a router
        counting requests in flight reads), leaving whole a run of decode steps in which none can; the time
        before which no request can finish from there (while none is added)."""
        quiet = self.t
        while self.t < until and self.sched.has_work():
            quiet = self.no_finish_before()
            if quiet > until:
                break
            self.step(until)
            quiet = self.t  # (what finished by then has)
        self.sched.clock = self.t
        return quiet if self.sched.has_work() else math.inf

    def no_finish_before(self) -> float:
        """A time before which no request here can finish while none is added (a fleet's router counting what is
        in flight need not advance this replica to an earlier instant): the end of the run of pure decode steps
        ahead, bounded from below by its first step's time, which the later ones cannot undercut (the context
        only grows and no part of the step time is negative); the clock itself where nothing is known."""
        sched, tm = self.sched, self.tm
        if not sched.has_work():
            return math.inf
        if not self.fast or min(tm.per_context, tm.context_cost) < 0.0 or sched.next_ready() is not None:
            return self.t
        k = sched.decode_run_limit()  # steps certain to be pure decode: only the last may finish a request
        if not k:
            return self.t
        r = len(sched.running)
        first = tm.step_seconds(r, sched.context_tokens(), None, r)
        end = self.t + k * first
        return self.t + k * first * (1.0 - 1e-12) - k * math.ulp(2.0 * end)  # (below k additions' rounding)

    def step(self, until: float) -> None:
        """One turn of the clock with work to do, `until` the next event outside (a fleet's), `check` counted."""
        self.sched.clock = self.t
        self.turns -= 1
        if not self.turns:
            self.check()
            self.turns = CHECK_EVERY
        self.turn(until)

    def offer(self, r: Request, release: Callable[[], None] | None = None) -> None:
        """One request routed here by a fleet (the clock at its arrival); `release`: the front door's hold on it."""
        self.t = max(self.t, r.arrival)
        self.admit(iter(()), r, release)

    def turn(self, arrival: float) -> None:
        """One turn of the clock with work to do: a run of decode steps, one step, or a wait for a load; `arrival`
        is when the next request reaches the engine (the fast path stops at it)."""
        sched = self.sched
        k = sched.decode_run_limit() if self.fast else 0
        ready = sched.next_ready()
        if k:
            self.decode_run(sched, k, min(arrival, math.inf if ready is None else ready))
            return
        step = self.scheduled(arrival)
        if step is not None:
            self.account(step, self.seconds(step))

    def scheduled(self, arrival: float) -> Step | None:
        """The scheduler's next step; None where nothing runs until a load is done (the clock moved to its end, or
        to `arrival` if sooner)."""
        sched = self.sched
        step = sched.schedule()
        if not step.tokens and not step.failed and (ready := sched.next_ready()) is not None and ready > self.t:
            self.t = max(self.t, min(ready, arrival))
            return None
        if not step.tokens and not step.failed:
            head = sched.waiting[0].request
            raise KVBudgetError(f"request {head.id or self.requests}: a prompt of {head.prompt_tokens} tokens "
                                f"can never be scheduled (max_num_batched_tokens "
                                f"{self.setup.max_num_batched_tokens}, allocator {self.setup.allocator}); "
                                "raise max_num_batched_tokens or filter the trace", param="trace")
        return step

    def seconds(self, step: Step, tokens: int | None = None) -> float:
        """How long `step` takes (`tokens`: the tokens it is run as, where more than its own: a padded batch)."""
        tm = self.tm
        dt = max(tm.step_seconds(step.tokens if tokens is None else tokens, step.context, step.pairs or step.context,
                                 len(step.scheduled) + step.drafted), step.overlapped_load) + step.load_seconds
        return dt + self.setup.drafting.seconds(step) if self.setup.drafting is not None else dt

    def account(self, step: Step, dt: float) -> None:
        """`step`, taking `dt` seconds, on the clock and in the running totals; its finished requests answered."""
        sched = self.sched
        slots = self.slot_time
        for i, held in enumerate(sched.memory()):
            if held:
                slots[i] += held * dt
        self.after_step(dt, step.tokens, step.usage)
        self.finish(sched.update(step, self.t))
        if step.failed:
            self.fail(sched.failed[-step.failed:])

    def decode_run(self, sched: Queues, k: int, arrival: float) -> None:
        """Up to k pure decode steps, stopping after the one that ends at or past the next arrival. The clock
        and the running totals advance step by step, as `after_step` would, without a call per step
        (simulation/decoding.py)."""
        r = len(sched.running)
        done, self.t = decoding.take(self, sched, k, arrival)
        self.steps += done
        self.fast_steps += done
        self.peak_running = max(self.peak_running, r)
        self.peak_waiting = max(self.peak_waiting, len(sched.waiting))
        self.finish(sched.decode_run(done, self.t))

    def after_step(self, dt: float, tokens: int, usage: float) -> None:
        self.t += dt
        self.steps += 1
        self.usage_time += usage * dt
        if usage > self.peak_usage:
            self.peak_usage = usage
        running, waiting = len(self.sched.running), len(self.sched.waiting)
        if running > self.peak_running:
            self.peak_running = running
        if waiting > self.peak_waiting:
            self.peak_waiting = waiting
        if self.t >= self.next_sample:
            self.next_sample = self.sampled(self.t, usage, running, waiting)
        if self.on_step is not None:
            self.on_step(self.t, tokens, usage, running, waiting)

    def sampled(self, t: float, usage: float, running: int, waiting: int) -> float:
        """A step ending at `t` reached the timeline's next instant or the next scrape: the state it left recorded
        where it did; the next instant of either."""
        if t >= self.next_line:
            self.timeline.append(Sample(t, usage, running, waiting))
            self.next_line = (math.floor(t / self.interval) + 1) * self.interval
        if t >= self.next_scrape:
            kept = self.scrapes
            kept.append((t, usage, running, waiting))  # (a Sample once read: most never are)
            while len(kept) > 1 and kept[1][0] <= self.read_at:  # (a later one read by then: never shown again)
                kept.popleft()
            self.next_scrape = (math.floor(t / self.scrape) + 1) * self.scrape
        return min(self.next_line, self.next_scrape)

    def _beam_finished(self, search: BeamSearch, now: float) -> None:
        """An engine request of a beam search finished: the next round goes in now; after the last round the
        request is answered (beam search is not streamed: its first token arrives with the whole answer)."""
        following = search.finished_one(now)
        if following is None:
            r = search.request
            e2e = now - r.arrival + self.tm.outside_seconds(r.prompt_tokens)
            assert search.first_round_end is not None
            tpot = (now - search.first_round_end) / (r.output_tokens - 1) if r.output_tokens > 1 else None
            self.ttft.append(e2e)
            self.e2e.append(e2e)
            self.finished_at.append(now)
            if tpot is not None:
                self.tpot.append(tpot)
            self.completed += 1
            self.free_client(now)
            if self.on_finish is not None:
                self.on_finish(r, e2e, tpot, e2e)
            if search.release is not None:
                search.release()
            return
        for child in following:
            self.beams[self.sched.add(child).uid] = search

    def fail(self, failed: list[Seq]) -> None:
        """Requests the engine answered with an error: they end without completing."""
        for q in failed:
            if self.releases:
                self.releases.pop(q.uid, lambda: None)()
            self.output_tokens += q.out
            if q.uid not in self.families:  # (a failed sample leaves its request unanswered)
                self.free_client(self.t)

    def finish(self, done: list[Seq]) -> None:
        for q in done:
            if self.releases:
                self.releases.pop(q.uid, lambda: None)()
            assert q.first_token is not None and q.finished is not None
            self.output_tokens += q.out
            if q.preemptions:
                self.preempted_requests += 1
                self.recomputed += q.recomputed
            search = self.beams.pop(q.uid, None) if self.beams else None
            if search is not None:
                self._beam_finished(search, q.finished)
                continue
            arrival = q.request.arrival - self.tm.outside_seconds(q.request.prompt_tokens)  # (see TimeModel)
            tpot = (q.finished - q.first_token) / (q.out - 1) if q.out > 1 else None
            if tpot is not None:
                self.tpot.append(tpot)
            if self.on_finish is not None:
                self.on_finish(q.request, q.first_token - arrival, tpot, q.finished - arrival)
            family = self.families.pop(q.uid, None) if self.families else None
            if family is None:
                self.ttft.append(q.first_token - arrival)
                self.e2e.append(q.finished - arrival)
                self.finished_at.append(q.finished)
                self.completed += 1
                self.free_client(q.finished)
            else:  # one of n samples: the request's first token is its first child's, its end its last child's
                family[0] -= 1
                family[1] = min(family[1], q.first_token)
                family[2] = max(family[2], q.finished)
                if not family[0]:
                    self.ttft.append(family[1] - arrival)
                    self.e2e.append(family[2] - arrival)
                    self.finished_at.append(family[2])
                    self.completed += 1
                    self.free_client(family[2])
                    if family[3] is not None:
                        family[3]()

    def result(self) -> Simulation:
        sched = self.sched
        duration = self.t
        notes = []
        if self.setup.time_model.basis == "roofline estimate":
            notes.append("times are estimates: a roofline over the GPU's datasheet peaks with assumed efficiencies "
                         f"(calibrate with measured steps); {self.setup.scheduling}")
        else:
            basis = self.setup.time_model.basis
            notes.append(f"times rest on {'a time model ' if basis.startswith('calibrated') else ''}{basis}: an "
                         f"estimate whose error the accuracy page of the docs states; {self.setup.scheduling}")

        def per_s(amount: float) -> float:  # over the run's duration
            return amount / duration if duration else 0.0

        return Simulation(
            setup=self.setup, requests=self.requests, completed=self.completed, duration_s=duration, steps=self.steps,
            ttft=Percentiles.of(self.ttft), tpot=Percentiles.of(self.tpot), e2e=Percentiles.of(self.e2e),
            requests_per_s=per_s(self.completed), output_tokens_per_s=per_s(self.output_tokens),
            prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens, preemptions=sched.preemptions,
            preempted_requests=self.preempted_requests, recomputed_tokens=self.recomputed,
            prefix_hit_tokens=sched.hit_tokens, prefix_queried_tokens=sched.queried_tokens,
            peak_usage=self.peak_usage, mean_usage=per_s(self.usage_time), peak_running=self.peak_running,
            peak_waiting=self.peak_waiting, memory=self._shares(duration), timeline=tuple(self.timeline),
            fast_steps=self.fast_steps, notes=tuple(notes), ttft_sorted=tuple(sorted(self.ttft)),
            e2e_sorted=tuple(sorted(self.e2e)), tpot_sorted=tuple(sorted(self.tpot)),
            guard=self.guard.report() if self.guard else None, failed=len(sched.failed),
            latency_timeline=latency_windows(self.finished_at, self.ttft, self.e2e, duration),
            offload=sched.offload_totals(), clients=self.client_count, speculation=sched.spec_totals())

    def _shares(self, duration: float) -> MemoryShares:
        if not duration:
            return MemoryShares(0.0, 0.0, 0.0, 1.0)
        slots = self.setup.token_slots
        states, reserve, internal = (x / duration / slots for x in self.slot_time)
        return MemoryShares(states, reserve, internal, 1.0 - states - reserve - internal)
