"""What a running TGI states about its KV cache: the pool in its /info."""

from __future__ import annotations

import json

from kvbudget.engines.metrics import PoolReport, whole_number


def tgi_pool(body: str) -> PoolReport | None:
    """TGI's /info: `max_batch_total_tokens` (the tokens its warm-up found room for), `max_total_tokens` the
    longest request (router/src/lib.rs `Info`)."""
    info = json.loads(body)
    if not isinstance(info, dict):
        return None
    tokens = whole_number(info.get("max_batch_total_tokens"))
    if tokens is None:
        return None
    return PoolReport(tokens=tokens, context=whole_number(info.get("max_total_tokens")),
                      source=f"/info: max_batch_total_tokens {tokens:,}")
