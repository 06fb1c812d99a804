"""vLLM's scaled KV cache formats (vllm 0.32, v1/attention/ops/triton_reshape_and_cache_flash.py).

- fp8 / fp8_e4m3 / fp8_e5m2: each value divided by the layer's scale (1.0 unless the checkpoint ships calibrated
  k_scale / v_scale: vLLM runs uncalibrated by default) and stored as float8, rounded to nearest even and
  saturated at the format's largest finite value (e4m3 448, e5m2 57,344); read back times the scale.
- int8_per_token_head / fp8_per_token_head: one float32 scale per token and head, max(max|x| / Q, 1e-6) with
  Q = 127 (int8) or 448 (e4m3); int8 codes round half away from zero, then clamp to [-128, 127].
Computed with torch's float8 types (the CPU and GPU kernels convert the same way for finite values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScaledType:
    name: str
    per_token_head: bool  # a scale per token and head (else one per layer)
    target: torch.dtype  # float8_e4m3fn, float8_e5m2 or int8

    @property
    def limit(self) -> float:
        if self.target == torch.int8:
            return 127.0
        return float(torch.finfo(self.target).max)

    def round_trip(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """x (..., head_dim), as the attention kernel reads it back from the cache, in x's dtype."""
        v = x.to(torch.float32)
        if self.per_token_head:
            s = torch.clamp(v.abs().amax(dim=-1, keepdim=True) / self.limit, min=1e-6)
        else:
            s = torch.tensor(scale, dtype=torch.float32)
        q = v * (1.0 / s)
        if self.target == torch.int8:
            q = torch.clamp(torch.trunc(q + torch.where(q >= 0, 0.5, -0.5)), -128.0, 127.0)
        else:
            q = torch.clamp(q, -self.limit, self.limit).to(self.target).to(torch.float32)
        return (q * s).to(x.dtype)


TYPES = {t.name: t for t in (ScaledType("fp8", False, torch.float8_e4m3fn),
                             ScaledType("fp8_e4m3", False, torch.float8_e4m3fn),
                             ScaledType("fp8_e5m2", False, torch.float8_e5m2),
                             ScaledType("int8_per_token_head", True, torch.int8),
                             ScaledType("fp8_per_token_head", True, torch.float8_e4m3fn))}
