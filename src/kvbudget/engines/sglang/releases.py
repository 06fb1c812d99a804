"""SGLang's default mem_fraction_static, per release: the share of the GPU its weights and KV pool may take; the
rest is left to activations and CUDA graphs (python/sglang/srt/server_args.py and model_executor/model_runner.py,
read in the sdists named). The rule changed often; the releases whose source was read are modelled, by era:

- 0.4.3 (read in 0.4.3.post4 and 0.4.4.post1): by tensor parallel size on every card: 0.88 at tp 1, 0.87 at 2,
  0.85 at 4, 0.81 at 8, 0.79 at 16. A multimodal model's fraction is then multiplied by 0.95 in model_runner.py,
  whether it was the default or given.
- 0.4.5: the same table; the multimodal factor is 0.90.
- 0.4.6: the table on cards of at most 80 GiB (81,920 MiB); larger cards leave 13 GiB: (memory - 13 GiB) /
  memory. Multimodal: 0.90, as in 0.4.5.
- 0.4.8 to 0.5.2 (read in 0.4.8, 0.4.9, 0.4.10, 0.5.1 and 0.5.2): reserved GiB by the card's memory, with p =
  tp x pp: under 35 GiB 2.8 + p / 10, under 90 GiB 9.5 + p / 2, under 160 GiB 12 + p / 2, else 32; then
  mem_fraction_static = round((memory - reserved) / memory, 3). A multimodal model: 0.4.8's model_runner.py
  multiplies any fraction by 0.90, 0.4.9's server_args.py the default only, 0.4.10 on weigh the vision tower as
  0.5.3 does (adjust_mem_fraction_for_vlm).
- 0.5.3 (still so in 0.5.9): reserved MiB = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x
  cuda_graph_max_bs + tp x pp / 8 x 1024, at least 10 GiB on cards above 60 GiB, and mem_fraction_static =
  round((memory - reserved) / memory, 3); chunked_prefill_size and cuda_graph_max_bs default by the card's memory
  (under 20 GiB 2048 / 8; under 35 GiB 2048 / 16, 80 from tp 4; under 60 GiB 4096 / 32, 160 from tp 4; under
  160 GiB 8192 / 256, 512 from tp 4; else 16384 / 512). A model with a vision_config then gets the default (only
  the default) times 0.95 x clamp(1 - 0.1 x (layers x hidden^2 / (24 x 1024^2) - 1), 0.8, 1.05), its ViT against
  a ViT-L/14 (adjust_mem_fraction_for_vlm). Later 0.5 releases size the pool after capturing the graphs in some
  configurations (not modelled). Read again in 0.5.5, 0.5.7, 0.5.8 and 0.5.9: the same rule (their piecewise
  CUDA graphs are opt-in, --enable-piecewise-cuda-graph).
- 0.5.10 (read in 0.5.10.post1): piecewise CUDA graphs are on by default, and their reserve joins the sum before the
  10 GiB floor: 1.5 GiB for an MLA model, else 8 MiB per capture size (4 to 32 by 4, to 256 by 16, to 512 by 32, to
  1,024 by 64, to 4,096 by 256, then by 512, up to chunked_prefill_size: 58 sizes at 8,192). server_args.py
  `_handle_piecewise_cuda_graph` turns them off on AMD and other non-CUDA devices, for multimodal models, with
  speculative decoding, pipeline parallelism or DP attention, and for DeepSeek-V3.2, Qwen3-Next, GLM-5 (DSA),
  Ling 2.5 and LLaDA; then nothing is added.
- AMD, 0.4.8 to 0.5.10: with no --attention-backend SGLang picks aiter for a multi-head model and for an MLA model
  with 16 or 128 KV heads a rank (others get triton), and with aiter and a context over 8,192 tokens it multiplies
  mem_fraction_static, default or given, by 0.85 (model_runner.py to 0.5.3, server_args.py
  `_handle_attention_backend_compatibility` from 0.5.5; 0.4.6 has no such cut).
0.4.7, whose source was not read, is refused rather than answered with a neighbour's rule. `sglang@0.4` is 0.4.6,
`sglang@0.5` is 0.5.3.
SGLang reads the card's memory as nvidia-smi reports it, on AMD as rocminfo's first pool (its size in KiB / 1,024:
the nominal 288 GiB of an MI355X: get_amdgpu_memory_capacity in utils.py, 0.4.8-0.5.10), so the default fraction
is taken of the catalog's nvidia-smi / rocminfo figure (kvbudget.gpus.reported_total), never of torch's total; the
pool is then that fraction of what torch finds free (model_runner.py profile_max_num_token)."""

from __future__ import annotations

import re

Release = tuple[int, int, int]
ERAS: tuple[Release, ...] = ((0, 4, 3), (0, 4, 5), (0, 4, 6), (0, 4, 8), (0, 4, 9), (0, 4, 10), (0, 5, 3), (0, 5, 10))
SPANS = (((0, 4, 3), (0, 4, 6)), ((0, 4, 8), (0, 5, 10)))  # the releases whose rule is modelled
NAMED = {(0, 4): (0, 4, 6), (0, 5): (0, 5, 3)}  # sglang@0.4, sglang@0.5
NEWEST: Release = (0, 5, 3)
MODELLED = "0.4.3-0.4.6 and 0.4.8-0.5.10 (0.4 is 0.4.6, 0.5 is 0.5.3)"
_TIERS = ((20, 2048, 8, 8), (35, 2048, 16, 80), (60, 4096, 32, 160), (160, 8192, 256, 512))  # GiB, chunk, bs
_TABLE = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
# 0.4.8-0.5.2: (card below GiB, reserved GiB fixed, reserved GiB per tp x pp); larger cards reserve 32 GiB
_RESERVED = ((35, 2.8, 0.1), (90, 9.5, 0.5), (160, 12.0, 0.5), (float("inf"), 32.0, 0.0))


def parse_release(version: str) -> Release | None:
    """The modelled SGLang release a version names ('0.4.4', '0.4.4.post2', or '0.5' for its era's first), else
    None."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(?:post|rc)\d+)?", version.strip())
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if m.group(3) is None:
        return NAMED.get((major, minor))
    release = (major, minor, int(m.group(3)))
    return release if any(low <= release <= high for low, high in SPANS) else None


def era(release: tuple[int, ...]) -> Release:
    """The era whose rule a modelled release follows."""
    return max(e for e in ERAS if tuple(release) >= e)


# The eras the KV budget's error band is measured per (kvbudget.budgetbands), oldest first: SGLang's minor releases.
BUDGET_ERAS = (((0, 0), "SGLang 0.4"), ((0, 5), "SGLang 0.5"))


def budget_era(release: tuple[int, ...]) -> str:
    """The era of BUDGET_ERAS a release falls in."""
    return [label for start, label in BUDGET_ERAS if tuple(release) >= start][-1]


def prefill_and_graphs(gpu_mib: float, tp: int) -> tuple[int, int]:
    """0.5's chunked_prefill_size and cuda_graph_max_bs defaults for a card of `gpu_mib` MiB."""
    for below, chunk, small, large in _TIERS:
        if gpu_mib < below * 1024:
            return chunk, small if tp < 4 else large
    return 16384, 512


def piecewise_mib(gpu_mib: float, tp: int, release: tuple[int, ...], mla: bool) -> int:
    """MiB the default fraction leaves for piecewise CUDA graphs where `release` captures them (0.5.10 on): 1.5 GiB
    for an MLA model, else 8 per capture size up to chunked_prefill_size; 0 before 0.5.10."""
    if era(release) < (0, 5, 10):
        return 0
    if mla:
        return 1536
    chunk, _ = prefill_and_graphs(gpu_mib, tp)
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, chunk + 1, 512)]
    return 8 * sum(1 for size in sizes if size <= chunk)


def mem_fraction_static(gpu_mib: float, tp: int, pp: int = 1, release: tuple[int, ...] = NEWEST,
                        drafter_mib: int = 0, piecewise: int = 0) -> float:
    """The default mem_fraction_static of `release` on a card of `gpu_mib` MiB at tensor parallel size `tp`, before
    any multimodal factor; `drafter_mib` more left aside for a speculative drafter (0.5: engines/sglang/speculative),
    `piecewise` MiB for piecewise CUDA graphs (`piecewise_mib`, where they are captured)."""
    rule = era(release)
    if rule < (0, 4, 6) or (rule == (0, 4, 6) and gpu_mib <= 81920):
        return next(f for at_least, f in _TABLE if tp >= at_least)
    if rule == (0, 4, 6):
        return (gpu_mib - 1024 * 13) / gpu_mib
    if rule < (0, 5, 3):
        fixed, per_rank = next((f, r) for below, f, r in _RESERVED if gpu_mib < below * 1024)
        return round((gpu_mib - (fixed + per_rank * tp * pp) * 1024 - drafter_mib) / gpu_mib, 3)
    chunk, graphs = prefill_and_graphs(gpu_mib, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + tp * pp / 8 * 1024 + piecewise
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    reserved += drafter_mib
    return round((gpu_mib - reserved) / gpu_mib, 3)


AITER_CUT = 0.85
AITER_CONTEXT = 8192  # the context above which the cut applies


def aiter_factor(release: tuple[int, ...], context_len: int, mla_heads_per_rank: int | None) -> float:
    """What SGLang on an AMD card multiplies mem_fraction_static by (default or given): 0.85 from 0.4.8 on where
    it picks aiter (a multi-head model: `mla_heads_per_rank` None; an MLA model with 16 or 128 KV heads a rank) and
    the context exceeds 8,192 tokens; else 1.0."""
    aiter = mla_heads_per_rank is None or mla_heads_per_rank in (16, 128)
    return AITER_CUT if era(release) >= (0, 4, 8) and aiter and context_len > AITER_CONTEXT else 1.0


def multimodal_factor(vision: tuple[int | None, int | None] | None, release: tuple[int, ...] = NEWEST
                      ) -> tuple[float, bool]:
    """What SGLang multiplies mem_fraction_static by for a model with a vision tower of (layers, hidden size)
    (1.0 without one), and whether it also scales a fraction the user gave (model_runner.py to 0.4.8 does; from
    0.4.9 server_args.py adjusts its default only). A size the config does not state is SGLang's own default (24
    layers, 1,024)."""
    if vision is None:
        return 1.0, False
    rule = era(release)
    if rule < (0, 4, 5):
        return 0.95, True
    if rule < (0, 4, 10):
        return 0.90, rule < (0, 4, 9)  # 0.4.9 moved the cut to server_args.py, of the default only
    layers, hidden = vision[0] or 24, vision[1] or 1024
    ratio = layers * hidden ** 2 / (24 * 1024 ** 2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0))), False


def release_name(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))
