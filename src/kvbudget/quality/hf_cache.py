"""transformers' own quantized KV caches (`QuantizedCache`, KIVI-style), run by transformers itself.

`cache_implementation="quantized"` with the quanto backend (optimum-quanto, int2 / int4) or HQQ (int2 / int4), as
transformers 5 builds them by default: groups of 64 values along axis 0, a residual window of the last 128 tokens
kept in full precision and folded into the quantized part (quantizing the dequantized states again) once it
fills. The prompt's own attention reads the unquantized K and V (the first `update` returns them), so these caches
change only what is decoded one token at a time after it: `kvbudget quality` measures them that way (measure.py:
the first half of each window in one pass, the rest token by token, against the same protocol untouched).

The quantizers are the installed packages' own; nothing here recomputes them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import FullAttention, ModelSpec


@dataclass(frozen=True)
class Backend:
    name: str  # the --kv-dtype name
    backend: str  # QuantizedCache's backend argument
    nbits: int
    package: str  # the pip package it needs
    module: str  # the module that tells it is installed

    def cache(self, spec: ModelSpec) -> Any:
        """A fresh cache for the model of `spec`, built as transformers' QuantizedCache builds it (one
        quantized layer of the backend per layer, the layer's defaults but `nbits`; full attention only)."""
        from transformers.cache_utils import Cache, HQQQuantizedLayer, QuantoQuantizedLayer

        self.require()
        others = sorted({type(s).__name__ for s in spec.layers if not isinstance(s, FullAttention)})
        if others:
            raise KVBudgetError(f"kv_dtype {self.name}: transformers' QuantizedCache takes full-attention models "
                                f"only; {spec.name} has {', '.join(others)} layers", param="kv_dtype")
        kind = QuantoQuantizedLayer if self.backend == "quanto" else HQQQuantizedLayer
        return Cache(layers=[kind(nbits=self.nbits) for _ in spec.layers])

    def require(self) -> None:
        if importlib.util.find_spec(self.module) is None:
            raise KVBudgetError(f"kv_dtype {self.name}: transformers' {self.backend} cache needs the {self.package} "
                                f"package (pip install {self.package})", param="kv_dtype")

    @property
    def bits_per_value(self) -> float:
        """Nominal: the codes plus a 16-bit scale and zero point per group of 64 values."""
        return self.nbits + 2 * 16 / 64


TYPES = {b.name: b for b in (Backend("quanto_int4", "quanto", 4, "optimum-quanto", "optimum.quanto"),
                             Backend("quanto_int2", "quanto", 2, "optimum-quanto", "optimum.quanto"),
                             Backend("hqq_int4", "hqq", 4, "hqq", "hqq"),
                             Backend("hqq_int2", "hqq", 2, "hqq", "hqq"))}
