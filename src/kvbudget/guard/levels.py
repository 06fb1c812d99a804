"""The guard's three levels, defined once: the plan's degradation table and YAML, the policy and the alerts
all read this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
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
    LevelSpec(1, "warn", "warn", 0.70, "cap_max_tokens", "log a warning and lower max_new_tokens", "KVCacheWarn",
              "warning"),
    LevelSpec(2, "single-beam", "single", 0.85, "force_single_sample",
              "force a single beam / sample (n=1, no beam search)", "KVCacheSingleSample", "warning"),
    LevelSpec(3, "reject", "reject", 0.95, "reject_503", "reject new requests with 503 and alert", "KVCacheReject",
              "critical"),
)
HYSTERESIS = 0.05  # levels fall only this far below their threshold


def find_level(name: str | None = None, action: str | None = None) -> LevelSpec | None:
    """The level a YAML entry names, by its name or its action key."""
    for level in LEVELS:
        if (name is not None and name == level.name) or (action is not None and action == level.action):
            return level
    return None
