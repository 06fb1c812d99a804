"""The guard's one admission pipeline, whatever carries the request: the API key, the request read and counted,
the decision (logged and counted), and the hold on the chosen replica. The HTTP proxy and sidecar (`app`) and the
Envoy external processor (`extproc`) are adapters: they turn what their transport gives into `Gate.read` and
`Gate.admit` calls and a `Refusal` into their own error answer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvbudget.engines import Engine
from kvbudget.errors import KVBudgetError
from kvbudget.guard.admission import Admission
from kvbudget.guard.clients import Clients
from kvbudget.guard.config import GuardConfig
from kvbudget.guard.log import event
from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import FORWARD, Decision, Replica
from kvbudget.guard.request import Asked, BadRequest, parse_json, read_request
from kvbudget.guard.signals import Prediction

PRIORITY_HEADER = "x-kvbudget-priority"
DENIED = "invalid or missing API key for the guard"
ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}  # the paths admission decides: path -> chat


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A request the guard answers itself: the status, the OpenAI-style error, and for a 503 the level and the
    seconds a client should wait."""

    status: int
    message: str
    kind: str
    param: str | None = None
    level: int | None = None
    retry_after: int | None = None


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A request read, validated and counted, waiting for its decision."""

    path: str
    body: dict[str, Any]
    asked: Asked
    prompts: list[int]  # each prompt's tokens (empty without a predictor)
    priority: bool
    client: str = ""  # who sent it (guard.clients): its key's digest, a trusted proxy's name for it, its address
    fitted: tuple[str, ...] = ()  # the output limits cut to the request's context (Admission.fit_context)


@dataclass(frozen=True)
class Admitted:
    """A request the guard forwards: the decision (replica, body as rewritten) and the release of its hold."""

    decision: Decision
    release: Callable[[], None]


class Gate:
    """The admission pipeline of one guard; its decisions and refusals are logged to `log` (`guard.log`)."""

    def __init__(self, config: GuardConfig, replicas: list[Replica], metrics: GuardMetrics, engine: Engine,
                 prediction: Prediction, log: logging.Logger):
        self.config, self.replicas, self.metrics, self.log = config, replicas, metrics, log
        self.keys = config.api_keys | config.priority_keys  # every key the guard accepts (none: open)
        self.admission = Admission(replicas, config.policy, prediction.predictor, prediction.count_prompt, metrics,
                                   engine, config.max_model_len)
        self.clients = Clients(config.clients)

    def key(self, authorization: str) -> str | None:
        """The bearer token of an Authorization header when it is one of the guard's keys, else None."""
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token in self.keys else None

    def authorize(self, headers: Mapping[str, str]) -> Refusal | None:
        """401 when the guard has keys and the request carries none of them."""
        if self.keys and self.key(headers.get("authorization", "")) is None:
            return Refusal(status=401, message=DENIED, kind="authentication_error")
        return None

    def priority(self, headers: Mapping[str, str]) -> bool:
        """With keys, priority is the key's (a priority key); without, the x-kvbudget-priority header's."""
        if self.keys:
            return self.key(headers.get("authorization", "")) in self.config.priority_keys
        return headers.get(PRIORITY_HEADER, "").lower() == "high"

    def read(self, path: str, raw: bytes, headers: Mapping[str, str], peer: str = "") -> Pending | Refusal:
        """The request's JSON body checked as the engine would check it, its prompts counted (400 when it is not
        a request the engine takes); `peer` is the address the connection comes from."""
        try:
            body = parse_json(raw)
            asked = read_request(body, chat=ROUTES[path])
        except BadRequest as exc:
            return Refusal(status=400, message=str(exc), kind="invalid_request_error", param=exc.param)
        try:
            prompts = self.admission.prompt_tokens(body, asked) if self.admission.predictor is not None else []
        except KVBudgetError as exc:  # the tokenizer's chat template refuses the messages
            return Refusal(status=400, message=str(exc), kind="invalid_request_error",
                           param="messages" if asked.chat else "prompt")
        fitted: tuple[str, ...] = ()
        if not self.config.sidecar:  # (a sidecar forwards as sent)
            fit = self.admission.fit_context(body, asked, prompts)
            if isinstance(fit, str):
                return Refusal(status=400, message=fit, kind="invalid_request_error",
                               param="messages" if asked.chat else "prompt")
            body, fitted = fit
        client = self.clients.identify(headers, peer, self.key(headers.get("authorization", "")) if self.keys else None)
        return Pending(path=path, body=body, asked=asked, prompts=prompts, priority=self.priority(headers),
                       client=client, fitted=fitted)

    def admit(self, pending: Pending, tried: set[str]) -> Admitted | Refusal:
        """The decision for a read request among the replicas not `tried`: a 503, or the request held against the
        chosen replica until its release runs."""
        slot = self.clients.enter(pending.client)
        if slot is None:
            cap = self.config.clients.max_in_flight
            self.metrics.client_refused.labels("in_flight").inc()
            event(self.log, {"event": "client_refused", "reason": "in_flight", "client": pending.client, "limit": cap})
            return Refusal(status=429, message=f"this client has {cap} requests in flight, its limit; retry when one "
                           "has finished", kind="rate_limit_exceeded", retry_after=self.config.policy.retry_after_s)
        decision = self.judge(pending, tried)
        if not decision.forwards:
            slot()
            if decision.replica is None:
                message, kind = f"no upstream can take the request: {decision.reason}", "server_unavailable"
            elif decision.level < 3:  # refused on the engine's queue (max_waiting), not its KV cache
                message, kind = f"the server is busy ({decision.reason}); retry later", "server_overloaded"
            else:
                message, kind = f"the KV cache is nearly full ({decision.reason}); retry later", "server_overloaded"
            return Refusal(status=503, message=message, kind=kind, level=decision.level,
                           retry_after=self.config.policy.retry_after_s)
        hold = self.admission.hold(decision, pending.asked, pending.prompts)

        def release() -> None:
            hold()
            slot()

        return Admitted(decision, release)

    def judge(self, pending: Pending, tried: set[str]) -> Decision:
        """The admission decision for a request, logged; a sidecar forwards the request as sent whatever the level
        (it logs what the guard would have done as `advice`)."""
        body = pending.body
        decision = self.admission.decide(body, pending.asked, pending.prompts, pending.priority, tried)
        if pending.fitted and decision.forwards:
            decision = replace(decision, changes=pending.fitted + tuple(decision.changes))
        advice = {}
        if self.config.sidecar:
            advice = {"advice": decision.action, "advised_changes": list(decision.changes)}
            decision = replace(decision, action=FORWARD, replica=self.replicas[0].url, body=body, changes=())
        # what was done, by level; a rejection because no replica can be reached is not a full cache
        level = "none" if decision.replica is None else str(decision.level)
        self.metrics.decided(level, decision.action if decision.replica else "unavailable")
        event(self.log, {"event": "decision", "path": pending.path, "action": decision.action,
                         "level": decision.level, "replica": decision.replica, "pressure": round(decision.pressure, 4),
                         "with_request": round(decision.total, 4), "changes": list(decision.changes),
                         "reason": decision.reason, "priority": pending.priority, **advice})
        return decision
