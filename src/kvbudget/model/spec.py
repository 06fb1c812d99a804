"""What each layer of a model caches, independent of any engine.

One spec object per cache a layer keeps. A layer with two caches (Falcon-H1 runs attention and a Mamba
mixer side by side) has two specs with the same `layer` index; a layer with none has `NoCache`.
Sizes are element counts and shapes; bytes are the engines' business. Each kind answers the questions every
engine asks (values per token for K and V on one tensor-parallel rank, the tokens it spans, its fixed state)
so that engines differ only in how they store the answer. Engines tell kinds apart with `isinstance`; `kind`
is the label people and the JSON output see.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from kvbudget.errors import EngineRuleError


def _nearest_fit(kv_heads: int, tp: int) -> int:
    fits = [n for n in range(1, 2 * max(kv_heads, tp) + 1) if kv_heads % n == 0 or n % kv_heads == 0]
    return min(fits, key=lambda n: (abs(n - tp), n))


def split_evenly(size: int, tp: int, what: str, where: str) -> int:
    """A dimension split across tensor-parallel ranks, which must divide evenly."""
    if size % tp:
        raise EngineRuleError(f"tp: {where}: {what} ({size}) does not split evenly over tensor parallel size {tp}",
                              param="tp")
    return size // tp


@dataclass(frozen=True)
class LayerSpec:
    """The base of every layer kind: `layer` is the decoder layer's index."""

    layer: int

    kind: ClassVar[str] = "layer"

    @property
    def token_span(self) -> int | None:
        """The most tokens this layer attends to (a window or chunk); None when it sees all of them."""
        return None


@dataclass(frozen=True)
class Attention(LayerSpec):
    """K and V for every token: K is `kv_heads x k_dim`, V is `kv_heads x v_dim` per token. `v_dim` 0: the values
    are the keys, one vector per token and head (DeepSeek-V4's shared-KV multi-query attention)."""

    kv_heads: int
    k_dim: int
    v_dim: int

    def kv_heads_per_rank(self, tp: int, where: str, heads: int | None = None) -> int:
        """KV heads on one tensor-parallel rank: split evenly, or replicated when tp > heads (the rule vLLM,
        SGLang and TGI share). `heads` overrides the layer's own count (engines that repeat K/V)."""
        heads = heads or self.kv_heads
        if heads % tp and tp % heads:
            raise EngineRuleError(
                f"tp: {where}: tensor parallel size {tp} does not fit {heads} KV heads; one must divide the "
                f"other (nearest that fits: {_nearest_fit(heads, tp)})", param="tp")
        return max(1, heads // tp)

    def kv_values(self, tp: int, where: str, heads: int | None = None) -> tuple[int, int]:
        """Values of K and of V one token adds to this layer on one tensor-parallel rank."""
        h = self.kv_heads_per_rank(tp, where, heads)
        return h * self.k_dim, h * self.v_dim

    def describe(self, tp: int, where: str, dtype: str, heads: int | None = None) -> str:
        h = self.kv_heads_per_rank(tp, where, heads)
        return f"{h} KV heads x ({self.k_dim} K + {self.v_dim} V) x {dtype}"


@dataclass(frozen=True)
class FullAttention(Attention):
    """Attention over every token of the sequence."""

    kind: ClassVar[str] = "full_attention"


@dataclass(frozen=True)
class SlidingWindow(Attention):
    """Attention over the last `window` tokens only (Mistral-7B-v0.1, Gemma-2/3 local layers, gpt-oss)."""

    window: int

    kind: ClassVar[str] = "sliding_window"

    @property
    def token_span(self) -> int | None:
        return self.window


@dataclass(frozen=True)
class ChunkedLocal(Attention):
    """Attention within fixed chunks of `chunk` tokens (Llama-4's local layers)."""

    chunk: int

    kind: ClassVar[str] = "chunked_local"

    @property
    def token_span(self) -> int | None:
        return self.chunk


@dataclass(frozen=True)
class LatentAttention(LayerSpec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).

    The model needs only the compressed latent (`latent_dim`, kv_lora_rank) and one shared rope key
    (`rope_dim`) per token, the same on every tensor-parallel rank; engines that expand it cache `heads`
    K heads of `qk_nope_dim + rope_dim` and V heads of `v_dim` instead.
    """

    latent_dim: int
    rope_dim: int
    heads: int
    qk_nope_dim: int
    v_dim: int

    kind: ClassVar[str] = "latent_attention"

    @property
    def expanded_k_dim(self) -> int:
        return self.qk_nope_dim + self.rope_dim

    @property
    def values_per_token(self) -> int:
        """Latent plus rope key: what one token adds to this layer, on every rank."""
        return self.latent_dim + self.rope_dim

    def kv_values(self, tp: int, where: str) -> tuple[int, int]:
        """The latent (K slot) and the rope key (V slot) one token adds: shared by every tensor-parallel rank,
        so the same whatever `tp`."""
        return self.latent_dim, self.rope_dim


@dataclass(frozen=True, kw_only=True)
class RecurrentState(LayerSpec):
    """A fixed-size per-sequence state (Mamba, Mamba-2, gated delta net linear attention).

    `conv_channels x conv_kernel` is the causal-convolution window (engines keep `conv_kernel` or
    `conv_kernel - 1` columns); `state_shape` is the recurrent (SSM) state. `heads` is the dimension
    tensor parallelism splits.
    """

    mixer: str  # "mamba", "mamba2", "gated_delta_net" or "kda" (Kimi delta attention)
    conv_channels: int
    conv_kernel: int
    state_shape: tuple[int, ...]
    heads: int
    groups: int = 1  # Mamba-2 B/C groups (conv channels = d_ssm + 2 x groups x d_state)
    # The dtype the config declares for the recurrent (SSM) state (Qwen3.5's mamba_ssm_dtype, Nemotron-H's
    # mamba_ssm_cache_dtype); None when it declares none and each engine keeps its own default.
    state_dtype: str | None = None

    kind: ClassVar[str] = "recurrent_state"

    def per_rank(self, tp: int, where: str, replicate_groups: bool = False) -> tuple[int, int, int]:
        """(conv channels, heads, SSM state values) on one tensor-parallel rank.

        `replicate_groups`: Mamba-2 B/C groups that do not split over tp are replicated to follow their heads
        (vLLM's extra_groups_for_head_shards)."""
        channels = self.conv_channels
        if replicate_groups and self.mixer == "mamba2" and self.groups % tp:
            channels += 2 * (tp - self.groups) * self.state_shape[-1]
        channels = split_evenly(channels, tp, "conv channels", where)
        heads = split_evenly(self.heads, tp, "recurrent heads", where)
        state = heads
        for size in self.state_shape[1:]:
            state *= size
        return channels, heads, state

    def state_text(self, heads: int) -> str:
        return "x".join(map(str, (heads, *self.state_shape[1:])))


@dataclass(frozen=True)
class IndexerKeys(LayerSpec):
    """The key cache of a sparse-attention indexer (DeepSeek-V3.2's lightning indexer): one `dim`-wide key per
    token beside the layer's MLA latent, the same on every tensor-parallel rank."""

    dim: int

    kind: ClassVar[str] = "indexer_keys"


@dataclass(frozen=True)
class Compressed(LayerSpec):
    """A compressed cache (DeepSeek-V4): one `dim`-wide entry for every `rate` tokens, the same on every
    tensor-parallel rank. A compressor makes each entry from the projections of the tokens of its window: a key
    series and a gate series, `width` values each per token. With `overlap` an entry reads two windows, the current
    one and the previous one (DeepSeek-V4's CSA, whose projections are twice as wide); without, one (HCA).
    `role` is "attention" (the compressed K=V the layer attends to) or "indexer" (the lightning indexer's keys)."""

    rate: int
    dim: int
    overlap: bool
    role: str = "attention"

    kind: ClassVar[str] = "compressed"

    @property
    def label(self) -> str:
        return f"compressed_{'indexer_keys' if self.role == 'indexer' else 'kv'}_1_in_{self.rate}"

    @property
    def width(self) -> int:
        """Values of each of the two projections (key and gate) one token feeds the compressor."""
        return (2 if self.overlap else 1) * self.dim


@dataclass(frozen=True)
class NoCache(LayerSpec):
    """A layer that caches nothing."""

    kind: ClassVar[str] = "no_cache"


@dataclass(frozen=True)
class SharedKV(NoCache):
    """A layer that reads the K and V of an earlier layer (`source`) and caches nothing of its own (Gemma-3n's
    last `num_kv_shared_layers`)."""

    source: int

    kind: ClassVar[str] = "shared_kv"


WINDOWED = (SlidingWindow, ChunkedLocal)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model as far as its cache is concerned."""

    name: str
    model_type: str
    num_layers: int
    dtype: str  # the model's own dtype name (float32/float16/bfloat16): what 'auto' means
    max_position_embeddings: int | None
    layers: tuple[LayerSpec, ...]
    attention_heads: int | None = None  # query heads (num_attention_heads)
    source: str = ""
    warnings: tuple[str, ...] = field(default=())
    # The caches of the model's own multi-token-prediction (MTP) layers, numbered after its layers: what a serving
    # engine adds when it drafts with them (speculative decoding, method "mtp"); empty where the config names none
    draft_layers: tuple[LayerSpec, ...] = ()
    # The config.json this came from. Only kvbudget.model reads it (parameters, weights, activation widths);
    # everything downstream asks those functions.
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def kinds(self) -> dict[str, int]:
        """How many cache specs of each kind the model has."""
        counts: dict[str, int] = {}
        for spec in self.layers:
            counts[spec.kind] = counts.get(spec.kind, 0) + 1
        return counts

    @property
    def has_windows(self) -> bool:
        """Some layer attends to a window or chunk only."""
        return any(isinstance(spec, WINDOWED) for spec in self.layers)

    @property
    def has_latent(self) -> bool:
        return any(isinstance(spec, LatentAttention) for spec in self.layers)

    def stage(self, layers: range) -> ModelSpec:
        """The part of the model a pipeline stage holds: the specs of `layers`."""
        return replace(self, layers=tuple(s for s in self.layers if s.layer in layers))
