"""Plain transformers (>= 5.19): what `DynamicCache` (default) or `StaticCache` holds.

Measured against real caches in tests/corpus/test_exactness_transformers.py:
- full attention: K and V `[batch, Hkv, T, D]` in the model's dtype;
- sliding window and chunked local layers (DynamicSlidingWindowLayer): the last `window - 1` tokens
  once the context reaches the window, all tokens before; a static cache keeps `min(window, T)`;
- MLA (deepseek_v2/v3, kimi_k2): the latent (kv_lora_rank) in the keys slot and the shared rope key
  in the values slot, one "head" each. transformers 4.x cached per-head K and V instead;
- Falcon with more than one KV head (new_decoder_architecture: Falcon-40B/180B): up to 5.24 it repeats K and V to
  every query head before caching them (models/falcon/modeling_falcon.py), so the cache holds
  num_attention_heads; from 5.25 the attention repeats them after the cache (`repeat_kv` in
  `eager_attention_forward`), which holds the KV heads. `hf@5.24` models the older releases;
- linear attention / Mamba: conv state of `conv_kernel` columns in the model's dtype and the recurrent
  state in float32, per sequence;
- DeepSeek-V4 (DeepseekV4CSACache / DeepseekV4HCACache): the window's shared K=V vector once (`values` is
  `keys`) on compressed layers, twice on the plain sliding layers (DynamicSlidingWindowLayer stores
  update(kv, kv) as two tensors); per compressor, `T // rate` entries, the key and gate projections of the
  `T % rate` tokens of the window still open (`buffer_kv`, `buffer_gate`), and with overlap the last closed
  window's first half (`overlap_kv` in the model's dtype, `overlap_gate` in float32 after the float32 position
  bias), held once a window has closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbudget.dtypes import Family, KVDtype, get_dtype, resolve_kv_dtype
from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    CompressedGroup,
    Engine,
    EngineOptions,
    group_layers,
    simple_capacity,
)
from kvbudget.engines.kinds import KindTable, no_cache
from kvbudget.errors import EngineRuleError, UnsupportedArchitectureError
from kvbudget.model.spec import (
    Attention,
    Compressed,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    NoCache,
    RecurrentState,
)
from kvbudget.validate import positive

_FP32 = get_dtype("float32")


@dataclass(frozen=True)
class HFEngine(Engine):
    name: str = "hf"
    reports_kv_size: ClassVar[bool] = False
    description: str = "transformers >= 5.19 DynamicCache (the generate() default)"
    static: bool = False

    def parse_release(self, version: str) -> tuple[int, ...]:
        """A transformers release, "5.24" or "5.24.0", from 5.19 on (`--engine hf@5.24`)."""
        parts = version.strip().split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            raise EngineRuleError(f"engine_version {version}: write a transformers release, e.g. 5.24",
                                  param="engine_version")
        found = (int(parts[0]), int(parts[1]))
        if found < OLDEST:
            raise EngineRuleError(f"engine_version {version}: kvbudget models transformers {OLDEST[0]}.{OLDEST[1]} "
                                  "and newer (4.x cached MLA per head)", param="engine_version")
        return found

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        positive(tp, "tp", "tensor parallel size")
        if options.block_size is not None:
            raise EngineRuleError(f"block_size: the {self.name} engine has no blocks; leave it out",
                                  param="block_size")
        dtype = resolve_kv_dtype(kv_dtype, model.dtype)
        if dtype.family is Family.PER_TOKEN_HEAD:
            raise EngineRuleError(f"kv_dtype {kv_dtype}: a vLLM cache format; transformers has no such cache "
                                  "(its quantized caches: kvbudget quality's quanto_* / hqq_*)", param="kv_dtype")
        # The conv state follows the activations: the KV dtype when it is a torch float type.
        act = dtype if dtype.family is Family.FLOAT else get_dtype(model.dtype)
        self.refuse_unchecked(model, options)
        repeat_to = _falcon_repeat(model, options.engine_version or NEWEST)
        compressing = {s.layer for s in model.layers if isinstance(s, Compressed)}
        if compressing and self.static:
            raise UnsupportedArchitectureError(f"{model.name}: transformers' StaticCache cannot hold a compressor's "
                                               "state (DeepSeek-V4 generates with its own dynamic cache layers); use "
                                               "the hf engine")
        groups = group_layers(self._group(spec, dtype, act, tp, model.name, repeat_to, spec.layer in compressing)
                              for spec in model.layers)
        notes = []
        exact = dtype.family is Family.FLOAT
        if dtype.family is Family.HF_QUANTIZED:
            others = sorted({type(s).__name__ for s in model.layers if not isinstance(s, FullAttention)})
            if others or self.static:
                raise EngineRuleError(f"kv_dtype {kv_dtype}: transformers' QuantizedCache is a dynamic cache for "
                                      f"full-attention models only; {model.name} has {', '.join(others)} layers"
                                      if others else f"kv_dtype {kv_dtype}: a dynamic cache; use the hf engine",
                                      param="kv_dtype")
            notes.append(f"upper bound: {dtype.name} codes with a {act.name} scale and zero point per 64 values, "
                         f"plus the largest residual, {RESIDUAL - 1} recent tokens per layer in {act.name} (the fixed "
                         "part; exact after a prompt and at that residual); each decoding step also dequantizes "
                         "one layer's whole cache at a time, beside it")
        elif not exact:
            notes.append(
                f"estimate: transformers keeps no {dtype.name} DynamicCache; figures are the raw {dtype.name} "
                "storage (its QuantizedCache adds scales and a full-precision residual, and refuses "
                "sliding and hybrid models)"
            )
        if model.has_latent:
            notes.append("MLA as cached by transformers >= 5.19 (latent + rope key); 4.x expanded it per head")
        return Allocation(engine=self.name, model=model.name, kv_dtype=dtype, tp=tp, groups=groups, exact=exact,
                          notes=tuple(notes))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        alloc = self.allocate(model, kv_dtype, tp, options)
        return simple_capacity(alloc, kv_memory, max_model_len,
                               "transformers has no block pool: whole sequences of max_model_len in the budget")

    def _group(self, spec: LayerSpec, dtype: KVDtype, act: KVDtype, tp: int, where: str,
               repeat_to: int | None, compressing: bool) -> CacheGroup | None:
        return _GROUP(spec, self.static, dtype, act, tp, where, repeat_to, compressing)


def _attention(spec: Attention, static: bool, dtype: KVDtype, act: KVDtype, tp: int, where: str,
               repeat_to: int | None, compressing: bool) -> CacheGroup:
    k, v = spec.kv_values(tp, where, heads=repeat_to)
    detail = spec.describe(tp, where, dtype.name, heads=repeat_to)
    if v == 0:  # one shared K=V vector: V4's own cache layers keep it once, DynamicSlidingWindowLayer twice
        detail = (f"{k} shared K=V x {dtype.name}" + ("" if compressing else
                  ", stored twice (DynamicSlidingWindowLayer keeps update(kv, kv) as keys and values)"))
        v = 0 if compressing else k
    span = spec.token_span
    cap = None if span is None else (span if static else span - 1)
    if cap is not None:
        detail += f", keeps {cap} tokens"
    if dtype.family is Family.HF_QUANTIZED:  # codes, 2 x (scale, zero) per 64 values, the residual
        quantized = dtype.bytes_for(k) + dtype.bytes_for(v) + 2 * act.bytes_for((k + v) // GROUP)
        full = act.bytes_for(k + v)
        return CacheGroup(kind=spec.kind, layers=1, bytes_per_token=quantized, token_cap=cap,
                          fixed_bytes=(RESIDUAL - 1) * (full - quantized), detail=detail)
    return CacheGroup(kind=spec.kind, layers=1, bytes_per_token=dtype.bytes_for(k) + dtype.bytes_for(v),
                      token_cap=cap, detail=detail)


def _latent(spec: LatentAttention, static: bool, dtype: KVDtype, act: KVDtype, tp: int, where: str,
            repeat_to: int | None, compressing: bool) -> CacheGroup:
    latent, rope = spec.kv_values(tp, where)
    bpt = dtype.bytes_for(latent) + dtype.bytes_for(rope)
    return CacheGroup(kind=spec.kind, layers=1, bytes_per_token=bpt,
                      detail=f"latent {spec.latent_dim} + rope key {spec.rope_dim} x {dtype.name}, every rank")


def _indexer(spec: IndexerKeys, static: bool, dtype: KVDtype, act: KVDtype, tp: int, where: str,
             repeat_to: int | None, compressing: bool) -> CacheGroup:
    """DynamicIndexedLayer.indexer_keys [batch, T, dim]."""
    return CacheGroup(kind=spec.kind, layers=1, bytes_per_token=dtype.bytes_for(spec.dim),
                      detail=f"indexer key {spec.dim} x {dtype.name}, every rank")


def _compressed(spec: Compressed, static: bool, dtype: KVDtype, act: KVDtype, tp: int, where: str,
                repeat_to: int | None, compressing: bool) -> CacheGroup:
    pending = 2 * act.bytes_for(spec.width)  # buffer_kv and buffer_gate of the open window's tokens
    primed = spec.rate * (act.bytes_for(spec.dim) + _FP32.bytes_for(spec.dim)) if spec.overlap else 0
    detail = (f"{spec.role} entry {spec.dim} x {dtype.name} per {spec.rate} tokens; open window "
              f"2 x {spec.width} x {act.name} per token"
              + (f"; last window's overlap {spec.rate} x {spec.dim} x ({act.name} + float32)"
                 if primed else ""))
    return CompressedGroup(kind=spec.label, layers=1, bytes_per_token=dtype.bytes_for(spec.dim), detail=detail,
                           tokens_per_state=spec.rate, pending_bytes_per_token=pending, primed_bytes=primed)


def _recurrent(spec: RecurrentState, static: bool, dtype: KVDtype, act: KVDtype, tp: int, where: str,
               repeat_to: int | None, compressing: bool) -> CacheGroup:
    channels, heads, state = spec.per_rank(tp, where)
    fixed = act.bytes_for(channels * spec.conv_kernel) + _FP32.bytes_for(state)
    detail = (f"{spec.mixer}: conv {channels} x {spec.conv_kernel} x {act.name} + "
              f"state {spec.state_text(heads)} x float32")
    return CacheGroup(kind=spec.kind, layers=1, bytes_per_token=0, fixed_bytes=fixed, detail=detail)


# One layer's cache in transformers' cache layers, by the layer's kind:
# (layer, static, dtype, act, tp, where, repeat_to, compressing) -> group or None
_GROUP: KindTable[CacheGroup | None] = KindTable("hf", {
    Attention: _attention, LatentAttention: _latent, IndexerKeys: _indexer, Compressed: _compressed,
    RecurrentState: _recurrent, NoCache: no_cache})
HFEngine.layer_kinds = _GROUP.kinds


# transformers' QuantizedLayer defaults (cache_utils.py): q_group_size 64, residual_length 128
GROUP, RESIDUAL = 64, 128


# The transformers releases the engine tells apart (major, minor): the newest modelled, and the first release whose
# Falcon caches its KV heads rather than K/V repeated to every query head.
OLDEST, NEWEST, FALCON_KV_HEADS = (5, 19), (5, 25), (5, 25)


def _falcon_repeat(model: ModelSpec, release: tuple[int, ...]) -> int | None:
    """Up to 5.24 transformers' Falcon caches K/V repeated to all query heads unless it is multi-query."""
    if model.model_type != "falcon" or not model.attention_heads or release >= FALCON_KV_HEADS:
        return None
    if all(not isinstance(s, Attention) or s.kv_heads == 1 for s in model.layers):
        return None
    return model.attention_heads


HF = HFEngine()
HF_STATIC = HFEngine(name="hf-static", static=True,
                     description="transformers >= 5.19 StaticCache sized to the context")
