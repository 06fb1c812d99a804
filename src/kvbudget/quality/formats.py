"""The cache formats `kvbudget quality` compares, by the names engines use (`--kv-dtype`): what K and V look like
after a trip through the cache. llama.cpp's block types (ggml.py), vLLM's scaled formats (scaled.py), and plain
float16 / bfloat16. A variant names one format for both, or K and V apart ("k=q8_0,v=q4_0")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbudget.errors import KVBudgetError
from kvbudget.quality import ggml, scaled

FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
NAMES = (*FLOATS, *ggml.TYPES, *scaled.TYPES)


def store(name: str, head_dim: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function from K or V ([batch, heads, tokens, head_dim], float) to what the cache gives back."""
    if name in FLOATS:
        target = FLOATS[name]
        return lambda x: x.to(target).to(x.dtype)
    if name in ggml.TYPES:
        if head_dim % ggml.BLOCK:
            raise KVBudgetError(f"kv-dtype {name}: llama.cpp stores it in blocks of {ggml.BLOCK} values along the "
                                f"head dim, and this model's head dim is {head_dim}; choose f16, q8_0 only where "
                                "it divides, or a vLLM format", param="kv_dtype")
        kind = ggml.TYPES[name]
        return lambda x: torch.from_numpy(kind.round_trip(x.detach().to(torch.float32).numpy())).to(x.dtype)
    if name in scaled.TYPES:
        return scaled.TYPES[name].round_trip
    raise KVBudgetError(f"kv-dtype {name!r}: choose from {', '.join(NAMES)}", param="kv_dtype")


@dataclass(frozen=True)
class Variant:
    """One cache to compare: K's format and V's."""

    k: str
    v: str

    @property
    def name(self) -> str:
        return self.k if self.k == self.v else f"k={self.k},v={self.v}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        """'q8_0' (both) or 'k=q8_0,v=q4_0'."""
        text = text.strip()
        if "=" not in text:
            if text not in NAMES:
                raise KVBudgetError(f"kv-dtype {text!r}: choose from {', '.join(NAMES)}, or k=...,v=...",
                                    param="kv_dtype")
            return cls(text, text)
        parts: dict[str, str] = {}
        for piece in text.split(","):
            half, _, value = piece.rpartition("=")
            parts[half.strip()] = value.strip()
        if set(parts) != {"k", "v"}:
            raise KVBudgetError(f"kv-dtype {text!r}: give both halves as k=FORMAT,v=FORMAT", param="kv_dtype")
        for half in parts.values():
            if half not in NAMES:
                raise KVBudgetError(f"kv-dtype {text!r}: {half!r} is not a format; choose from {', '.join(NAMES)}",
                                    param="kv_dtype")
        return cls(parts["k"], parts["v"])

