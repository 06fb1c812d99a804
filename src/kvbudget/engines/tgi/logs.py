"""TGI's token limits as its start-up log states them (the launcher's `Args { ... }` block, on one line or
pretty-printed over many, and the lines it prints when it picks a default), and the rules TGI holds them to
(text-generation-inference v3.3 backends/v3/src/main.rs and launcher/src/main.rs): what check-log can check of a
TGI log that prints no KV line."""

from __future__ import annotations

import re

from kvbudget.engines.base import LogRow
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec

# The limits, each as the Args block names it (`name: Some(N)`, `name: N`; None when left to TGI) or as the launcher
# and router print the default they picked.
_LIMITS = {"max_input_tokens": ("max_input_tokens", "max_input_length", r"Maximum input tokens defaulted to"),
           "max_total_tokens": ("max_total_tokens", r"Maximum total tokens defaulted to"),
           "max_batch_prefill_tokens": ("max_batch_prefill_tokens", "max_prefill_tokens",
                                        r"Default `max_batch_prefill_tokens` to"),
           "max_batch_total_tokens": ("max_batch_total_tokens", r"Setting max batch total tokens to",
                                      r"Inferred max batch total tokens:")}
# TGI's own checks (backends/v3/src/main.rs; launcher/src/main.rs and router/src/main.rs of v1.1.0): each pair
# (smaller, larger, strict) and what TGI says when it fails
_RULES = (("max_input_tokens", "max_total_tokens", True),
          ("max_input_tokens", "max_batch_prefill_tokens", False),
          ("max_batch_prefill_tokens", "max_batch_total_tokens", False),
          ("max_total_tokens", "max_batch_total_tokens", False))
NO_POOL = ("check-log: the TGI log prints no KV line ('KV-cache blocks: N, size: B', 'Setting max batch total tokens "
           "to N'): its token limits are checked, not the KV pool; pass the log up to that line")
NOTHING = ("check-log: the TGI log prints no KV line ('KV-cache blocks: N, size: B', 'Setting max batch total "
           "tokens to N') and states none of max_input_tokens, max_total_tokens, max_batch_prefill_tokens, "
           "max_batch_total_tokens (TGI picks them at warm-up): nothing to check; pass the log up to TGI's "
           "'Setting max batch total tokens to N' line, or one started with --max-total-tokens")


# The warm-up's refusal of TGI 0.9-1.1 (server/text_generation_server/models/flash_causal_lm.py, warmup(), v0.9.4 and
# v1.1.0): the shard's RuntimeError, the router's 'Server error: ...' and the launcher's 'Error: Warmup(Generation(
# "..."))' all carry it. The warm-up batch is max_batch_prefill_tokens tokens (router/client/src/client.rs, warmup():
# requests of max_input_length truncated to fill it), so N is that limit as TGI ran it. 0.9.0-0.9.3 refused with the
# cache they had allocated for max_batch_total_tokens: "Not enough memory to handle T total tokens with N prefill
# tokens" (T that limit; N counted after the step, not checked).
WARMUP = re.compile(r"Not enough memory to handle (\d{1,12}) (prefill|total) tokens")


def warmup_rows(text: str, stated: dict[str, int], token_bytes: int | None = None) -> list[LogRow]:
    """The warm-up's refusal, where the log has one: its tokens against the limit the log states (the same number,
    by TGI's warm-up), and with the model the KV memory those tokens take on a shard."""
    m = WARMUP.search(text)
    if m is None:
        return []
    n, which = int(m.group(1)), m.group(2)
    key = "max_batch_prefill_tokens" if which == "prefill" else "max_batch_total_tokens"
    limit = stated.get(key)
    rows = [LogRow(f"warm-up refused: {which} tokens", f"{n:,}", "-" if limit is None else f"{limit:,}",
                   None if limit is None else n == limit, f"TGI's warm-up {'batch' if which == 'prefill' else 'cache'}"
                   f" is {key} tokens; it did not fit beside the weights: lower --{key.replace('_', '-')}")]
    if token_bytes is not None and (which == "prefill" or limit is None):  # else the pool's own row says it
        rows.append(LogRow("KV memory of those tokens per shard", "-", f"{n * token_bytes / 2**30:.2f} GiB", None,
                           f"{token_bytes:,} bytes per token" + (" (the warm-up also needs their activations)"
                                                                 if which == "prefill" else "")))
    return rows


REFUSED = ("check-log: the TGI log is its warm-up's refusal ('Not enough memory to handle N prefill tokens') and "
           "states none of max_input_tokens, max_batch_prefill_tokens, max_batch_total_tokens to check it against: "
           "nothing to check; pass the launcher's 'Args { ... }' block with it")


def limits(text: str) -> dict[str, int]:
    """The token limits the log states, by TGI's name (max_input_length read as max_input_tokens)."""
    found: dict[str, int] = {}
    for key, names in _LIMITS.items():
        for name in names:
            pattern = (rf"{name}\s*(\d{{1,12}})" if " " in name or name.endswith(":") else
                       rf"\b{name}[:=]\s*(?:Some\()?(\d{{1,12}})")  # '=': the router's warmup span fields
            if m := re.search(pattern, text):
                found[key] = int(m.group(1))
                break
    return found


def limit_rows(stated: dict[str, int], model: ModelSpec | None = None) -> list[LogRow]:
    """The limits stated, each shown; TGI's rules between them checked (a rule broken: TGI refuses to start, shown);
    with the model, max_total_tokens against its context. An error where the log states none."""
    if not stated:
        raise KVBudgetError(NOTHING)
    rows = [LogRow(_label(key), f"{value:,}", "-", None, "as its arguments state it (the log prints no blocks)")
            for key, value in stated.items()]
    for small, large, strict in _RULES:
        if small in stated and large in stated:
            holds = stated[small] < stated[large] if strict else stated[small] <= stated[large]
            rows.append(LogRow(f"{_label(small)} {'<' if strict else '<='} {_label(large)}", f"{stated[small]:,} / "
                               f"{stated[large]:,}", "holds" if holds else "broken", True if holds else None,
                               "TGI's rule (backends/v3/src/main.rs)" + ("" if holds else ": TGI refuses to start")))
    context = model.max_position_embeddings if model is not None else None
    if context and "max_total_tokens" in stated:
        within = stated["max_total_tokens"] <= context
        rows.append(LogRow("max total tokens within the model's context", f"{stated['max_total_tokens']:,}",
                           f"<= {context:,}", True if within else None,
                           f"{model.name if model else ''}'s max_position_embeddings (TGI's default is at most it)"
                           + ("" if within else "; beyond it only with rope scaling")))
    return rows


def _label(key: str) -> str:
    return key.replace("_", " ")
