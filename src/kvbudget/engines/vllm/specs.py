"""vLLM's view of one layer's cache, one class per kind of spec as in vllm/v1/kv_cache_interface.py (0.32):
FullSpec (FullAttentionSpec), MLASpec (MLAAttentionSpec, a kind of full attention), SlidingSpec
(SlidingWindowSpec), ChunkedSpec (ChunkedLocalAttentionSpec) and MambaSpec. Each answers what differs by
kind: the blocks one request needs in a group of its layers, the allocation's group and the simulator's
group. `vllm_spec` makes the spec vLLM registers for a layer of kvbudget's model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from kvbudget.dtypes import Family, KVDtype, get_dtype
from kvbudget.engines.base import CacheGroup
from kvbudget.engines.vllm.blocks import BlockGroup, ChunkedGroup, SlidingGroup, StateGroup
from kvbudget.engines.vllm.releases import Release
from kvbudget.errors import EngineRuleError
from kvbudget.model.spec import (
    Attention,
    ChunkedLocal,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    RecurrentState,
    SlidingWindow,
)
from kvbudget.units import cdiv

V0_HEAD_PADDING = 256  # vLLM < 0.7 padded DeepSeek's 192-wide heads to 256 (config.py get_head_size)
V0_MLA_ALIGN_BYTES = 256  # V0 MLA caches align each token's entry to 256 bytes (VLLM_CUDA_MEM_ALIGN_KV_CACHE)
INDEXER_QUANT_BLOCK = 128  # DeepSeek-V3.2's indexer keys: one float32 scale per 128 fp8 values
_FP32 = get_dtype("float32")


class Sizing(Protocol):
    """What a spec needs of the layout it is placed in (engine.Layout)."""

    @property
    def page(self) -> int: ...

    @property
    def mnbt(self) -> int: ...

    @property
    def prefix_caching(self) -> bool: ...

    @property
    def speculative_blocks(self) -> int: ...

    def block_of(self, spec: KVSpec) -> int: ...


@dataclass(frozen=True, kw_only=True)
class KVSpec:
    """One layer's cache as vLLM sizes it: bytes per token (attention) or state bytes (Mamba), window."""

    token_bytes: int  # per token per layer (attention kinds)
    state_bytes: int = 0  # per sequence per layer (mamba), before padding
    span: int | None = None  # window or chunk
    detail: str
    label: str  # the layer kind as kvbudget names it
    mixer: str = ""  # recurrent layers: "mamba", "mamba2", "gated_delta_net"

    keeps_all: ClassVar[bool] = True  # every token, for the request's whole life
    windowed: ClassVar[bool] = False  # sliding or chunked: admitted against a reservation
    keeps_state: ClassVar[bool] = False  # one state per request (Mamba / linear attention)
    unifies: ClassVar[bool] = True  # its page may be unified with other attention layers' (Gemma 4)

    def blocks_needed(self, layout: Sizing, max_model_len: int) -> int:
        """Blocks one request of `max_model_len` tokens needs in one group of these layers."""
        return cdiv(max_model_len, layout.block_of(self))

    def cache_group(self, layout: Sizing, layers: int, detail: str, block_size: int) -> CacheGroup:
        """The allocation's group of `layers` such layers (padding included); `block_size` is the pool's."""
        sb = layout.block_of(self)
        cap = None if self.keeps_all else sb * self.blocks_needed(layout, 1 << 62)
        if sb != block_size:
            detail += f"; blocks of {sb} tokens (page {layout.page:,} B, as the largest layer's)"
        return CacheGroup(kind=self.label, layers=layers, bytes_per_token=layout.page // sb, token_cap=cap,
                          detail=detail, block_size=sb)

    def block_group(self, layout: Sizing, max_model_len: int, run_block: int) -> BlockGroup:
        """The simulator's group (vLLM's spec_manager_map); `run_block` is the block size the scheduler cuts
        prefill chunks at while running."""
        return BlockGroup(block_size=layout.block_of(self))


@dataclass(frozen=True, kw_only=True)
class FullSpec(KVSpec):
    """Full attention: every token."""


@dataclass(frozen=True, kw_only=True)
class MLASpec(FullSpec):
    """Latent attention (and DeepSeek-V3.2's indexer keys): full attention on every tensor-parallel rank."""

    unifies: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class WindowSpec(KVSpec):
    """The windowed kinds: a request is admitted against a reservation, not its whole length."""

    keeps_all: ClassVar[bool] = False
    windowed: ClassVar[bool] = True
    group: ClassVar[type[BlockGroup]]

    def block_group(self, layout: Sizing, max_model_len: int, run_block: int) -> BlockGroup:
        return self.group(span=self.span or 0, block_size=layout.block_of(self),
                          admission_cap=self.blocks_needed(layout, max_model_len))


@dataclass(frozen=True, kw_only=True)
class SlidingSpec(WindowSpec):
    """A sliding window, admitted against `cdiv(min(W - 1 + max_num_batched_tokens, M), B) + 1` blocks."""

    group: ClassVar[type[BlockGroup]] = SlidingGroup

    def blocks_needed(self, layout: Sizing, max_model_len: int) -> int:
        return cdiv(min((self.span or 0) - 1 + layout.mnbt, max_model_len), layout.block_of(self)) + 1


@dataclass(frozen=True, kw_only=True)
class ChunkedSpec(WindowSpec):
    """Chunked local attention, admitted against `cdiv(min(C + max_num_batched_tokens, M), B)` blocks."""

    group: ClassVar[type[BlockGroup]] = ChunkedGroup

    def blocks_needed(self, layout: Sizing, max_model_len: int) -> int:
        return cdiv(min((self.span or 0) + layout.mnbt, max_model_len), layout.block_of(self))


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVSpec):
    """Mamba / linear attention: one state per request, in blocks of the attention page."""

    keeps_all: ClassVar[bool] = False
    keeps_state: ClassVar[bool] = True
    unifies: ClassVar[bool] = False

    def blocks_needed(self, layout: Sizing, max_model_len: int) -> int:
        """State blocks one request holds: 1; with prefix caching ("align" mode) 2, and a third prefill
        checkpoint block for Mamba-2 mixers (mamba_mixer2.py); one more per draft token under speculative
        decoding (MambaSpec.num_speculative_blocks)."""
        if not layout.prefix_caching:
            return 1 + layout.speculative_blocks
        return (3 if self.mixer == "mamba2" else 2) + layout.speculative_blocks

    def cache_group(self, layout: Sizing, layers: int, detail: str, block_size: int) -> CacheGroup:
        blocks = self.blocks_needed(layout, 0)
        return CacheGroup(kind=self.label, layers=layers, bytes_per_token=0, fixed_bytes=layout.page * blocks,
                          detail=detail + f"; page padded to {layout.page:,} B x {blocks} block(s)",
                          block_size=block_size)

    def block_group(self, layout: Sizing, max_model_len: int, run_block: int) -> BlockGroup:
        cached = layout.prefix_caching
        return StateGroup(block_size=layout.block_of(self) if cached else max_model_len,
                          checkpoint=self.blocks_needed(layout, max_model_len) > 2,
                          chunk_align=run_block if cached else 0)


def vllm_spec(layer: LayerSpec, dtype: KVDtype, act: KVDtype, ssm: KVDtype | None, tp: int,
              where: str, rel: Release, spec_tokens: int = 0) -> KVSpec | None:
    """The spec vLLM registers for `layer`, or None for a layer without a cache of its own."""
    if isinstance(layer, Attention):
        k, v = layer.kv_values(tp, where)
        kind = SlidingSpec if isinstance(layer, SlidingWindow) else ChunkedSpec if isinstance(layer, ChunkedLocal) \
            else FullSpec
        span = layer.token_span
        detail = layer.describe(tp, where, dtype.name)
        if span:
            detail += f", {'window' if kind is SlidingSpec else 'chunk'} {span}"
        scales = layer.kv_heads_per_rank(tp, where) * dtype.head_scale_bytes
        if scales:
            detail += f", + {dtype.head_scale_bytes} B of scales per head"
        return kind(token_bytes=dtype.bytes_for(k + v) + scales, span=span, detail=detail, label=layer.kind)
    if isinstance(layer, LatentAttention) and dtype.family is Family.PER_TOKEN_HEAD:
        raise EngineRuleError(f"kv_dtype {dtype.name}: {where} has latent (MLA) attention; vLLM's per-token-head "
                              "caches are for attention with K and V heads", param="kv_dtype")
    if isinstance(layer, LatentAttention) and not rel.mla_latent:  # vLLM < 0.7: heads expanded, padded to 256
        heads = max(1, layer.heads // tp)
        return FullSpec(token_bytes=dtype.bytes_for(2 * heads * V0_HEAD_PADDING), label=FullAttention.kind,
                        detail=f"vLLM < 0.7: {heads} K + {heads} V heads x {V0_HEAD_PADDING} (192 padded) x "
                               f"{dtype.name} per rank, no MLA")
    if isinstance(layer, LatentAttention) and rel.v0:  # V0 MLA: one entry per token, aligned to 256 bytes
        width = cdiv(dtype.bytes_for(layer.values_per_token), V0_MLA_ALIGN_BYTES) * V0_MLA_ALIGN_BYTES
        return MLASpec(token_bytes=width, label=layer.kind,
                       detail=f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, aligned to "
                              f"{V0_MLA_ALIGN_BYTES} B = {width} B (vLLM V0), on every TP rank")
    if isinstance(layer, LatentAttention):
        return MLASpec(token_bytes=dtype.bytes_for(layer.values_per_token), label=layer.kind,
                       detail=f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, on every TP rank")
    if isinstance(layer, IndexerKeys):  # fp8 values and a float32 scale per block of 128 (deepseek_v2.py Indexer)
        width = layer.dim + layer.dim // INDEXER_QUANT_BLOCK * 4
        return MLASpec(token_bytes=width, label=layer.kind,
                       detail=f"indexer key {layer.dim} x fp8 + float32 scale per {INDEXER_QUANT_BLOCK} values = "
                              f"{width} B, on every TP rank")
    if isinstance(layer, RecurrentState):
        channels, heads, state = layer.per_rank(tp, where, replicate_groups=True)
        columns = layer.conv_kernel - 1 + spec_tokens  # the conv state also holds the draft tokens' columns
        conv = act.bytes_for(channels * columns)
        ssm = ssm or recurrent_state_dtype(layer, act)
        return MambaSpec(token_bytes=0, state_bytes=conv + ssm.bytes_for(state), label=layer.kind, mixer=layer.mixer,
                         detail=f"{layer.mixer}: conv {channels} x {columns} x {act.name} + state "
                                f"{layer.state_text(heads)} x {ssm.name}")
    return None


def recurrent_state_dtype(layer: RecurrentState, act: KVDtype) -> KVDtype:
    """The dtype vLLM's GPU backends keep a recurrent state in with --mamba-ssm-cache-dtype auto: what the config
    declares (Qwen3.5's mamba_ssm_dtype, models/config.py; Nemotron-H's mamba_ssm_cache_dtype, float32 when
    absent), float32 for KDA (mamba_utils.kda_state_dtype), else the conv state's, the model dtype."""
    if layer.state_dtype is not None:
        return get_dtype(layer.state_dtype)
    return _FP32 if layer.mixer == "kda" else act
