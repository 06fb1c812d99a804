"""The three-level survival switch, as pure functions over replica states and request bodies.

Level 1 (default 70% of the KV budget): log, and cap max_tokens / max_completion_tokens.
Level 2 (85%): also force a single sample (n=1, best_of=1, no beam search).
Level 3 (95%): reject new requests with 503 and Retry-After; admitted requests finish.
A high-priority request is admitted up to `priority_reject`. Levels rise at once and fall only
`hysteresis` below their threshold, so the switch does not flap.
Beside the levels, `max_waiting` (off by default) sheds on the engine's own queue: while a replica's gauge of
waiting requests is at or above it, it takes no new request but a high-priority one (an engine that computes
slower than requests arrive queues them with its KV cache far from full).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from kvbudget.errors import UpstreamConfigError
from kvbudget.levels import HYSTERESIS, LEVELS

_DEFAULT = {level.key: level.threshold for level in LEVELS}


@dataclass(frozen=True, kw_only=True)
class Policy:
    warn: float = _DEFAULT["warn"]
    single: float = _DEFAULT["single"]
    reject: float = _DEFAULT["reject"]
    priority_reject: float = 0.99  # high-priority requests are rejected only above this
    hysteresis: float = HYSTERESIS
    max_tokens_cap: int | None = None  # level >= 1: a fixed cap on max_tokens ...
    max_tokens_fraction: float = 0.5  # ... or this fraction of what the request asked for
    default_max_tokens: int = 1024  # what a request without max_tokens is assumed to ask for
    staleness_s: float = 10.0  # observed usage older than this is not trusted
    fail_open: bool = True  # stale metrics: keep serving on the prediction (True) or reject (False)
    retry_after_s: int = 5
    max_waiting: int | None = None  # requests waiting in the engine's queue at which new ones are refused

    def __post_init__(self) -> None:
        if not 0 < self.warn < self.single < self.reject <= self.priority_reject <= 1:
            raise UpstreamConfigError("guard thresholds must rise: 0 < warn < single < reject <= priority_reject "
                                      "<= 1")
        if not 0 <= self.hysteresis < self.warn:
            raise UpstreamConfigError("guard hysteresis must be >= 0 and below the warn threshold")
        if self.max_waiting is not None and (isinstance(self.max_waiting, bool) or
                                             not isinstance(self.max_waiting, int) or self.max_waiting < 1):
            raise UpstreamConfigError(f"max_waiting: must be a whole number of requests, at least 1 (got "
                                      f"{self.max_waiting!r})", param="max_waiting")

    @property
    def thresholds(self) -> tuple[float, float, float]:
        return self.warn, self.single, self.reject


@dataclass(kw_only=True)
class Replica:
    """What the guard knows about one upstream."""

    url: str
    observed: float | None = None  # the engine's own KV usage, 0..1
    observed_at: float = 0.0  # time.monotonic() of the last successful scrape
    waiting: int | None = None  # requests in the engine's queue at that scrape (None: not read)
    predicted: float = 0.0  # what the requests in flight will hold at the end of their generation, 0..1
    in_flight: int = 0
    healthy: bool = True
    level: int = 0  # with hysteresis
    budget: int | None = None  # KV bytes its pool holds, as the engine states it (None: not read)
    pool: str = ""  # ... where that came from
    exposition: bytes = b""  # the body of the last complete scrape of its /metrics (a sidecar republishes it)
    failures: int = 0  # its answers that failed (5xx, timeouts) in a row, ...
    failed_at: float = 0.0  # ... time.monotonic() of the last, ...
    failure: str = ""  # ... and what it was

    def fresh(self, policy: Policy, now: float) -> bool:
        return self.observed is not None and now - self.observed_at <= policy.staleness_s

    def pressure(self, policy: Policy, now: float) -> float:
        """The larger of observed (when fresh) and predicted usage."""
        observed = self.observed if self.fresh(policy, now) else 0.0
        return max(observed or 0.0, self.predicted)

    def queued(self, policy: Policy, now: float) -> bool:
        """Whether its engine's queue (when freshly read) is at or above `max_waiting`."""
        return (policy.max_waiting is not None and self.waiting is not None and self.waiting >= policy.max_waiting
                and self.fresh(policy, now))

    def settle(self, policy: Policy, now: float) -> float:
        """The pressure now, with the level brought up to date (with hysteresis); returns the pressure."""
        pressure = self.pressure(policy, now)
        self.level = level_for(pressure, self.level, policy)
        return pressure


def level_for(pressure: float, previous: int, policy: Policy) -> int:
    """The level for this pressure: up at once, down only below threshold - hysteresis."""
    up = sum(pressure >= t for t in policy.thresholds)
    if up >= previous:
        return up
    down = sum(pressure >= t - policy.hysteresis for t in policy.thresholds)
    return max(up, min(previous, down))


Action = Literal["forward", "reject"]  # what a decision does, as its log line and metrics name it
FORWARD: Action = "forward"
REJECT: Action = "reject"


@dataclass(frozen=True, kw_only=True)
class Decision:
    action: Action
    level: int
    replica: str | None
    body: dict[str, Any] | None  # the (rewritten) request body to forward
    changes: tuple[str, ...] = ()
    reason: str = ""
    pressure: float = 0.0  # the replica's, before this request
    total: float = 0.0  # ... with this request (as rewritten) counted

    @property
    def forwards(self) -> bool:
        """Whether the request goes on: to `replica`, as `body`."""
        return self.action == FORWARD and self.replica is not None and self.body is not None


def choose_replica(replicas: list[Replica], policy: Policy, now: float) -> tuple[Replica | None, str]:
    """The healthy replica with the most headroom (ties: fewest in flight), one whose queue is not full first."""
    usable = [r for r in replicas if r.healthy]
    if not usable:
        return None, "no healthy upstream"
    fresh = [r for r in usable if r.fresh(policy, now)]
    if not fresh and not policy.fail_open:
        return None, "upstream metrics are stale (fail-closed)"
    pool = fresh or usable  # fail-open: the prediction alone still guards
    best = min(pool, key=lambda r: (r.queued(policy, now), r.pressure(policy, now), r.in_flight))
    return best, "" if fresh else "upstream metrics are stale; acting on predicted usage (fail-open)"


OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens")  # OpenAI's; an engine's own list comes from its rule


def fit_context(body: dict[str, Any], prompts: list[int], context: int, fields: tuple[str, ...],
                exact: bool) -> tuple[dict[str, Any], tuple[str, ...]] | str:
    """The body with each output-limit field (`fields`) cut to what a request's context of `context` tokens leaves
    after its longest prompt, and what changed; or why the prompt alone cannot fit (a string). `exact`: the prompts
    were counted, not estimated from characters; an estimate never refuses and cuts no field below `context` (the
    server counts the prompt itself and stops where the context ends)."""
    longest = max(prompts, default=0)
    if exact and longest >= context:
        return (f"the prompt ({longest:,} tokens) leaves no room in the server's context of {context:,} tokens per "
                "request; shorten it")
    room = context - longest if exact else context
    out, changes = body, []
    for key in fields:
        asked = body.get(key)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > room:
            out = out if out is not body else copy.copy(body)
            out[key] = room
            changes.append(f"{key} {asked}->{room} (the context of {context:,} tokens)")
    return out, tuple(changes)


def rewrite(body: dict[str, Any], level: int, policy: Policy,
            fields: tuple[str, ...] = OUTPUT_FIELDS) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request body as the level allows it, and what changed. At level 1 every output-limit field the
    engine reads (`fields`) is capped; a request that sets none (null, or llama.cpp's -1) is given the cap of
    `default_max_tokens` in each field it names, else in max_tokens."""
    if level < 1:
        return body, ()
    out = copy.copy(body)
    changes = []
    def cap_of(asked: int) -> int:
        if policy.max_tokens_cap is not None:
            return policy.max_tokens_cap
        return max(1, int(asked * policy.max_tokens_fraction))

    limited = False
    for key in fields:
        asked = out.get(key)
        if asked is None or asked < 0:
            continue
        limited = True
        cap = cap_of(asked)
        if asked > cap:
            out[key] = cap
            changes.append(f"{key} {asked}->{cap}")
    if not limited:
        cap = cap_of(policy.default_max_tokens)
        for key in [k for k in fields if k in out] or ["max_tokens"]:
            changes.append(f"{key} {out.get(key, 'unset')}->{cap}")
            out[key] = cap
    if level >= 2:
        for key, value in (("n", 1), ("best_of", 1)):
            if out.get(key, 1) not in (None, value):
                changes.append(f"{key} {out[key]}->{value}")
                out[key] = value
        if out.get("use_beam_search"):
            out["use_beam_search"] = False
            changes.append("use_beam_search true->false")
    return out, tuple(changes)


def decide(body: dict[str, Any], replicas: list[Replica], policy: Policy, priority: bool = False,
           now: float | None = None, cost: Callable[[dict[str, Any], Replica], float] | None = None,
           fields: tuple[str, ...] = OUTPUT_FIELDS) -> Decision:
    """Route, rewrite or reject one request. `cost` is what a body would add to a replica's predicted usage:
    the request is judged with itself counted, at the lowest level (from its replica's) whose rewriting lets it
    stay below that level's next threshold; one that does not fit even at level 2 is rejected."""
    now = time.monotonic() if now is None else now
    replica, note = choose_replica(replicas, policy, now)
    if replica is None:
        return Decision(action=REJECT, level=3, replica=None, body=None, reason=note)
    decision = _decide_on(replica, note, body, policy, priority, now, cost, fields)
    if decision.action == REJECT and policy.fail_open and replica.fresh(policy, now):
        # the fresh replicas are full: a replica whose metrics have gone stale may still take it, on its
        # prediction alone (fail-open), rather than every request being refused while its gauge hangs
        stale = [r for r in replicas if r.healthy and not r.fresh(policy, now)]
        if stale:
            other = min(stale, key=lambda r: (r.pressure(policy, now), r.in_flight))
            second = _decide_on(other, "upstream metrics are stale; acting on predicted usage (fail-open)", body,
                                policy, priority, now, cost, fields)
            if second.action == FORWARD:
                return second
    return decision


def _decide_on(replica: Replica, note: str, body: dict[str, Any], policy: Policy, priority: bool, now: float,
               cost: Callable[[dict[str, Any], Replica], float] | None, fields: tuple[str, ...]) -> Decision:
    pressure = replica.settle(policy, now)
    if replica.queued(policy, now) and not priority and replica.level < 3:
        return Decision(action=REJECT, level=replica.level, replica=replica.url, body=None, pressure=pressure,
                        total=pressure, reason=f"{replica.waiting} requests waiting in the engine's queue, at or above "
                                               f"max_waiting {policy.max_waiting}")
    limit = policy.priority_reject if priority else policy.reject
    total = pressure
    for level in range(replica.level, 4):
        new_body, changes = rewrite(body, min(level, 2), policy, fields)
        total = pressure + (cost(new_body, replica) if cost is not None else 0.0)
        if level == 3:
            if not priority or total >= limit:
                reason = (f"KV usage {pressure:.0%} at or above {limit:.0%}" if replica.level >= 3 and
                          (not priority or pressure >= limit) else
                          f"this request would take the KV cache to {total:.0%} even with its output capped and "
                          "one sample")
                return Decision(action=REJECT, level=3, replica=replica.url, body=None, reason=reason,
                                pressure=pressure, total=total)
            return Decision(action=FORWARD, level=2, replica=replica.url, body=new_body, changes=changes, reason=note,
                            pressure=pressure, total=total)
        if sum(total >= t for t in policy.thresholds) <= level:
            return Decision(action=FORWARD, level=level, replica=replica.url, body=new_body, changes=changes,
                            reason=note, pressure=pressure, total=total)
    raise AssertionError("unreachable: level 3 always decides")


__all__ = ["FORWARD", "REJECT", "Decision", "Policy", "Replica", "choose_replica", "decide", "level_for",
           "rewrite"]
