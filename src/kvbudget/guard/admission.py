"""Admission: the policy's decision for one request, with the request's own predicted bytes counted, and the
predicted bytes of every request in flight."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

from kvbudget.engines import Engine
from kvbudget.guard.policy import Decision, Policy, Replica, decide, fit_context
from kvbudget.guard.request import Asked, samples
from kvbudget.guard.signals import Predictor, approximate_prompt_tokens


class Observer(Protocol):
    """What watches admission (the guard's Prometheus metrics; the simulator's guard has none)."""

    def held(self, replica: str, predicted: float | None, in_flight: int) -> None:
        """A replica's predicted usage (None without a predictor) and requests in flight, after a change."""


class Admission:
    def __init__(self, replicas: list[Replica], policy: Policy, predictor: Predictor | None,
                 count_prompt: Callable[[dict[str, Any]], int] | None, observer: Observer | None, engine: Engine,
                 max_model_len: int | None = None):
        self.replicas, self.policy, self.predictor, self.observer = replicas, policy, predictor, observer
        self.count_prompt = count_prompt or approximate_prompt_tokens
        self.engine, self.max_model_len = engine, max_model_len
        self.held: dict[str, dict[int, int]] = {r.url: {} for r in replicas}  # request id -> predicted bytes
        self.ids = itertools.count()

    def prompt_tokens(self, body: dict[str, Any], asked: Asked) -> list[int]:
        """Each prompt's tokens: token ids counted, text by the tokenizer (or the estimate)."""
        if asked.chat:
            return [self.count_prompt(body)]
        return [p if isinstance(p, int) else self.count_prompt({"prompt": p}) for p in asked.prompts]

    def fit_context(self, body: dict[str, Any], asked: Asked, prompts: list[int]
                    ) -> tuple[dict[str, Any], tuple[str, ...]] | str:
        """The body with its output limit cut to the context, for an engine that stops where a request's context
        ends (llama.cpp's slot), and what changed; or why its prompt cannot fit (`policy.fit_context`). Bodies
        pass untouched where the context or the prompts are not known."""
        rule = self.engine.output_limit
        if not rule.stops_at_context or self.max_model_len is None or not prompts:
            return body, ()
        exact = self.count_prompt is not approximate_prompt_tokens or (
            not asked.chat and all(isinstance(p, int) for p in asked.prompts))
        fields = tuple(dict.fromkeys(rule.chat if asked.chat else rule.completions))
        return fit_context(body, prompts, self.max_model_len, fields, exact)

    def request_bytes(self, body: dict[str, Any], asked: Asked, prompts: list[int]) -> int:
        """What the request will hold once every sequence has generated all it may: its output limit read as
        the engine reads it (an absent one: the rest of the context, when the context length is known)."""
        if self.predictor is None:
            return 0
        sequences = samples(body)  # the body as rewritten
        total = 0
        for prompt in prompts:
            remaining = None if self.max_model_len is None else self.max_model_len - prompt
            output = self.engine.output_limit.tokens(body, asked.chat, remaining)
            total += self.predictor.request_bytes(prompt, self.policy.default_max_tokens if output is None
                                                  else output, sequences)
        return total

    def decide(self, body: dict[str, Any], asked: Asked, prompts: list[int], priority: bool, tried: set[str],
               now: float | None = None) -> Decision:
        """The policy's decision with this request counted. `prompts` from `prompt_tokens` (empty without a
        predictor); `now` (default: the monotonic clock) is the time metrics ages are measured against; the
        simulator passes its own clock."""
        candidates = [r for r in self.replicas if r.url not in tried]
        cost = None
        if self.predictor is not None:
            predictor = self.predictor

            def cost(rewritten: dict[str, Any], replica: Replica) -> float:
                return predictor.fraction(self.request_bytes(rewritten, asked, prompts), replica)

        rule = self.engine.output_limit
        fields = tuple(dict.fromkeys(rule.chat + rule.completions))  # every field it reads, capped alike
        return decide(body, candidates, self.policy, priority, now, cost, fields)

    def hold(self, decision: Decision, asked: Asked, prompts: list[int]) -> Callable[[], None]:
        """Count the forwarded request's predicted bytes against its replica; returns the release."""
        url, body = decision.replica, decision.body
        assert url is not None and body is not None  # a forward decision
        rid = next(self.ids)
        self.held[url][rid] = self.request_bytes(body, asked, prompts)
        self._update(url)

        def release() -> None:
            self.held[url].pop(rid, None)
            self._update(url)

        return release

    def _update(self, url: str) -> None:
        replica = next(r for r in self.replicas if r.url == url)
        if self.predictor is not None:
            replica.predicted = self.predictor.fraction(sum(self.held[url].values()), replica)
        replica.in_flight = len(self.held[url])
        if self.observer is not None:
            self.observer.held(url, replica.predicted if self.predictor is not None else None, replica.in_flight)
