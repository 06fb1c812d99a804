"""Reading vLLM's startup logs back: the settings it printed, its KV figures beside kvbudget's for the same
settings, and the likely causes where they differ. What each release printed and checked is in releases.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.choices import Device
from kvbudget.engines.base import Capacity, EngineOptions, LogCheck, LogRow
from kvbudget.engines.speclog import speculative_rows
from kvbudget.engines.vllm import argslog, logsettings, speculative
from kvbudget.engines.vllm.budgetless import (
    count_check,
    count_span,
    cpu_blocks_row,
    early_v1_check,
    needed_check,
    needed_gib,
    shown_settings,
    understood,
    v0_check_without_budget,
    v1_blocks_rows,
    v1_check_without_budget,
)
from kvbudget.engines.vllm.logsettings import (
    DEVICE_BLOCKS,
    NO_MAX_LEN,
    LogSettings,
    num,
    other_sizes,
    read_settings,
    setting,
)
from kvbudget.engines.vllm.memorylog import memory_rows, offload_rows
from kvbudget.engines.vllm.refusal import V0_REFUSAL, read_refusal
from kvbudget.engines.vllm.releases import Release, release
from kvbudget.engines.vllm.speclog import read_speculative
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import LatentAttention, ModelSpec, RecurrentState
from kvbudget.speculative import SpecMethod
from kvbudget.units import GIB, log_figure

if TYPE_CHECKING:
    from kvbudget.engines.vllm.engine import VLLMEngine


# Each rank's KV budget as a release printed it (GiB), the first pattern found in the log winning. From 0.34 the
# extensible KV cache's final size (v1/worker/extensible_kv_cache.py extend_kv_cache: "Extended KV cache to %d blocks
# (%.2f GiB)") comes before "Available KV cache memory", which then prints the reserved capacity.
BUDGET_LINES = (r"Extended KV cache to \d+ blocks \(([\d.]+) GiB\)",
                r"Explicitly set \(([\d.]+)/", r"Available KV cache memory: ([\d.]+) GiB",
                r"kv_cache_size[= ]\s{0,20}([\d.]+) ?GiB",  # V0's one-line and (0.6.5) tabled profiling results
                r"reserved for KV Cache is ([\d.]+) ?GiB",
                r"Reserved for KV cache: ([\d.]+) GiB",  # Aphrodite, a V0 fork
                r"available_kv_cache_memory[=:]?\s{0,20}([\d.]+) ?GiB",
                r"reserved ([\d.]+) GiB memory for KV Cache as specified by kv_cache_memory_bytes",  # no profiling
                r"Current kv cache memory in use is ([\d.]+) GiB",  # 2026: after the one-line memory split
                r"Current KV cache memory: ([\d.]+) GiB",  # vllm-ascend's split (worker.py)
                logsettings.GAUDI_BUDGET)
_BUDGET_BYTES = r"Current kv cache memory in use is (\d+) bytes"  # the same line in late-2025 releases


def _rank_budgets(text: str) -> list[str]:
    """Every rank's KV budget line (BUDGET_LINES), as printed (GiB)."""
    for pattern in BUDGET_LINES:
        found = re.findall(pattern, text)
        if found:
            for budget in found:  # each a number, or a one-line error
                log_figure(budget, "KV budget")
            return found
    return [f"{int(b) / GIB:.6f}" for b in re.findall(_BUDGET_BYTES, text)]


class _Log:
    """One vLLM log read once: the lines check-log compares, and (once `budget` is set) the KV budget it printed,
    with the range of budgets its rounding allows."""

    def __init__(self, engine: VLLMEngine, text: str, model: ModelSpec) -> None:
        self.engine, self.text, self.model = engine, text, model
        self.conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
        flat = re.sub(r"\s+", " ", text)  # refusal messages wrap when pasted
        self.refusal = read_refusal(text)
        self.v0_refusal = V0_REFUSAL.search(flat)
        self.cpu_blocks = re.search(r"# CPU blocks: (\d+)", text)
        self.budgets: list[str] = []
        self.from_refusal = False

    def budget(self, budgets: list[str], from_refusal: bool, device: Device) -> None:
        """The ranks' budgets as logged (GiB, as text); the smallest is what every rank gets."""
        self.budgets, self.from_refusal = budgets, from_refusal
        self.budget_text = min(budgets, key=float)  # vLLM sizes every rank's cache to the smallest rank's
        self.decimals = len(self.budget_text.split(".")[1]) if "." in self.budget_text else 0
        self.value = float(self.budget_text)
        self.exact = device == Device.CPU and self.value == int(self.value)  # VLLM_CPU_KVCACHE_SPACE is whole GiB
        self.half_step = 0.5 * 10 ** -self.decimals
        self.logged = (self.value, self.value) if self.exact else (max(self.value - self.half_step, 0),
                                                                   self.value + self.half_step)

    def rows(self, s: LogSettings, span: tuple[float, float] | None = None) -> list[LogRow]:
        """The rows under settings `s`, for the logged budget's range or another rank's `span` (GiB)."""
        engine, model = self.engine, self.model
        lo, hi = span or self.logged
        options = s.options()
        rel = release(options)
        stages = [model] if s.pp == 1 else [model.stage(r) for r in engine.pipeline_stages(
            model.num_layers, s.pp, s.partition)]
        # the refusal names the memory left after the null block (0.29 on): add one block back for the budget
        extra = (engine.pool(stages[0], s.kv_dtype, s.tp, options)[0].block_bytes
                 if self.from_refusal and rel.null_block_in_check and not rel.v0 else 0)

        def cap(gib: float) -> Capacity:
            """What the smallest rank holds (vLLM gives every rank that many blocks)."""
            budget = int(gib * GIB) + extra
            per_stage = [engine.capacity(stage, budget, s.max_len, kv_dtype=s.kv_dtype, tp=s.tp, options=options)
                         for stage in stages]
            return min(per_stage, key=lambda c: (c.num_blocks or 0, c.estimated_max_model_len or s.max_len))

        low, high = cap(lo), cap(hi)
        rounding = "" if self.exact else (f"the log rounds the budget to {self.decimals} decimals of GiB: a range of "
                                          "predictions")
        shown_budget = f"{lo:g}-{hi:g} GiB" if not self.exact else f"{self.value:g} GiB"
        source = "read from the refusal message" if self.from_refusal else "read from the log" + (
            f": the smallest of {len(self.budgets)} ranks' budgets" if len(self.budgets) > 1 else "")
        out = [LogRow("KV budget", f"{self.budget_text} GiB", shown_budget, True, source)]
        out += self._capacity_rows(s, rel, low, high, rounding)
        if self.refusal and self.refusal.needed:
            out += self._refusal_rows(s, options, stages, extra, (lo, hi), rounding)
        if self.v0_refusal:
            n = int(self.v0_refusal.group(2))
            out.append(LogRow("refused: tokens the cache holds", f"{n:,}",
                              count_span(low.physical_token_slots, high.physical_token_slots),
                              low.physical_token_slots <= n <= high.physical_token_slots,
                              "vLLM V0: blocks x block size"))
            out.append(LogRow("refused: fits", "no", "yes" if high.fits else "no", not low.fits,
                              "vLLM V0: max_model_len beyond the tokens the blocks hold"))
        if self.cpu_blocks and rel.v0:
            out.append(cpu_blocks_row(engine, model, s, int(self.cpu_blocks.group(1))))
        out += self._weights_rows(s)
        if self.budgets:
            out += memory_rows(self.engine, self.text, self.model, s, self.budget_text)
        raised = re.search(r"Setting attention block size to (\d+) tokens", self.text)
        if raised:
            out.append(LogRow("block size", raised.group(1), str(low.block_size),
                              int(raised.group(1)) == low.block_size,
                              "raised so that one attention page covers a Mamba state page"))
        padded = re.search(r"Padding mamba page size by ([\d.]+)%", self.text)
        layout = engine.layout(stages[0], s.kv_dtype, s.tp, options)[0] if padded else None
        states = [spec.state_bytes for spec, _, _ in layout.buckets if spec.keeps_state] if layout else []
        if padded and layout and states:
            ours = f"{100 * (layout.page - max(states)) / max(states):.2f}"
            out.append(LogRow("Mamba page padding", f"{padded.group(1)}%", f"{ours}%", ours == padded.group(1),
                              f"the attention page ({layout.page:,} B) over one layer's state ({max(states):,} B), "
                              "as platforms/interface.py computes it"))
        return out

    def _capacity_rows(self, s: LogSettings, rel: Release, low: Capacity, high: Capacity, rounding: str
                       ) -> list[LogRow]:
        """The blocks, the token count (in the meaning of the release) and the concurrency the log printed."""
        out = []
        blocks = DEVICE_BLOCKS.search(self.text)
        if blocks and low.num_blocks is not None and high.num_blocks is not None:
            n = int(blocks.group(2))
            out.append(LogRow("blocks", f"{n:,}", count_span(low.num_blocks, high.num_blocks),
                              low.num_blocks <= n <= high.num_blocks, rounding))
        tokens = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", self.text)
        if tokens:
            n = int(num(tokens.group(1)))
            slots = (low.physical_token_slots, high.physical_token_slots)
            by_conc = (low.kv_cache_tokens, high.kv_cache_tokens)
            if s.version == (0, 20):  # kv_cache_utils.py _report_kv_cache_config: 0.20.0 still counts the slots
                meaning, ranges = ("either meaning: 0.20.0 counts num_blocks // groups x block size, 0.20.1 on "
                                   "int(concurrency x max_model_len)"), [slots, by_conc]
            elif s.version is not None and rel.reports_slots:
                meaning, ranges = "num_blocks // groups x block size (vLLM <= 0.19)", [slots]
            elif s.version is not None:
                meaning, ranges = "int(concurrency x max_model_len) (vLLM >= 0.20)", [by_conc]
            else:
                meaning, ranges = "either meaning: the log names no version", [slots, by_conc]
            ok = any(a <= n <= b for a, b in ranges)
            shown = " or ".join(count_span(a, b) for a, b in dict.fromkeys(ranges))
            out.append(LogRow("KV cache size (tokens)", f"{n:,}", shown, ok, meaning))
        if self.conc:
            logged = self.conc.group(2)
            lo_c, hi_c = f"{low.max_concurrency:.2f}", f"{high.max_concurrency:.2f}"
            out.append(LogRow(f"max concurrency at {s.max_len:,} tokens", f"{logged}x",
                              f"{lo_c}x" if lo_c == hi_c else f"{lo_c}-{hi_c}x",
                              float(lo_c) <= log_figure(logged, "concurrency") <= float(hi_c), rounding))
        return out

    def _refusal_rows(self, s: LogSettings, options: EngineOptions, stages: list[ModelSpec], extra: int,
                      span: tuple[float, float], rounding: str) -> list[LogRow]:
        """V1's refusal: the memory one request needs, that it does not fit, and the longest that would."""
        assert self.refusal is not None
        engine, model = self.engine, self.model
        lo, hi = span
        checked = engine.checked_model(model, stages[0], options) if s.pp > 1 else stages[0]
        whole = checked is model and s.pp > 1
        weighed = "the whole model (vLLM 0.14-0.16 under pipeline parallelism)" if whole else (
            "one request of max_model_len" + (" on the first rank short of memory" if s.pp > 1 else ""))
        # each rank checks its own layers in rank order and the first short one raises (0.17 on, <= 0.13)
        weighed_model = checked if whole else next(
            (m for m in stages if needed_gib(engine, m, s, options) > hi), stages[0])
        wlow, whigh = (engine.capacity(weighed_model, int(g * GIB) + extra, s.max_len, kv_dtype=s.kv_dtype,
                                       tp=s.tp, options=options) for g in (lo, hi))
        needed = self.refusal.needed
        assert needed is not None
        ours = f"{needed_gib(engine, weighed_model, s, options):.2f}"
        out = [LogRow("refused: KV cache needed", f"{needed} GiB", f"{ours} GiB", f"{float(needed):.2f}" == ours,
                      weighed),
               LogRow("refused: fits", "no", "yes" if whigh.fits else "no", not wlow.fits)]
        if self.refusal.estimated is not None:
            n = self.refusal.estimated
            a, b = (wlow.estimated_max_model_len or 0), (whigh.estimated_max_model_len or 0)
            out.append(LogRow("estimated maximum model length", f"{n:,}", count_span(a, b), a <= n <= b, rounding))
        return out

    def _weights_rows(self, s: LogSettings) -> list[LogRow]:
        """The weights vLLM says it loaded beside kvbudget's count (an estimate: shown, never a mismatch of the
        cache)."""
        weights = re.search(r"(?:Loading model weights took|Model loading took) ([\d.]+) G", self.text)
        if not weights:
            return []
        from kvbudget.model.params import quantized
        from kvbudget.model.weights import model_weights

        model = self.model
        try:
            w = self.engine.as_loaded(model_weights(model, s.tp, self.engine.pipeline_stages(
                model.num_layers, s.pp, s.partition)), model, s.options(), s.tp, s.pp)
        except KVBudgetError:
            return []
        logged_bytes = log_figure(weights.group(1), "weights figure") * GIB
        if not logged_bytes:  # a paste's 0: nothing to compare against
            return []
        diff = w.per_gpu_bytes / logged_bytes - 1
        drafting = read_speculative(self.text)
        drafter = "; the log's figure counts the drafter too" if drafting and drafting.weights_include_drafter else ""
        if s.drafting is not None and s.drafting.method.drafter_weights and s.pp == 1:
            drafter += ", and kvbudget's counts it (the drafter weights row)"
        quant = re.search(r"\bquantization=(\w+)", self.text)  # the engine line's: the method vLLM loaded with
        if quant and quant.group(1) != "None" and not quantized(model):
            return [LogRow("weights per GPU", f"{float(weights.group(1)):.2f} GiB", f"{w.per_gpu_bytes / GIB:.2f} GiB",
                           None, f"{diff:+.1%}: the log loads a {quant.group(1)} checkpoint and {model.name}'s config "
                           "states no quantization, so its weights are not comparable (shown); give --model the "
                           "checkpoint's config.json" + drafter)]
        return [LogRow("weights per GPU", f"{float(weights.group(1)):.2f} GiB", f"{w.per_gpu_bytes / GIB:.2f} GiB",
                       abs(diff) < 0.02, f"{diff:+.1%}: vLLM measures allocated memory (buffers, padding, quantized "
                       "checkpoints); kvbudget counts parameters" + drafter)]


def _cache_rows(rows: list[LogRow]) -> list[LogRow]:
    """The rows that check the cache itself (the weights and the memory terms check the plan's estimates)."""
    return [r for r in rows if r.quantity != "weights per GPU" and not r.quantity.startswith("memory: ")]


def check_log(engine: VLLMEngine, text: str, model: ModelSpec, given: dict | None = None) -> LogCheck:
    """vLLM V0 and V1, GPU and CPU builds, plain or structured logging: the settings and KV budget it printed
    (or the refusal it printed), and what kvbudget makes of them under that release's rules."""
    given = dict(given or {})
    log = _Log(engine, text, model)
    conc, refusal, v0_refusal, cpu_blocks = log.conc, log.refusal, log.v0_refusal, log.cpu_blocks
    refused_len = (refusal.max_len if refusal else None) or (v0_refusal.group(1) if v0_refusal else None)
    st, read, assumed = read_settings(text, given, refused_len, conc,
                                       any(isinstance(layer, RecurrentState) for layer in model.layers),
                                       model.max_position_embeddings or 0)
    budgets = _rank_budgets(text)
    budget_from_refusal = not budgets and refusal is not None and refusal.available is not None
    if budget_from_refusal and refusal and refusal.available:
        budgets = [refusal.available]
    if not budgets and st.device == Device.CPU:  # the CPU backend's budget is VLLM_CPU_KVCACHE_SPACE (GiB), 4 unset
        space = re.search(r"VLLM_CPU_KVCACHE_SPACE[= ]['\"]?(\d+)", text)
        budgets = [space.group(1) if space else "4"]
        if not space:
            assumed["VLLM_CPU_KVCACHE_SPACE"] = "4 GiB (vLLM's default when unset)"
    if (cpu_blocks or v0_refusal) and (st.version is None or st.version >= (0, 8)):
        # only V0 printed CPU (swap) blocks and this refusal; 0.8-0.10 still ran V0 on request (and on CPUs)
        if st.version is None:
            assumed["engine_version"] = "V0 (< 0.8: the log prints V0's CPU blocks or refusal)"
        else:
            read["engine"] = "V0 (its CPU blocks or refusal)"
        st = replace(st, version=(0, 7) if st.version else (0, 6), hybrid=False)
    if not budgets and cpu_blocks:
        return _drafting(v0_check_without_budget(engine, text, model, st, assumed, v0_refusal, conc,
                                                 int(cpu_blocks.group(1))), text, model, st)
    if not st.max_len:
        raise KVBudgetError(NO_MAX_LEN)
    tokens_line = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", text)
    if not budgets and tokens_line and conc and st.version is None:
        st = _era_of_the_token_count(engine, model, st, assumed, int(num(tokens_line.group(1))), conc.group(2))
        if st.version is None:  # neither era's meaning agrees: the newest's rows, the other era named if it agrees
            assumed["engine_version"] = (">= 0.20 (not in the log; under neither era's meaning does its token count "
                                         "agree with its concurrency)")
            st = replace(st, version=(0, 32))
    if not budgets and tokens_line and conc and st.version is not None:
        return _drafting(v1_check_without_budget(engine, model, st, assumed, int(num(tokens_line.group(1))),
                                                 conc.group(2)), text, model, st)
    blocks_line = re.search(r"# GPU blocks: (\d+)\s*$", text, re.MULTILINE)
    if not budgets and blocks_line and conc:
        return _drafting(early_v1_check(engine, model, st, read, assumed, int(blocks_line.group(1)), conc.group(2)),
                         text, model, st)
    if not budgets and refusal and refusal.needed:  # the refusal cut before the memory it had
        return _drafting(needed_check(engine, model, st, read, assumed, refusal.needed), text, model, st)
    if not budgets and not conc and (counted := count_check(engine, text, model, st, read, assumed, v0_refusal)):
        weighed = log._weights_rows(st)
        heavier = tuple(f"the weights: vLLM loaded {r.logged} per GPU where kvbudget counts {r.predicted} ({r.note})"
                       for r in weighed if r.matches is False)  # what left no cache, where the budget is below zero
        return _drafting(replace(counted, rows=counted.rows + tuple(weighed), causes=counted.causes + heavier), text,
                         model, st)
    if not budgets and (argued := argslog.check(text, model, st, shown_settings(st, read, assumed), assumed, lambda: (
            (layout := engine.layout(model, st.kv_dtype, st.tp, st.options())[0]).block_bytes, layout.block_size))):
        return argued  # a shape line or the arguments alone (engines/vllm/argslog.py)
    if not budgets:
        raise KVBudgetError("check-log: the vLLM log states no KV budget ('Available KV cache memory', "
                            "'kv_cache_size=', 'Explicitly set' or a refusal naming the available memory); run vLLM "
                            f"at INFO level (understood: {understood(text)})")
    log.budget(budgets, budget_from_refusal, st.device)
    rows = log.rows(st)
    causes: list[str] = []
    kv_rows = _cache_rows(rows)
    if not all(r.matches for r in kv_rows):
        causes = _likely_causes(st, assumed, log.rows, rows, model)
        if len(budgets) == 1 and st.tp * st.pp > 1 and not budget_from_refusal and not log.exact:
            rank = _smaller_rank(st, log.rows, log.value, log.half_step)  # first; replaces "none of the known causes"
            causes = rank + [c for c in causes if not (rank and c.startswith("none of"))]
    rows += offload_rows(engine, model, text, size=setting(text, "kv_offloading_size"),
                         backend=setting(text, "kv_offloading_backend"), kv_dtype=st.kv_dtype, tp=st.tp,
                         options=st.options())
    return _drafting(LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(st, read, assumed),
                              rows=tuple(rows), assumed=assumed, causes=tuple(causes)), text, model, st)


def _drafting(check: LogCheck, text: str, model: ModelSpec, st: LogSettings) -> LogCheck:
    """The check with the log's drafting beside the plan's for the same settings (st.drafting, whose drafter the
    KV rows above already count), with the drafter's weights as the plan loads them (speculative.py's
    drafter_weights) where the method has a model of its own."""
    logged = read_speculative(text)
    if logged is None:
        return check
    plan = st.drafting  # the model's own MTP layers (speculative.py's mtp_weights) or a head's or draft model's
    try:
        weights = speculative.drafter_weights(model, plan, st.tp) if plan is not None and st.pp == 1 else None
    except KVBudgetError:  # a quantization kvbudget does not count: the row shows the log's line alone
        weights = None
    rows = speculative_rows(logged, plan, drafter_bytes=weights[0] if weights else None)
    if weights and plan is not None and plan.method is SpecMethod.MTP:  # which layers kvbudget counts
        rows = [replace(r, note=f"{r.note}; kvbudget: {weights[1].split(' B per GPU')[0]} B per GPU")
                if r.quantity == "speculative: drafter weights" else r for r in rows]
    if plan is not None and plan.draft_id and logged.draft and plan.draft_id != logged.draft:
        # the drafter was loaded from another name (draft_model) as a stand-in for the log's: shown, not compared
        rows = [replace(r, matches=None, note=f"loaded from {plan.draft_id} in place of the log's path")
                if r.quantity == "speculative: draft model" else r for r in rows]
    return replace(check, rows=check.rows + tuple(rows))


def _era_of_the_token_count(engine: VLLMEngine, model: ModelSpec, st: LogSettings, assumed: dict, tokens: int,
                            concurrency: str) -> LogSettings:
    """No release named: the token count means int(concurrency x max_model_len) from 0.20, blocks // groups x
    block size before; where the count and the concurrency agree under one meaning only, that is the era."""
    def agree(version: tuple[int, int]) -> bool:
        try:
            rows = v1_blocks_rows(engine, model, replace(st, version=version), tokens, concurrency)
        except KVBudgetError:  # a setting that release does not have (speculative decoding before 0.20)
            return False
        return all(r.matches for r in rows)

    eras = [(version, label) for version, label in (((0, 32), ">= 0.20"), ((0, 19), "<= 0.19")) if agree(version)]
    if len(eras) != 1:
        return st
    assumed["engine_version"] = (f"{eras[0][1]} (not in the log; the only era under which its token count "
                                 "and concurrency agree)")
    return replace(st, version=eras[0][0])


def _smaller_rank(st: LogSettings, rows_for: Callable[..., list[LogRow]], value: float, half_step: float,
                  reach: float = 0.05) -> list[str]:
    """The log prints one rank's budget, and vLLM gives every rank the smallest rank's blocks: the largest budget
    within `reach` below the printed one (in the log's own rounding steps) under which every row agrees, if any."""
    steps = int(value * reach / (2 * half_step))
    for k in range(1, steps + 1):
        other = round(value - 2 * half_step * k, 6)
        rows = _cache_rows(rows_for(st, (max(other - half_step, 0), other + half_step)))
        if all(r.matches for r in rows):
            return [f"the log prints one rank's budget ({value:g} GiB) and vLLM sizes every rank's cache to the "
                    f"smallest rank's: a rank with {other:g} GiB ({other / value - 1:+.1%}) gives the log's rows "
                    "(the other ranks' lines are not in the excerpt)"]
    return []


def _likely_causes(st: LogSettings, assumed: dict, rows_for: Callable[[LogSettings], list[LogRow]],
                   rows: list[LogRow], model: ModelSpec) -> list[str]:
    """Alternative settings, the assumed ones first, under which the KV rows agree: each a likely cause, with the
    size of its effect on the first row that differed."""
    alternatives: list[tuple[str, LogSettings]] = []
    if "kv_cache_dtype" in assumed or st.kv_dtype == "auto":
        alternatives.append(("the cache is fp8 (--kv-cache-dtype fp8), not the model dtype",
                             replace(st, kv_dtype="fp8")))
    if st.kv_dtype != "auto":
        alternatives.append(("the cache is in the model dtype (kv_cache_dtype auto)", replace(st, kv_dtype="auto")))
    for tp in other_sizes(st, "tp", (1, 2, 4, 8)):
        alternatives.append((f"tensor parallel size {tp}, not {st.tp} (the log's budget is one rank's)",
                             replace(st, tp=tp)))
    for pp in other_sizes(st, "pp", (2, 4)):
        alternatives.append((f"pipeline parallel size {pp}: the budget is one stage's",
                             replace(st, pp=pp, partition=None)))
    alternatives.append(("sliding-window layers sized as full attention (vLLM < 0.9, or "
                         "--disable-hybrid-kv-cache-manager)" if st.hybrid else
                         "the hybrid KV cache manager was on (sliding windows sized to their reservation)",
                         replace(st, hybrid=not st.hybrid)))
    alternatives.append(("prefix caching " + ("off" if st.prefix else "on"), replace(st, prefix=not st.prefix)))
    if any(isinstance(layer, LatentAttention) for layer in model.layers) and st.backend is None:
        for backend, label in (("FLASHMLA", "FlashMLA's 64-token blocks"), ("TRITON_MLA", "16-token MLA blocks"),
                               ("CUTLASS_MLA", "CUTLASS MLA's 128-token blocks"),
                               ("FLASHINFER_MLA", "FlashInfer MLA's blocks")):
            alternatives.append((f"the MLA backend was {backend} ({label}; --attention-backend)",
                                 replace(st, backend=backend)))
    for version, label in (((0, 6), "vLLM V0 (< 0.8: blocks of every layer, no null block)"),
                           ((0, 8), "vLLM 0.8 (no hybrid manager, FlashMLA)"),
                           ((0, 15), "vLLM 0.14-0.16 (the whole model checked under pipeline parallelism)"),
                           ((0, 19), "vLLM 0.9-0.19 (its token count: physical slots)"),
                           ((0, 24), "vLLM >= 0.20 (its token count: concurrency x max_model_len)")):
        if st.version != version:  # the version as a whole: its token count, sizing and checks
            alternatives.append((label + ", not the version read or given",
                                 replace(st, version=version, hybrid=Release(version).hybrid_allocator)))
    base = {r.quantity: r for r in rows}  # the rows under the settings read
    causes = []
    for label, alt in alternatives:
        try:
            alt_rows = _cache_rows(rows_for(alt))
        except KVBudgetError:
            continue
        if alt_rows and all(r.matches for r in alt_rows):
            first = next((r for r in alt_rows if r.quantity in base and not base[r.quantity].matches), None)
            effect = f" ({first.quantity}: {base[first.quantity].predicted} -> {first.predicted})" if first else ""
            causes.append(label + effect)
    return causes or ["none of the known causes (dtype, tensor/pipeline parallel size, window sizing, prefix "
                      "caching, MLA backend, the version's rules) makes the rows agree: check the model and its "
                      "config"]
