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
    shard_recurrent,
)
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import FullAttention, LayerSpec, ModelSpec
from kvbudget.units import cdiv

CELL_PAD = 256
N_UBATCH = 512  # llama-server default physical batch
LLAMA4_CHUNK = 8192  # src/models/llama4.cpp sets n_swa = 8192 whatever the config says
# Architectures whose sliding windows llama.cpp honours (swa_type set in src/models/*.cpp); every other one,
# Mistral-7B-v0.1 (llama arch) and Phi-3 ("Phi SWA is currently disabled") included, is cached in full.
HONOURS_WINDOW = frozenset({"gemma2", "gemma3_text", "gpt_oss", "llama4_text"})
_F32 = get_dtype("float32")
_TYPES = ("float32", "float16", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


def pad(n: int) -> int:
    return cdiv(n, CELL_PAD) * CELL_PAD


@dataclass(frozen=True)
class Buffer:
    """One cache llama-server creates, as its log line reports it."""

    name: str  # "kv" (non-SWA), "kv_swa" or "recurrent"
    cells: int  # per stream
    streams: int
    layers: int
    k_bytes: int  # K (or R for recurrent) over all layers and streams
    v_bytes: int  # V (or S for recurrent)

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


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
        _check_block_fit(model, dtype)
        groups: dict[tuple, int] = {}
        for layer in model.layers:
            group = _group(_as_cached(layer, model), dtype, model.name)
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

    def server_buffers(self, model: ModelSpec, n_ctx: int, n_parallel: int = 1, kv_dtype: str = "auto",
                       unified: bool = False, swa_full: bool = False, n_ubatch: int = N_UBATCH) -> tuple[Buffer, ...]:
        """The caches `llama-server -c n_ctx -np n_parallel [--kv-unified] [--swa-full]` allocates."""
        if n_ctx <= 0 or n_parallel <= 0 or n_ubatch <= 0:
            raise KVBudgetError("llama.cpp: -c, -np and -ub must be positive")
        dtype = self._dtype(kv_dtype, model)
        _check_block_fit(model, dtype)
        total = pad(n_ctx)
        if unified:
            cells, streams = total, 1
        else:
            cells, streams = pad(total // n_parallel), n_parallel
        swa_cells = cells if swa_full else None
        kv: dict[str, list[int]] = {}
        for layer in model.layers:
            layer = _as_cached(layer, model)
            kind = layer.kind
            if kind == "recurrent_state":
                r, s_ = _recurrent_rows(layer)
                entry = kv.setdefault("recurrent", [max(1, n_parallel), 1, 0, 0, 0])
                entry[2] += 1
                entry[3] += _F32.bytes_for(r) * entry[0]
                entry[4] += _F32.bytes_for(s_) * entry[0]
                continue
            if kind == "no_cache":
                continue
            if kind in ("sliding_window", "chunked_local"):
                span = layer.window if kind == "sliding_window" else LLAMA4_CHUNK
                n = swa_cells or pad(min(total if unified else cells,
                                         span * (n_parallel if unified else 1) + n_ubatch))
                name = "kv_swa"
            else:
                n, name = cells, "kv"
            k, v = _kv_rows(layer)
            entry = kv.setdefault(name, [n, streams, 0, 0, 0])
            entry[2] += 1
            entry[3] += dtype.bytes_for(k) * n * streams
            entry[4] += dtype.bytes_for(v) * n * streams if v else 0
        order = ("kv", "kv_swa", "recurrent")  # the order llama.cpp creates and logs them
        return tuple(Buffer(name, *kv[name]) for name in order if name in kv)

    def _dtype(self, kv_dtype: str, model: ModelSpec) -> KVDtype:
        if str(kv_dtype).lower() == "auto":
            return get_dtype("float16")  # llama-server's default -ctk/-ctv f16, whatever the weights
        dtype = resolve_kv_dtype(kv_dtype, model.dtype)
        if dtype.name not in _TYPES:
            raise KVBudgetError(f"--kv-dtype {kv_dtype}: llama.cpp cache types are f32, f16, bf16, q8_0, q4_0, "
                                "q4_1, q5_0, q5_1 and iq4_nl")
        return dtype


def _check_block_fit(model: ModelSpec, dtype: KVDtype) -> None:
    """llama.cpp refuses a block type whose block does not divide the head dim (llama_init_from_model)."""
    if dtype.block_values == 1:
        return
    for layer in model.layers:
        dims = [getattr(layer, "k_dim", None), getattr(layer, "v_dim", None)]
        if layer.kind == "latent_attention":
            dims = [layer.latent_dim + layer.rope_dim, layer.latent_dim]  # K row, and the latent V view
        for dim in dims:
            if dim and dim % dtype.block_values:
                raise KVBudgetError(f"--kv-dtype {dtype.name}: llama.cpp needs the head dim ({dim}) to be a multiple "
                                    f"of the {dtype.block_values}-value block; choose f16, bf16 or f32")


def _as_cached(layer: LayerSpec, model: ModelSpec) -> LayerSpec:
    """The layer as llama.cpp caches it: windows it does not honour become full attention."""
    if layer.kind in ("sliding_window", "chunked_local") and model.model_type not in HONOURS_WINDOW:
        return FullAttention(layer.layer, layer.kv_heads, layer.k_dim, layer.v_dim)
    return layer


def _kv_rows(layer: LayerSpec) -> tuple[int, int]:
    """Values per cell in the K and V rows of one layer (MLA: one K row, no V)."""
    if layer.kind == "latent_attention":
        return layer.latent_dim + layer.rope_dim, 0
    return layer.kv_heads * layer.k_dim, layer.kv_heads * layer.v_dim


def _recurrent_rows(layer: LayerSpec) -> tuple[int, int]:
    """Values per sequence in the r (conv) and s (SSM) rows of one recurrent layer."""
    channels, _, state = shard_recurrent(layer, 1, "")
    return (layer.conv_kernel - 1) * channels, state


def _group(layer: LayerSpec, dtype: KVDtype, where: str) -> tuple | None:
    kind = layer.kind
    if kind in ("full_attention", "sliding_window", "chunked_local"):
        k, v = _kv_rows(layer)
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
        bpt = dtype.bytes_for(_kv_rows(layer)[0])
        return (kind, bpt, None, 0, f"K row of {layer.latent_dim} + {layer.rope_dim} x {dtype.name}, no V", CELL_PAD)
    if kind == "recurrent_state":
        r, state = _recurrent_rows(layer)
        fixed = _F32.bytes_for(r) + _F32.bytes_for(state)
        return (kind, 0, None, fixed, f"{layer.mixer}: r {layer.conv_kernel - 1} x {layer.conv_channels} + "
                                     f"s {'x'.join(map(str, layer.state_shape))}, f32, one cell per sequence", CELL_PAD)
    return None


LLAMACPP = LlamaCppEngine()
