"""The most of a card an engine that sizes its cache after warm-up can take (vLLM 0.34's extensible KV cache)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class FreeMemoryCap:
    """An engine that sizes its cache from the memory left free after its warm-up (vLLM 0.34's extensible KV
    cache): its share is capped at the card less `in_use` bytes in use before it started (an estimate) less a margin
    of max(`floor`, `fraction` x the activation peak)."""

    in_use: int
    floor: int
    fraction: float
    note: str

    def limit(self, gpu_memory: int, activation: int) -> int:
        return gpu_memory - self.in_use - max(self.floor, int(activation * self.fraction))
