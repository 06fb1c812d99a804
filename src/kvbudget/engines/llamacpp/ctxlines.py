"""llama.cpp's context lines alone: a log cut after `n_ctx` / `n_seq_max` and before any cache size line.

What each build prints (ggml-org/llama.cpp; Ollama vendors the same file under llama/llama.cpp/):
- src/llama-context.cpp, from #16812 (b6900 on, `n_ctx_seq`): n_ctx = pad(n_ctx, 256); with kv_unified
  n_ctx_seq = n_ctx, else n_ctx_seq = pad(n_ctx / n_seq_max, 256) and n_ctx = n_ctx_seq x n_seq_max; then
  `llama_context: n_seq_max = N`, `n_ctx = N`, `n_ctx_seq = N`, ..., `kv_unified = true|false`.
- src/llama-context.cpp, b5000 to b6800 (`n_ctx_per_seq`): n_ctx_per_seq = n_ctx / n_seq_max (integer division),
  printed under `llama_context:` (and `llama_new_context_with_model:` in the builds before the refactor).
- src/llama.cpp before b5000 (and ik_llama.cpp): `llama_new_context_with_model: n_ctx = N` only, one cache of n_ctx
  cells for every sequence (llama_kv_cache_init's kv_size).
Each build warns `n_ctx_seq (N) > n_ctx_train (M) -- possible training context overflow` past the model's context:
the row the model allows checks the same."""

from __future__ import annotations

import re

from kvbudget.engines.base import LogRow
from kvbudget.engines.settingscheck import settings_rows
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec

CTX_PAD = 256  # GGML_PAD(n_ctx, 256) in llama_context (#16812)
MAX_CELLS = 2**32 - 1  # llama.cpp holds n_ctx, n_seq_max and the cells in uint32_t: a value past it is no log's
_FIELD = r"(?:llama_context|llama_new_context_with_model|llama_init_from_model): {name}\s+=\s*(\S{{1,12}})"


def _field(text: str, name: str) -> str | None:
    m = re.search(_FIELD.format(name=name), text)
    return m.group(1) if m else None


def _int(value: str | None, name: str) -> int | None:
    """The line's whole number; an error where it is one llama.cpp never prints (0, or past uint32)."""
    if value is None or not value.isdigit():
        return None
    return within(int(value), f"'{name} = {value}'")


def within(cells: int, what: str) -> int:
    """`cells` where llama.cpp can print it (1 to MAX_CELLS), else the one-line error naming `what` was read."""
    if not 0 < cells <= MAX_CELLS:
        raise KVBudgetError(f"check-log: the llama.cpp log's {what} is out of range: llama.cpp prints 1 to "
                            f"{MAX_CELLS:,} (uint32); pass the log as the engine printed it")
    return cells


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def found(text: str) -> bool:
    """Whether the log states the context's n_ctx (the lines this module reads)."""
    return _int(_field(text, "n_ctx"), "n_ctx") is not None


def per_sequence(text: str) -> tuple[int, str] | None:
    """The cells one sequence may hold, as the log states them, and the line that says so: n_ctx_seq (or
    n_ctx_per_seq), else n_ctx where the build prints no n_seq_max (one cache for every sequence)."""
    for name in ("n_ctx_seq", "n_ctx_per_seq"):
        if (value := _int(_field(text, name), name)) is not None:
            return value, name
    n_ctx = _int(_field(text, "n_ctx"), "n_ctx")
    return (n_ctx, "n_ctx") if n_ctx is not None and _field(text, "n_seq_max") is None else None


def rows_without_model(text: str) -> list[LogRow]:
    """The context the log states and, where it prints n_seq_max, each sequence's share of it by the build's rule."""
    n_ctx, n_seq = _int(_field(text, "n_ctx"), "n_ctx"), _int(_field(text, "n_seq_max"), "n_seq_max")
    if n_ctx is None:
        return []
    if not n_seq:
        return [LogRow("n_ctx (cells of the one cache)", f"{n_ctx:,}", "-", None,
                       "read from the log: builds before b5000 print no n_seq_max and cache n_ctx cells for all "
                       "sequences")]
    unified = _field(text, "kv_unified")
    rows = [LogRow("n_ctx, n_seq_max", f"{n_ctx:,}, {n_seq}", "-", None, "read from the log")]
    if (seq := _int(_field(text, "n_ctx_seq"), "n_ctx_seq")) is not None:  # b6900 on (#16812)
        split = _pad(n_ctx // n_seq)
        rules = {"true": [n_ctx], "false": [split]}.get(unified or "", [n_ctx, split])
        said = {"true": "kv_unified: n_ctx", "false": f"pad(n_ctx / {n_seq}, {CTX_PAD})"}.get(
            unified or "", f"n_ctx with kv_unified, else pad(n_ctx / {n_seq}, {CTX_PAD})")
        ours = " or ".join(f"{v:,}" for v in dict.fromkeys(rules))
        rows.append(LogRow("n_ctx_seq", f"{seq:,}", ours, seq in rules, f"llama_context's rule: {said}"))
        if unified == "false" or (unified is None and seq != n_ctx):
            rows.append(LogRow("n_ctx = n_ctx_seq x n_seq_max", f"{n_ctx:,}", f"{seq * n_seq:,}",
                               n_ctx == seq * n_seq, "llama_context rounds n_ctx to whole sequences"))
    elif (seq := _int(_field(text, "n_ctx_per_seq"), "n_ctx_per_seq")) is not None:  # b5000 to b6800
        rows.append(LogRow("n_ctx_per_seq", f"{seq:,}", f"{n_ctx // n_seq:,}", seq == n_ctx // n_seq,
                           f"llama_context's rule (b5000-b6800): n_ctx / {n_seq}"))
    return rows


def rows_with_model(text: str, model: ModelSpec) -> list[LogRow]:
    """The rows above and each sequence's cells within the model's context (llama.cpp warns of a training context
    overflow past n_ctx_train)."""
    seq = per_sequence(text)
    return rows_without_model(text) + (settings_rows(model, max_len=seq[0], tp=None, length_name=seq[1])
                                       if seq else [])
