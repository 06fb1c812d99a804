"""The memory lines an SGLang start-up prints before its pool, checked against the rule its source sizes the pool
by, and its weights beside `kvbudget plan`'s.

SGLang (python/sglang/srt/model_executor/model_runner.py profile_max_num_token in 0.4.3-0.5.3,
model_runner_kv_cache_mixin.py from 0.5.4 on) measures the free memory before the weights load (`Load weight
begin. avail mem=`), again after them (`Load weight end. ... avail mem=`), and keeps for the pool
`after - before x (1 - mem_fraction_static)`: its share is of the memory free before loading, not of the card,
so the CUDA context and NCCL buffers already in use come out of it too. The pool is that many GiB over the bytes
of one token cell, rounded down. Printed figures are rounded to 0.01 "GB" (which are GiB).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.engines.sglang.speclog import DRAFT_TYPES
from kvbudget.units import GIB, log_figure

ROUNDING = 0.005  # each printed figure is within half a hundredth of a GiB


def memory_rows(text: str, tokens: int, cell_bytes: int, weights_bytes: int | None, scale: float = 1.0,
                headroom: Callable[[int], int | None] | None = None) -> list[LogRow]:
    """Rows for the memory lines the log has: the weights as loaded (beside the plan's count) and, where the log
    states mem_fraction_static and both measurements, the pool the source's rule gives from them against the
    pool the log allocated. Empty when the log prints none of them. `scale`: what the release multiplies the
    printed fraction by after printing it (0.4's model_runner, for a multimodal model), unless the log says the
    fraction it settled on ('Automatically reduce --mem-fraction-static to X'). Without a 'Load weight begin'
    line the memory free before loading is the end line's two figures added (SGLang prints their difference as
    the usage). A speculative drafter's own 'Load weight end' line (an EAGLE head's or MTP layers' class) is not
    the target's; `headroom`: the tokens a drafting release adds to the profiled pool (None: not known, and the
    row is then shown, not checked)."""
    target = rf"Load weight end\b(?![^\n]*{DRAFT_TYPES})[^\n]*?"  # the target's line, not a drafter's after it
    after = _number(text, target + r"avail mem=([\d.]+) GB")
    used = _number(text, target + r"mem usage=([\d.]+) GB")
    before = _number(text, r"Load weight begin\. avail mem=([\d.]+) GB")
    if before is None and after is not None and used is not None:
        before = after + used
    fraction = _number(text, r"mem_fraction_static[=' ]+([\d.]+)")
    reduced = _number(text, r"Automatically reduce --mem-fraction-static to ([\d.]+)")
    fraction = reduced if reduced is not None else None if fraction is None else fraction * scale
    out = []
    if used is not None and weights_bytes is not None:
        out.append(LogRow("memory: weights as loaded", f"{used:.2f} GB", f"{weights_bytes / GIB:.2f} GiB", None,
                          "kvbudget plan's count; the log's figure is all the loading took"))
    if before is None or after is None or fraction is None or "--max-total-tokens" in text or not cell_bytes:
        return out
    pool = after - before * (1 - fraction)
    worst = ROUNDING * (2 - fraction)  # both measurements rounded
    low, high = (int((pool + d) * GIB // cell_bytes) for d in (-worst, worst))
    extra = (headroom(low), headroom(high)) if headroom else (0, 0)
    drafting = ""
    if headroom:
        drafting = (f"; plus the drafter's headroom of {extra[0]:,} tokens" if None not in extra and extra[0] else
                    "; the drafter's headroom is not known for this release" if None in extra else "")
    known = None not in extra
    if known:
        low, high = low + (extra[0] or 0), high + (extra[1] or 0)
    out.append(LogRow("memory: pool by SGLang's rule", f"{tokens:,} tokens", f"{low:,}-{high:,} tokens",
                      low <= tokens <= high if known else None,
                      f"{after:.2f} - {before:.2f} x (1 - {fraction:g}) = {pool:.2f} GiB over "
                      f"{cell_bytes:,} B per token (the printed figures' rounding gives the range)" + drafting))
    return out


def _number(text: str, pattern: str) -> float | None:
    m = re.search(pattern, text)
    return log_figure(m.group(1), "memory figure") if m else None


_POOL = re.compile(r"(?:\[[^\]\n]*?(TP\d+)[^\]\n]*\] )?KV Cache is allocated\.(?: dtype: [\w.]+,)? #tokens: (\d+), "
                   r"(K size: [\d.]+ GB, V size: [\d.]+ GB|KV size: [\d.]+ GB)")


def check_without_model(text: str) -> LogCheck:
    """The rows of an SGLang log that need no model: each pool's tokens and buffers shown, the ranks' pools (which
    SGLang sizes to the same tokens) and the scheduler's max_total_num_tokens checked against each other."""
    pools = _POOL.findall(text)
    rows = []
    for sizes in dict.fromkeys(s for _, _, s in pools):  # one row per pool (a drafter's has buffers of its own)
        tokens = {int(n) for _, n, s in pools if s == sizes}
        ranks = {r for r, _, s in pools if s == sizes and r}
        rows.append(LogRow("pool (tokens)", ", ".join(f"{t:,}" for t in sorted(tokens)), "-",
                           len(tokens) == 1 if len(ranks) > 1 else None,
                           f"{sizes} ('GB' are GiB)" + (f"; {len(ranks)} ranks, one size" if len(ranks) > 1 else "")))
    if total := re.search(r"max_total_num_tokens=(\d+)", text):
        first = int(pools[0][1]) if pools else None
        same = first == int(total.group(1)) if first is not None and "sliding window" not in text else None
        stated = dict.fromkeys(int(n) for n in re.findall(r"max_total_num_tokens=(\d+)", text))
        others = (f"; the first of {len(stated)} values the log states ("
                  + ", ".join(f"{n:,}" for n in stated) + "): one run's log checks one") if len(stated) > 1 else ""
        rows.append(LogRow("max_total_num_tokens", f"{int(total.group(1)):,}", f"{first:,}" if first else "-", same,
                           ("the scheduler's tokens against the first pool's" if first else "read from the log")
                           + others))
    return LogCheck(engine="sglang", model_in_log=None, settings={}, rows=tuple(rows))
