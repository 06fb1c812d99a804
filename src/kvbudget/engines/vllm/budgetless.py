"""vLLM logs checked without their KV budget line, as far as they go: V0's CPU blocks and GPU blocks, V1's token
count against its concurrency, V1 0.7's GPU blocks, a V1 refusal cut before its budget; and what a log that cannot
be checked was understood to say."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.engines.base import Capacity, EngineOptions, LogCheck, LogRow
from kvbudget.engines.vllm.logsettings import DEVICE_BLOCKS, other_sizes
from kvbudget.engines.vllm.refusal import NO_MEMORY, no_block_budget
from kvbudget.engines.vllm.releases import SWAP_SPACE, release
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB, format_bytes

if TYPE_CHECKING:
    from kvbudget.engines.vllm.engine import VLLMEngine
    from kvbudget.engines.vllm.logsettings import LogSettings


def count_span(a: int | None, b: int | None) -> str:
    return f"{a:,}" if a == b else f"{a:,}-{b:,}"


def shown_settings(st: LogSettings, read: dict, assumed: dict) -> dict:
    """The settings the check ran under that the log (or the user) stated: the assumed ones are shown apart."""
    settings = {"max_model_len": st.max_len, "device": st.device, "tp": st.tp, "pp": st.pp,
                "kv_cache_dtype": st.kv_dtype, "prefix_caching": st.prefix,
                "engine_version": read.get("engine_version"), "hybrid_allocator": st.hybrid}
    if st.mnbt is not None:
        settings["max_num_batched_tokens"] = st.mnbt
    if st.max_num_seqs is not None:
        settings["max_num_seqs"] = st.max_num_seqs
    if st.eager:
        settings["enforce_eager"] = True
    if st.flashinfer_sampler:
        settings["flashinfer_sampler"] = True
    if st.partition is not None:
        settings["pp_layer_partition"] = ",".join(map(str, st.partition))
    if st.backend is not None:
        settings["attention_backend"] = st.backend
    settings.update(st.drafting_shown())
    return {k: v for k, v in settings.items() if k not in assumed}


def cpu_blocks_row(engine: VLLMEngine, model: ModelSpec, s: LogSettings, logged: int) -> LogRow:
    """V0's CPU blocks: its 4 GiB swap space over one block of every layer on one rank: the model's shape, the
    tensor parallel size and the dtype, checked without the GPU budget."""
    block = engine.layout(model, s.kv_dtype, s.tp, s.options())[0].block_bytes
    ours = SWAP_SPACE // block
    return LogRow("CPU blocks (4 GiB swap space)", f"{logged:,}", f"{ours:,}", logged == ours,
                  f"4 GiB // {format_bytes(block)} per block (vLLM V0's default --swap-space)")


def v0_check_without_budget(engine: VLLMEngine, text: str, model: ModelSpec, st: LogSettings, assumed: dict,
                             v0_refusal: re.Match | None, conc: re.Match | None, cpu_blocks: int) -> LogCheck:
    """A V0 log without its GPU budget: the CPU blocks, and what the GPU blocks it printed mean."""
    rows = [cpu_blocks_row(engine, model, st, cpu_blocks)]
    gpu = DEVICE_BLOCKS.search(text)
    block_size = engine.layout(model, st.kv_dtype, st.tp, st.options())[0].block_size
    if gpu and v0_refusal:
        n, held = int(v0_refusal.group(2)), int(gpu.group(2)) * block_size
        rows.append(LogRow("refused: tokens the cache holds", f"{n:,}", f"{held:,}", n == held,
                           f"the log's GPU blocks x {block_size} (the budget is not printed)"))
    if gpu and conc:
        logged, ours = conc.group(2), f"{int(gpu.group(2)) * block_size / st.max_len:.2f}"
        rows.append(LogRow(f"max concurrency at {st.max_len:,} tokens", f"{logged}x", f"{ours}x", logged == ours,
                           f"the log's GPU blocks x {block_size} / max_model_len"))
    if re.search(NO_MEMORY, text):  # vLLM 0.1's negative GPU blocks
        block = engine.layout(model, st.kv_dtype, st.tp, st.options())[0].block_bytes
        rows.append(LogRow("refused: no cache block", "refused", f"under {format_bytes(block)} per GPU", None,
                           "the budget held no block of every layer on this GPU; the log prints no budget"))
    causes: tuple[str, ...] = ()
    if not all(r.matches is not False for r in rows):
        alternatives = [(f"tensor parallel size {tp}, not {st.tp}", replace(st, tp=tp))
                        for tp in other_sizes(st, "tp", (1, 2, 4, 8))]
        alternatives += [("the cache is fp8", replace(st, kv_dtype="fp8"))] if st.kv_dtype == "auto" else []
        alternatives += [("vLLM 0.7 (V0 with MLA)", replace(st, version=(0, 7)))] if st.version != (0, 7) else []
        causes = tuple(label for label, alt in alternatives
                       if cpu_blocks_row(engine, model, alt, cpu_blocks).matches) or (
            "none of the known causes (tensor parallel size, dtype, MLA) makes the CPU blocks agree: check the "
            "model and --swap-space",)
    settings = {"max_model_len": st.max_len, "tp": st.tp, "kv_cache_dtype": st.kv_dtype}
    shown = {k: v for k, v in settings.items() if k not in assumed and v}
    assumed = {**assumed, "KV budget": "not printed: the CPU blocks are checked instead"}
    if not st.max_len:
        assumed["max_model_len"] = "not in the log (these rows do not need it)"
    return LogCheck(engine="vllm", model_in_log=None, settings=shown, rows=tuple(rows), assumed=assumed, causes=causes)


def v1_blocks_rows(engine: VLLMEngine, model: ModelSpec, st: LogSettings, tokens: int, logged: str) -> list[LogRow]:
    """A V1 log without its budget: the blocks its token count implies (under the release's meaning of that count)
    and the concurrency those blocks give, beside the concurrency it printed."""
    layout, _ = engine.pool(model, st.kv_dtype, st.tp, st.options())
    per_request = layout.blocks_per_request(st.max_len)
    if release(st.options()).reports_slots:  # tokens = blocks // groups x block size
        first = tokens // layout.block_size * layout.num_groups
        blocks = range(first, first + layout.num_groups)
        meaning = f"blocks // {layout.num_groups} groups x {layout.block_size} (vLLM <= 0.19)"
    else:  # tokens = int(blocks / per_request x max_len)
        guess = tokens * per_request // st.max_len
        blocks = range(max(guess - 2, 1), guess + 3)
        blocks = range(min(b for b in blocks if int(b / per_request * st.max_len) == tokens) if any(
            int(b / per_request * st.max_len) == tokens for b in blocks) else guess, 1 + max(
            (b for b in blocks if int(b / per_request * st.max_len) == tokens), default=guess))
        meaning = "int(concurrency x max_model_len) (vLLM >= 0.20)"
    shown = {f"{b / per_request:.2f}" for b in blocks}
    return [LogRow("GPU blocks (from the token count)", f"{tokens:,} tokens", count_span(blocks[0], blocks[-1]), True,
                   meaning + "; the budget is not printed"),
            LogRow(f"max concurrency at {st.max_len:,} tokens", f"{logged}x", " / ".join(sorted(shown)) + "x",
                   logged in shown, f"those blocks / {per_request} blocks per request")]


def v1_check_without_budget(engine: VLLMEngine, model: ModelSpec, st: LogSettings, assumed: dict, tokens: int,
                             logged: str) -> LogCheck:
    rows = v1_blocks_rows(engine, model, st, tokens, logged)
    causes: tuple[str, ...] = ()
    if not all(r.matches for r in rows):
        alternatives = [("prefix caching " + ("off" if st.prefix else "on"), replace(st, prefix=not st.prefix))]
        alternatives += [(f"tensor parallel size {tp}, not {st.tp}", replace(st, tp=tp))
                         for tp in other_sizes(st, "tp", (1, 2, 4, 8))]
        alternatives += [(f"vLLM {label}'s meaning of the token count", replace(st, version=version))
                         for version, label in (((0, 19), "<= 0.19"), ((0, 32), ">= 0.20"))
                         if st.version is not None and release(st.options()).reports_slots
                         != release(replace(st, version=version).options()).reports_slots]
        causes = tuple(label for label, alt in alternatives
                       if all(r.matches for r in v1_blocks_rows(engine, model, alt, tokens, logged))) or (
            "none of the known causes (prefix caching, tensor parallel size) makes the rows agree",)
    settings = {"max_model_len": st.max_len, "tp": st.tp, "kv_cache_dtype": st.kv_dtype, "prefix_caching": st.prefix,
                "engine_version": f"{st.version[0]}.{st.version[1]}" if st.version else None}
    settings.update(st.drafting_shown())
    shown = {k: v for k, v in settings.items() if k not in assumed}
    return LogCheck(engine="vllm", model_in_log=None, settings=shown, rows=tuple(rows),
                    assumed={**assumed, "KV budget": "not printed: the token count and "
                                                        "the concurrency are checked against each other"},
                                                        causes=causes)


def early_v1_check(engine: VLLMEngine, model: ModelSpec, st: LogSettings, read: dict, assumed: dict,
                    blocks: int, logged: str) -> LogCheck:
    """vLLM V1 before 0.8 printed '# GPU blocks: N' and 'Maximum concurrency' = N x block size / max_model_len
    (v1/core/kv_cache_utils.py of 0.7.3), not its budget: the blocks checked against the concurrency, and the
    memory they take."""
    layout = engine.layout(model, st.kv_dtype, st.tp, st.options())[0]
    ours = f"{blocks * layout.block_size / st.max_len:.2f}"
    rows = (LogRow(f"max concurrency at {st.max_len:,} tokens", f"{logged}x", f"{ours}x", ours == logged,
                   f"the log's {blocks:,} GPU blocks x {layout.block_size} / max_model_len (vLLM V1 0.7)"),
            LogRow("KV memory these blocks take", "-", format_bytes(blocks * layout.block_bytes), True,
                   "per GPU; the log prints no budget"))
    return LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(st, read, assumed), rows=rows,
                    assumed={**assumed, "KV budget": "not printed (vLLM V1 0.7): the blocks are checked against "
                                                     "the concurrency"})


_KNOWN_LINES = {"a KV cache size in tokens": r"KV cache size: +[\d,]+ tokens",
                "the maximum concurrency": r"Maximum concurrency for",
                "GPU blocks": DEVICE_BLOCKS.pattern, "the weights loaded": r"(?:Model loading|model weights) took",
                "the engine's version": r"LLM engine \(v|vLLM (?:API server )?version",
                "the engine configuration": r"max_seq_len=|max_model_len",
                "a refusal's max seq len": r"max seq len \(\d+\)", "the memory split": r"Free memory on device"}


def understood(text: str) -> str:
    """The vLLM lines the log has, for an error that says what was read before what was missing."""
    found = [what for what, pattern in _KNOWN_LINES.items() if re.search(pattern, text)]
    return ", ".join(found) if found else "no vLLM line kvbudget reads"





def count_check(engine: VLLMEngine, text: str, model: ModelSpec, st: LogSettings, read: dict, assumed: dict,
                v0_refusal: re.Match | None) -> LogCheck | None:
    """A log with no KV budget line but a count of what its cache holds (V0's refusal, the GPU blocks, the token
    count) or a refusal that the budget held no block: the memory that count takes for this model (the pool the
    guard reads the same way, `pool_budget`), the plan's capacity in that memory beside the count, and whether a
    request of max_model_len fits there, as the log says it did or did not; None where the log has no count."""
    from kvbudget.engines.metrics import PoolReport

    options = st.options()
    layout, _ = engine.pool(model, st.kv_dtype, st.tp, options)
    tokens = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", text)
    blocks = DEVICE_BLOCKS.search(text)
    if v0_refusal:
        report = PoolReport(tokens=int(v0_refusal.group(2)), source="the refusal's token count")
        what = "refused: tokens"
    elif blocks:
        report, what = PoolReport(tokens=0, blocks=int(blocks.group(2)), source="the GPU blocks"), "blocks"
    elif tokens and release(options).reports_slots:  # to 0.19: blocks // groups x block size
        report = PoolReport(tokens=int(tokens.group(1).replace(",", "")), source="the token count")
        what = "KV cache size (tokens)"
    elif re.search(NO_MEMORY, re.sub(r"\s+", " ", text)):
        return _no_block_check(engine, text, model, st, read, assumed, layout.block_bytes)
    else:  # no count, or a token count of 0.20 on (int(concurrency x max_model_len)): checked with its concurrency
        return None
    budget = engine.pool_budget(model, report, kv_dtype=st.kv_dtype, tp=st.tp, options=options)
    cap, refusal = _capacity(engine, model, budget, st)
    logged = report.blocks if report.blocks is not None else report.tokens
    counted = "blocks" if report.blocks is not None else "token slots"
    ours = (cap.num_blocks if report.blocks is not None else cap.physical_token_slots) if cap else None
    rows = [LogRow(what, f"{logged:,}", "-" if ours is None else f"{ours:,}", None if ours is None else logged == ours,
                   f"the plan's {counted} in the memory of {report.source} ({layout.block_size}-token blocks)"),
            LogRow("KV memory the count takes", "-", format_bytes(budget), None,
                   f"per GPU, {format_bytes(layout.block_bytes)} a block; the log prints no budget")]
    if v0_refusal or cap is None or logged == 0:
        rows.append(_fits_row(cap, refusal, st.max_len, "in that memory"))
    else:
        rows.append(LogRow(f"max concurrency at {st.max_len:,} tokens", "-", f"{cap.max_concurrency:.2f}x", None,
                           "the plan's, in that memory"))
    return LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(st, read, assumed), rows=tuple(rows),
                    assumed={**assumed, "KV budget": f"not printed: the memory of {report.source}"})


def _capacity(engine: VLLMEngine, model: ModelSpec, budget: int, st: LogSettings) -> tuple[Capacity | None, str]:
    """The plan's capacity in `budget` bytes per GPU, or None and why the plan refuses that budget outright."""
    try:
        return engine.capacity(model, budget, st.max_len, kv_dtype=st.kv_dtype, tp=st.tp, options=st.options()), ""
    except KVBudgetError as exc:
        return None, str(exc).split(": ", 1)[-1]


def _fits_row(cap: Capacity | None, refusal: str, max_len: int, where: str) -> LogRow:
    """The log refused to start: whether the plan fits a request of max_model_len in the same memory."""
    fits = cap is not None and cap.fits
    why = f"the plan refuses the memory itself: {refusal}" if cap is None else f"a request of {max_len:,} tokens"
    return LogRow("refused: fits", "no", "yes" if fits else "no", not fits, f"{why} ({where})")


def _no_block_check(engine: VLLMEngine, text: str, model: ModelSpec, st: LogSettings, read: dict, assumed: dict,
                    block_bytes: int) -> LogCheck:
    """'No available memory for the cache blocks': the budget held no block of every layer; the plan's verdict on
    a budget just under one block."""
    cap, refusal = _capacity(engine, model, block_bytes - 1, st)
    logged = no_block_budget(text)
    printed = logged != "refused"
    rows = (LogRow("refused: no cache block", logged, f"under {format_bytes(block_bytes)} per GPU",
                   True if printed else None, "the budget held no block of every layer on this GPU; " + (
                       "the log prints it below zero" if printed else "the log prints no budget")),
            _fits_row(cap, refusal, st.max_len, "in less than one block"))
    return LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(st, read, assumed), rows=rows,
                    assumed=assumed if printed else {**assumed, "KV budget": "not printed: under one block (vLLM "
                                                                             "found no memory for one)"})


def needed_gib(engine: VLLMEngine, model: ModelSpec, s: LogSettings, options: EngineOptions) -> float:
    """The memory one request of max_model_len takes in `model`'s pool (GiB), as the refusal states it."""
    layout, _ = engine.pool(model, s.kv_dtype, s.tp, options)
    return layout.blocks_per_request(s.max_len) * layout.block_bytes / GIB


def needed_check(engine: VLLMEngine, model: ModelSpec, s: LogSettings, read: dict, assumed: dict,
                 needed: str) -> LogCheck:
    """A refusal cut before the memory it had: the memory one request needs, which needs no budget, beside the
    plan's (under pipeline parallelism, any stage's: which stage fell short needs the budget)."""
    options = s.options()
    stages = [model] if s.pp == 1 else [model.stage(r) for r in engine.pipeline_stages(
        model.num_layers, s.pp, s.partition)]
    if s.pp > 1:
        stages.append(engine.checked_model(model, stages[0], options))
    ours = list(dict.fromkeys(f"{needed_gib(engine, m, s, options):.2f}" for m in stages))
    logged = f"{float(needed):.2f}"
    where = "one request of max_model_len" + (" on a pipeline stage (or the whole model, 0.14-0.16)"
                                               if s.pp > 1 else "")
    row = LogRow("refused: KV cache needed", f"{needed} GiB", " or ".join(f"{g} GiB" for g in ours),
                 logged in ours, f"{where}; the refusal is cut before the memory it had")
    return LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(s, read, assumed), rows=(row,),
                    assumed={**assumed, "KV budget": "not in the log: the refusal is cut before the available KV "
                                                     "cache memory"})
