"""What speculative decoding's drafter costs a plan (`plan --speculative`): whether one request of the plan's length
still fits with it, and how many such requests fit at once with it and without it. No engine is named: each engine's
capacity and lookahead slots (Engine.lookahead_slots) say what the drafter holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvbudget.engines import Capacity, Engine, EngineOptions
    from kvbudget.estimator import Estimate
    from kvbudget.model.weights import Weights


class Planned(Protocol):
    """What the advice reads of a plan (planner.Plan)."""

    @property
    def weights(self) -> Weights: ...

    @property
    def kv_memory_bytes(self) -> int: ...

    @property
    def estimate(self) -> Estimate: ...

    @property
    def capacity(self) -> Capacity: ...


@dataclass(frozen=True, kw_only=True)
class DrafterAdvice:
    """The drafter against the same plan without it (with it, each running request also holds the engine's lookahead
    slots)."""

    method: str
    num_tokens: int
    draft: str | None
    fits: bool  # one request of the plan's length fits with the drafter
    weights_bytes: int  # the drafter's weights on one GPU, as the engine loads them (with the plan's other loads)
    kv_budget_bytes: int  # the KV budget with the drafter less the one without (its weights come out of it)
    bytes_per_token: int  # the drafter's KV bytes per token in the engine's pool (0: none in the pool)
    lookahead_slots: int  # KV slots each running request holds beyond its tokens
    requests_with: float
    requests_without: float | None  # None where the plan without the drafter was refused

    @property
    def cost(self) -> float | None:
        """The share of concurrent requests the drafter costs (0.1: a tenth fewer)."""
        return 1 - self.requests_with / self.requests_without if self.requests_without else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cost": self.cost}


def drafter_advice(engine: Engine, replan: Callable[..., Planned | None], kv_memory: int | None, kv_budget: int,
                   weights: Weights, result: Estimate, options: EngineOptions) -> DrafterAdvice | None:
    """The plan's drafter (`options.speculative`, the plan's `result` and `weights` with it; None without one)
    against the same plan without it (`replan` with changes, None where refused; a given `kv_memory` kept)."""
    spec, alloc, cap = options.speculative, result.allocation, result.capacity
    if spec is None:
        return None
    assert cap is not None
    without = replan(options=replace(options, speculative=None), kv_memory=kv_memory)
    slots = engine.lookahead_slots(options)
    held = engine.capacity(result.model, kv_budget, cap.max_model_len + slots, alloc.kv_dtype.name, alloc.tp, options)
    return DrafterAdvice(
        method=str(spec.method), num_tokens=spec.num_tokens,
        draft=spec.draft_id or (spec.draft.name if spec.draft else None), fits=cap.fits,
        weights_bytes=weights.per_gpu_bytes - (without.weights.per_gpu_bytes if without else 0),
        kv_budget_bytes=kv_budget - (without.kv_memory_bytes if without else 0),
        bytes_per_token=result.bytes_per_token - (without.estimate.bytes_per_token if without else 0),
        lookahead_slots=slots, requests_with=held.max_concurrency,
        requests_without=without.capacity.max_concurrency if without else None)
