"""The fleet's front door: an admission policy (simulation/guarded.py's, deciding on the fleet's gauges) and the
llm-d router's flow control, a queue at the gateway.

Flow control as llm-d-router v0.10.0 runs it (github.com/llm-d/llm-d-router, the Endpoint Picker that left the
Gateway API Inference Extension; on with `featureGates: [flowControl]`, cmd/epp/runner/runner.go): a request that
finds the pool saturated, or others already waiting, joins a first-come-first-served queue (pkg/epp/flowcontrol/:
fcfs ordering, global-strict fairness); the queue sends its head whenever the pool is not saturated, the
saturation read as the utilization detector does (pkg/epp/framework/plugins/flowcontrol/saturationdetector/
utilization: the mean over the serving replicas of max(waiting / 5, KV usage / 0.8), saturated at 1, the default
static usage limit 1.0) from gauges refreshed every 50 ms. v0.10 bounds the queue by default (#2123): 5,000 requests
a priority band (pkg/epp/flowcontrol/registry/config.go defaultPriorityBandMaxRequests; 1 GB of bodies, not
modelled) and 60 s of wait (controller/config.go defaultRequestTTL; `defaultRequestTTL: 0s` turns it off). A
request that finds the queue full is refused with 429 (QueueOutcomeRejectedCapacity -> ResourceExhausted,
pkg/epp/requestcontrol/admission.go, pkg/common/error/error.go); one that waits past its time-to-live is evicted
with 429 while the pool has endpoints (#2047; 503, ServiceUnavailable, in GIE v1.5 and llm-d-router v0.9) and 503
when it has none. Every request has priority 0 here (one band).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvbudget import validate
from kvbudget.choices import Admission
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.setup import Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.guarded import Gatekeeper, admission_policy, refusal_status
from kvbudget.simulation.percentiles import Percentiles

GIE_QUEUE_THRESHOLD = 5  # the utilization detector's DefaultQueueDepthThreshold
GIE_KV_THRESHOLD = 0.8  # ... and its DefaultKVCacheUtilThreshold
GIE_REFRESH_S = 0.05  # the endpoints' metrics refresh the detector reads
MAX_QUEUE = 1_000_000  # requests held at the gateway: a queue past that is a misconfiguration, not a buffer
LLMD_MAX_REQUESTS = 5000  # llm-d-router v0.10's bound on a priority band's queue (defaultPriorityBandMaxRequests)
LLMD_TTL_S = 60.0  # ... and on a request's wait in it (defaultRequestTTL)


@dataclass(frozen=True, kw_only=True)
class FlowControl:
    """A queue at the fleet's front: at most `max_requests` held, each for at most `ttl` seconds (None: until sent);
    llm-d-router v0.10's defaults."""

    max_requests: int = LLMD_MAX_REQUESTS
    ttl: float | None = LLMD_TTL_S
    refresh: float = GIE_REFRESH_S  # seconds between the dispatcher's reads of the gauges

    def check(self) -> FlowControl:
        validate.count(self.max_requests, "flow_control", 1, MAX_QUEUE, given=f"max={self.max_requests!r}")
        if self.ttl is not None:
            validate.number(self.ttl, "flow_control", 0.0, validate.MAX_SECONDS, above=False,
                            given=f"ttl={self.ttl!r}")
        validate.number(self.refresh, "flow_control", 0.0, validate.MAX_SECONDS, given=f"refresh={self.refresh!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"max_requests": self.max_requests, "ttl_s": self.ttl, "refresh_s": self.refresh}


def parse_flow_control(text: str) -> FlowControl:
    """`[max=N][,ttl=SECONDS][,refresh=SECONDS]` (seconds as `30` or `30s`), e.g. `max=100,ttl=30s`; what is left
    out takes llm-d-router v0.10's default (5,000 requests, 60 s), `ttl=0` holds a request until it is sent."""
    values: dict[str, Any] = {}
    items = [a for a in text.split(",") if a.strip()]
    for item in items:
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in ("max", "ttl", "refresh") or key in values:
            raise KVBudgetError(f"flow_control {validate.shown(text)}: write [max=N][,ttl=SECONDS][,refresh=SECONDS] "
                                "(e.g. max=100,ttl=30s), each key once", param="flow_control")
        raw = value[:-1] if key != "max" and value.endswith("s") else value
        try:
            values[key] = int(raw) if key == "max" else float(raw)
        except ValueError:
            raise KVBudgetError(f"flow_control {validate.shown(text)}: {key}={validate.shown(value)} is not "
                                f"{'a whole number' if key == 'max' else 'a number of seconds'}",
                                param="flow_control") from None
    if not items:
        raise KVBudgetError(f"flow_control {validate.shown(text)}: give max=N, ttl=SECONDS or both (e.g. "
                            "max=100,ttl=30s); --admission llm-d alone takes llm-d-router v0.10's max=5000,ttl=60s",
                            param="flow_control")
    ttl = values.get("ttl", LLMD_TTL_S)
    return FlowControl(max_requests=values.get("max", LLMD_MAX_REQUESTS), ttl=None if ttl == 0 else ttl,
                       refresh=values.get("refresh", GIE_REFRESH_S)).check()


def saturation(gauges: Sequence[tuple[float, int]]) -> float:
    """GIE's utilization detector over the serving replicas' (KV usage, waiting): 1 or more is saturated; no
    replica serving is saturated."""
    if not gauges:
        return float("inf")
    return sum(max(w / GIE_QUEUE_THRESHOLD, u / GIE_KV_THRESHOLD) for u, w in gauges) / len(gauges)


@dataclass(frozen=True, kw_only=True)
class FrontReport:
    """What the fleet's front door did: requests refused by reason (and the HTTP status each gets), and the time
    those the queue held waited there."""

    admission: str | None  # the admission policy, if one decided (llm-d: the flow control alone)
    flow_control: FlowControl | None
    # reason -> requests: admission (the policy's own answer), queue-full (429), ttl (429), ttl-no-endpoints (503),
    # and an engine's own limits by name (vLLM's max_num_queued_reqs, max_num_queued_tokens: 503)
    refused: dict[str, int]
    held: int  # requests that waited in the queue and were sent on
    wait: Percentiles | None  # their time in the queue (seconds); latencies at the replicas count from the send
    peak_queue: int

    def status(self, reason: str) -> int:
        """The HTTP status a refusal gets: 429 for a full queue, a time-to-live past while the pool has endpoints
        and llm-d's shedding or a concurrency limit (ResourceExhausted), 503 where no endpoint serves, for
        kvbudget's guard and for vLLM's own limits."""
        if reason == "admission":
            return refusal_status(self.admission or "")
        return 429 if reason in ("queue-full", "ttl") else 503

    def to_dict(self) -> dict[str, Any]:
        return {"admission": self.admission,
                "flow_control": self.flow_control.to_dict() if self.flow_control else None,
                "refused": dict(self.refused), "status": {k: self.status(k) for k in self.refused},
                "held": self.held, "wait_s": self.wait.__dict__ if self.wait else None, "peak_queue": self.peak_queue}


Release = Callable[[], None] | None  # an admission policy's hold on a request, run when it is answered
Gauges = Sequence[tuple[float, int]]  # the serving replicas' (KV usage, waiting) as last scraped


class FrontDoor:
    """The admission policy and the queue in front of a fleet: what each arrival meets, and what the queue sends
    on as the pool frees up. `setups` are the fleet's (a policy that predicts against a budget, kvbudget's guard,
    takes their KV memory together)."""

    def __init__(self, admission: str | None, guard_config: Any, setups: Sequence[Setup],
                 flow: FlowControl | str | None, engine_limits: bool = False, poll_interval: float = 1.0) -> None:
        first = setups[0]
        total = sum(s.kv_memory_bytes or 0 for s in setups)
        self.queued = admission == Admission.LLMD  # llm-d-router's flow control: the queue, its defaults unless given
        self.gate: Gatekeeper | None = None if self.queued else admission_policy(
            admission, guard_config, replace(first, kv_memory_bytes=total or first.kv_memory_bytes),
            get_engine(first.engine), poll_interval)
        self.flow = parse_flow_control(flow) if isinstance(flow, str) else flow.check() if flow else \
            FlowControl() if self.queued else None
        self.queue: deque[tuple[Request, Release]] = deque()  # held at the gateway, in arrival order
        self.refused: dict[str, int] = {}
        self.waits = array("d")
        self.peak_queue = 0
        self.engine_limits = engine_limits  # the replicas' engines refuse past their own queue limits
        # how often the gauges this door reads are scraped: the queue's dispatcher, the policy's own scrape
        # (GIE's shedding: its refresh; kvbudget's guard: its poll interval); None: nothing read
        scrapes = (self.flow.refresh if self.flow else None, getattr(self.gate, "refresh", None),
                   getattr(self.gate, "poll_interval", None))
        self.refresh: float | None = min((x for x in scrapes if x), default=None)

    @property
    def active(self) -> bool:
        return self.gate is not None or self.flow is not None or self.engine_limits

    def arrive(self, r: Request, gauges: Gauges) -> tuple[Request, Release] | None:
        """A request at `r.arrival`: the one to route now (as the policy forwards it) and its hold, or None (held
        in the queue, or refused)."""
        now = r.arrival
        release: Release = None
        if self.gate is not None:  # the policy reads the serving replicas' mean gauges
            n = max(len(gauges), 1)
            self.gate.observe(now, sum(u for u, _ in gauges) / n, math.ceil(sum(w for _, w in gauges) / n))
            admitted = self.gate.admit(r, now)
            if admitted is None:
                self._refuse("admission")
                return None
            r, release = admitted
        if self.flow is None or not (self.queue or saturation(gauges) >= 1.0):
            return r, release
        if len(self.queue) >= self.flow.max_requests:
            self._refuse("queue-full")
            if release is not None:
                release()
            return None
        self.queue.append((r, release))
        self.peak_queue = max(self.peak_queue, len(self.queue))
        return None

    def next_tick(self, now: float) -> float:
        """The dispatcher's next read of the gauges after `now`, while the queue holds requests."""
        if not self.queue or self.flow is None:
            return math.inf
        step = self.flow.refresh
        t = (math.floor(now / step) + 1) * step
        return t if t > now else t + step

    def dispatch(self, now: float, gauges: Callable[[], Gauges], send: Callable[[Request, Release], None]) -> None:
        """The queue at `now`: requests past their time-to-live evicted (503), then the head sent on (`send`, the
        request arriving at the replica now) while the pool is not saturated, `gauges()` read after each send."""
        flow = self.flow
        assert flow is not None
        if flow.ttl:  # (0 or None: none)
            while self.queue and now >= self.queue[0][0].arrival + flow.ttl:  # (in arrival order: the oldest first)
                _, release = self.queue.popleft()
                self._refuse("ttl" if gauges() else "ttl-no-endpoints")
                if release is not None:
                    release()
        while self.queue and saturation(gauges()) < 1.0:
            r, release = self.queue.popleft()
            self.waits.append(now - r.arrival)
            send(replace(r, arrival=now), release)

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def refuse(self, reason: str, release: Release) -> None:
        """A request a replica's engine refused (its limit's name as the reason), its hold released."""
        self._refuse(reason)
        if release is not None:
            release()

    def report(self) -> FrontReport | None:
        if not self.active:
            return None
        policy = str(Admission.LLMD) if self.queued else self.gate.report().policy if self.gate else None
        return FrontReport(admission=policy, flow_control=self.flow,
                           refused=dict(self.refused), held=len(self.waits), wait=Percentiles.of(self.waits),
                           peak_queue=self.peak_queue)
