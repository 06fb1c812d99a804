"""SGLang start-up logs without a pool line: the refusal a profiled pool below zero makes, and the server arguments
alone (`server_args=ServerArgs(...)`, printed by every release before the model loads).

python/sglang/srt/model_executor/model_runner.py (init_memory_pool, 0.3-0.5; _apply_token_constraints from 0.5.4)
warns "max_total_tokens=M is larger than the profiled value P. Use the profiled value instead." where
--max-total-tokens exceeds the profiled pool, then raises "Not enough memory. Please try to increase
--mem-fraction-static." where the pool is 0 or less: P is the pool in tokens (positive: the pool it kept), every rank
printing its own under an '[... DPn TPn]' prefix."""

from __future__ import annotations

import re
from collections.abc import Callable

from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.engines.settingscheck import settings_rows
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB
from kvbudget.validate import positive

PROFILED = re.compile(r"max_total_tokens=\d{1,12} is larger than the profiled value (-?\d{1,15})")
SERVER_ARGS = r"server_args=ServerArgs\("
# model_runner.py load_model (0.3 on): "Load weight end. type=..., avail mem=X GB, mem usage=Y GB." on every rank
LOAD_END = r"Load weight end\.[^\n]{0,400}avail mem=-?[\d.]{1,12} GB"
# model_runner.py _profile_available_bytes (2026): rest = available - pre_model_load_memory x (1 -
# mem_fraction_static), the available memory after the weights and pre_model_load_memory before them (GB: GiB); at 0
# or less it raises "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=F. Raise
# --mem-fraction-static above S (minimum viable = 1 - available/pre = M). ..."
NO_KV_MEMORY = re.compile(r"Loaded weights leave no GPU memory for the KV cache under\s+--mem-fraction-static="
                          r"(\d{1,3}(?:\.\d{1,6})?)")
_MINIMUM = re.compile(r"minimum viable = 1 - available/pre = (\d{1,3}(?:\.\d{1,6})?)")
_LOADS = re.compile(r"Load weight (begin|end)\.[^\n]{0,400}?avail mem=(-?\d{1,9}(?:\.\d{1,6})?) GB"
                    r"(?:, mem usage=(\d{1,9}(?:\.\d{1,6})?) GB)?")
SIGNATURES = (PROFILED.pattern, SERVER_ARGS, LOAD_END, NO_KV_MEMORY.pattern)
LACKS = ("check-log: the SGLang log lacks 'KV Cache is allocated. #tokens: N, K size: ..., V size' (or 'KV size' for "
         "MLA models) and 'max_total_num_tokens='")
CUT = (f"{LACKS}: it stops before the pool is sized, and its other lines (weights loaded, free memory) check nothing "
       "alone; pass the log up to its 'KV Cache is allocated' line")
_RANK_TP = re.compile(r"\[[^\]\n]{0,80}\bTP(\d{1,4})\]")


def profiled(text: str) -> list[int]:
    """Every rank's profiled pool (tokens) as its warning printed it."""
    return [int(p) for p in PROFILED.findall(text)]


def tp_of(text: str, given: dict) -> tuple[int, str | None]:
    """The tensor parallel size: given, else the server arguments', else the ranks' prefixes' ('[... TP7]': 8);
    and where it was read (None: assumed 1)."""
    if given.get("tp"):
        return int(given["tp"]), "given"
    if m := re.search(r"(?:--tp(?:-size)?|tp_size=)[ =]?(\d{1,4})", text):
        return positive(int(m.group(1)), "tp", "the log's tensor parallel size (tp_size)"), "the server arguments"
    ranks = [int(r) for r in _RANK_TP.findall(text)]
    return (max(ranks) + 1, "the ranks' prefixes") if ranks else (1, None)


def ranks_row(found: list[int]) -> list[LogRow]:
    """The profiled pool, the ranks' values checked against each other (SGLang profiles each rank alike)."""
    if not found:
        return []
    values = sorted(set(found))
    ranks = len(found) > 1
    note = "read from the log ('larger than the profiled value')" + (f"; {len(found)} ranks" if ranks else "")
    return [LogRow("profiled pool (tokens)", ", ".join(f"{v:,}" for v in values), "-", len(values) == 1 if ranks else
                   None, note + ("; below zero: SGLang refuses to start ('Not enough memory')" if min(values) <= 0
                                 else ""))]


def refusal_rows(text: str) -> list[LogRow]:
    """SGLang's refusal for want of memory after the weights, checked by its own rule on the log's figures (the
    memory before the weights: the 'Load weight begin' line's, else the 'Load weight end' line's available memory
    plus its usage); an error naming what to pass where the log states neither."""
    refused = NO_KV_MEMORY.search(re.sub(r"\s+", " ", text))
    if not refused:
        return []
    fraction = float(refused.group(1))
    loads = {kind: (float(avail), float(usage or 0)) for kind, avail, usage in _LOADS.findall(text)}
    if "end" not in loads:
        raise KVBudgetError("check-log: the SGLang log is its refusal ('Loaded weights leave no GPU memory for the "
                            "KV cache') without the memory after the weights ('Load weight end. ... avail mem=X "
                            "GB'): nothing to check; pass the log from its 'Load weight begin' line on")
    after, usage = loads["end"]
    before = loads["begin"][0] if "begin" in loads else after + usage
    rest = after - before * (1 - fraction)
    where = "'Load weight begin'" if "begin" in loads else "the weights' end line: available + usage"
    rows = [LogRow("refused: memory left for the KV pool", "none", f"{rest:.2f} GiB", rest <= 0.01 or None,
                   f"available after the weights {after:.2f} - {before:.2f} ({where}) x (1 - mem_fraction_static "
                   f"{fraction}); SGLang refuses at 0 or less" + ("" if rest <= 0.01 else " (a hybrid's state "
                                                                    "cache, taken first, may explain it)"))]
    if minimum := _MINIMUM.search(re.sub(r"\s+", " ", text)):
        ours = 1 - after / before
        rows.append(LogRow("minimum mem_fraction_static", minimum.group(1), f"{ours:.4f}",
                           abs(ours - float(minimum.group(1))) <= 0.0005 + 0.01 / before,
                           "1 - available after / before the weights, as the refusal computes it"))
    return rows


def check_without_pool(text: str, model: ModelSpec, given: dict, cell_bytes: Callable[[int, str], int]) -> LogCheck:
    """A log with no pool line: a profiled pool of 0 or less (the memory the pool fell short by, the weights as
    loaded, the refusal), else the server arguments against the model; an error where it has neither.
    `cell_bytes(tp, kv_cache_dtype)`: the engine's bytes of one token on a rank."""
    from kvbudget.engines.sglang.memorylog import memory_rows
    from kvbudget.model.weights import model_weights

    if refused := refusal_rows(text):  # the log's own figures, by SGLang's rule: no model needed
        return LogCheck(engine="sglang", model_in_log=None, settings={}, rows=tuple(refused),
                        assumed={"KV pool": "none: the weights left no memory for it"})
    tp, tp_from = tp_of(text, given)
    assumed = {} if tp_from else {"tp": 1}
    settings = {"tp": tp} if tp_from else {}
    found = profiled(text)
    if found and min(found) <= 0:
        pool = min(found)
        cell = cell_bytes(tp, str(given.get("kv_cache_dtype") or "auto"))
        rows = [*ranks_row(found),
                LogRow("memory the pool fell short by (per rank)", "-", f"{-pool * cell / GIB:.2f} GiB", None,
                       f"{-pool:,} tokens x {cell:,} bytes: the memory after the weights is that far below what "
                       "SGLang keeps back (total x (1 - mem_fraction_static))"),
                *memory_rows(text, pool, 0, model_weights(model, tp).per_gpu_bytes),
                LogRow("refused: fits", "no", "no", True, "a pool of no token holds no request (model_runner.py "
                       "raises 'Not enough memory. Please try to increase --mem-fraction-static.')")]
        return LogCheck(engine="sglang", model_in_log=None, settings=settings, rows=tuple(rows),
                        assumed={**assumed, "KV pool": "none: the profiled pool is below zero"})
    if re.search(SERVER_ARGS, text):
        length = re.search(r"context_length=(\d{1,9})", text)
        rows = settings_rows(model, max_len=int(length.group(1)) if length else None,
                             tp=tp if tp_from else None, length_name="context_length")
        if rows:
            return LogCheck(engine="sglang", model_in_log=None, settings=settings, rows=tuple(rows),
                            assumed={**assumed, "KV pool": "not in the log (its server arguments only): what they "
                                                           "allow against the model checked"})
        raise KVBudgetError("check-log: the SGLang log is its server arguments only and states neither "
                            "context_length nor tp_size to check against the model; pass the log up to its "
                            "'KV Cache is allocated' line")
    raise KVBudgetError(LACKS)
