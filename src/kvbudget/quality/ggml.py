"""llama.cpp's KV cache block types, byte for byte as ggml's reference quantizer writes them.

Each block holds 32 values: a float16 scale `d` (and a float16 minimum `m` for the _1 types), then the values'
codes. The rules, from ggml-quants.c (`quantize_row_*_ref`) of the llama.cpp the engine harness builds:
- q8_0: d = max|x| / 127, codes round(x / d) (half away from zero), int8;
- q4_0 / q5_0: d = -(the value of largest magnitude) / 8 (16), codes min(15 (31), trunc(x / d + 8.5 (16.5)));
- q4_1 / q5_1: d = (max - min) / 15 (31), m = min, codes min(15 (31), trunc((x - m) / d + 0.5));
four-bit codes pack value j into the low nibble of byte j and value j + 16 into its high nibble; the fifth bits
of the 5-bit types sit in a little-endian uint32, bit j for value j. The arithmetic is float32 with the scale's
reciprocal taken before d is rounded to float16 (as the C code does); a zero block gets d = 0 and zero codes.
Dequantization: q8_0 d·c; q4_0 d·(c - 8); q5_0 d·(c - 16); q4_1 / q5_1 d·c + m.

iq4_nl (`NonLinear`) maps 4-bit codes to a fixed table of 16 levels instead of a uniform grid; its scale is a
weighted least-squares fit (see `NonLinear`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32


@dataclass(frozen=True)
class BlockType:
    name: str
    bits: int  # code width
    offset: bool  # the _1 types: a minimum per block instead of a symmetric range
    nbytes: int  # bytes per block of 32 values

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Values (any shape whose size is a multiple of 32, blocks along the last axis) to ggml's bytes:
        shape (blocks, nbytes), uint8."""
        blocks = np.asarray(x, dtype=np.float32).reshape(-1, BLOCK)
        d, m, codes = self._codes(blocks)
        with np.errstate(over="ignore"):  # (beyond float16's range the scale is inf, as in ggml)
            parts: list[np.ndarray] = [d.astype(np.float16).view(np.uint8).reshape(-1, 2)]
            if self.offset:
                parts.append(m.astype(np.float16).view(np.uint8).reshape(-1, 2))
        if self.bits == 8:
            parts.append(codes.astype(np.int8).view(np.uint8))
        else:
            if self.bits == 5:
                high = ((codes >> 4) & 1).astype(np.uint32) << np.arange(BLOCK, dtype=np.uint32)
                parts.append(high.sum(axis=1, dtype=np.uint32).astype("<u4").view(np.uint8).reshape(-1, 4))
            low = (codes & 0xF).astype(np.uint8)
            parts.append(low[:, :16] | (low[:, 16:] << 4))
        out = np.concatenate(parts, axis=1)
        assert out.shape[1] == self.nbytes
        return out

    def dequantize(self, data: np.ndarray) -> np.ndarray:
        """ggml's bytes (blocks, nbytes) back to float32 values, shape (blocks, 32)."""
        data = np.asarray(data, dtype=np.uint8).reshape(-1, self.nbytes)
        d = data[:, 0:2].copy().view(np.float16).astype(np.float32)
        at = 2
        m = np.zeros_like(d)
        if self.offset:
            m = data[:, 2:4].copy().view(np.float16).astype(np.float32)
            at = 4
        if self.bits == 8:
            return _scaled(d, data[:, at:].view(np.int8))
        high = np.zeros((len(data), BLOCK), dtype=np.int32)
        if self.bits == 5:
            qh = data[:, at:at + 4].copy().view("<u4").astype(np.int64)
            high = (((qh >> np.arange(BLOCK)) & 1) << 4).astype(np.int32)
            at += 4
        qs = data[:, at:at + 16].astype(np.int32)
        codes = np.concatenate([qs & 0xF, qs >> 4], axis=1) | high
        return _scaled(d, codes, m) if self.offset else _scaled(d, codes - (1 << (self.bits - 1)))

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """The values as the engine reads them back from the cache (same shape as x)."""
        x = np.asarray(x, dtype=np.float32)
        return self.dequantize(self.quantize(x)).reshape(x.shape)

    def _codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(d, m, integer codes) per block, in float32 as ggml computes them."""
        levels = (1 << self.bits) - 1  # 15, 31 (the _1 types); 255 unused for q8_0
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.bits == 8:
                d = np.abs(blocks).max(axis=1) / np.float32(127)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                scaled = blocks * inv[:, None]
                codes = np.trunc(scaled + np.copysign(np.float32(0.5), scaled))  # roundf: half away from zero
                return d, d, codes.astype(np.int32)
            if self.offset:
                lo, hi = blocks.min(axis=1), blocks.max(axis=1)
                d = (hi - lo) / np.float32(levels)
                inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
                codes = np.trunc((blocks - lo[:, None]) * inv[:, None] + np.float32(0.5))
                return d, lo, np.minimum(levels, codes.astype(np.int32))
            half = 1 << (self.bits - 1)  # 8, 16
            first = np.abs(blocks).argmax(axis=1)  # the first value of largest magnitude
            extreme = blocks[np.arange(len(blocks)), first]
            d = extreme / np.float32(-half)
            inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            codes = np.trunc(blocks * inv[:, None] + np.float32(half + 0.5))
            return d, d, np.minimum(2 * half - 1, codes.astype(np.int32))


@dataclass(frozen=True)
class NonLinear(BlockType):
    """iq4_nl: a float16 scale d, then 32 four-bit indices into LEVELS (packed as q4_0's), value d·LEVELS[i].

    The cache's quantizer is `quantize_row_iq4_nl_ref` (ggml-cpu's from_float for this type), which runs
    `quantize_row_iq4_nl_impl` with no importance weights and ntry = -1, so no search over scales:
    1. the value of largest magnitude `max` (the first one); a block with max|x| < 1e-15 gets d = 0;
    2. indices: the level nearest x·(1/d0) with d0 = max / LEVELS[0] (`best_index_int8`: a tie goes to the upper);
    3. d = Σ w·q·x / Σ w·q² over those levels q with weights w = x² (float32 sums in index order), stored as
       float16; the indices are not recomputed with the final d."""

    LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

    def _codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        levels = np.array(self.LEVELS, dtype=np.float32)
        rows = np.arange(len(blocks))
        first = np.abs(blocks).argmax(axis=1)
        extreme = blocks[rows, first]
        live = np.abs(extreme) >= np.float32(1e-15)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d0 = extreme / levels[0]
            inv = np.where(live, np.float32(1) / d0, np.float32(0)).astype(np.float32)
            scaled = blocks * inv[:, None]
            # best_index_int8: the bracketing pair by binary search, then the nearer (the upper on a tie)
            upper = np.clip(np.searchsorted(levels, scaled, side="right"), 1, 15)
            lower = upper - 1
            pick_lower = (scaled - levels[lower]) < (levels[upper] - scaled)
            codes = np.where(scaled <= levels[0], 0, np.where(scaled >= levels[15], 15,
                                                              np.where(pick_lower, lower, upper)))
            q = levels[codes]
            sum_qx = np.zeros(len(blocks), dtype=np.float32)
            sum_q2 = np.zeros(len(blocks), dtype=np.float32)
            for j in range(BLOCK):  # float32, in index order, as the C loop adds
                x = blocks[:, j]
                wq = (x * x) * q[:, j]
                sum_qx = sum_qx + wq * x
                sum_q2 = sum_q2 + wq * q[:, j]
            d = np.where(live & (sum_q2 > 0), sum_qx / sum_q2, np.float32(0)).astype(np.float32)
        codes = np.where(live[:, None], codes, 0)
        return d, d, codes.astype(np.int32)

    def dequantize(self, data: np.ndarray) -> np.ndarray:
        data = np.asarray(data, dtype=np.uint8).reshape(-1, self.nbytes)
        d = data[:, 0:2].copy().view(np.float16).astype(np.float32)
        qs = data[:, 2:18].astype(np.int32)
        codes = np.concatenate([qs & 0xF, qs >> 4], axis=1)
        return _scaled(d, np.array(self.LEVELS, dtype=np.float32)[codes])


def _scaled(d: np.ndarray, codes: np.ndarray, m: np.ndarray | None = None) -> np.ndarray:
    """d·codes (+ m) per block (d and m one column per block) in float32, as ggml's C computes it. A block whose
    values pass float16's range has an infinite scale (or minimum), as ggml writes it; where IEEE arithmetic then
    has no value, 0 x inf and inf - inf, the value is NaN as in ggml, set here rather than computed (numpy warns
    of those operations as invalid)."""
    out = np.full(codes.shape, np.nan, dtype=np.float32)
    np.multiply(d, codes.astype(np.float32), out=out, where=np.isfinite(d) | (codes != 0))
    if m is not None:
        defined = ~(np.isinf(out) & np.isinf(m) & (np.sign(out) != np.sign(m)))
        np.add(out, m, out=out, where=defined)
        out[~defined] = np.nan
    return out


TYPES = {t.name: t for t in (BlockType("q8_0", 8, False, 34), BlockType("q4_0", 4, False, 18),
                             BlockType("q4_1", 4, True, 20), BlockType("q5_0", 5, False, 22),
                             BlockType("q5_1", 5, True, 24), NonLinear("iq4_nl", 4, False, 18))}


def q8_0_round_trip(x: torch.Tensor) -> torch.Tensor:
    """q8_0's round trip in torch, without the bytes: the same float32 steps as `TYPES["q8_0"].round_trip`
    (equal to it bit for bit, tested), several times faster; for the matmul inputs of every layer."""
    blocks = x.to(torch.float32).reshape(-1, BLOCK)
    d = blocks.abs().amax(dim=1) / 127
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    scaled = blocks * inv[:, None]
    codes = torch.trunc(scaled + torch.copysign(torch.full_like(scaled, 0.5), scaled))
    return (codes * d.to(torch.float16).to(torch.float32)[:, None]).reshape(x.shape).to(x.dtype)
