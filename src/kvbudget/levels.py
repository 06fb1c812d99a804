"""The three degradation levels, defined once: the plan's degradation table, the guard's policy and its
configuration file (`kvbudget.guard.config`), and the alerts all follow this module."""

from __future__ import annotations

from dataclasses import dataclass


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
REJECT = LEVELS[-1]  # the level whose figures an engine's own admission takes


def queue_limits(max_num_seqs: int, reject_requests: int, reject_tokens: int) -> tuple[int, int]:
    """An engine's own admission limits (vLLM's --max-num-queued-reqs and --max-num-queued-tokens, 503 past them)
    from the guard's reject level (its requests of max_model_len and its tokens), so that the engine refuses no
    earlier than the guard would:
    - queued requests: max_num_seqs (the most the engine runs at once) + the requests of max_model_len the cache
      holds at the reject level (a queue as long as one more full cache);
    - queued tokens: the tokens the cache holds at the reject level (prompts still waiting for their prefill
      beyond what 95% of the cache holds could not all be admitted at once anyway)."""
    return max_num_seqs + reject_requests, max(1, reject_tokens)


def find_level(name: str | None = None, action: str | None = None) -> LevelSpec | None:
    """The level a YAML entry names, by its name or its action key."""
    for level in LEVELS:
        if (name is not None and name == level.name) or (action is not None and action == level.action):
            return level
    return None
