"""What each layer of a model caches, independent of any engine.

One spec object per cache a layer keeps. A layer with two caches (Falcon-H1 runs attention and a Mamba
mixer side by side) has two specs with the same `layer` index; a layer with none has `NoCache`.
Sizes are element counts and shapes; bytes are the engines' business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(frozen=True)
class FullAttention:
    """K and V for every token: K is `kv_heads x k_dim`, V is `kv_heads x v_dim` per token."""

    layer: int
    kv_heads: int
    k_dim: int
    v_dim: int

    kind = "full_attention"


@dataclass(frozen=True)
class SlidingWindow(FullAttention):
    """Attention over the last `window` tokens only (Mistral-7B-v0.1, Gemma-2/3 local layers, gpt-oss)."""

    window: int

    kind = "sliding_window"


@dataclass(frozen=True)
class ChunkedLocal(FullAttention):
    """Attention within fixed chunks of `chunk` tokens (Llama-4's local layers)."""

    chunk: int

    kind = "chunked_local"


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).

    The model needs only the compressed latent (`latent_dim`, kv_lora_rank) and one shared rope key
    (`rope_dim`) per token; engines that expand it cache `heads` K heads of `qk_nope_dim + rope_dim`
    and V heads of `v_dim` instead.
    """

    layer: int
    latent_dim: int
    rope_dim: int
    heads: int
    qk_nope_dim: int
    v_dim: int

    kind = "latent_attention"

    @property
    def expanded_k_dim(self) -> int:
        return self.qk_nope_dim + self.rope_dim


@dataclass(frozen=True)
class RecurrentState:
    """A fixed-size per-sequence state (Mamba, Mamba-2, gated delta net linear attention).

    `conv_channels x conv_kernel` is the causal-convolution window (engines keep `conv_kernel` or
    `conv_kernel - 1` columns); `state_shape` is the recurrent (SSM) state. `heads` is the dimension
    tensor parallelism splits.
    """

    layer: int
    mixer: str  # "mamba", "mamba2" or "gated_delta_net"
    conv_channels: int
    conv_kernel: int
    state_shape: tuple[int, ...]
    heads: int
    groups: int = 1  # Mamba-2 B/C groups (conv channels = d_ssm + 2 x groups x d_state)

    kind = "recurrent_state"


@dataclass(frozen=True)
class NoCache:
    """A layer that caches nothing."""

    layer: int

    kind = "no_cache"


LayerSpec = Union[FullAttention, SlidingWindow, ChunkedLocal, LatentAttention, RecurrentState, NoCache]
AttentionSpec = (FullAttention, SlidingWindow, ChunkedLocal)


@dataclass(frozen=True)
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
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the config.json read

    def kinds(self) -> dict[str, int]:
        """How many cache specs of each kind the model has."""
        counts: dict[str, int] = {}
        for spec in self.layers:
            counts[spec.kind] = counts.get(spec.kind, 0) + 1
        return counts
