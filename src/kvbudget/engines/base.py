"""The engine seam: what every engine module returns, and the rules they share.

An engine turns a ModelSpec into an Allocation: groups of layers it stores alike, each with bytes per
token, the most tokens a sequence keeps there, and fixed bytes per sequence. Everything downstream
(estimate, and later planner, guard, simulator) reads Allocations and never redoes this math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvbudget.dtypes import KVDtype, resolve_kv_dtype
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import cdiv


@dataclass(frozen=True)
class EngineOptions:
    """The knobs that change what an engine allocates; None means the engine's own default."""

    block_size: int | None = None  # tokens per block / page
    max_num_batched_tokens: int | None = None  # vLLM: tokens in flight per step
    prefix_caching: bool = True
    device: str = "cuda"  # "cuda" or "cpu" (vLLM's CPU backend differs in block size and state dtype)


@dataclass(frozen=True)
class CacheGroup:
    """Layers of one kind that an engine stores alike (numbers per layer, on the most loaded GPU)."""

    kind: str
    layers: int  # including padding layers an engine allocates for alignment
    bytes_per_token: int  # per layer, per cached token
    token_cap: int | None  # the most tokens one sequence keeps per layer; None = grows with context
    fixed_bytes: int  # per layer, per sequence, whatever the context
    detail: str  # how the per-token and fixed figures are made up, for people
    block_size: int = 1  # tokens are held in whole blocks of this many

    def tokens_held(self, context: int) -> int:
        held = cdiv(context, self.block_size) * self.block_size
        return held if self.token_cap is None else min(held, self.token_cap)

    def sequence_bytes(self, context: int, capped: bool = True) -> int:
        held = self.tokens_held(context) if capped else cdiv(context, self.block_size) * self.block_size
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


@dataclass(frozen=True)
class Capacity:
    """What an engine makes of a KV budget, in its own definitions."""

    engine: str
    kv_memory_bytes: int
    num_blocks: int | None  # None where the engine has no blocks
    block_size: int | None
    kv_cache_tokens: int  # the figure the engine prints
    physical_token_slots: int  # tokens that physically fit in every layer group at once
    max_model_len: int
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    fits: bool  # one request of max_model_len fits
    estimated_max_model_len: int | None  # the longest request that fits, when one of max_model_len does not
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "kv_memory_bytes": self.kv_memory_bytes,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "kv_cache_tokens": self.kv_cache_tokens,
            "physical_token_slots": self.physical_token_slots,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "fits": self.fits,
            "estimated_max_model_len": self.estimated_max_model_len,
        }


class Engine(Protocol):
    name: str
    description: str

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation: ...

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity: ...


def simple_capacity(alloc: Allocation, kv_memory: int, max_model_len: int, note: str) -> Capacity:
    """Capacity of an engine without a block pool: whole sequences of max_model_len in the budget."""
    per_request = alloc.sequence_bytes(max_model_len)
    concurrency = kv_memory / per_request if per_request else float("inf")
    fits = per_request <= kv_memory
    longest = None
    if not fits:
        longest = _largest(lambda n: alloc.sequence_bytes(n) <= kv_memory, max_model_len)
    slots = kv_memory // alloc.bytes_per_token if alloc.bytes_per_token else 0
    return Capacity(alloc.engine, kv_memory, None, None, int(concurrency * max_model_len), slots,
                    max_model_len, concurrency, fits, longest, (note,))


def _largest(ok, upper: int) -> int:
    """The largest n in [1, upper] with ok(n) (ok is monotone), or 0 when even 1 fails."""
    if not ok(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


largest_fitting = _largest


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


def shard_recurrent(layer, tp: int, where: str, replicate_groups: bool = False) -> tuple[int, int, int]:
    """(conv channels, heads, SSM state values) of one recurrent layer on one tensor-parallel rank.

    `replicate_groups`: Mamba-2 B/C groups that do not split over tp are replicated to follow their heads
    (vLLM's extra_groups_for_head_shards)."""
    channels = layer.conv_channels
    if replicate_groups and layer.mixer == "mamba2" and layer.groups % tp:
        channels += 2 * (tp - layer.groups) * layer.state_shape[-1]
    channels = shard_evenly(channels, tp, "conv channels", where)
    heads = shard_evenly(layer.heads, tp, "recurrent heads", where)
    state = heads
    for size in layer.state_shape[1:]:
        state *= size
    return channels, heads, state


def _nearest_fit(kv_heads: int, tp: int) -> int:
    fits = [n for n in range(1, 2 * max(kv_heads, tp) + 1) if kv_heads % n == 0 or n % kv_heads == 0]
    return min(fits, key=lambda n: (abs(n - tp), n))


def pipeline_stages(num_layers: int, pp: int) -> list[range]:
    """Layers per pipeline stage, as vLLM's get_pp_indices splits them: L // pp each, the remainder going
    one by one to the stages before the last, starting from the second to last."""
    if not isinstance(pp, int) or isinstance(pp, bool) or pp <= 0:
        raise KVBudgetError(f"--pp: pipeline parallel size must be a positive integer, got {pp!r}")
    if pp > num_layers:
        raise KVBudgetError(f"--pp {pp}: the model has only {num_layers} layers to split")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def serving_kv_dtype(model: ModelSpec, kv_dtype: str, tp: int, engine: str, accepted: str) -> KVDtype:
    """The checks every serving engine makes first: a valid tp, query heads that split evenly over it, and a
    KV dtype it can store (a torch float type or fp8; `accepted` names them in the error)."""
    check_tp(tp)
    if model.attention_heads and model.attention_heads % tp:
        raise KVBudgetError(f"{model.name}: {engine} needs the {model.attention_heads} attention heads to split "
                            f"evenly over tensor parallel size {tp}")
    dtype = resolve_kv_dtype(kv_dtype, model.dtype)
    if dtype.family not in ("float", "fp8"):
        raise KVBudgetError(f"--kv-dtype {kv_dtype}: {engine}'s KV cache dtypes are {accepted}")
    return dtype


def check_tp(tp: int) -> None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 0:
        raise KVBudgetError(f"--tp: tensor parallel size must be a positive integer, got {tp!r}")
