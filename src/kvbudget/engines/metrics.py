"""Reading a running engine's KV usage (Prometheus text exposition, llama-server's /slots JSON) and the KV pool
it states (vLLM's cache_config_info, SGLang's server info, llama-server's /props, TGI's /info)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvbudget.engines.base import EngineOptions
    from kvbudget.model.spec import ModelSpec


def parse_prometheus(text: str, name: str) -> float | None:
    """The largest sample of metric `name` in a Prometheus text exposition (one per engine or rank)."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text,
                                                        re.M)]
    return max(values) if values else None


def first_gauge(text: str, names: tuple[str, ...]) -> float | None:
    """The first of `names` the exposition has (a metric's current name, then the names it had before)."""
    for name in names:
        value = parse_prometheus(text, name)
        if value is not None:
            return value
    return None


def gauge_ratio(text: str, used: str, total: str) -> float | None:
    """used / total from two gauges of one exposition."""
    current, whole = parse_prometheus(text, used), parse_prometheus(text, total)
    return current / whole if current is not None and whole else None


def slots_usage(body: str) -> float | None:
    """llama-server's /slots: tokens the busy slots hold over the cells of all slots."""
    slots = json.loads(body)
    if not isinstance(slots, list):
        return None
    slots = [s for s in slots if isinstance(s, dict)]
    total = sum(s.get("n_ctx", 0) or 0 for s in slots)
    return sum(_slot_tokens(s) for s in slots) / total if total else None


def _slot_tokens(slot: dict) -> int:
    """Tokens a busy llama-server slot holds: its prompt plus what it has decoded (n_past in older builds)."""
    if "n_past" in slot:
        return int(slot["n_past"] or 0)
    if not slot.get("is_processing"):
        return 0
    decoded = sum(t.get("n_decoded", 0) for t in slot.get("next_token", []) if isinstance(t, dict))
    return int((slot.get("n_prompt_tokens") or 0) + decoded)


# --- the pool a running engine states ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PoolReport:
    """A running engine's KV pool, as the engine itself states it."""

    tokens: int  # token slots of the pool (blocks x block size where it has blocks)
    source: str  # where it was read, in words
    blocks: int | None = None
    block_size: int | None = None
    context: int | None = None  # the longest request it takes, where it says


@dataclass(frozen=True, kw_only=True)
class PoolGauge:
    """Where a running engine states its KV pool (the first of `paths` that answers) and how to read it."""

    paths: tuple[str, ...]
    read: Callable[[str], PoolReport | None]  # the body -> the pool, or None when it states none (yet)


@runtime_checkable
class ReportsPool(Protocol):
    """An engine that states its KV pool while it runs."""

    pool_gauge: PoolGauge

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """The KV budget, in this engine's allocation of `model`, that holds the pool `report` states."""


def tokens_budget(engine: Any, model: ModelSpec, report: PoolReport, kv_dtype: str = "auto", tp: int = 1,
                  options: EngineOptions | None = None) -> int:
    """The budget of a pool counted in tokens: its tokens at the bytes per token of the engine's allocation."""
    from kvbudget.engines.base import EngineOptions

    return report.tokens * engine.allocate(model, kv_dtype, tp, options or EngineOptions()).bytes_per_token


def _whole(value: Any) -> int | None:
    """A positive whole number, or None (a label "None", a missing field, a boolean)."""
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number > 0 else None


def vllm_pool(text: str) -> PoolReport | None:
    """vLLM's /metrics: `vllm:cache_config_info{...num_gpu_blocks="N",block_size="B"...} 1` (every cache setting
    as a label, v1/metrics/loggers.py `log_metrics_info`; num_gpu_blocks is the sum over data-parallel engines)."""
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    if m is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    blocks, size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
    if blocks is None or size is None:
        return None
    return PoolReport(tokens=blocks * size, blocks=blocks, block_size=size,
                      source=f"/metrics cache_config_info: {blocks:,} blocks of {size}")


def sglang_pool(body: str) -> PoolReport | None:
    """SGLang's /server_info (/get_server_info before 0.5): `max_total_num_tokens` (the scheduler's), else the
    sum of each data-parallel rank's `memory_usage.token_capacity`; `context_length` where it was set
    (entrypoints/http_server.py, managers/scheduler.py `get_internal_state`)."""
    info = json.loads(body)
    if not isinstance(info, dict):
        return None
    tokens = _whole(info.get("max_total_num_tokens"))
    if tokens is None:
        states = info.get("internal_states") or []
        capacities = [_whole((s.get("memory_usage") or {}).get("token_capacity")) for s in states
                      if isinstance(s, dict)]
        tokens = sum(c for c in capacities if c) or None
    if tokens is None:
        return None
    page = _whole(info.get("page_size"))
    return PoolReport(tokens=tokens, block_size=page, context=_whole(info.get("context_length")),
                      source=f"server info: max_total_num_tokens {tokens:,}")


def llamacpp_pool(body: str) -> PoolReport | None:
    """llama-server's /props: `total_slots` slots of `default_generation_settings.n_ctx` cells each. Whether the
    cells are one unified pool is not stated there: counted as slots x n_ctx, as /slots' usage counts them."""
    props = json.loads(body)
    if not isinstance(props, dict):
        return None
    n_ctx = _whole((props.get("default_generation_settings") or {}).get("n_ctx"))
    slots = _whole(props.get("total_slots")) or 1
    if n_ctx is None:
        return None
    return PoolReport(tokens=n_ctx * slots, context=n_ctx,
                      source=f"/props: {slots} slot{'s' if slots > 1 else ''} of {n_ctx:,} tokens")


def tgi_pool(body: str) -> PoolReport | None:
    """TGI's /info: `max_batch_total_tokens` (the tokens its warm-up found room for), `max_total_tokens` the
    longest request (router/src/lib.rs `Info`)."""
    info = json.loads(body)
    if not isinstance(info, dict):
        return None
    tokens = _whole(info.get("max_batch_total_tokens"))
    if tokens is None:
        return None
    return PoolReport(tokens=tokens, context=_whole(info.get("max_total_tokens")),
                      source=f"/info: max_batch_total_tokens {tokens:,}")
