"""The fleet's front door: an admission policy (simulation/guarded.py's, deciding on the fleet's gauges) and the
Gateway API Inference Extension's flow control, a queue at the gateway.

Flow control as GIE v1.5.0 runs it (pkg/epp/flowcontrol/): a request that finds the pool saturated, or others
already waiting, joins a first-come-first-served queue; the queue sends its head whenever the pool is not
saturated, the saturation read as the utilization detector does (pkg/epp/framework/plugins/flowcontrol/
saturationdetector/utilization: the mean over the serving replicas of max(waiting / 5, KV usage / 0.8), saturated
at 1) from gauges refreshed every 50 ms. A request that finds the queue full is refused with 429
(QueueOutcomeRejectedCapacity -> ResourceExhausted, pkg/epp/requestcontrol/admission.go and
pkg/common/error/error.go); one that waits past its time-to-live is evicted with 503 (QueueOutcomeEvictedTTL ->
ServiceUnavailable). GIE bounds the queue by bytes and requests (MaxBytes, MaxRequests: none by default but a 1 GB
band) and applies no TTL unless one is configured (DefaultRequestTTL); here both are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbudget import validate
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.percentiles import Percentiles

GIE_QUEUE_THRESHOLD = 5  # the utilization detector's DefaultQueueDepthThreshold
GIE_KV_THRESHOLD = 0.8  # ... and its DefaultKVCacheUtilThreshold
GIE_REFRESH_S = 0.05  # the endpoints' metrics refresh the detector reads
MAX_QUEUE = 1_000_000  # requests held at the gateway: a queue past that is a misconfiguration, not a buffer


@dataclass(frozen=True, kw_only=True)
class FlowControl:
    """A queue at the fleet's front: at most `max_requests` held, each for at most `ttl` seconds (None: until sent)."""

    max_requests: int
    ttl: float | None = None
    refresh: float = GIE_REFRESH_S  # seconds between the dispatcher's reads of the gauges

    def check(self) -> FlowControl:
        validate.count(self.max_requests, "flow_control", 1, MAX_QUEUE, given=f"max={self.max_requests!r}")
        if self.ttl is not None:
            validate.number(self.ttl, "flow_control", 0.0, validate.MAX_SECONDS, given=f"ttl={self.ttl!r}")
        validate.number(self.refresh, "flow_control", 0.0, validate.MAX_SECONDS, given=f"refresh={self.refresh!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"max_requests": self.max_requests, "ttl_s": self.ttl, "refresh_s": self.refresh}


def parse_flow_control(text: str) -> FlowControl:
    """`max=N[,ttl=SECONDS][,refresh=SECONDS]` (seconds as `30` or `30s`), e.g. `max=100,ttl=30s`."""
    values: dict[str, Any] = {}
    for item in (a for a in text.split(",") if a.strip()):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in ("max", "ttl", "refresh") or key in values:
            raise KVBudgetError(f"flow_control {validate.shown(text)}: write max=N[,ttl=SECONDS][,refresh=SECONDS] "
                                "(e.g. max=100,ttl=30s), each key once", param="flow_control")
        raw = value[:-1] if key != "max" and value.endswith("s") else value
        try:
            values[key] = int(raw) if key == "max" else float(raw)
        except ValueError:
            raise KVBudgetError(f"flow_control {validate.shown(text)}: {key}={validate.shown(value)} is not "
                                f"{'a whole number' if key == 'max' else 'a number of seconds'}",
                                param="flow_control") from None
    if "max" not in values:
        raise KVBudgetError(f"flow_control {validate.shown(text)}: give the queue's bound, max=N (e.g. "
                            "max=100,ttl=30s)", param="flow_control")
    return FlowControl(max_requests=values["max"], ttl=values.get("ttl"),
                       refresh=values.get("refresh", GIE_REFRESH_S)).check()


def saturation(gauges: list[tuple[float, int]]) -> float:
    """GIE's utilization detector over the serving replicas' (KV usage, waiting): 1 or more is saturated; no
    replica serving is saturated."""
    if not gauges:
        return float("inf")
    return sum(max(w / GIE_QUEUE_THRESHOLD, u / GIE_KV_THRESHOLD) for u, w in gauges) / len(gauges)


@dataclass(frozen=True, kw_only=True)
class FrontReport:
    """What the fleet's front door did: requests refused by reason (and the HTTP status each gets), and the time
    those the queue held waited there."""

    admission: str | None  # the admission policy, if one decided
    flow_control: FlowControl | None
    refused: dict[str, int]  # reason -> requests: admission (the policy's own answer), queue-full (429), ttl (503)
    held: int  # requests that waited in the queue and were sent on
    wait: Percentiles | None  # their time in the queue (seconds); latencies at the replicas count from the send
    peak_queue: int

    def status(self, reason: str) -> int:
        """The HTTP status a refusal gets: 429 for a full queue and GIE's shedding or a concurrency limit
        (ResourceExhausted), 503 for a time-to-live past and kvbudget's guard."""
        if reason == "admission":
            return 503 if self.admission == "kvbudget" else 429
        return 429 if reason == "queue-full" else 503

    def to_dict(self) -> dict[str, Any]:
        return {"admission": self.admission,
                "flow_control": self.flow_control.to_dict() if self.flow_control else None,
                "refused": dict(self.refused), "status": {k: self.status(k) for k in self.refused},
                "held": self.held, "wait_s": self.wait.__dict__ if self.wait else None, "peak_queue": self.peak_queue}
