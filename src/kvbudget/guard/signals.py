"""The two pressure signals per replica: observed (the engine's own gauge, scraped) and predicted
(what the requests in flight will hold at the end of their generation, from kvbudget's allocation)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvbudget.engines import Allocation, Engine, get_engine
from kvbudget.engines.metrics import PoolReport, parse_prometheus

# Tokens a chat template adds per message (role markers), for the character estimate only: ChatML and Llama-3
# templates add 5 per message; 8 errs on the side of protecting the cache. An estimate, like the 4 characters
# per token; --tokenizer replaces both with exact counts.
TEMPLATE_TOKENS_PER_MESSAGE = 8
CHARS_PER_TOKEN = 4


def observed_usage(engine: str | Engine, body: str) -> float | None:
    """The engine's reported KV usage as a 0..1 fraction, from the body of its usage endpoint (see
    `Engine.usage`: /metrics for most, /slots for llama-server), or None when it holds no figure."""
    gauge = get_engine(engine).usage
    return gauge.read(body) if gauge is not None else None


class Predictor:
    """Bytes the admitted requests will hold once they have generated all their tokens, as a fraction of a
    replica's KV budget: the one given (`kv_budget_bytes`, for every replica), else the pool the replica's engine
    states (`Replica.budget`); every number comes from the engine's Allocation for the model."""

    def __init__(self, allocation: Allocation, kv_budget_bytes: int | None = None):
        self.allocation = allocation
        self.budget = kv_budget_bytes

    def request_bytes(self, prompt_tokens: int, max_tokens: int, samples: int = 1) -> int:
        return samples * self.allocation.sequence_bytes(max(1, prompt_tokens + max_tokens))

    def fraction(self, held_bytes: int, replica: Any = None) -> float:
        """`held_bytes` over the replica's budget (0 where none is known: the observed usage alone guards)."""
        budget = self.budget or (replica.budget if replica is not None else None)
        return held_bytes / budget if budget else 0.0


def approximate_prompt_tokens(body: dict[str, Any]) -> int:
    """Characters / 4 over the messages (or prompt), plus role markers: the guard's estimate without a tokenizer."""
    if "messages" in body and isinstance(body["messages"], list):
        chars = 0
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        return math.ceil(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    return math.ceil(len(str(prompt)) / CHARS_PER_TOKEN)


__all__ = ["Predictor", "approximate_prompt_tokens", "observed_usage", "parse_prometheus"]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What a guard predicts with, assembled from its configuration (`server.build_guard`)."""

    predictor: Predictor | None = None
    # the KV budget a replica's stated pool holds (the engine's ReportsPool, for the model predicted with); None:
    # a budget was given, or the engine states none, or there is no model to predict with
    pool_budget: Callable[[PoolReport], int] | None = None
    budget: int | None = None  # each replica's KV budget until its pool is read (None: none), ...
    budget_source: str = ""  # ... and where it comes from (kv_memory given, the config's kv_budget_bytes)
    count_prompt: Callable[[dict[str, Any]], int] | None = None  # prompt tokens of a body; None: characters / 4
