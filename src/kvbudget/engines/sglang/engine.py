"""SGLang: one token pool sized from the memory left after weights (`mem_fraction_static`).

From SGLang's source (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py,
memory_pool.py); not run here (no CPU build), so every SGLang figure is labelled "from the source":

- a token cell holds `Hkv_rank x (Dk + Dv) x s` per layer; MLA `(kv_lora_rank + rope) x s` on every rank;
- `max_total_num_tokens = kv_memory // cell`, rounded down to the page size (default 1);
- Gemma-2/3, gpt-oss and Mistral-style windows are cached in full (its hybrid SWA pool is off for them);
  we treat every window that way;
- Mamba / gated-delta-net state in float32 with kernel - 1 conv columns, one slot per running request;
- DeepSeek-V3.2 (NSA pool, mem_cache/memory_pool.py of 0.5.3): pages of 64; an fp8 latent row of 656 bytes
  (512 fp8 + 4 float32 scales + 64 bf16 rope values) or the bf16 576; beside it the indexer keys, 128 fp8 + a
  float32 scale per 128 = 132 bytes per token and layer; SGLang makes the cache fp8 on compute capability 10.x
  (server_args.py). Buffers hold `size + page_size` rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from kvbudget.dtypes import KVDtype, get_dtype
from kvbudget.engines.base import (
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
    layer_stages,
    serving_kv_dtype,
)
from kvbudget.engines.kinds import KindTable, no_cache
from kvbudget.engines.metrics import PoolGauge, PoolReport, first_gauge, tokens_budget
from kvbudget.engines.sglang import speculative as drafting
from kvbudget.engines.sglang import startlog
from kvbudget.engines.sglang.gauges import sglang_pool
from kvbudget.engines.sglang.hicache import hicache_rows, hicache_tier
from kvbudget.engines.sglang.releases import (
    AITER_CONTEXT,
    MODELLED,
    NEWEST,
    aiter_factor,
    era,
    mem_fraction_static,
    multimodal_factor,
    parse_release,
    piecewise_mib,
    release_name,
)
from kvbudget.engines.tiers import HostTier
from kvbudget.errors import BudgetError, EngineRuleError, KVBudgetError, UnsupportedArchitectureError
from kvbudget.gpus import gpus, reported_total
from kvbudget.model.params import vision_tower
from kvbudget.model.spec import (
    Attention,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    ModelSpec,
    NoCache,
    RecurrentState,
)
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import GIB, MIB, log_figure

_F32 = get_dtype("float32")
SOURCE_NOTE = "SGLang figures follow its source (not run here): windows cached in full, page size 1"


@dataclass(frozen=True)
class SGLangEngine(Engine):
    name: str = "sglang"
    expert_parallel: ClassVar[bool] = True  # vLLM --enable-expert-parallel, SGLang --enable-dp-attention --ep
    unchecked_families: ClassVar[dict[str, str]] = {
        "gemma4_text": ("Gemma 4's sliding and global layers of different sizes have not been checked "
                        "against SGLang's pools")}
    description: str = "SGLang token pool (from its source; not run here)"

    serves = True
    usage = UsageGauge(path="/metrics", read=lambda text: first_gauge(text, ("sglang:token_usage",)),
                       promql="max by (instance) (sglang:token_usage)", series="sglang:token_usage")
    pool_gauge = PoolGauge(paths=("/server_info", "/get_server_info"), read=sglang_pool)
    queue_gauges = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
    # chat: `max_completion_tokens or max_tokens` (a 0 falls through); none: clipped to the context and the KV
    # memory by the scheduler; completions: max_tokens, 16 by default
    output_limit = OutputLimit(chat=("max_completion_tokens", "max_tokens"), completions=("max_tokens",),
                               completions_default=16, zero_is_absent=True,
                               source="sglang 0.5.23 srt/entrypoints/openai/protocol.py, managers/scheduler.py")
    # 2026 releases print the dtype before #tokens; the scheduler's line follows the pool's
    log_signatures = (r"KV Cache is allocated\.[^\n]*#tokens", r"max_total_num_tokens=\d+\b",
                      *startlog.SIGNATURES)

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        self.refuse_unchecked(model, options)
        dtype = self._dtype(model, kv_dtype, tp, options)
        page = options.block_size or (NSA_PAGE if _nsa(model) else 1)
        act = get_dtype(model.dtype)
        groups = group_layers(_CELL(layer, dtype, act, tp, model.name, page, _nsa(model)) for layer in model.layers)
        notes = (SOURCE_NOTE,) + ((f"DeepSeek sparse attention (NSA): pages of {NSA_PAGE}; SGLang makes the cache "
                                   "fp8 on compute capability 10.x",) if _nsa(model) else ())
        return Allocation(engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=groups, exact=False,
                          notes=notes)

    def _dtype(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> KVDtype:
        if kv_dtype == "auto" and _nsa(model) and options.compute_capability and \
                int(options.compute_capability.split(".")[0]) >= 10:
            kv_dtype = "fp8"  # server_args.py: "Setting KV cache dtype to fp8." for NSA on Blackwell
        return serving_kv_dtype(model, kv_dtype, tp, "SGLang", "auto, bf16, fp16, fp32 and fp8")

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        self.refuse_unchecked(model, options)
        alloc = self.allocate(model, kv_dtype, tp, options)
        page = options.block_size or 1
        cell = alloc.bytes_per_token
        fixed = alloc.fixed_bytes_per_sequence
        if cell == 0:
            raise UnsupportedArchitectureError(f"{model.name}: no attention layer; SGLang's token pool is not what "
                                               "limits it")
        tokens = kv_memory // cell // page * page
        if tokens < page:
            raise BudgetError(f"kv_memory: {kv_memory} bytes is less than one page of {page} token(s) "
                              f"({cell * page} bytes)", param="kv_memory")
        spec = options.speculative
        notes: tuple[str, ...] = ()
        if spec is not None and (extra := drafting.headroom(spec)):
            drafted = self._draft_cell(model, spec, kv_dtype, tp, options)
            notes = (f"speculative {drafting.NAMES[spec.method]} ({spec.num_tokens} steps, topk 1, "
                     f"{spec.num_tokens + 1} draft tokens): the pool gets {extra:,} tokens of headroom "
                     f"(max_running_requests {drafting.MAX_RUNNING_REQUESTS}), and the drafter a pool of its own of "
                     f"as many tokens, {(tokens + extra) * drafted / GIB:.2f} GiB ({drafted:,} B per token), sized "
                     "apart: it and the drafter's weights come out of the memory SGLang leaves aside (SGLang 0.5.3 "
                     "model_runner.py, from source)",)
            tokens += extra
        concurrency = tokens / max_model_len
        if fixed:  # recurrent state slots come out of the same memory
            concurrency = kv_memory / (cell * max_model_len + fixed)
        fits = tokens >= max_model_len
        longest = None if fits else largest_fitting(lambda n: n <= tokens, max_model_len)
        return Capacity(engine=self.name, kv_memory_bytes=kv_memory, num_blocks=None, block_size=page,
                        kv_cache_tokens=tokens, physical_token_slots=tokens, max_model_len=max_model_len,
                        max_concurrency=concurrency, fits=fits, estimated_max_model_len=longest,
                        notes=(f"SGLang log: KV Cache is allocated. #tokens: {tokens}", SOURCE_NOTE, *notes))

    def speculative_methods(self, options: EngineOptions) -> tuple[SpecMethod, ...]:
        """EAGLE, EAGLE3, NEXTN, STANDALONE and NGRAM, as SGLang 0.5.3's source sizes them (engines/sglang/
        speculative.py); other releases' rules were not read."""
        return drafting.methods(options.engine_version or NEWEST)

    def check_speculative(self, model: ModelSpec, spec: Speculative, options: EngineOptions) -> None:
        super().check_speculative(model, spec, options)
        if spec.method is SpecMethod.MTP and not model.draft_layers:
            raise UnsupportedArchitectureError(f"{model.name}: speculative mtp: its config declares no MTP layers "
                                               "kvbudget models", param="speculative")

    def _draft_cell(self, model: ModelSpec, spec: Speculative, kv_dtype: str, tp: int, options: EngineOptions) -> int:
        """Bytes per token of the drafter's own pool: its layers' (NEXTN: the model's MTP layers')."""
        if spec.draft is not None:
            return self.allocate(spec.draft, kv_dtype, tp).bytes_per_token
        dtype = self._dtype(model, kv_dtype, tp, options)
        page = options.block_size or 1
        groups = group_layers(_CELL(layer, dtype, get_dtype(model.dtype), tp, model.name, page, _nsa(model))
                              for layer in model.draft_layers)
        return sum(g.layers * g.bytes_per_token for g in groups)

    def scheduler_defaults(self, tokens: int, context_len: int, gpu_memory: int | None) -> tuple[int, int]:
        """(chunked_prefill_size, max_running_requests) as SGLang 0.5.23 picks them: the chunk by the GPU's
        memory (arg_groups/memory_hook.py), the request cap from the token pool
        (mem_cache/kv_cache_configurator.py resolve_max_num_reqs)."""
        mib = gpu_memory / 2**20 if gpu_memory else None
        if mib is None:
            chunk = 4096
        else:
            chunk = next(size for limit, size in ((20 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192),
                                                   (float("inf"), 16384)) if mib < limit)
        estimated = max(min(int(tokens / context_len * 512), 4096), 2048)
        return chunk, min(estimated, tokens // 2)

    def kv_buffers(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                   options: EngineOptions = EngineOptions()) -> tuple[int, int, int]:
        """Bytes per token of SGLang's K buffer, its V buffer and its indexer-key buffer on one rank (MLA: latent
        and rope key; an fp8 NSA latent row of 656 bytes holds both)."""
        self.refuse_unchecked(model, options)
        dtype = self._dtype(model, kv_dtype, tp, options)
        rows = [_BUFFERS(layer, dtype, tp, model.name, _nsa(model)) for layer in model.layers]
        k_bytes, v_bytes, index_bytes = (sum(column) for column in zip((0, 0, 0), *rows, strict=False))
        return k_bytes, v_bytes, index_bytes

    def pipeline_stages(self, num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[range]:
        if partition is not None:
            raise EngineRuleError("pp_layer_partition: SGLang splits layers evenly; a partition is vLLM's "
                                  "(VLLM_PP_LAYER_PARTITION)", param="pp_layer_partition")
        return layer_stages(num_layers, pp)

    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "", tp: int = 1, model: ModelSpec | None = None) -> Serving:
        version = options.engine_version or NEWEST
        drafter = drafting.reserve_mib(options.speculative)
        vision = vision_tower(model) if model else None
        vendor = next((card.vendor for card in gpus() if card.name == gpu_name), "")
        reported = reported_total(gpu_memory, gpu_name) / MIB  # nvidia-smi's / rocminfo's, not torch's
        graphs = piecewise_mib(reported, tp, version, bool(model and model.has_latent)) if _piecewise(
            model, vision, vendor, options) else 0
        fraction = mem_fraction_static(reported, tp, 1, version, drafter, graphs)
        knob = f"mem_fraction_static default ({release_name(era(version))}'s rule for this card"
        factor, scales_given = multimodal_factor(vision, version)
        cut = aiter_factor(version, max_model_len, _mla_heads(model, tp)) if vendor == "AMD" else 1.0
        if cut != 1:
            fraction *= cut
            knob += f", times {cut:g}: the aiter attention SGLang picks on AMD, for a context over {AITER_CONTEXT:,}"
        if graphs:
            knob += f", {graphs:,} MiB more left aside for piecewise CUDA graphs"
        if drafter:
            knob += f", {drafter // 1024} GiB more left aside for the speculative drafter"
        if factor != 1:
            fraction *= factor
            knob += f", times {factor:.3f} for a model with a vision tower"
        before = PRELOAD_TP8 if tp >= 8 else PRELOAD
        return Serving(memory_fraction=fraction, memory_knob=knob + ")", prefill_tokens=0,
                       prefill_note="SGLang keeps activations in the (1 - mem_fraction_static) it leaves aside",
                       max_num_seqs=0, overhead_bytes=0, preload_bytes=before,
                       given_fraction_scale=(factor if scales_given else 1.0) * cut,
                       overhead_note=(f"SGLang takes its share of the memory free before the weights load, so "
                                      f"the share x what is in use then (CUDA context, NCCL; fit: "
                                      f"{before / GIB:.2f} GiB, one log at tp {'8' if tp >= 8 else '4'})"),
                       options=options)

    def parse_release(self, version: str) -> tuple[int, ...]:
        release = parse_release(version)
        if release is None:
            raise EngineRuleError(f"engine_version {version}: SGLang's rules are modelled for {MODELLED}",
                                  param="engine_version")
        return release

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        return cheaper_if_wider(current, "fp8")

    def honours_windows(self, model: ModelSpec) -> bool:
        return False

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """The pool's tokens at this engine's bytes per token."""
        return tokens_budget(self, model, report, kv_dtype, tp, options)

    offload_backends = ("hicache",)

    def host_tiers(self, model: ModelSpec, *, memory: int, disk: int | None, backend: str, kv_dtype: str, tp: int,
                   options: EngineOptions) -> tuple[HostTier, ...]:
        """HiCache's host pool (engines/sglang/hicache.py)."""
        alloc = self.allocate(model, kv_dtype, tp, options)
        return (hicache_tier(model, alloc, memory=memory, disk=disk, tp=tp, page=options.block_size or 1,
                             version=options.engine_version or NEWEST),)

    def check_log_without_model(self, text: str, given: Mapping[str, Any] | None = None) -> LogCheck:
        from kvbudget.engines.sglang.memorylog import check_without_model  # ReadsLogsWithoutModel

        check = check_without_model(text)  # without a pool line, the profiled pool (engines/sglang/startlog.py)
        check = check if check.rows else replace(check, rows=tuple(startlog.ranks_row(startlog.profiled(text)) or
                                                                   startlog.refusal_rows(text)))
        if not check.rows and not re.search(startlog.SERVER_ARGS, text):  # cut before the pool: a model won't help
            raise KVBudgetError(startlog.CUT)
        return check

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        """SGLang prints its pool in tokens and the buffer sizes per rank ("GB" meaning GiB): K and V apart for
        multi-head pools, one "KV size" for MLA pools (latent and rope key in one buffer; for DeepSeek-V3.2 the
        indexer keys too since October 2025, sglang PR #11309). Buffers hold `tokens + page_size` rows."""
        split = re.search(r"#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", text)
        joint = re.search(r"#tokens: (\d+), KV size: ([\d.]+) GB", text)
        # without the buffer sizes, the pool's count alone: the memory it takes for the model is shown, not checked
        count = split or joint or re.search(r"max_total_num_tokens=(\d+)|#tokens: (\d+)|profiled value (\d+)\.",
                                            text)
        if not count:  # a profiled pool below zero, or the server arguments alone (engines/sglang/startlog.py)
            return startlog.check_without_pool(text, model, dict(given or {}), lambda tp, dtype: sum(
                self.kv_buffers(model, dtype, tp)))
        given = dict(given or {})
        tokens = int(next(g for g in count.groups() if g))
        tp_text = t.group(1) if (t := re.search(r"(?:--tp(?:-size)?|tp_size=)[ =]?(\d+)", text)) else None
        tp = int(given.get("tp") or tp_text or 1)
        dtype_text = d.group(1) if (d := re.search(r"(?:--kv-cache-dtype[ =]|kv_cache_dtype=')(\w+)", text)) else (
            "fp8" if "Setting KV cache dtype to fp8" in text else None)
        if (used := re.search(r"Using KV cache dtype: torch\.(\w+)", text)) is not None:  # what SGLang settled on
            dtype_text = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}.get(used.group(1), used.group(1))
        dtype = str(given.get("kv_cache_dtype") or dtype_text or "auto")
        assumed = {k: v for k, v, found in (("tp", 1, given.get("tp") or tp_text),
                                            ("kv_cache_dtype", "auto", given.get("kv_cache_dtype") or dtype_text))
                   if not found}
        k_bytes, v_bytes, index_bytes = self.kv_buffers(model, dtype, tp)
        rows_held = tokens + (NSA_PAGE if _nsa(model) else 1)  # buffers keep a page (page size 1: a row) more
        pool = LogRow("pool (tokens)", f"{tokens:,}", "-", True, "read from the log; kvbudget checks its buffer sizes"
                      if split or joint else "read from the log, without its buffer sizes to check")
        buffers = _buffer_rows(split, joint, rows_held, k_bytes, v_bytes, index_bytes)
        total = k_bytes + v_bytes + index_bytes
        rows = (pool, *buffers, LogRow("KV memory per rank", "-", f"{rows_held * total / GIB:.2f} GiB",
                                       True if buffers else None,
                                       "the budget this pool implies" + (", indexer keys included" if index_bytes
                                                                         else "")))
        from kvbudget.engines.sglang.memorylog import memory_rows
        from kvbudget.model.weights import model_weights

        recurrent = any(isinstance(layer, RecurrentState) for layer in model.layers)  # its state is sized apart
        version_text = given.get("engine_version") or (
            v.group(1) if (v := re.search(r"sglang(?: version)?[ =:]+v?(\d+\.\d+\.\d+)", text)) else None)
        release = self.parse_release(str(version_text)) if version_text else NEWEST
        factor, scales_printed = multimodal_factor(vision_tower(model), release)
        if not version_text and factor != 1:  # the release decides what a multimodal model's fraction becomes
            assumed["engine_version"] = f"{release_name(NEWEST)} (the log does not say)"
        from kvbudget.engines.sglang.speclog import draft_pool_rule, max_num_reqs, pool_headroom, read_speculative
        from kvbudget.engines.speclog import speculative_rows

        drafting = read_speculative(text)  # a drafter's headroom in the pool, where the release adds one
        context = int(c) if (c := _context_length(text)) else model.max_position_embeddings or 0
        version_seen = str(version_text) if version_text else None

        def headroom(profiled: int) -> int | None:
            if drafting is None or not context:
                return None
            return pool_headroom(version_seen, drafting, max_num_reqs(text, profiled, context))

        rows += tuple(memory_rows(text, tokens, 0 if recurrent else total, model_weights(model, tp).per_gpu_bytes,
                                  scale=factor if scales_printed else 1.0, headroom=headroom if drafting else None))
        if not index_bytes:  # the host pool of a multi-head or MLA pool (not DeepSeek's sparse-attention pools)
            rows += hicache_rows(text, k_bytes + v_bytes, tokens, release)
        if drafting is not None:
            rule = draft_pool_rule(version_seen, drafting, max_num_reqs(text, drafting.pool_tokens or 0, context)
                                   ) if context else None
            rows += tuple(speculative_rows(drafting, draft_pool_tokens=rule))
        settings = {k: v for k, v in (("tp", tp), ("kv_cache_dtype", dtype), ("engine_version", version_text))
                    if k not in assumed and v}
        return LogCheck(engine="sglang", model_in_log=None, settings=settings, rows=rows, assumed=assumed)


def _buffer_rows(split: re.Match | None, joint: re.Match | None, rows_held: int, k_bytes: int, v_bytes: int,
                 index_bytes: int) -> tuple[LogRow, ...]:
    """The buffer sizes a pool line prints beside the model's (K and V apart, or one KV buffer for MLA pools, with
    or without DeepSeek-V3.2's indexer keys); none where the log printed only the pool's count."""
    note = "SGLang's 'GB' are GiB"

    def row(label: str, logged: str, per_token: int, why: str = note) -> LogRow:
        ours = f"{rows_held * per_token / GIB:.2f}"
        return LogRow(label, f"{logged} GB", f"{ours} GiB", f"{log_figure(logged, 'buffer size'):.2f}" == ours, why)

    if split:
        return (row("K buffer per rank", split.group(2), k_bytes), row("V buffer per rank", split.group(3), v_bytes))
    if not joint:
        return ()
    logged = joint.group(2)
    plain = row("KV buffer per rank", logged, k_bytes + v_bytes)
    if not index_bytes:
        return (plain,)
    with_index = row("KV buffer per rank", logged, k_bytes + v_bytes + index_bytes,  # the indexer keys from PR #11309
                     note + "; with the indexer keys (SGLang after PR #11309, October 2025)")
    return (with_index,) if with_index.matches else (
        replace(plain, note=note + "; without the indexer keys (SGLang <= 0.5.3)"),)


# Memory in use before the weights load, below the GPU's catalog figure (SGLang's `Load weight begin. avail mem`):
# 0.42 GiB on an L4 at tp 4 (sglang 0.4.3 log in tests/data/logs: torch's 22.05 GiB total less the 21.63 free; 0.86
# while the catalog's L4 was nvidia-smi's 22.49) and 1.96 GiB on an H200 at tp 8 (`Init torch distributed ends. mem
# usage=1.96 GB`, sglang PR #11716). One log each: fits.
PRELOAD = int(0.42 * GIB)
PRELOAD_TP8 = int(1.96 * GIB)
NSA_PAGE = 64  # SGLang forces 64-token pages for DeepSeek's sparse attention (server_args.py)
NSA_FP8_ROW = 656  # an fp8 NSA latent row: 512 fp8 values, 4 float32 scales, 64 bf16 rope values
INDEX_QUANT_BLOCK = 128


def _context_length(text: str) -> str | None:
    """The context length the log's server arguments state, else None."""
    m = re.search(r"context_length=(\d+)|--context-length[ =]+(\d+)", text)
    return (m.group(1) or m.group(2)) if m else None


# The model types of the architectures SGLang 0.5.10 captures no piecewise CUDA graphs for (configs/model_config.py
# piecewise_cuda_graph_disabled_model_archs: DeepseekV32, Qwen3Next, GlmMoeDsa, BailingMoeV2_5, LLaDA), beside
# DeepSeek's sparse attention (NSA) wherever it appears
_NO_PIECEWISE = ("deepseek_v32", "qwen3_next", "glm_moe_dsa", "bailing_moe_v2_5", "llada")


def _piecewise(model: ModelSpec | None, vision: object, vendor: str, options: EngineOptions) -> bool:
    """Whether SGLang 0.5.10 would capture piecewise CUDA graphs (server_args.py _handle_piecewise_cuda_graph): on
    NVIDIA cards (kvbudget takes a card it has no vendor for as one), not for a multimodal model, a speculative
    drafter or an architecture it turns them off for."""
    return vendor in ("NVIDIA", "") and vision is None and options.speculative is None and not (
        model and (_nsa(model) or model.model_type in _NO_PIECEWISE))


def _mla_heads(model: ModelSpec | None, tp: int) -> int | None:
    """An MLA model's KV heads a rank as SGLang counts them (model_config.py get_num_kv_heads: the config's KV
    heads // tp, at least 1); None for a multi-head model."""
    heads = next((layer.heads for layer in model.layers if isinstance(layer, LatentAttention)), None) if model else None
    return None if heads is None else max(1, heads // tp)


def _nsa(model: ModelSpec) -> bool:
    return any(isinstance(layer, IndexerKeys) for layer in model.layers)


def _index_row(layer: IndexerKeys) -> int:
    """Bytes per token of one layer's indexer keys: fp8 values and a float32 scale per 128 (memory_pool.py)."""
    return layer.dim + layer.dim // INDEX_QUANT_BLOCK * 4


def _indexer_cell(layer: IndexerKeys, dtype: KVDtype, act: KVDtype, tp: int, where: str, page: int,
                  nsa: bool) -> CacheGroup:
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=_index_row(layer),
                      detail=f"indexer key {layer.dim} x fp8 + float32 scale per {INDEX_QUANT_BLOCK} = "
                             f"{_index_row(layer)} B, every rank", block_size=page)


def _latent_cell(layer: LatentAttention, dtype: KVDtype, act: KVDtype, tp: int, where: str, page: int,
                 nsa: bool) -> CacheGroup:
    if nsa and dtype.name.startswith("fp8"):
        return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=NSA_FP8_ROW,
                          detail=f"fp8 latent {layer.latent_dim} + 4 float32 scales + rope {layer.rope_dim} x "
                                 f"bf16 = {NSA_FP8_ROW} B, every rank", block_size=page)
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=dtype.bytes_for(layer.values_per_token),
                      detail=f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, every rank",
                      block_size=page)


def _attention_cell(layer: Attention, dtype: KVDtype, act: KVDtype, tp: int, where: str, page: int,
                    nsa: bool) -> CacheGroup:
    k, v = layer.kv_values(tp, where)
    detail = layer.describe(tp, where, dtype.name) + (
        " (window cached in full)" if layer.token_span is not None else "")
    return CacheGroup(kind=FullAttention.kind, layers=1, bytes_per_token=dtype.bytes_for(k + v), detail=detail,
                      block_size=page)


def _state_cell(layer: RecurrentState, dtype: KVDtype, act: KVDtype, tp: int, where: str, page: int,
                nsa: bool) -> CacheGroup:
    channels, _, state = layer.per_rank(tp, where)
    fixed = act.bytes_for(channels * (layer.conv_kernel - 1)) + _F32.bytes_for(state)
    return CacheGroup(kind=layer.kind, layers=1, bytes_per_token=0, fixed_bytes=fixed,
                      detail=f"{layer.mixer}: conv {channels} x {layer.conv_kernel - 1} x {act.name} + "
                             "float32 state", block_size=page)


# One layer's cells in SGLang's token pool, by the layer's kind: (layer, dtype, act, tp, where, page, nsa)
_CELL: KindTable[CacheGroup | None] = KindTable("sglang", {
    Attention: _attention_cell, LatentAttention: _latent_cell, IndexerKeys: _indexer_cell,
    RecurrentState: _state_cell, NoCache: no_cache})
SGLangEngine.layer_kinds = _CELL.kinds


def _kv_row(layer: Attention | LatentAttention, dtype: KVDtype, tp: int, where: str,
            nsa: bool) -> tuple[int, int, int]:
    """MLA: the latent in K, the rope key in V."""
    k, v = layer.kv_values(tp, where)
    return dtype.bytes_for(k), dtype.bytes_for(v), 0


def _latent_row(layer: LatentAttention, dtype: KVDtype, tp: int, where: str, nsa: bool) -> tuple[int, int, int]:
    """An fp8 NSA latent row holds the latent and the rope key."""
    return (NSA_FP8_ROW, 0, 0) if nsa and dtype.name.startswith("fp8") else _kv_row(layer, dtype, tp, where, nsa)


# Bytes per token one layer adds to the K, V and indexer-key buffers: (layer, dtype, tp, where, nsa)
_BUFFERS: KindTable[tuple[int, int, int]] = KindTable("sglang", {
    Attention: _kv_row, LatentAttention: _latent_row,
    IndexerKeys: lambda layer, *_: (0, 0, _index_row(layer)),
    RecurrentState: lambda *_: (0, 0, 0), NoCache: lambda *_: (0, 0, 0)})

