"""vLLM V1's refusal to start for want of KV cache memory, read from whatever part of it a paste kept.

v1/core/kv_cache_utils.py (check_enough_kv_cache_memory) raises "To serve at least one request with the model's
(some releases: models's) max seq len (N), (X GiB KV cache is needed, which is larger than the available KV cache
memory (Y GiB). Based on the available memory, the estimated maximum model length is Z. Try increasing ...". 0.7 and
0.8 printed the same figures (bytes / 1024**3, so GiB) labelled "GB" and without the estimate (v0.8.2's
kv_cache_utils.py: "... ({needed_memory/1024/1024/1024:.2f} GB KV cache is needed ..."): read as GiB. Pastes
hard-wrap it (the wrap joined back without its blank), cut it mid-word, or drop its parentheses: each part is read
on its own, and the refusal is the parts that survive. A hybrid's refusal for want of state blocks (MAMBA) is
recognised here too."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Each part, with any run of blanks (or none, where a hard wrap was joined back without one) between its words.
_SPACE = r"\s*"
_GIB = r"(\d{1,9}(?:\.\d{1,6})?)"  # a figure in GiB, bounded (a run of digits is never read in quadratic time)


def _loose(words: str) -> str:
    return words.replace(" ", _SPACE)


# "... the model's max seq len (N)," with its comma (V0's "The model's max seq len (N) is larger ..." has none)
_START = re.compile(r"model[s']{0,3}" + _SPACE + _loose("max seq len") + r"\s*\((\d{1,12})\)\s*,")
# V0's refusal (worker/worker.py raise_if_cache_size_invalid): "The model's max seq len (N) is larger than the maximum
# number of tokens that can be stored in KV cache (M). Try increasing ..."; retyped pastes misspell 'seq' ('sew')
V0_REFUSAL = re.compile(r"max \w{2,4} len \((\d{1,12})\) is larger than the maximum number of tokens that can be "
                        r"stored in KV cache \((\d{1,12})\)")
_UNIT = r"Gi?B"  # 0.9 on 'GiB'; 0.7-0.8 'GB' for the same GiB figure
_NEEDED = re.compile(r"\(?" + _GIB + _SPACE + _UNIT + _SPACE + _loose("KV cache is need"))
_AVAILABLE = re.compile(_loose("than the available KV cache memory") + _SPACE + r"\(" + _GIB + _SPACE + _UNIT + r"\)")
_ESTIMATED = re.compile(_loose("stimated maximum model length is") + r"\s*(\d[\d,]{0,15})")
# A hybrid's refusal at CUDA graph capture (config/compilation.py, 2026): every decoding sequence holds one block of
# its recurrent state, and max_num_seqs asked for more than the pool's blocks
MAMBA = re.compile(r"max_num_seqs \((\d{1,9})\) exceeds available Mamba cache blocks \((\d{1,12})\)")
# V0 and V1: the budget held no block; vLLM 0.1 printed the count unclamped instead (vllm/worker/worker.py,
# profile_num_available_blocks: (total x gpu_memory_utilization - peak) // block size, '# GPU blocks: -1'); V1 (and
# vllm-ascend's worker) print the budget below zero before the refusal (gpu_worker.py determine_available_memory:
# the share less the profiled use, unclamped; kv_cache_utils.py check_enough_kv_cache_memory then raises "No
# available memory for the cache blocks" for any budget <= 0)
NO_MEMORY = r"No available memory for the cache blocks|# GPU blocks: -\d|Available KV cache memory: -\d"
_NEGATIVE = re.compile(r"Available KV cache memory: (-\d{1,6}(?:\.\d{1,6})?) GiB")


def no_block_budget(text: str) -> str:
    """How the no-block refusal shows in the log: the budget below zero where printed (GiB), else 'refused'."""
    negative = _NEGATIVE.search(text)
    return f"{negative.group(1)} GiB" if negative else "refused"


# vLLM's CPU worker (v1/worker/cpu_worker.py, 2026) refuses a cache its NUMA node cannot hold: "Available memory on
# node N (free/total GiB) on kv cache allocation is less than requested memory for kv (kv/share GiB)", the share
# total x gpu_memory_utilization and kv the share less what the model and its warm-up took; "(kv GiB)" alone where
# --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE sets it
CPU_NODE = re.compile(r"Available memory on node (\d{1,4}) \(" + _GIB + "/" + _GIB + r" GiB\) on kv cache "
                      r"allocation is less than requested memory for kv \((-?\d{1,9}(?:\.\d{1,6})?)(?:/" + _GIB +
                      r")? GiB\)")

# What marks a pasted fragment as one of these refusals (any one of them)
SIGNATURES = (_START.pattern, _NEEDED.pattern, _loose("KV cache is needed, which is larger"), MAMBA.pattern, NO_MEMORY,
              CPU_NODE.pattern)


@dataclass(frozen=True)
class Refusal:
    """What survives of the refusal: `needed` and `available` as printed (GiB), None where cut off."""

    max_len: str | None
    needed: str | None
    available: str | None
    estimated: int | None


def read_refusal(text: str) -> Refusal | None:
    """The V1 refusal in `text` (a cleaned log), or None where no part of it is there. V0's refusal ("max seq len
    (N) is larger than the maximum number of tokens ...") is not this one."""
    flat = re.sub(r"\s+", " ", text)
    start = _START.search(flat)
    needed = _NEEDED.search(flat, start.start() if start else 0)
    if start is None and needed is None:
        return None
    at = start.start() if start else needed.start() if needed else 0
    available = _AVAILABLE.search(flat, at)
    estimated = _ESTIMATED.search(flat, at)
    return Refusal(max_len=start.group(1) if start else None,
                   needed=needed.group(1) if needed else None,
                   available=available.group(1) if available else None,
                   estimated=int(estimated.group(1).replace(",", "")) if estimated else None)

