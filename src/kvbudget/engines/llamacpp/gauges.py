"""What a running llama-server states about its KV cache: the slots' usage (/slots) and the pool (/props)."""

from __future__ import annotations

import json

from kvbudget.engines.metrics import PoolReport, whole_number


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


def llamacpp_pool(body: str) -> PoolReport | None:
    """llama-server's /props: `total_slots` slots of `default_generation_settings.n_ctx` cells each. That n_ctx is
    a slot's context, the longest request it takes (tools/server/server-context.cpp of the llama.cpp in
    llama-cpp-python 0.3.36, get_res_props: `meta.slot_n_ctx`, n_ctx_slot(): llama_n_ctx_seq, the server's -c over
    its -np slots padded to 256, or the whole -c with --kv-unified, capped by --kv-unified-per-slot and the model's
    training context). Whether the cells are one unified pool is not stated there: counted as slots x n_ctx, as
    /slots' usage counts them."""
    props = json.loads(body)
    if not isinstance(props, dict):
        return None
    n_ctx = whole_number((props.get("default_generation_settings") or {}).get("n_ctx"))
    slots = whole_number(props.get("total_slots")) or 1
    if n_ctx is None:
        return None
    return PoolReport(tokens=n_ctx * slots, context=n_ctx,
                      source=f"/props: {slots} slot{'s' if slots > 1 else ''} of {n_ctx:,} tokens")
