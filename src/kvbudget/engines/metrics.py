"""Reading a running engine's KV usage: Prometheus text exposition and llama-server's /slots JSON."""

from __future__ import annotations

import json
import re


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
