"""llama.cpp (`llama-server`): the whole KV buffer is allocated when the server starts.

Read from src/llama-context.cpp, llama-kv-cache.cpp, llama-kv-cache-iswa.cpp and llama-memory-recurrent.cpp of
the llama.cpp copy in llama-cpp-python 0.3.36, and checked against real llama-server runs in
tests/engines/test_llamacpp_real.py:

- `-c` is padded to a multiple of 256 cells; with `-np N` slots and no `--kv-unified` every slot gets its own
  stream of `pad256(n_ctx / N)` cells;
- a cell of a layer holds `row_size(type_k, Hkv x Dk) + row_size(type_v, Hkv x Dv)` bytes, row_size counting
  whole blocks (q8_0: 34 bytes per 32 values);
- sliding-window layers get `pad256(min(cells, n_swa + n_ubatch))` cells per stream unless `--swa-full`;
  Llama-4's chunked layers go to the same SWA cache with n_swa = 8192;
- MLA (deepseek2) caches one 576-wide K row per cell and no V;
- recurrent layers (Mamba, gated delta net) keep f32 state: `(d_conv - 1) x channels` plus the SSM state,
  one cell per sequence.

The memory map's "batch x context" is the server started with `-np batch -c batch x context`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.dtypes import KVDtype, get_dtype, resolve_kv_dtype
from kvbudget.engines.base import (
    Allocation,
    CacheGroup,
    Capacity,
    EngineOptions,
    check_tp,
    largest_fitting,
)
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import LayerSpec, ModelSpec
from kvbudget.units import cdiv

CELL_PAD = 256
N_UBATCH = 512  # llama-server default physical batch
LLAMA4_CHUNK = 8192  # src/models/llama4.cpp sets n_swa = 8192 whatever the config says
_F32 = get_dtype("float32")
_TYPES = ("float32", "float16", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


def pad(n: int) -> int:
    return cdiv(n, CELL_PAD) * CELL_PAD


@dataclass(frozen=True)
class LlamaCppEngine:
    name: str = "llamacpp"
    description: str = "llama.cpp llama-server: whole buffer up front, cells padded to 256"

    def allocate(self, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                 options: EngineOptions = EngineOptions()) -> Allocation:
        check_tp(tp)
        if tp != 1:
            raise KVBudgetError("--tp: llama.cpp splits layers across GPUs (--split-mode), not KV heads; use --tp 1")
        if options.block_size is not None:
            raise KVBudgetError("--block-size: llama.cpp has no KV blocks (cells are padded to 256); leave it out")
        dtype = self._dtype(kv_dtype, model)
        groups: dict[tuple, int] = {}
        for layer in model.layers:
            group = _group(layer, dtype, model.name)
            if group is not None:
                groups[group] = groups.get(group, 0) + 1
        notes = ["llama.cpp: cells padded to 256 per slot; the memory map is `-np batch -c batch x context`"]
        if dtype.family == "block":
            notes.append("a quantized V cache needs flash attention (-fa on)")
        return Allocation(self.name, model.name, dtype, tp,
                          tuple(CacheGroup(kind, n, bpt, cap, fixed, detail, block)
                                for (kind, bpt, cap, fixed, detail, block), n in groups.items()),
                          notes=tuple(notes))

    def capacity(self, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                 tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
        """How many slots of max_model_len tokens (`-np`, own streams) fit in kv_memory."""
        alloc = self.allocate(model, kv_dtype, tp, options)
        per_slot = alloc.sequence_bytes(max_model_len)
        slots = kv_memory // per_slot if per_slot else 0
        fits = slots >= 1
        longest = None if fits else largest_fitting(lambda n: alloc.sequence_bytes(n) <= kv_memory, max_model_len)
        if longest is not None:
            longest = longest // CELL_PAD * CELL_PAD  # n_ctx is padded up to 256: the largest that still fits
        cells = pad(max_model_len) * slots
        return Capacity(self.name, kv_memory, None, CELL_PAD, cells, cells, max_model_len,
                        kv_memory / per_slot if per_slot else float("inf"), fits, longest,
                        (f"llama.cpp allocates up front: -np {max(slots, 1)} -c {cells or pad(max_model_len)} "
                         f"fills this budget with slots of {pad(max_model_len)} cells",))

    def _dtype(self, kv_dtype: str, model: ModelSpec) -> KVDtype:
        if str(kv_dtype).lower() == "auto":
            return get_dtype("float16")  # llama-server's default -ctk/-ctv f16, whatever the weights
        dtype = resolve_kv_dtype(kv_dtype, model.dtype)
        if dtype.name not in _TYPES:
            raise KVBudgetError(f"--kv-dtype {kv_dtype}: llama.cpp cache types are f32, f16, bf16, q8_0, q4_0, "
                                "q4_1, q5_0, q5_1 and iq4_nl")
        return dtype


def _group(layer: LayerSpec, dtype: KVDtype, where: str) -> tuple | None:
    kind = layer.kind
    if kind in ("full_attention", "sliding_window", "chunked_local"):
        k, v = layer.kv_heads * layer.k_dim, layer.kv_heads * layer.v_dim
        bpt = dtype.bytes_for(k) + dtype.bytes_for(v)
        cap = None
        detail = f"{layer.kv_heads} KV heads x ({layer.k_dim} K + {layer.v_dim} V) x {dtype.name}"
        if kind == "sliding_window":
            cap = pad(layer.window + N_UBATCH)
            detail += f", window {layer.window}: {cap} cells per slot"
        if kind == "chunked_local":  # llama4.cpp puts them in the SWA cache with n_swa fixed at 8192
            cap = pad(LLAMA4_CHUNK + N_UBATCH)
            detail += f", chunked (llama.cpp uses {LLAMA4_CHUNK}): {cap} cells per slot"
        return (kind, bpt, cap, 0, detail, CELL_PAD)
    if kind == "latent_attention":
        bpt = dtype.bytes_for(layer.latent_dim + layer.rope_dim)
        return (kind, bpt, None, 0, f"K row of {layer.latent_dim} + {layer.rope_dim} x {dtype.name}, no V", CELL_PAD)
    if kind == "recurrent_state":
        state = 1
        for size in layer.state_shape:
            state *= size
        fixed = _F32.bytes_for((layer.conv_kernel - 1) * layer.conv_channels) + _F32.bytes_for(state)
        return (kind, 0, None, fixed, f"{layer.mixer}: r {layer.conv_kernel - 1} x {layer.conv_channels} + "
                                     f"s {'x'.join(map(str, layer.state_shape))}, f32, one cell per sequence", CELL_PAD)
    return None


LLAMACPP = LlamaCppEngine()
