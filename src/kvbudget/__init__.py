"""kvbudget: exact KV-cache memory for LLM serving.

    >>> import kvbudget
    >>> model = kvbudget.load_model("llama-3.1-8b")
    >>> kvbudget.estimate(model, batch=[1, 8], context=[4096]).bytes_per_token
    131072

The public API: `load_model` (a catalog name, config file, model folder, Hub id or config dict -> ModelSpec),
`estimate` (the memory map on one engine), `plan` (weights, budget, capacity and advice on a GPU), `compare`
(models side by side), `count_prompt` (exact prompt tokens), `simulate` (traffic through the engine's scheduler
and allocator; workloads and searches in `kvbudget.simulation`), and the types they return. Engines are named by
their registered names (`ENGINES`) or passed as `Engine` objects; `register` adds one. Every error is a
`KVBudgetError`, subclassed by what went wrong.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own flag, without importing typing (mypy reads this name the same way)
if TYPE_CHECKING:
    from typing import Any

    from kvbudget import catalog
    from kvbudget.comparison import Comparison, compare
    from kvbudget.dtypes import KVDtype, get_dtype
    from kvbudget.engines import (
        ENGINES,
        Allocation,
        CacheGroup,
        Capacity,
        Engine,
        EngineOptions,
        get_engine,
        register,
    )
    from kvbudget.errors import (
        BudgetError,
        ConfigError,
        EngineRuleError,
        KVBudgetError,
        TokenizerError,
        UnsupportedArchitectureError,
        UpstreamConfigError,
    )
    from kvbudget.estimator import Estimate, Point, estimate
    from kvbudget.model.config import parse_config
    from kvbudget.model.load import load_model
    from kvbudget.model.spec import (
        Attention,
        ChunkedLocal,
        FullAttention,
        LatentAttention,
        LayerSpec,
        ModelSpec,
        NoCache,
        RecurrentState,
        SlidingWindow,
    )
    from kvbudget.planner import Plan, plan
    from kvbudget.simulation import Simulation, simulate
    from kvbudget.tokens import PromptCount, count_prompt

# Every public name loads on first use, so that `import kvbudget` costs next to nothing and a command imports
# only what it runs (`kvbudget estimate` never loads the planner, the guard or the other engines).
_WHERE = {
    "kvbudget.dtypes": ("KVDtype", "get_dtype"),
    "kvbudget.engines": ("ENGINES", "Allocation", "CacheGroup", "Capacity", "Engine", "EngineOptions", "get_engine",
                         "register"),
    "kvbudget.errors": ("BudgetError", "ConfigError", "EngineRuleError", "KVBudgetError", "TokenizerError",
                        "UnsupportedArchitectureError", "UpstreamConfigError"),
    "kvbudget.estimator": ("Estimate", "Point", "estimate"),
    "kvbudget.model.config": ("parse_config",),
    "kvbudget.model.load": ("load_model",),
    "kvbudget.model.spec": ("Attention", "ChunkedLocal", "FullAttention", "LatentAttention", "LayerSpec",
                            "ModelSpec", "NoCache", "RecurrentState", "SlidingWindow"),
    "kvbudget.planner": ("Plan", "plan"),
    "kvbudget.comparison": ("Comparison", "compare"),
    "kvbudget.simulation": ("Simulation", "simulate"),
    "kvbudget.tokens": ("PromptCount", "count_prompt"),
}
_LAZY = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "catalog":
        value = importlib.import_module("kvbudget.catalog")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'kvbudget' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "ENGINES",
    "Allocation",
    "Attention",
    "BudgetError",
    "CacheGroup",
    "Capacity",
    "ChunkedLocal",
    "Comparison",
    "ConfigError",
    "Engine",
    "EngineOptions",
    "EngineRuleError",
    "Estimate",
    "FullAttention",
    "KVBudgetError",
    "KVDtype",
    "LatentAttention",
    "LayerSpec",
    "ModelSpec",
    "NoCache",
    "Plan",
    "Point",
    "PromptCount",
    "RecurrentState",
    "Simulation",
    "SlidingWindow",
    "TokenizerError",
    "UnsupportedArchitectureError",
    "UpstreamConfigError",
    "catalog",
    "compare",
    "count_prompt",
    "estimate",
    "get_dtype",
    "get_engine",
    "load_model",
    "parse_config",
    "plan",
    "register",
    "simulate",
]
