"""Engines: one small module each, behind the seam in `base`, and the registry that names them.

Adding an engine is one module with an `Engine` subclass and one `register()` call (or one line below).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    Engine,
    EngineOptions,
    LogCheck,
    LogRow,
    ReadsLogs,
    Serving,
)
from kvbudget.engines.nomodel import ReadsLogsWithoutModel
from kvbudget.errors import KVBudgetError

# The built-in engines by name, loaded on first use (a command that runs one engine imports only its module).
BUILT_IN = {"hf": ("kvbudget.engines.hf", "HF"), "hf-static": ("kvbudget.engines.hf", "HF_STATIC"),
            "vllm": ("kvbudget.engines.vllm", "VLLM"), "sglang": ("kvbudget.engines.sglang", "SGLANG"),
            "llamacpp": ("kvbudget.engines.llamacpp", "LLAMACPP"), "tgi": ("kvbudget.engines.tgi", "TGI")}


class Registry(Mapping[str, Engine]):
    """Engines by name, in registration order: the built-in ones imported when first looked up."""

    def __init__(self) -> None:
        self._names: list[str] = list(BUILT_IN)
        self._loaded: dict[str, Engine] = {}

    def __getitem__(self, name: str) -> Engine:
        engine = self._loaded.get(name)
        if engine is None:
            if name not in BUILT_IN:
                raise KeyError(name)
            module, attr = BUILT_IN[name]
            engine = self._loaded[name] = getattr(importlib.import_module(module), attr)
        return engine

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in BUILT_IN

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def add(self, engine: Engine) -> None:
        self._loaded[engine.name] = engine
        if engine.name not in self._names:
            self._names.append(engine.name)


ENGINES = Registry()


def register(engine: Engine) -> Engine:
    """Make `engine` known by its name to estimate(), plan() and the command line."""
    if not isinstance(engine, Engine):
        raise TypeError(f"{engine!r} is not a kvbudget.engines.Engine")
    ENGINES.add(engine)
    return engine


def get_engine(engine: str | Engine) -> Engine:
    """A registered engine by name, or the engine object itself."""
    if isinstance(engine, Engine):
        return engine
    try:
        return ENGINES[engine]
    except KeyError:
        raise KVBudgetError(f"engine: unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}",
                            param="engine") from None


def engine_release(engine: str) -> tuple[str, tuple[int, ...] | None]:
    """The engine `NAME@VERSION` names and the release it models (None for the newest); a release the engine does
    not model is the engine parameter's error here, where the person wrote NAME@VERSION."""
    name, at, version = engine.partition("@")
    if not at:
        return name, None
    try:
        return name, get_engine(name).parse_release(version)
    except KVBudgetError as exc:
        if exc.param != "engine_version":
            raise
        why = exc.args[0].split(": ", 1)[-1]
        raise type(exc)(f"engine {engine}: {why}", param="engine") from None


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
    "ReadsLogs",
    "ReadsLogsWithoutModel",
    "Registry",
    "Serving",
    "engine_release",
    "get_engine",
    "register",
    "serving_engines",
]
