"""The guard's three levels and its configuration file, defined once: the plan's degradation table and the YAML
it writes (`write_config`), the policy that reads it back and the alerts all follow this module."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class LevelSpec:
    number: int  # 1, 2, 3
    name: str  # the YAML name
    key: str  # the Policy field holding its threshold
    threshold: float  # default fraction of the KV budget
    action: str  # the YAML action key: what the guard does
    meaning: str  # for people
    alert: str  # the Prometheus alert name
    severity: str  # the alert's severity label


LEVELS: tuple[LevelSpec, ...] = (
    LevelSpec(number=1, name="warn", key="warn", threshold=0.70, action="cap_max_tokens",
              meaning="log a warning and lower max_new_tokens", alert="KVCacheWarn",
              severity="warning"),
    LevelSpec(number=2, name="single-beam", key="single", threshold=0.85, action="force_single_sample",
              meaning="force a single beam / sample (n=1, no beam search)", alert="KVCacheSingleSample",
              severity="warning"),
    LevelSpec(number=3, name="reject", key="reject", threshold=0.95, action="reject_503",
              meaning="reject new requests with 503 and alert", alert="KVCacheReject",
              severity="critical"),
)
HYSTERESIS = 0.05  # levels fall only this far below their threshold


def find_level(name: str | None = None, action: str | None = None) -> LevelSpec | None:
    """The level a YAML entry names, by its name or its action key."""
    for level in LEVELS:
        if (name is not None and name == level.name) or (action is not None and action == level.action):
            return level
    return None


def write_config(*, model: str, engine: str, gpu: str, tp: int, kv_budget_bytes: int, kv_cache_tokens: int,
                 bytes_per_token: int, fixed_bytes_per_sequence: int, max_model_len: int,
                 levels: Iterable[Any]) -> str:
    """The guard's configuration as YAML (plain scalars, written without a YAML library): the deployment's KV
    figures and each level's threshold and action with what it means in bytes, tokens and requests (`levels`:
    records with name, fraction, action, kv_bytes, tokens and requests, as the planner's degradation table has)."""
    lines = [
        "# kvbudget guard configuration, written by `kvbudget plan --guard-config`",
        f"# {model} on {gpu} with {engine}; thresholds are fractions of the KV budget.",
        f"model: {model}",
        f"engine: {engine}",
        f"gpu: {gpu}",
        f"tp: {tp}",
        f"kv_budget_bytes: {kv_budget_bytes}",
        f"kv_cache_tokens: {kv_cache_tokens}",
        f"bytes_per_token: {bytes_per_token}",
        f"fixed_bytes_per_sequence: {fixed_bytes_per_sequence}",
        f"max_model_len: {max_model_len}",
        f"hysteresis: {HYSTERESIS}",
        "levels:",
    ]
    for level in levels:
        lines += [
            f"  - name: {level.name}",
            f"    threshold: {level.fraction}",
            f"    action: {level.action}",
            f"    kv_bytes: {level.kv_bytes}",
            f"    tokens: {level.tokens}",
            f"    requests: {level.requests}",
        ]
    return "\n".join(lines) + "\n"
