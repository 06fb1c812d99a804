"""Hugging Face TGI (text-generation-inference; maintenance mode since Dec 2025): paged blocks after warm-up.

From TGI's source (server/text_generation_server/models/flash_causal_lm.py); not run here,
so every TGI figure is labelled "from the source":

- a block holds `L x B x Hkv_shard x D x 2 x s` bytes; B = 1 with flashinfer (default), 256 with
  flashdecoding, 16 paged; `max_batch_total_tokens = num_blocks x B`; block 0 is reserved;
- sliding windows are not used for allocation (every layer full);
- DeepSeek-V2/V3 are not cached as a latent: K and V for every head at `qk_nope + rope` width (V padded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from kvbudget.dtypes import KVDtype
from kvbudget.engines.base import (
    DEFAULT_SAMPLED_ROWS,
    NON_TORCH_ESTIMATE,
    Allocation,
    CacheGroup,
    Capacity,
    Engine,
    EngineOptions,
    LogCheck,
    LogRow,
    OutputLimit,
    Serving,
    UsageGauge,
    cheaper_if_wider,
    group_layers,
    largest_fitting,
    serving_kv_dtype,
)
from kvbudget.engines.kinds import KindTable, no_cache
from kvbudget.engines.metrics import PoolGauge, PoolReport, gauge_ratio, tokens_budget
from kvbudget.engines.tgi.gauges import tgi_pool
from kvbudget.engines.tgi.logs import NO_POOL, REFUSED, WARMUP, limit_rows, limits, warmup_rows
from kvbudget.engines.tgi.releases import describe, era, parse_release
from kvbudget.errors import BudgetError, EngineRuleError, KVBudgetError, UnsupportedArchitectureError
from kvbudget.model.spec import (
    Attention,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    ModelSpec,
    NoCache,
    RecurrentState,
)
from kvbudget.units import GIB, cdiv

BLOCK_SIZES = (1, 16, 256)  # flashinfer (the default), paged, flashdecoding
SOURCE_NOTE = "TGI figures follow its source (not run here): every layer full, MLA expanded per head"
MAX_BATCH_PREFILL_TOKENS = 4096  # the warm-up forward pass (launcher default)


@dataclass(frozen=True)
class TGIEngine(Engine):
    name: str = "tgi"
    unchecked_families: ClassVar[dict[str, str]] = {
        "gemma4_text": ("Gemma 4's sliding and global layers of different sizes have not been checked "
                        "against TGI's cache")}
    description: str = "TGI paged blocks after warm-up (from its source; not run here)"

    serves = True
    usage = UsageGauge(path="/metrics", read=lambda text: gauge_ratio(text, "tgi_batch_current_max_tokens",
                                                            "tgi_batch_max_total_tokens"),
                       promql="max by (instance) (tgi_batch_current_max_tokens / tgi_batch_max_total_tokens)")
    pool_gauge = PoolGauge(paths=("/info",), read=tgi_pool)
    queue_gauges = ("tgi_batch_current_size", "tgi_queue_size")
    # max_tokens (TGI reads no max_completion_tokens); none: max_total_tokens less the input
    output_limit = OutputLimit(chat=("max_tokens",), completions=("max_tokens",), completions_default=None,
                               source="text-generation-inference router/src/lib.rs (ChatRequest), validation.rs")
    log_signatures = (r"KV-cache blocks: \d+, size: \d+", r"text_generation_launcher: Args \{",
                      r"max_batch_total_tokens: (?:Some\()?\d+", r"Setting max batch total tokens to \d",
                      r"Inferred max batch total tokens: \d",  # the router's (backends/v3/src/lib.rs)
                      WARMUP.pattern)

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """The pool's tokens at this engine's bytes per token."""
        return tokens_budget(self, model, report, kv_dtype, tp, options)

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        self.refuse_unchecked(model, options)
        dtype = serving_kv_dtype(model, kv_dtype, tp, "TGI", "auto and fp8 (e4m3 / e5m2)")
        block = options.block_size or 1
        if block not in BLOCK_SIZES:
            raise EngineRuleError(f"block_size {block}: TGI uses 1 (flashinfer), 16 (paged) or 256 (flashdecoding)",
                                  param="block_size")
        groups = group_layers(_GROUP(layer, dtype, tp, model.name, block) for layer in model.layers)
        return Allocation(engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=groups, exact=False,
                          notes=(SOURCE_NOTE,))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        self.refuse_unchecked(model, options)
        alloc = self.allocate(model, kv_dtype, tp, options)
        block = options.block_size or 1
        block_bytes = alloc.bytes_per_token * block
        num_blocks = kv_memory // block_bytes
        if num_blocks < 2:
            raise BudgetError(f"kv_memory: {kv_memory} bytes holds {num_blocks} TGI block(s) of "
                              f"{block_bytes} bytes; block 0 is reserved, so at least 2 are needed", param="kv_memory")
        usable = num_blocks - 1
        per_request = cdiv(max_model_len, block)
        fits = per_request <= usable
        longest = None if fits else largest_fitting(lambda n: cdiv(n, block) <= usable, max_model_len)
        tokens = num_blocks * block
        return Capacity(engine=self.name, kv_memory_bytes=kv_memory, num_blocks=num_blocks, block_size=block,
                        kv_cache_tokens=tokens, physical_token_slots=usable * block, max_model_len=max_model_len,
                        max_concurrency=usable / per_request, fits=fits, estimated_max_model_len=longest,
                        notes=(f"TGI log: KV-cache blocks: {num_blocks}, size: {block}; "
                         f"max_batch_total_tokens {tokens}", SOURCE_NOTE))

    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "", tp: int = 1, model: ModelSpec | None = None) -> Serving:
        """The warm-up's rule of the release (tgi/releases.py): from 3.0 a share of the total (CUDA_MEMORY_FRACTION,
        given as utilization, times TGI_WIGGLE_ROOM), before it all of that less a share of what stays free."""
        rule = era(options.engine_version)
        return Serving(memory_fraction=rule.wiggle if rule.of_total else 1.0, memory_knob=describe(rule),
                       given_fraction_scale=rule.wiggle if rule.of_total else 1.0,
                       free_share=1.0 if rule.of_total else rule.wiggle,
                       prefill_tokens=MAX_BATCH_PREFILL_TOKENS,
                       prefill_note=f"warm-up pass over max_batch_prefill_tokens ({MAX_BATCH_PREFILL_TOKENS})",
                       max_num_seqs=DEFAULT_SAMPLED_ROWS, overhead_bytes=NON_TORCH_ESTIMATE,
                       overhead_note="non-torch memory", options=options)

    def parse_release(self, version: str) -> tuple[int, ...]:
        return parse_release(version)

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        return cheaper_if_wider(current, "fp8")

    def honours_windows(self, model: ModelSpec) -> bool:
        return False

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        """TGI prints its block count and size, and the max_batch_total_tokens they make; the budget they imply
        follows from kvbudget's bytes per token for the model (every layer full, MLA expanded)."""
        check = self.check_log_without_model(text, given)
        m = re.search(r"KV-cache blocks: (\d+), size: (\d+)", text)
        if m is None:  # no blocks: its token limits, and max_total_tokens against the model's context
            token_bytes = self.allocate(model, "auto", check.settings.get("num_shard", 1)).bytes_per_token
            check = replace(check, rows=tuple(_limit_rows(text, model, token_bytes)))
            if "max_batch_total_tokens" not in check.settings:  # no KV line at all
                if all(r.matches is None for r in check.rows):
                    raise KVBudgetError(REFUSED if WARMUP.search(text) else NO_POOL)
                return replace(check, assumed={**check.assumed,
                                               "KV pool": "not in the log (no KV line): its token limits checked"})
        size = int(m.group(2)) if m else None
        tokens = int(m.group(1)) * int(m.group(2)) if m else int(check.settings["max_batch_total_tokens"])
        shards = check.settings.get("num_shard", 1)
        alloc = self.allocate(model, "auto", shards, EngineOptions(block_size=size if size in BLOCK_SIZES else None))
        implied = LogRow("KV memory per shard", "-", f"{tokens * alloc.bytes_per_token / GIB:.2f} GiB", True,
                         f"implied by {alloc.bytes_per_token:,} bytes per token for {model.name}")
        return replace(check, rows=(*check.rows, implied))

    def check_log_without_model(self, text: str, given: Mapping[str, Any] | None = None) -> LogCheck:
        """TGI's own arithmetic: max_batch_total_tokens = blocks x block size (or, before TGI printed its blocks,
        the max_batch_total_tokens its arguments state, shown)."""
        m = re.search(r"KV-cache blocks: (\d+), size: (\d+)", text)
        s = re.search(r"(?:--num-shard|NUM_SHARD=|num_shard:?)[ =]?(?:Some\()?(\d+)", text)
        shards = int(s.group(1)) if s else (given or {}).get("tp")  # the log's, else --tp's, else one (assumed)
        read = {"num_shard": int(shards)} if shards else {}
        unstated = {} if shards else {"num_shard": "1 (not in the log; --tp sets it)"}
        if m is None:  # TGI's token limits as its arguments state them, checked against each other
            stated = limits(text)
            rows = _limit_rows(text)
            argued = {"max_batch_total_tokens": stated["max_batch_total_tokens"]} if (
                "max_batch_total_tokens" in stated) else {}
            return LogCheck(engine="tgi", model_in_log=None, settings={**read, **argued}, rows=tuple(rows),
                            assumed=unstated)
        blocks, size = int(m.group(1)), int(m.group(2))
        rows = [LogRow("KV-cache blocks", f"{blocks:,} of {size}", "-", True, "read from the log")]
        total = re.search(r"(?:max batch total tokens to\s+|MAX_BATCH_TOTAL_TOKENS\W+)(\d+)", text)
        if total:
            rows.append(LogRow("max batch total tokens", f"{int(total.group(1)):,}", f"{blocks * size:,}",
                               int(total.group(1)) == blocks * size, "TGI: blocks x block size"))
        return LogCheck(engine="tgi", model_in_log=None, settings={**read, "block_size": size}, assumed=unstated,
                        rows=tuple(rows))


def _limit_rows(text: str, model: ModelSpec | None = None, token_bytes: int | None = None) -> list[LogRow]:
    """A log without a KV line: the warm-up's refusal where it has one, and the token limits it states (an error
    where it states neither)."""
    stated = limits(text)
    refused = warmup_rows(text, stated, token_bytes)
    return [*refused, *(limit_rows(stated, model) if stated or not refused else [])]


def _indexer(layer: IndexerKeys, dtype: KVDtype, tp: int, where: str, block: int) -> CacheGroup:
    raise UnsupportedArchitectureError(f"{where}: kvbudget does not model TGI's sparse-attention indexer cache yet; "
                                       "use the vllm or hf engine")


def _recurrent(layer: RecurrentState, dtype: KVDtype, tp: int, where: str, block: int) -> CacheGroup:
    raise UnsupportedArchitectureError(f"{where}: TGI does not serve models with recurrent (Mamba / linear "
                                       "attention) layers")


def _latent(layer: LatentAttention, dtype: KVDtype, tp: int, where: str, block: int) -> CacheGroup:
    """Every shard holds its share of the heads, each expanded to the K width (V padded to it)."""
    heads = max(1, layer.heads // tp)
    width = layer.expanded_k_dim
    return CacheGroup(kind=FullAttention.kind, layers=1, bytes_per_token=2 * dtype.bytes_for(heads * width),
                      detail=f"MLA expanded: {heads} heads x ({width} K + {width} V, padded) x {dtype.name}",
                      block_size=block)


def _attention(layer: Attention, dtype: KVDtype, tp: int, where: str, block: int) -> CacheGroup:
    """Every layer full: a window is cached in full."""
    heads = layer.kv_heads_per_rank(tp, where)
    width = max(layer.k_dim, layer.v_dim)
    detail = f"{heads} KV heads x ({width} K + {width} V) x {dtype.name}" + (
        " (window cached in full)" if layer.token_span is not None else "")
    return CacheGroup(kind=FullAttention.kind, layers=1, bytes_per_token=2 * dtype.bytes_for(heads * width),
                      detail=detail, block_size=block)


# One layer's cache as TGI stores it, by the layer's kind: (layer, dtype, tp, where, block) -> group or None
_GROUP: KindTable[CacheGroup | None] = KindTable("tgi", {
    Attention: _attention, LatentAttention: _latent, IndexerKeys: _indexer, RecurrentState: _recurrent,
    NoCache: no_cache})
TGIEngine.layer_kinds = _GROUP.kinds


TGI = TGIEngine()
