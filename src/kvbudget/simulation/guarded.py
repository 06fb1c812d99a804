"""Admission in front of the simulated engine: `kvbudget guard`'s own code, or the policies clusters run instead.

- `kvbudget` (GuardInLoop): the guard's `Admission` (policy, predictor, levels with hysteresis) sees every
  request as it arrives, with the engine's usage gauge as the guard would have scraped it (every `poll_interval`
  seconds of simulated time) and its own prediction of what the requests in flight will hold. Nothing here
  decides anything itself.
- `gie`: the Endpoint Picker's legacy admission (llm-d-router v0.10.0 with its flowControl feature gate off, the
  default; the Gateway API Inference Extension's before it): while the utilization detector reads the pool
  saturated (pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization/config.go: 5 waiting requests or
  0.8 KV usage; metrics refreshed every 50 ms), a sheddable request (priority below 0) is rejected with 429
  (pkg/epp/requestcontrol/admission.go, rejectIfSheddableAndSaturated); every request is taken as sheddable here.
- `llm-d`: the same router with flow control on: a bounded queue at the gateway (simulation/front.py), so it runs
  as a fleet's front door (a fleet of one replica from the command line).
- `concurrency:N`: a static limit of N requests in flight at the gateway; one more is rejected.
- `none`: the engine alone (vLLM queues, preempts and recomputes).
A rejected request never reaches the engine; a capped one generates at most its new max_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvbudget.choices import Admission
from kvbudget.engines import Engine
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.guard.config import GuardConfig


@dataclass(frozen=True, kw_only=True)
class GuardReport:
    """What the guard did: decisions by level and action, and what its caps took away."""

    forwarded: dict[int, int]  # level -> requests forwarded at it (0 untouched, 1 capped, 2 single sample)
    rejected: int
    capped: int  # requests whose max_tokens the guard lowered below what they would have generated
    tokens_cut: int  # output tokens those caps removed (per sample kept)
    peak_predicted: float  # the guard's predicted usage, at its highest when it decided
    policy: str = "kvbudget"  # the admission policy that decided

    @property
    def status(self) -> int:
        """The HTTP status its rejections get."""
        return refusal_status(self.policy)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "forwarded": {str(k): v for k, v in self.forwarded.items()},
                "rejected": self.rejected, "status": self.status, "capped": self.capped,
                "tokens_cut": self.tokens_cut, "peak_predicted": self.peak_predicted}


class Gatekeeper(Protocol):
    """What decides each arrival in front of the simulated engine."""

    def observe(self, now: float, usage: float, waiting: int = 0) -> None:
        """The engine's KV usage and waiting requests now (each policy reads them when it would)."""

    def admit(self, r: Request, now: float) -> tuple[Request, Callable[[], None] | None] | None:
        """The request as forwarded and the release of its hold, or None (rejected)."""

    def report(self) -> GuardReport: ...


class GuardInLoop:
    def __init__(self, config: GuardConfig, allocation: Any, kv_budget: int | None, engine: Engine,
                 max_model_len: int, poll_interval: float = 1.0):
        from kvbudget.guard.admission import Admission
        from kvbudget.guard.policy import Replica
        from kvbudget.guard.request import Asked
        from kvbudget.guard.signals import Predictor

        budget = config.kv_budget_bytes or kv_budget
        if not budget:
            raise KVBudgetError("guard_config: no kv_budget_bytes in it and no KV budget to predict against",
                                param="guard_config")
        self.replica = Replica(url="simulated")
        self.asked = Asked(chat=True)  # a chat request: max_tokens and n, the prompt counted already
        self.admission = Admission([self.replica], config.policy, Predictor(allocation, int(budget)),
                                   None, None, engine, max_model_len)
        self.poll_interval = poll_interval
        self.next_poll = 0.0
        self.forwarded = {0: 0, 1: 0, 2: 0}
        self.rejected = self.capped = self.tokens_cut = 0
        self.peak_predicted = 0.0

    def observe(self, now: float, usage: float, waiting: int = 0) -> None:
        """The guard's scrape of the engine's gauges, when one is due (the queue too: `max_waiting`)."""
        if now >= self.next_poll:
            self.replica.observed, self.replica.waiting = usage, waiting
            self.replica.observed_at = now
            self.next_poll = now + self.poll_interval

    def admit(self, r: Request, now: float) -> tuple[Request, Callable[[], None]] | None:
        """The request as the guard forwards it and the release of its predicted bytes, or None (503)."""
        asked = r.max_tokens or r.output_tokens
        prompts = [r.prompt_tokens]
        decision = self.admission.decide({"max_tokens": asked, "n": r.n}, self.asked, prompts, False, set(), now=now)
        self.peak_predicted = max(self.peak_predicted, self.replica.predicted)
        if not decision.forwards:
            self.rejected += 1
            return None
        assert decision.body is not None
        self.forwarded[decision.level] += 1
        release = self.admission.hold(decision, self.asked, prompts)
        allowed = int(decision.body.get("max_tokens") or asked)
        n = int(decision.body.get("n") or 1)
        if allowed < r.output_tokens:
            self.capped += 1
            self.tokens_cut += (r.output_tokens - allowed) * n
        if allowed < r.output_tokens or n != r.n:
            r = Request(arrival=r.arrival, prompt_tokens=r.prompt_tokens, output_tokens=min(allowed, r.output_tokens),
                        prefix=r.prefix, id=r.id, max_tokens=allowed, n=n)
        return r, release

    def report(self) -> GuardReport:
        return GuardReport(forwarded=dict(self.forwarded), rejected=self.rejected, capped=self.capped,
                           tokens_cut=self.tokens_cut, peak_predicted=self.peak_predicted)


class SaturationShedding:
    """GIE's saturation detector in front of one replica (see the module's docstring)."""

    def __init__(self, queue: int = 5, kv: float = 0.8, refresh: float = 0.05):
        self.queue, self.kv, self.refresh = queue, kv, refresh
        self.next_poll = 0.0
        self.saturated = False
        self.forwarded = self.rejected = 0

    def observe(self, now: float, usage: float, waiting: int = 0) -> None:
        if now >= self.next_poll:
            self.saturated = waiting >= self.queue or usage >= self.kv
            self.next_poll = now + self.refresh

    def admit(self, r: Request, now: float) -> tuple[Request, None] | None:
        if self.saturated:
            self.rejected += 1
            return None
        self.forwarded += 1
        return r, None

    def report(self) -> GuardReport:
        return GuardReport(forwarded={0: self.forwarded, 1: 0, 2: 0}, rejected=self.rejected, capped=0, tokens_cut=0,
                           peak_predicted=0.0, policy="gie")


class ConcurrencyLimit:
    """At most `limit` requests in flight at the gateway; one more is rejected."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight = self.forwarded = self.rejected = 0

    def observe(self, now: float, usage: float, waiting: int = 0) -> None:
        pass

    def admit(self, r: Request, now: float) -> tuple[Request, Callable[[], None]] | None:
        if self.in_flight >= self.limit:
            self.rejected += 1
            return None
        self.in_flight += 1
        self.forwarded += 1

        def release() -> None:
            self.in_flight -= 1

        return r, release

    def report(self) -> GuardReport:
        return GuardReport(forwarded={0: self.forwarded, 1: 0, 2: 0}, rejected=self.rejected, capped=0, tokens_cut=0,
                           peak_predicted=0.0, policy=f"concurrency:{self.limit}")


POLICIES = tuple(kind.spelled for kind in Admission)


def refusal_status(policy: str) -> int:
    """The HTTP status an admission policy refuses with: 503 for kvbudget's guard (Retry-After), 429 for the router's
    shedding and a concurrency limit (ResourceExhausted)."""
    return 503 if policy == Admission.KVBUDGET else 429


def admission_policy(name: str | None, guard_config: GuardConfig | Mapping[str, Any] | None, setup: Any,
                     engine: Engine, poll_interval: float = 1.0) -> Gatekeeper | None:
    """The policy `name` names (None: the guard when a guard config is given, else none); `guard_config` is the
    guard's configuration (`guard.config.read`), or a mapping as its file holds it."""
    name = name or (Admission.KVBUDGET if guard_config is not None else Admission.NONE)
    text, colon, limit = name.partition(":")
    kind = next((k for k in Admission if k == text and colon == (":" if k is Admission.CONCURRENCY else "")), None)
    if kind is Admission.NONE:
        return None
    if kind is Admission.GIE:
        return SaturationShedding()
    if kind is Admission.KVBUDGET:
        from kvbudget.guard.config import of

        return GuardInLoop(of(guard_config, "guard_config"), setup.allocation, setup.kv_memory_bytes, engine,
                           setup.max_model_len, poll_interval)
    if kind is Admission.LLMD:
        raise KVBudgetError("admission llm-d: flow control is a queue at a fleet's front; run it with "
                            "simulation.fleet.simulate_fleet (the command line does, over one replica)",
                            param="admission")
    if kind is Admission.CONCURRENCY and limit.isdigit() and int(limit) > 0:
        return ConcurrencyLimit(int(limit))
    raise KVBudgetError(f"admission {name!r}: choose one of {', '.join(POLICIES)} (N a positive whole number)",
                        param="admission")
