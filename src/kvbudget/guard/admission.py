"""Admission: the policy's decision for one request, and the predicted bytes of every request in flight."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import Decision, Policy, Replica, decide
from kvbudget.guard.signals import Predictor, approximate_prompt_tokens


class Admission:
    def __init__(self, replicas: list[Replica], policy: Policy, predictor: Predictor | None,
                 count_prompt: Callable[[dict[str, Any]], int] | None, metrics: GuardMetrics):
        self.replicas, self.policy, self.predictor, self.metrics = replicas, policy, predictor, metrics
        self.count_prompt = count_prompt or approximate_prompt_tokens
        self.held: dict[str, dict[int, int]] = {r.url: {} for r in replicas}  # request id -> predicted bytes
        self.ids = itertools.count()

    def decide(self, body: dict[str, Any], priority: bool, tried: set[str], now: float | None = None) -> Decision:
        """`now` (default: the monotonic clock) is the time metrics ages are measured against; the simulator
        passes its own clock."""
        candidates = [r for r in self.replicas if r.url not in tried]
        decision = decide(body, candidates, self.policy, priority, now)
        self.metrics.decisions.labels(str(decision.level), decision.action).inc()
        return decision

    def hold(self, decision: Decision) -> Callable[[], None]:
        """Count the forwarded request's predicted bytes against its replica; returns the release."""
        url, body = decision.replica, decision.body
        assert url is not None and body is not None  # a forward decision
        rid = next(self.ids)
        prompt = self.count_prompt(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or self.policy.default_max_tokens
        samples = max(int(body.get("n", 1) or 1), int(body.get("best_of", 1) or 1))
        held = self.predictor.request_bytes(prompt, max_tokens, samples) if self.predictor is not None else 0
        self.held[url][rid] = held
        self._update(url)

        def release() -> None:
            self.held[url].pop(rid, None)
            self._update(url)

        return release

    def _update(self, url: str) -> None:
        replica = next(r for r in self.replicas if r.url == url)
        if self.predictor is not None:
            replica.predicted = self.predictor.fraction(sum(self.held[url].values()))
            self.metrics.predicted.labels(url).set(replica.predicted)
        replica.in_flight = len(self.held[url])
        self.metrics.in_flight.labels(url).set(replica.in_flight)
