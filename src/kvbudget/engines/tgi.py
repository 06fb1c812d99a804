"""Hugging Face TGI (text-generation-inference; maintenance mode since Dec 2025): paged blocks after warm-up.

From TGI's source as summarised in shared/notes/engine-memory-facts.md (flash_causal_lm.py); not run here,
so every TGI figure is labelled "from the source":

- a block holds `L x B x Hkv_shard x D x 2 x s` bytes; B = 1 with flashinfer (default), 256 with
  flashdecoding, 16 paged; `max_batch_total_tokens = num_blocks x B`; block 0 is reserved;
- sliding windows are not used for allocation (every layer full);
- DeepSeek-V2/V3 are not cached as a latent: K and V for every head at `qk_nope + rope` width (V padded).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.engines.base import Allocation, CacheGroup, Capacity, EngineOptions, largest_fitting, serving_kv_dtype
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import cdiv

BLOCK_SIZES = (1, 16, 256)
SOURCE_NOTE = "TGI figures follow its source (not run here): every layer full, MLA expanded per head"


@dataclass(frozen=True)
class TGIEngine:
    name: str = "tgi"
    description: str = "TGI paged blocks after warm-up (from its source; not run here)"

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        dtype = serving_kv_dtype(model, kv_dtype, tp, "TGI", "auto and fp8 (e4m3 / e5m2)")
        block = options.block_size or 1
        if block not in BLOCK_SIZES:
            raise KVBudgetError(f"--block-size {block}: TGI uses 1 (flashinfer), 16 (paged) or 256 (flashdecoding)")
        groups: dict[tuple, int] = {}
        for layer in model.layers:
            if layer.kind == "recurrent_state":
                raise KVBudgetError(f"{model.name}: TGI does not serve models with recurrent (Mamba / linear "
                                    "attention) layers")
            if layer.kind == "latent_attention":
                heads = max(1, layer.heads // tp)
                width = layer.expanded_k_dim  # V padded to the K width
                detail = f"MLA expanded: {heads} heads x ({width} K + {width} V, padded) x {dtype.name}"
            elif layer.kind == "no_cache":
                continue
            else:
                heads = max(1, layer.kv_heads // tp)
                width = max(layer.k_dim, layer.v_dim)
                detail = f"{heads} KV heads x ({width} K + {width} V) x {dtype.name}" + (
                    " (window cached in full)" if layer.kind != "full_attention" else "")
            key = ("full_attention", 2 * dtype.bytes_for(heads * width), detail)
            groups[key] = groups.get(key, 0) + 1
        return Allocation(self.name, model.name, dtype, tp,
                          tuple(CacheGroup(kind, n, bpt, None, 0, detail, block)
                                for (kind, bpt, detail), n in groups.items()),
                          exact=False, notes=(SOURCE_NOTE,))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        alloc = self.allocate(model, kv_dtype, tp, options)
        block = options.block_size or 1
        block_bytes = alloc.bytes_per_token * block
        num_blocks = kv_memory // block_bytes
        if num_blocks < 2:
            raise KVBudgetError(f"--kv-memory: {kv_memory} bytes holds {num_blocks} TGI block(s) of "
                                f"{block_bytes} bytes; block 0 is reserved, so at least 2 are needed")
        usable = num_blocks - 1
        per_request = cdiv(max_model_len, block)
        fits = per_request <= usable
        longest = None if fits else largest_fitting(lambda n: cdiv(n, block) <= usable, max_model_len)
        tokens = num_blocks * block
        return Capacity(self.name, kv_memory, num_blocks, block, tokens, usable * block, max_model_len,
                        usable / per_request, fits, longest,
                        (f"TGI log: KV-cache blocks: {num_blocks}, size: {block}; "
                         f"max_batch_total_tokens {tokens}", SOURCE_NOTE))


TGI = TGIEngine()
