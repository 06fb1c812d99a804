"""What a running SGLang states about its KV cache: the pool in its server info."""

from __future__ import annotations

import json

from kvbudget.engines.metrics import PoolReport, whole_number


def sglang_pool(body: str) -> PoolReport | None:
    """SGLang's /server_info (/get_server_info before 0.5): `max_total_num_tokens` (the scheduler's), else the
    sum of each data-parallel rank's `memory_usage.token_capacity`; `context_length` where it was set
    (entrypoints/http_server.py, managers/scheduler.py `get_internal_state`)."""
    info = json.loads(body)
    if not isinstance(info, dict):
        return None
    tokens = whole_number(info.get("max_total_num_tokens"))
    if tokens is None:
        states = info.get("internal_states") or []
        capacities = [whole_number((s.get("memory_usage") or {}).get("token_capacity")) for s in states
                      if isinstance(s, dict)]
        tokens = sum(c for c in capacities if c) or None
    if tokens is None:
        return None
    page = whole_number(info.get("page_size"))
    return PoolReport(tokens=tokens, block_size=page, context=whole_number(info.get("context_length")),
                      source=f"server info: max_total_num_tokens {tokens:,}")
