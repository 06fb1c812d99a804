"""Engines: one small module each, behind the seam in `base`."""

from __future__ import annotations

from kvbudget.engines.base import Allocation, CacheGroup, Capacity, Engine, EngineOptions
from kvbudget.engines.hf import HF, HF_STATIC
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.sglang import SGLANG
from kvbudget.engines.tgi import TGI
from kvbudget.engines.vllm import VLLM
from kvbudget.errors import KVBudgetError

ENGINES: dict[str, Engine] = {e.name: e for e in (HF, HF_STATIC, VLLM, SGLANG, LLAMACPP, TGI)}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise KVBudgetError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}")
    return ENGINES[name]


__all__ = ["Allocation", "CacheGroup", "Capacity", "Engine", "EngineOptions", "ENGINES", "get_engine"]
