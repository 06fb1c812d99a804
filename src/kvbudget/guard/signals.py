"""The two pressure signals per replica: observed (the engine's own gauge, scraped) and predicted
(what the requests in flight will hold at the end of their generation, from kvbudget's allocation)."""

from __future__ import annotations

import math
import re

from kvbudget.engines import Allocation

_GAUGES = {
    "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the new name, then the old one
    "sglang": ("sglang:token_usage",),
}


def parse_prometheus(text: str, name: str) -> float | None:
    """The largest sample of metric `name` in a Prometheus text exposition (one per engine or rank)."""
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text,
                                                        re.M)]
    return max(values) if values else None


def observed_usage(engine: str, metrics_text: str | None = None, slots: list | None = None) -> float | None:
    """The engine's reported KV usage as a 0..1 fraction, from its /metrics (or llama.cpp's /slots)."""
    if engine == "llamacpp":
        if not slots:
            return None
        slots = [s for s in slots if isinstance(s, dict)]
        total = sum(s.get("n_ctx", 0) or 0 for s in slots)
        return sum(_slot_tokens(s) for s in slots) / total if total else None
    if metrics_text is None:
        return None
    if engine == "tgi":
        current = parse_prometheus(metrics_text, "tgi_batch_current_max_tokens")
        total = parse_prometheus(metrics_text, "tgi_batch_max_total_tokens")
        return current / total if current is not None and total else None
    for name in _GAUGES.get(engine, ()):
        value = parse_prometheus(metrics_text, name)
        if value is not None:
            return value
    return None


def _slot_tokens(slot: dict) -> int:
    """Tokens a busy llama-server slot holds: its prompt plus what it has decoded (n_past in older builds)."""
    if "n_past" in slot:
        return slot["n_past"] or 0
    if not slot.get("is_processing"):
        return 0
    decoded = sum(t.get("n_decoded", 0) for t in slot.get("next_token", []) if isinstance(t, dict))
    return (slot.get("n_prompt_tokens") or 0) + decoded


class Predictor:
    """Bytes the admitted requests will hold once they have generated all their tokens, as a fraction of
    the KV budget; every number comes from the engine's Allocation for the model."""

    def __init__(self, allocation: Allocation, kv_budget_bytes: int):
        self.allocation = allocation
        self.budget = kv_budget_bytes

    def request_bytes(self, prompt_tokens: int, max_tokens: int, samples: int = 1) -> int:
        return samples * self.allocation.sequence_bytes(max(1, prompt_tokens + max_tokens))

    def fraction(self, held_bytes: int) -> float:
        return held_bytes / self.budget if self.budget else 0.0


def approximate_prompt_tokens(body: dict) -> int:
    """Characters / 4 over the messages (or prompt): the guard's fallback when it has no tokenizer."""
    if "messages" in body and isinstance(body["messages"], list):
        chars = 0
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        return math.ceil(chars / 4) + 8 * len(body["messages"])  # role markers
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    return math.ceil(len(str(prompt)) / 4)
