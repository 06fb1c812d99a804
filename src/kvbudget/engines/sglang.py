"""SGLang: one token pool sized from the memory left after weights (`mem_fraction_static`).

From SGLang's source as summarised in shared/notes/engine-memory-facts.md (model_runner_kv_cache_mixin.py,
memory_pool.py); not run here (no CPU build), so every SGLang figure is labelled "from the source":

- a token cell holds `Hkv_rank x (Dk + Dv) x s` per layer; MLA `(kv_lora_rank + rope) x s` on every rank;
- `max_total_num_tokens = kv_memory // cell`, rounded down to the page size (default 1);
- Gemma-2/3, gpt-oss and Mistral-style windows are cached in full (its hybrid SWA pool is off for them);
  we treat every window that way;
- Mamba / gated-delta-net state in float32 with kernel - 1 conv columns, one slot per running request.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.dtypes import KVDtype, get_dtype
from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    EngineOptions,
    serving_kv_dtype,
    largest_fitting,
    shard_kv_heads,
    shard_recurrent,
)
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec

_F32 = get_dtype("float32")
SOURCE_NOTE = "SGLang figures follow its source (not run here): windows cached in full, page size 1"


@dataclass(frozen=True)
class SGLangEngine:
    pipeline_parallel = True
    name: str = "sglang"
    description: str = "SGLang token pool (from its source; not run here)"

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        dtype = serving_kv_dtype(model, kv_dtype, tp, "SGLang", "auto, bf16, fp16, fp32 and fp8")
        page = options.block_size or 1
        act = get_dtype(model.dtype)
        groups: dict[tuple, int] = {}
        for layer in model.layers:
            key = _cell(layer, dtype, act, tp, model.name, page)
            if key:
                groups[key] = groups.get(key, 0) + 1
        return Allocation(self.name, model.name, dtype, tp,
                          tuple(CacheGroup(kind, n, bpt, None, fixed, detail, page)
                                for (kind, bpt, fixed, detail, page), n in groups.items()),
                          exact=False, notes=(SOURCE_NOTE,))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        alloc = self.allocate(model, kv_dtype, tp, options)
        page = options.block_size or 1
        cell = alloc.bytes_per_token
        fixed = alloc.fixed_bytes_per_sequence
        if cell == 0:
            raise KVBudgetError(f"{model.name}: no attention layer; SGLang's token pool is not what limits it")
        tokens = kv_memory // cell // page * page
        if tokens < page:
            raise KVBudgetError(f"--kv-memory: {kv_memory} bytes is less than one page of {page} token(s) "
                                f"({cell * page} bytes)")
        concurrency = tokens / max_model_len
        if fixed:  # recurrent state slots come out of the same memory
            concurrency = kv_memory / (cell * max_model_len + fixed)
        fits = tokens >= max_model_len
        longest = None if fits else largest_fitting(lambda n: n <= tokens, max_model_len)
        return Capacity(self.name, kv_memory, None, page, tokens, tokens, max_model_len, concurrency, fits,
                        longest, (f"SGLang log: KV Cache is allocated. #tokens: {tokens}", SOURCE_NOTE))


def _cell(layer, dtype: KVDtype, act: KVDtype, tp: int, where: str, page: int) -> tuple | None:
    kind = layer.kind
    if kind in ("full_attention", "sliding_window", "chunked_local"):
        heads = shard_kv_heads(layer.kv_heads, tp, where)
        bpt = dtype.bytes_for(heads * (layer.k_dim + layer.v_dim))
        return ("full_attention", bpt, 0, f"{heads} KV heads x ({layer.k_dim} K + {layer.v_dim} V) x {dtype.name}"
                + (" (window cached in full)" if kind != "full_attention" else ""), page)
    if kind == "latent_attention":
        return (kind, dtype.bytes_for(layer.latent_dim + layer.rope_dim), 0,
                f"latent {layer.latent_dim} + rope {layer.rope_dim} x {dtype.name}, every rank", page)
    if kind == "recurrent_state":
        channels, heads, state = shard_recurrent(layer, tp, where)
        fixed = act.bytes_for(channels * (layer.conv_kernel - 1)) + _F32.bytes_for(state)
        return (kind, 0, fixed, f"{layer.mixer}: conv {channels} x {layer.conv_kernel - 1} x {act.name} + "
                                f"float32 state", page)
    return None


SGLANG = SGLangEngine()
