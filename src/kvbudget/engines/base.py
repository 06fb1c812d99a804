"""The engine seam: what every engine module returns, and the rules they share.

An engine turns a ModelSpec into an Allocation: groups of layers it stores alike, each with bytes per
token, the most tokens a sequence keeps there, and fixed bytes per sequence. Everything downstream
(estimate, and later planner, guard, simulator) reads Allocations and never redoes this math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvbudget.dtypes import KVDtype
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec


@dataclass(frozen=True)
class CacheGroup:
    """Layers of one kind that an engine stores alike (numbers per layer, on the most loaded GPU)."""

    kind: str
    layers: int
    bytes_per_token: int  # per layer, per cached token
    token_cap: int | None  # the most tokens one sequence keeps per layer; None = grows with context
    fixed_bytes: int  # per layer, per sequence, whatever the context
    detail: str  # how the per-token and fixed figures are made up, for people

    def tokens_held(self, context: int) -> int:
        return context if self.token_cap is None else min(context, self.token_cap)

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        held = self.tokens_held(context) if capped else context
        return self.layers * (self.bytes_per_token * held + self.fixed_bytes)


@dataclass(frozen=True)
class Allocation:
    """What one engine holds for one model, KV dtype and parallel layout."""

    engine: str
    model: str
    kv_dtype: KVDtype
    tp: int
    groups: tuple[CacheGroup, ...]
    exact: bool = True
    notes: tuple[str, ...] = ()

    @property
    def bytes_per_token(self) -> int:
        """Bytes one sequence adds per token before any window cap."""
        return sum(g.layers * g.bytes_per_token for g in self.groups)

    @property
    def fixed_bytes_per_sequence(self) -> int:
        """Bytes one sequence holds whatever its length (recurrent state)."""
        return sum(g.layers * g.fixed_bytes for g in self.groups)

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        """Bytes one sequence of `context` tokens holds; `capped=False` ignores windows and chunks."""
        return sum(g.sequence_bytes(context, capped) for g in self.groups)

    def kv_bytes(self, sequences: int, context: int, capped: bool = True) -> int:
        """Bytes `sequences` sequences of `context` tokens each hold."""
        return sequences * self.sequence_bytes(context, capped)


class Engine(Protocol):
    name: str
    description: str

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1) -> Allocation: ...


def shard_kv_heads(kv_heads: int, tp: int, where: str) -> int:
    """KV heads on one tensor-parallel rank: heads split evenly, or replicated when tp > kv_heads."""
    if kv_heads % tp and tp % kv_heads:
        raise KVBudgetError(
            f"{where}: tensor parallel size {tp} does not fit {kv_heads} KV heads; "
            f"one must divide the other (try --tp {_nearest_fit(kv_heads, tp)})"
        )
    return max(1, kv_heads // tp)


def shard_evenly(size: int, tp: int, what: str, where: str) -> int:
    """A dimension split across tensor-parallel ranks, which must divide evenly."""
    if size % tp:
        raise KVBudgetError(f"{where}: {what} ({size}) does not split evenly over tensor parallel size {tp}")
    return size // tp


def _nearest_fit(kv_heads: int, tp: int) -> int:
    fits = [n for n in range(1, 2 * max(kv_heads, tp) + 1) if kv_heads % n == 0 or n % kv_heads == 0]
    return min(fits, key=lambda n: (abs(n - tp), n))


def check_tp(tp: int) -> None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0:
        raise KVBudgetError(f"--tp: tensor parallel size must be a positive integer, got {tp!r}")
