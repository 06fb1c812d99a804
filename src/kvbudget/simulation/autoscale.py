"""Autoscaling a fleet in the loop: a policy reads the replicas' gauges every `interval` seconds and asks for a
replica count; new replicas take requests once their cold start is over, removed ones drain.

The policies, each as its source does it:

- `kv` and `queue`: the Kubernetes Horizontal Pod Autoscaler on a per-replica metric (the KV usage gauge, or the
  requests waiting: the engines' queues and the gateway's): desired = ceil(sum of the metric over the ready
  replicas / target), replicas still starting counting as 0 (the HPA's rule for pods not yet ready on a scale-up),
  no change within a tolerance of 0.1 of the target, out by at most 4 replicas or 100% a decision (the HPA's
  default scale-up policies, per its 15 s sync period), and a scale-in only to the highest count asked for over
  the last `window` seconds (the HPA's downscale stabilization, 300 s by default).
- `llm-d`: llm-d's workload variant autoscaler, its token-based saturation analyzer (V2,
  internal/engines/analyzers/saturation_v2/analyzer.go): a replica supplies 0.8 (KvCacheThreshold) of its KV token
  capacity; demand is the tokens in use plus, for each waiting request, its prompt and output tokens (there: the
  averages), plus what the gateway holds; scale out when demand exceeds 0.85 (ScaleUpThreshold) of the supply
  counting the replicas still starting (requiredCapacity = demand / 0.85 - anticipated supply, in replicas rounded
  up), in by one when supply - demand / 0.70 (ScaleDownBoundary) leaves a whole replica spare and none is
  starting; every 60 s (GLOBAL_OPT_INTERVAL). Its compute-bound capacity (k2) is not modelled.
- `dynamo`: NVIDIA Dynamo's load-based planner (components/planner/src/dynamo/planner/defaults.py,
  LoadPlannerDefaults): the KV load averaged over samples every 10 s (metric_pulling_interval), one worker more
  above 0.9 (decode_kv_scale_up_threshold), one fewer below 0.5 (decode_kv_scale_down_threshold), every 180 s
  (adjustment_interval). Scaling a pool of prefill workers it reads their queue instead (the older planner that
  read one, examples/llm/components/planner.py at e3f4bfef): the requests waiting there and at the gateway,
  sampled every 10 s, one worker more above a mean of 5 when the last sample plus 3 times the interval's trend is
  still above 5, one fewer below 0.2. The grace period it gives a new decode worker, and the 0.02 of KV load it
  adds for each waiting request, are not modelled here.

A replica's cold start is its weights (bytes per GPU) over `load_bandwidth`, plus `startup` (engine init,
torch.compile and CUDA graph capture). Neither default is measured here: `DEFAULT_LOAD_BANDWIDTH` is a 25 Gbit/s
network link at line rate (weights from a model cache volume), `DEFAULT_STARTUP_S` an estimate; give your own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.choices import Choice
from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.simulation.routing import Pool

DEFAULT_LOAD_BANDWIDTH = 25e9 / 8  # bytes/s: a 25 Gbit/s link at line rate (weights pulled from a model cache)
DEFAULT_STARTUP_S = 60.0  # estimate: engine init, torch.compile, CUDA graph capture after the weights are loaded
MAX_LOAD_BANDWIDTH = 1e12  # bytes/s: 1 TB/s, past any disk or network a replica loads its weights over
HPA_TOLERANCE = 0.1  # kube-controller-manager --horizontal-pod-autoscaler-tolerance
HPA_UP_PODS = 4  # the HPA's default behavior.scaleUp: 4 pods or 100% per 15 s, whichever adds more
DYNAMO_SAMPLE_S = 10.0  # Dynamo's load planner: metric_pulling_interval
# ... and its rule for prefill workers (examples/llm/components/planner.py at e3f4bfef, LoadPlannerDefaults): one
# more above a mean prefill queue of 5 (prefill_queue_scale_up_threshold) when the queue, its trend over the
# interval carried 3 intervals on (NEW_PREFILL_WORKER_QUEUE_BUFFER_PERIOD), is still above it; one fewer below 0.2
DYNAMO_PREFILL_UP, DYNAMO_PREFILL_DOWN, DYNAMO_PREFILL_TREND = 5.0, 0.2, 3
MAX_DECISIONS = 100_000  # decisions kept in the report (a day at one a second); the count over time is all kept


class Signal(Choice):
    """What the autoscaler reads (see the module's docstring)."""

    KV = "kv"
    QUEUE = "queue"
    LLMD = "llm-d"
    DYNAMO = "dynamo"


# each signal's defaults: interval, target (kv, queue: per replica; llm-d: its KvCacheThreshold), up, down, window
_DEFAULTS: dict[Signal, dict[str, float]] = {
    Signal.KV: {"interval": 15.0, "target": 0.8, "window": 300.0},
    Signal.QUEUE: {"interval": 15.0, "target": 5.0, "window": 300.0},
    Signal.LLMD: {"interval": 60.0, "target": 0.8, "up": 0.85, "down": 0.70},
    Signal.DYNAMO: {"interval": 180.0, "up": 0.9, "down": 0.5},
}
_KEYS = {"min", "max", "interval", "startup", "pool"}  # every policy's; and each signal's own:
_OWN = {Signal.KV: {"target", "window"}, Signal.QUEUE: {"target", "window"}, Signal.LLMD: {"target", "up", "down"},
        Signal.DYNAMO: {"up", "down"}}


@dataclass(frozen=True, kw_only=True)
class Autoscale:
    """A fleet's autoscaler: `signal` read every `interval` seconds, from `min_replicas` to `max_replicas` (those
    starting and serving; draining ones apart). None takes the signal's default (see `_DEFAULTS`)."""

    signal: Signal = Signal.KV
    min_replicas: int = 1
    max_replicas: int = 8
    interval: float | None = None
    target: float | None = None  # kv: usage 0..1 per replica; queue: waiting requests per replica; llm-d: KV share
    up: float | None = None  # llm-d: utilization that scales out; dynamo: KV load that adds a worker
    down: float | None = None  # llm-d: utilization boundary for a scale-in; dynamo: KV load that removes one
    window: float | None = None  # kv, queue: seconds of downscale stabilization
    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH  # bytes/s a new replica loads its weights at
    startup: float = DEFAULT_STARTUP_S  # seconds of start-up beside the weights' load
    pool: str | None = None  # the pool it scales (None: the fleet's only one); the other pools stay as they are

    def resolved(self, most: int = validate.MAX_COUNT) -> Autoscale:
        """The policy with its signal's defaults filled in, checked (one line naming what is wrong; `most`: the
        replicas a fleet may have)."""
        signal = Signal.parse(str(self.signal), "autoscale") if not isinstance(self.signal, Signal) else self.signal
        given = {k: getattr(self, k) for k in ("interval", "target", "up", "down", "window")}
        for key, value in given.items():
            if value is not None and key != "interval" and key not in _OWN[signal]:
                raise KVBudgetError(f"autoscale {signal}: takes no {key} (it takes "
                                    f"{', '.join(sorted(_KEYS | _OWN[signal]))})", param="autoscale")
        filled: dict[str, Any] = {k: v if v is not None else _DEFAULTS[signal].get(k) for k, v in given.items()}
        out = replace(self, signal=signal, **filled)
        out.check(most)
        return out

    def check(self, most: int = validate.MAX_COUNT) -> None:
        """One line naming what is wrong; `most`: the replicas a fleet may have."""
        lo = validate.count(self.min_replicas, "autoscale", 1, most, given=f"min={self.min_replicas!r}")
        validate.count(self.max_replicas, "autoscale", lo, most, given=f"max={self.max_replicas!r}")
        validate.number(self.interval, "autoscale", 0.0, validate.MAX_SECONDS, given=f"interval={self.interval!r}")
        if self.target is not None:
            top = 1.0 if self.signal in (Signal.KV, Signal.LLMD) else float(validate.MAX_COUNT)
            validate.number(self.target, "autoscale", 0.0, top, given=f"target={self.target!r}")
        for key in ("up", "down"):
            value = getattr(self, key)
            if value is not None:
                validate.number(value, "autoscale", 0.0, 1.0, given=f"{key}={value!r}")
        if self.up is not None and self.down is not None and not self.down < self.up:
            raise KVBudgetError(f"autoscale {self.signal}: down={self.down:g} must be below up={self.up:g}",
                                param="autoscale")
        if self.window is not None:
            validate.number(self.window, "autoscale", 0.0, validate.MAX_SECONDS, above=False,
                            given=f"window={self.window!r}")
        validate.number(self.load_bandwidth, "load_bandwidth", 0.0, MAX_LOAD_BANDWIDTH)
        validate.number(self.startup, "autoscale", 0.0, validate.MAX_SECONDS, above=False,
                        given=f"startup={self.startup!r}")

    def cold_start(self, weight_bytes: int) -> float:
        """Seconds from the decision to a replica taking requests: its weights loaded, then its start-up."""
        return weight_bytes / self.load_bandwidth + self.startup

    def to_dict(self) -> dict[str, Any]:
        return {"signal": str(self.signal), "min": self.min_replicas, "max": self.max_replicas,
                "interval_s": self.interval, "target": self.target, "up": self.up, "down": self.down,
                "window_s": self.window, "load_bandwidth": self.load_bandwidth, "startup_s": self.startup,
                "pool": self.pool}


def parse_autoscale(text: str, load_bandwidth: float | None = None, startup: float | None = None,
                    most: int = validate.MAX_COUNT) -> Autoscale:
    """`SIGNAL[:key=value,...]`: kv, queue, llm-d or dynamo; keys min, max, interval and startup (seconds, `30` or
    `30s`), pool (the pool it scales, where the fleet has several) and each signal's own (kv, queue: target, window;
    llm-d: target, up, down; dynamo: up, down). E.g.
    `kv:min=1,max=8,target=0.8,interval=30s`, `queue:max=4,target=5`, `llm-d`, `dynamo:max=4,startup=90s`.
    `load_bandwidth` in bytes/s (`--load-bandwidth` reads GB/s: `read_load_bandwidth`)."""
    name, _, args = text.strip().partition(":")
    try:
        signal = Signal(name.strip())
    except ValueError:
        raise KVBudgetError(f"autoscale {validate.shown(text)}: name one of {', '.join(Signal.values())}, then "
                            ":key=value,... (e.g. kv:min=1,max=8,target=0.8,interval=30s)", param="autoscale") from None
    values: dict[str, Any] = {}
    for item in (a for a in args.split(",") if a.strip()) if args else ():
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in _KEYS | _OWN[signal]:
            raise KVBudgetError(f"autoscale {validate.shown(text)}: {validate.shown(item)} is not key=value with a "
                                f"key of {', '.join(sorted(_KEYS | _OWN[signal]))}", param="autoscale")
        if key in values:
            raise KVBudgetError(f"autoscale {validate.shown(text)}: {key} given twice", param="autoscale")
        values[key] = value if key == "pool" else _number(value, key, text)
    startup = values.pop("startup", DEFAULT_STARTUP_S if startup is None else startup)
    out = Autoscale(signal=signal, min_replicas=values.pop("min", 1), max_replicas=values.pop("max", 8),
                    load_bandwidth=DEFAULT_LOAD_BANDWIDTH if load_bandwidth is None else load_bandwidth,
                    startup=startup, **values)
    return out.resolved(most)


def _number(value: str, key: str, text: str) -> Any:
    """A key's value: min and max whole numbers; the rest numbers, interval and window in seconds (`s` allowed)."""
    raw = value[:-1] if key in ("interval", "window", "startup") and value.endswith("s") else value
    try:
        return int(raw) if key in ("min", "max") else float(raw)
    except ValueError:
        kind = "a whole number" if key in ("min", "max") else "a number"
        raise KVBudgetError(f"autoscale {validate.shown(text)}: {key}={validate.shown(value)} is not {kind}",
                            param="autoscale") from None


def read_load_bandwidth(text: str) -> float:
    """`--load-bandwidth` in GB/s (a number above 0, up to 1,000) -> bytes/s."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    return validate.number(value, "load_bandwidth", 0.0, MAX_LOAD_BANDWIDTH / 1e9, given=text) * 1e9


def fleet_policy(autoscale: Autoscale | str | None, pools: Sequence[Pool], most: int) -> Autoscale | None:
    """The autoscaler checked against the fleet: the pool it scales named (where there are several), its replicas
    within its bounds (`most`: the replicas a fleet may have)."""
    if autoscale is None:
        return None
    policy = parse_autoscale(autoscale, most=most) if isinstance(autoscale, str) else autoscale.resolved(most)
    names = [p.name for p in pools]
    if policy.pool is None and len(pools) > 1:
        raise KVBudgetError(f"autoscale: name the pool it scales, pool=NAME (the fleet has {', '.join(names)})",
                            param="autoscale")
    scaled = pools[names.index(policy.pool)] if policy.pool in names else pools[0] if policy.pool is None else None
    if scaled is None:
        raise KVBudgetError(f"autoscale: pool={validate.shown(policy.pool)} is not one of the fleet's pools "
                            f"({', '.join(names)})", param="autoscale")
    if not policy.min_replicas <= scaled.replicas <= policy.max_replicas:
        raise KVBudgetError(f"autoscale: pool {scaled.name} starts with {scaled.replicas} replicas, outside min "
                            f"{policy.min_replicas} to max {policy.max_replicas}; start within them",
                            param="autoscale")
    if policy.signal is Signal.DYNAMO and scaled.role is Role.PREFILL and \
            (policy.up, policy.down) != (_DEFAULTS[Signal.DYNAMO]["up"], _DEFAULTS[Signal.DYNAMO]["down"]):
        raise KVBudgetError(f"autoscale dynamo: up and down are KV loads of decode workers; pool {scaled.name} is "
                            f"prefill, scaled by its queue (above {DYNAMO_PREFILL_UP:g}, below "
                            f"{DYNAMO_PREFILL_DOWN:g} requests, Dynamo's thresholds): leave them out",
                            param="autoscale")
    total = sum(p.replicas for p in pools) - scaled.replicas + policy.max_replicas
    if total > most:
        raise KVBudgetError(f"autoscale: up to {total:,} replicas in all, over the {most:,} a fleet may have",
                            param="autoscale")
    return replace(policy, pool=scaled.name)


def weight_bytes(model: Any, pool: Pool) -> int:
    """The bytes each GPU of a replica loads at a cold start: the pool's, or the planner's weights per GPU as the
    engine loads them, the model split over the replica's GPUs by tensor parallelism."""
    if pool.weight_bytes is not None:
        return pool.weight_bytes
    from kvbudget.planner import plan
    from kvbudget.simulation.run import NO_GPU_MEMORY

    s = pool.setup
    return plan(model, engine=s.engine, gpu_memory=NO_GPU_MEMORY, tp=pool.gpus, max_model_len=s.max_model_len,
                kv_memory=NO_GPU_MEMORY, recommend=False).weights.per_gpu_bytes


@dataclass(frozen=True)
class Gauge:
    """What the autoscaler reads of one replica serving requests."""

    usage: float  # the KV usage gauge, 0..1
    waiting: int  # requests waiting in its engine
    waiting_tokens: int  # their prompt and output tokens
    capacity_tokens: int  # its KV cache's token slots


@dataclass(frozen=True)
class Decision:
    """One decision: at `time`, from `replicas` (starting and serving) to `desired`, and the signal read (kv: the
    serving replicas' KV usage summed; queue: the requests waiting in them and at the gateway; llm-d: demand over
    supply; dynamo: the mean of its KV load samples)."""

    time: float
    replicas: int
    desired: int
    signal: float

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "replicas": self.replicas, "desired": self.desired, "signal": self.signal}


@dataclass
class Scaler:
    """A policy's state over a run: its recent recommendations (kv, queue), its KV samples (dynamo)."""

    policy: Autoscale
    recent: deque[tuple[float, int]] = field(default_factory=deque)  # (time, recommendation) within the window
    samples: list[float] = field(default_factory=list)  # dynamo: mean KV loads since the last decision
    next_sample: float = 0.0
    prefill: bool = False  # dynamo: it scales prefill workers, by their queue

    def sample(self, now: float, serving: Sequence[Gauge], held: int = 0) -> None:
        """Dynamo's metric pull (every 10 s): the mean KV load of the serving replicas; for prefill workers the
        prefill queue, their requests waiting and the `held` ones at the gateway."""
        if self.policy.signal is Signal.DYNAMO and self.prefill:
            self.samples.append(sum(g.waiting for g in serving) + held)
        elif self.policy.signal is Signal.DYNAMO and serving:
            self.samples.append(sum(g.usage for g in serving) / len(serving))

    def decide(self, now: float, serving: Sequence[Gauge], starting: int, held: int, held_tokens: int) -> Decision:
        """The replica count the policy asks for now; `held` requests (`held_tokens` tokens) wait at the gateway."""
        p = self.policy
        current = len(serving) + starting
        signal, desired = _ask(p, serving, starting, held, held_tokens, self.samples, self.prefill)
        self.samples = []
        if p.signal in (Signal.KV, Signal.QUEUE):
            assert p.window is not None
            self.recent.append((now, desired))
            while self.recent and self.recent[0][0] < now - p.window:
                self.recent.popleft()
            if desired < current:  # scale in only to the highest recommendation over the window
                desired = min(current, max(d for _, d in self.recent))
            # out by at most 4 pods or 100% a period (the HPA's default scaleUp policies, the larger of the two)
            desired = min(desired, current + max(HPA_UP_PODS, current))
        return Decision(now, current, max(p.min_replicas, min(p.max_replicas, desired)), signal)


def _ask(p: Autoscale, serving: Sequence[Gauge], starting: int, held: int, held_tokens: int,
         samples: Sequence[float], prefill: bool = False) -> tuple[float, int]:
    """(the signal as read, the replica count asked for) before the bounds and the stabilization window."""
    current = len(serving) + starting
    if p.signal in (Signal.KV, Signal.QUEUE):
        assert p.target is not None
        total = sum(g.usage for g in serving) if p.signal is Signal.KV else \
            sum(g.waiting for g in serving) + held
        if current and abs(total / (current * p.target) - 1.0) <= HPA_TOLERANCE:
            return total, current
        return total, math.ceil(total / p.target - 1e-9)  # (a ratio a rounding above a whole number is that number)
    if p.signal is Signal.LLMD:
        assert p.target is not None and p.up is not None and p.down is not None
        if not serving:
            return 0.0, current
        per = math.floor(serving[0].capacity_tokens * p.target)  # k1 of one replica
        supply = sum(math.floor(g.capacity_tokens * p.target) for g in serving)
        demand = sum(g.usage * g.capacity_tokens + g.waiting_tokens for g in serving) + held_tokens
        required = demand / p.up - (supply + starting * per)
        if required > 0:
            return demand / supply, current + math.ceil(required / per)
        if not starting and supply - demand / p.down >= per:
            return demand / supply, current - 1
        return demand / supply, current
    assert p.up is not None and p.down is not None
    if not samples:
        return 0.0, current
    load = sum(samples) / len(samples)
    if prefill:
        ahead = samples[-1] + (samples[-1] - samples[0]) * DYNAMO_PREFILL_TREND
        if load < DYNAMO_PREFILL_DOWN:
            return load, current - 1
        return load, current + 1 if load > DYNAMO_PREFILL_UP and ahead > DYNAMO_PREFILL_UP else current
    if load < p.down:
        return load, current - 1
    if load > p.up:
        return load, current + 1
    return load, current


@dataclass(frozen=True, kw_only=True)
class AutoscaleReport:
    """What the autoscaler did: the replica count over time (serving, starting) and each decision."""

    policy: Autoscale
    timeline: tuple[tuple[float, int, int], ...]  # (time, replicas serving, replicas starting) at each change
    decisions: tuple[Decision, ...]  # the first MAX_DECISIONS of them
    started: int  # replicas added during the run
    removed: int  # replicas drained
    cold_start_s: dict[str, float]  # each pool's cold start
    gpu_hours: float  # each replica's GPUs for the time it was up, starting included
    decided: int = 0  # decisions taken in all (those past MAX_DECISIONS counted, not kept)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.to_dict(), "replicas": [{"time": t, "serving": s, "starting": n}
                                                              for t, s, n in self.timeline],
                "decisions": [d.to_dict() for d in self.decisions], "decided": self.decided, "started": self.started,
                "removed": self.removed, "cold_start_s": dict(self.cold_start_s), "gpu_hours": self.gpu_hours}


Span = tuple[float, float, "float | None", float]  # a replica's (asked for, taking requests, drained, given back)


def replica_counts(spans: Sequence[Span]) -> tuple[tuple[float, int, int], ...]:
    """The replica count over time, (time, serving, starting) at each change, from each replica's span."""
    times = sorted({t for start, ready, drained, _ in spans for t in (start, ready, drained) if t is not None})
    out: list[tuple[float, int, int]] = []
    for t in times:
        up = [(start, ready) for start, ready, drained, _ in spans if start <= t and (drained is None or t < drained)]
        counts = (sum(1 for _, ready in up if ready <= t), sum(1 for _, ready in up if t < ready))
        if not out or out[-1][1:] != counts:
            out.append((t, *counts))
    return tuple(out)
