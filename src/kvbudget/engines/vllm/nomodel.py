"""A vLLM log read without its model: the KV figures it printed, shown, and checked against each other where the
arithmetic needs no model (the token count against the concurrency, the blocks against a refusal, the memory
share against the total)."""

from __future__ import annotations

import re

from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.engines.vllm.logsettings import DEVICE_BLOCKS, num
from kvbudget.engines.vllm.refusal import CPU_NODE, MAMBA, V0_REFUSAL, no_block_budget, read_refusal
from kvbudget.units import GIB, log_figure

V0_BLOCK = 16  # vLLM's default block size (V0 and V1 for full attention)
# V0's blocks line per device: '# GPU blocks: N' (CUDA, ROCm), '# CUDA blocks' (0.6), '# TPU blocks' (tpu_executor.py),
# '# HPU blocks' / '# hpu blocks' (Gaudi's habana_executor.py and plugin)


def _ratio_row(quantity: str, logged: str, value: float, printed: float, tolerance: float, note: str,
               unless: str) -> LogRow:
    """A check of the log's own arithmetic; where it does not hold it may be the model's layout (`unless`), which
    only the model tells: shown, not a difference."""
    ok = abs(value - printed) <= tolerance
    return LogRow(quantity, logged, f"{value:,.2f}", True if ok else None, note if ok else f"{note}; {unless}")


def check_without_model(text: str) -> LogCheck:
    """The rows of a vLLM log that need no model."""
    from kvbudget.engines.vllm.argslog import SHAPE
    from kvbudget.engines.vllm.logs import _rank_budgets
    from kvbudget.engines.vllm.refusal import NO_MEMORY

    rows: list[LogRow] = []
    budgets = _rank_budgets(text)
    if budgets:
        ranks = f": the smallest of {len(budgets)} ranks'" if len(budgets) > 1 else ""
        rows.append(LogRow("KV budget", f"{min(budgets, key=float)} GiB", "-", None, f"read from the log{ranks}"))
    tokens = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", text)
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    blocks = re.search(DEVICE_BLOCKS, text)
    if tokens:
        rows.append(LogRow("KV cache size (tokens)", f"{int(num(tokens.group(1))):,}", "-", None, "read from the log"))
    if blocks and not budgets and not tokens:  # V0's blocks line alone: its figures, what they hold needs the model
        rows.append(LogRow(f"{blocks.group(1).upper()} blocks", f"{int(blocks.group(2)):,}", "-", None,
                           "read from the log: the blocks of every layer's cache it made"))
        if cpu := re.search(r"# CPU blocks: (\d+)", text):
            rows.append(LogRow("CPU blocks (swap space)", f"{int(cpu.group(1)):,}", "-", None, "read from the log"))
    if shape := SHAPE.search(text):  # the cross-layer KV cache (engines/vllm/argslog.py)
        rows.append(LogRow("GPU blocks", f"{int(shape.group(1).split(',')[0]):,}", "-", None,
                           "the cross-layer KV cache shape's first dimension"))
    if conc:
        length, printed = int(num(conc.group(1))), log_figure(conc.group(2), "concurrency")
        held = int(num(tokens.group(1))) if tokens else int(blocks.group(2)) * V0_BLOCK if blocks else None
        if held is not None and length > 0:
            what = "the token count" if tokens else f"the blocks x {V0_BLOCK}"
            rows.append(_ratio_row(f"max concurrency at {length:,} tokens", f"{printed}x", held / length, printed,
                                   0.005 + 1 / length, f"{what} / max_model_len",
                                   "they differ for models of several cache groups or other block sizes"))
        elif held is None and length > 0:  # the line alone (quoted, or the log cut after it): the pool it implies
            rows.append(LogRow(f"max concurrency at {length:,} tokens", f"{printed}x",
                               f"about {round(printed * length):,} tokens", None,
                               f"the pool it implies for one cache group: concurrency x max_model_len, within "
                               f"{round(0.005 * length):,} tokens (vLLM prints two decimals)"))
    if refused := V0_REFUSAL.search(re.sub(r"\s+", " ", text)):
        n = int(refused.group(2))
        rows.append(LogRow("refused: tokens the cache holds", f"{n:,}", "-", None, "vLLM V0's refusal"))
        if blocks:
            rows.append(_ratio_row("refused: blocks x block size", f"{n:,}", int(blocks.group(2)) * V0_BLOCK, n, 0,
                                   f"the log's blocks x {V0_BLOCK}", "another block size (--block-size)"))
    if (refusal := read_refusal(text)) and refusal.needed:
        if refusal.max_len:
            rows.append(LogRow("refused: max seq len", f"{int(refusal.max_len):,}", "-", None, "vLLM V1's refusal"))
        rows.append(LogRow("refused: KV cache needed", f"{refusal.needed} GiB",
                           f"more than the {refusal.available} GiB available" if refusal.available else "-",
                           float(refusal.needed) > float(refusal.available) if refusal.available else None,
                           "vLLM V1's refusal" + ("" if refusal.available else
                                                  " (cut before the memory it had: how much one request needs, "
                                                  "the model tells)")))
        if refusal.max_len and refusal.available and refusal.estimated is not None and float(refusal.needed) > 0:
            # the estimate: the longest max_model_len whose cache fits the memory (kv_cache_utils.py,
            # estimate_max_model_len), for one cache group max_len x available / needed, within the two decimals
            length, have, need = int(refusal.max_len), float(refusal.available), float(refusal.needed)
            rows.append(_ratio_row("refused: estimated maximum model length", f"{refusal.estimated:,}",
                                   length * have / need, refusal.estimated,
                                   length * have / need * (0.005 / have + 0.005 / need) + V0_BLOCK,
                                   "max seq len x available / needed",
                                   "sliding windows, several cache groups and a recurrent state's fixed part "
                                   "grow otherwise"))
    if node := CPU_NODE.search(re.sub(r"\s+", " ", text)):
        rows += _cpu_node_rows(node)
    if mamba := MAMBA.search(text):
        seqs, held = int(mamba.group(1)), int(mamba.group(2))
        rows.append(LogRow("refused: Mamba cache blocks", f"{held:,}", f"fewer than max_num_seqs {seqs:,}",
                           held < seqs, "every decoding sequence holds one block of the recurrent state"))
    if re.search(NO_MEMORY, re.sub(r"\s+", " ", text)):
        rows.append(LogRow("refused: no cache block", no_block_budget(text), "-", None,
                           "the budget held no block of every layer: how large one is needs the model"))
    rows += _memory_rows(text)
    return LogCheck(engine="vllm", model_in_log=None, settings={}, rows=tuple(rows))


# The one-line memory split (0.11 on, gpu_worker.py; vllm-ascend's worker.py the same with "Actual usage:"), and the
# refusal where less is free than the share asks for ("... on startup is less than desired GPU memory utilization")
_GIB = r"(\d{1,6}(?:\.\d{1,4})?)"  # a figure in GiB as vLLM rounds it
_SPLIT = re.compile(r"Free memory on device \(" + _GIB + "/" + _GIB + r" GiB\) on startup(\.| is less than) desired "
                    r"GPU memory utilization (?:is )?\(" + _GIB + ", " + _GIB + r" GiB\)", re.IGNORECASE)
_TERM = re.compile(_GIB + r" GiB for (weights?|peak activation|non-torch memory|consumed memory \(weights \+ "
                   r"non-torch\)|CUDAGraph memory|NPU graph memory)")
_SUGGESTED = re.compile(r"--kv-cache-memory=(\d{1,16})`?\s*(?:\([\d.]{1,12} GiB\)\s*)?to (fit|fully)")
BUFFER_GIB = 150 / 1024  # the 150 MiB the suggestion keeps back (gpu_worker.py's redundancy_buffer_memory)


def _memory_rows(text: str) -> list[LogRow]:
    """The engine's share of the GPU: the total times gpu_memory_utilization, as V0 and V1 print both; and the one-line
    split's own arithmetic where the log prints it."""
    share = re.search(r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization \(([\d.]+)\) = ([\d.]+) ?GiB",
                      text)
    split = _SPLIT.search(text)
    if share:
        total, fraction, logged = (log_figure(g, "memory figure") for g in share.groups())
    elif split:
        total, fraction, logged = (float(split.group(i)) for i in (2, 4, 5))
    else:
        return []
    rows = [_ratio_row("memory: the engine's share", f"{logged:.2f} GiB", total * fraction, logged, 0.011,
                       f"total {total} GiB x gpu_memory_utilization {fraction}", "the log's figures do not multiply")]
    return rows + (_split_rows(text, split) if split and not share else [])


def _split_rows(text: str, split: re.Match) -> list[LogRow]:
    """The one-line split: the terms shown; the --kv-cache-memory it suggests checked against them (the share less
    every term and a 150 MiB buffer; the free memory less the same), or, refused, the free memory below the share."""
    free, requested = float(split.group(1)), float(split.group(5))
    if split.group(3) != ".":
        return [LogRow("refused: free memory below the share", f"{free:.2f} GiB free", f"{requested:.2f} GiB asked",
                       free < requested, "vLLM refuses to start where less is free than gpu_memory_utilization asks")]
    end = text.find("\n", split.start())
    line = text[split.start():end if end >= 0 else None]
    terms = [(what, float(gib)) for gib, what in _TERM.findall(line)]
    rows = [LogRow(f"memory: {what}", f"{gib:.2f} GiB", "-", None, "read from the log's memory split")
            for what, gib in terms]
    suggested = {kind: int(b) / GIB for b, kind in _SUGGESTED.findall(line)}
    if "fit" in suggested and terms:
        rows.append(_ratio_row("memory: suggested --kv-cache-memory", f"{suggested['fit']:.2f} GiB",
                               requested - sum(g for _, g in terms) - BUFFER_GIB, suggested["fit"],
                               0.005 * (len(terms) + 1) + 0.001, "the share less the terms and 150 MiB",
                               "a term sized apart from the one printed (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)"))
    if "fit" in suggested and "fully" in suggested:
        rows.append(_ratio_row("memory: free memory less the share", f"{suggested['fully'] - suggested['fit']:.2f} "
                               "GiB", free - requested, suggested["fully"] - suggested["fit"], 0.011,
                               "the two suggestions apart: free memory less the share",
                               "the log's figures do not subtract"))
    return rows


def _cpu_node_rows(node: re.Match) -> list[LogRow]:
    """The CPU worker's refusal (refusal.CPU_NODE): the cache asked for against the node's free memory, and, where the
    share is printed, what the model and its warm-up took of it (the share less the cache)."""
    free, total, kv, share = node.group(2), node.group(3), node.group(4), node.group(5)
    short = float(kv) <= 0  # the model took the whole share: no cache left to ask for
    rows = [LogRow(f"refused: KV cache on CPU node {node.group(1)}", f"{kv} GiB",
                   "nothing left of the share" if short else f"more than the {free} GiB free of {total}",
                   short or float(kv) > float(free),
                   "vLLM's CPU worker: raise gpu_memory_utilization (the share)" if short else
                   "vLLM's CPU worker: other processes hold the rest of the node, or the cache asked is too large")]
    if share is not None:
        rows.append(LogRow("CPU share (total x gpu_memory_utilization)", f"{share} GiB",
                           f"{float(share) / float(total):.3f} of {total} GiB", None,
                           f"of which the model and its warm-up took {float(share) - float(kv):.2f} GiB (the share "
                           "less the cache)"))
    return rows

