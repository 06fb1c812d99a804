"""Engines: one small module each, behind the seam in `base`, and the registry that names them.

Adding an engine is one module with an `Engine` subclass and one `register()` call (or one line below).
"""

from __future__ import annotations

from kvbudget.engines.base import Allocation, CacheGroup, Capacity, Engine, EngineOptions, LogCheck, LogRow, Serving
from kvbudget.engines.hf import HF, HF_STATIC
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.sglang import SGLANG
from kvbudget.engines.tgi import TGI
from kvbudget.engines.vllm import VLLM
from kvbudget.errors import KVBudgetError

ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Make `engine` known by its name to estimate(), plan() and the command line."""
    if not isinstance(engine, Engine):
        raise TypeError(f"{engine!r} is not a kvbudget.engines.Engine")
    ENGINES[engine.name] = engine
    return engine


for _engine in (HF, HF_STATIC, VLLM, SGLANG, LLAMACPP, TGI):
    register(_engine)


def get_engine(engine: str | Engine) -> Engine:
    """A registered engine by name, or the engine object itself."""
    if isinstance(engine, Engine):
        return engine
    if engine not in ENGINES:
        raise KVBudgetError(f"engine: unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}", param="engine")
    return ENGINES[engine]


def serving_engines() -> tuple[Engine, ...]:
    """The registered engines that run as servers (with a usage gauge for the guard and alerts)."""
    return tuple(e for e in ENGINES.values() if e.serves and e.usage is not None)


__all__ = [
    "ENGINES",
    "Allocation",
    "CacheGroup",
    "Capacity",
    "Engine",
    "EngineOptions",
    "LogCheck",
    "LogRow",
    "Serving",
    "get_engine",
    "register",
    "serving_engines",
]
