"""SGLang's default mem_fraction_static, per release: the share of the GPU its weights and KV pool may take; the
rest is left to activations and CUDA graphs (python/sglang/srt/server_args.py, read in the sdists named).

- 0.4 (0.4.6): by tensor parallel size on cards of at most 80 GiB (81,920 MiB): 0.88 at tp 1, 0.87 at 2, 0.85 at
  4, 0.81 at 8, 0.79 at 16; larger cards leave 13 GiB: (memory - 13 GiB) / memory.
- 0.5 (0.5.3, still so in 0.5.10): reserved MiB = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x
  cuda_graph_max_bs + tp x pp / 8 x 1024, at least 10 GiB on cards above 60 GiB, and mem_fraction_static =
  round((memory - reserved) / memory, 3); chunked_prefill_size and cuda_graph_max_bs default by the card's memory
  (under 20 GiB 2048 / 8; under 35 GiB 2048 / 16, 80 from tp 4; under 60 GiB 4096 / 32, 160 from tp 4; under
  160 GiB 8192 / 256, 512 from tp 4; else 16384 / 512). Later 0.5 releases size the pool after capturing the
  graphs in some configurations (not modelled).
SGLang reads the card's memory as nvidia-smi reports it; kvbudget uses the catalog's figure (torch's, where
known: about 0.6% less, which moves the fraction by under 0.001).
"""

from __future__ import annotations

NEWEST = (0, 5)
MODELLED = ((0, 4), (0, 5))
_TIERS = ((20, 2048, 8, 8), (35, 2048, 16, 80), (60, 4096, 32, 160), (160, 8192, 256, 512))  # GiB, chunk, bs


def parse_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a modelled SGLang release, or None."""
    parts = version.split(".")
    try:
        key = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError):
        return None
    return key if key in MODELLED else None


def prefill_and_graphs(gpu_mib: float, tp: int) -> tuple[int, int]:
    """0.5's chunked_prefill_size and cuda_graph_max_bs defaults for a card of `gpu_mib` MiB."""
    for below, chunk, small, large in _TIERS:
        if gpu_mib < below * 1024:
            return chunk, small if tp < 4 else large
    return 16384, 512


def mem_fraction_static(gpu_mib: float, tp: int, pp: int = 1, release: tuple[int, ...] = NEWEST) -> float:
    """The default mem_fraction_static of `release` on a card of `gpu_mib` MiB at tensor parallel size `tp`."""
    if release[:2] == (0, 4):
        if gpu_mib <= 81920:
            return next(f for at_least, f in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88)) if tp >= at_least)
        return (gpu_mib - 1024 * 13) / gpu_mib
    chunk, graphs = prefill_and_graphs(gpu_mib, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + tp * pp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)
