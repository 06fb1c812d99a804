"""The cache formats `kvbudget quality` compares, by the names engines use (`--kv-dtype`): what K and V look like
after a trip through the cache. llama.cpp's block types (ggml.py), vLLM's scaled formats (scaled.py), and plain
float16 / bfloat16. A variant names one format for both, or K and V apart ("k=q8_0,v=q4_0")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbudget.errors import KVBudgetError
from kvbudget.quality import ggml, hf_cache, names, scaled
from kvbudget.quality.names import NAMES

FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Walsh-Hadamard matrix of order n (a power of two), symmetric: H·H = I."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)])
    return h / n**0.5


def rotation(head_dim: int, half: str) -> int:
    """The order of the Hadamard rotation llama.cpp applies to K (with Q) or V (undone on the output) when the
    cache type is quantized and the head dim is a multiple of 64 (llama-kv-cache.cpp, attn_rot_k / attn_rot_v;
    LLAMA_ATTN_ROT_DISABLE=1 turns it off): K the largest power of two dividing the head dim, V 64; 0 for none."""
    if head_dim % 64:
        return 0
    if half == "v":
        return 64
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def store(name: str, head_dim: int, half: str = "k", scale: float = 1.0) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function from K or V ([batch, heads, tokens, head_dim], float) to what attention effectively reads back
    (for llama.cpp's block types after its rotation: rotating Q with K, and V's output back, leaves attention
    unchanged but for what the quantizer does to the rotated values). `scale`: the layer's scale for vLLM's
    per-tensor formats (fp8*)."""
    if name in FLOATS:
        target = FLOATS[name]
        return lambda x: x.to(target).to(x.dtype)
    if name in ggml.TYPES:
        if head_dim % ggml.BLOCK:
            raise KVBudgetError(f"kv_dtype {name}: llama.cpp stores it in blocks of {ggml.BLOCK} values along the "
                                f"head dim, and this model's head dim is {head_dim}; choose f16, q8_0 only where "
                                "it divides, or a vLLM format", param="kv_dtype")
        return _blocks(ggml.TYPES[name], rotation(head_dim, half))
    if name in scaled.TYPES:
        kind = scaled.TYPES[name]
        return lambda x: kind.round_trip(x, scale)
    if name in hf_cache.TYPES:
        raise KVBudgetError(f"kv_dtype {name}: transformers' whole cache, not a per-layer format (measure.py "
                            "runs it as its own cache)", param="kv_dtype")
    raise KVBudgetError(f"kv_dtype {name!r}: choose from {', '.join(NAMES)}", param="kv_dtype")


def _blocks(kind: ggml.BlockType, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    h = hadamard(n) if n else None

    def blocks(x: torch.Tensor) -> torch.Tensor:
        values = x.detach().to(torch.float32)
        if h is not None:
            values = (values.reshape(*values.shape[:-1], -1, n) @ h).reshape(values.shape)
        back = torch.from_numpy(kind.round_trip(values.numpy()))
        if h is not None:
            back = (back.reshape(*back.shape[:-1], -1, n) @ h).reshape(back.shape)
        return back.to(x.dtype)

    return blocks


def query_store(k_name: str, head_dim: int, llamacpp: bool = False) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What llama.cpp's attention does to Q against a K cache of one of its block types: Q (rotated with K)
    goes into 8-bit blocks for the integer dot product (ggml-cpu ops.cpp, flash attention: `q_to_vec_dot`, the
    K type's vec_dot_type q8_0, or q8_1 with the same codes for q4_1 / q5_1). With `llamacpp` (llama.cpp's
    arithmetic throughout) Q also goes to f16 against an f16 or f32 K (an f32 cache is cast to f16 for flash
    attention: llama-graph.cpp) and to bf16 against bf16. None: Q as it is."""
    if k_name in ggml.TYPES:
        return _blocks(ggml.TYPES["q8_0"], rotation(head_dim, "k"))
    if llamacpp and k_name in FLOATS:
        half = torch.bfloat16 if k_name == "bf16" else torch.float16
        return lambda x: x.to(half).to(x.dtype)
    return None


def as_llamacpp_keeps(name: str) -> str:
    """The format llama.cpp's flash attention reads a cache type as: f32 is cast to f16 (llama-graph.cpp)."""
    return "f16" if name == "f32" else name


def bits_per_value(name: str) -> float:
    """Storage bits per K or V value of a format ('k=..,v=..': the mean of the two), scales included."""
    if "=" in name:
        v = Variant.parse(name)
        return (bits_per_value(v.k) + bits_per_value(v.v)) / 2
    if name in FLOATS:
        return float(torch.finfo(FLOATS[name]).bits)
    if name in ggml.TYPES:
        return 8 * ggml.TYPES[name].nbytes / ggml.BLOCK
    if name in hf_cache.TYPES:
        return hf_cache.TYPES[name].bits_per_value
    return 8.0  # vLLM's 8-bit formats (per-token scales aside)


@dataclass(frozen=True)
class Variant:
    """One cache to compare: K's format and V's."""

    k: str
    v: str
    scales: tuple[tuple[float, float], ...] | None = None  # (K, V) scale per layer (None: 1.0, uncalibrated)

    @property
    def name(self) -> str:
        plain = self.k if self.k == self.v else f"k={self.k},v={self.v}"
        return f"{plain} dyn" if self.scales is not None else plain

    @property
    def backend(self) -> hf_cache.Backend | None:
        """transformers' QuantizedCache backend this variant is, if it is one (then K and V are the same)."""
        return hf_cache.TYPES.get(self.k)

    @property
    def scaled(self) -> bool:
        """Whether K or V is in one of vLLM's formats with one scale per layer (fp8, fp8_e4m3, fp8_e5m2)."""
        return any(name in scaled.TYPES and not scaled.TYPES[name].per_token_head for name in (self.k, self.v))

    def scale(self, layer: int, half: str) -> float:
        return 1.0 if self.scales is None else self.scales[layer][0 if half == "k" else 1]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """'q8_0' (both) or 'k=q8_0,v=q4_0'."""
        return cls(*names.split(text))

