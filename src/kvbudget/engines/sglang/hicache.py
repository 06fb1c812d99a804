"""SGLang's hierarchical cache (HiCache): the host-memory tier behind the radix cache (0.5.3 to 0.5.10).

`--enable-hierarchical-cache` with `--hicache-size GB` (an integer, per rank; 0: `--hicache-ratio`, 2.0 by
default, times the GPU pool's tokens) builds a host pool per rank in mem_cache/memory_pool_host.py
(HostKVCache.__init__, read in the 0.5.3 to 0.5.10 wheels):
- bytes per token `size_per_token`: the GPU pool's, every layer of the rank (MHA: 2 x heads x head size x layers x
  dtype bytes; MLA: (kv_lora_rank + rope dim) x layers x dtype bytes);
- tokens `int(hicache_size x 1e9 // size_per_token)`, then to whole pages: 0.5.3-0.5.5 round down
  (`size - size % page_size`), 0.5.6-0.5.10 round up past it (`(size // page_size + 1) x page_size`);
- it must exceed the GPU pool (an assert), and leave 10 GiB of the host's available memory; pinned, logged as
  "Allocating X GB host memory for hierarchical KV cache." in 10^9 bytes;
- `--hicache-write-policy` write_through (default: a node is copied to host when the radix cache inserts it),
  write_back (when the GPU evicts it), write_through_selective (after it is hit twice); host entries are evicted
  least recently used, and a hit in host memory is loaded back layer by layer as the prefill runs.
"""

from __future__ import annotations

import re

from kvbudget.engines.base import Allocation, LogRow
from kvbudget.engines.tiers import HostTier, full_layers_only, no_disk
from kvbudget.errors import EngineRuleError
from kvbudget.model.spec import ModelSpec

ROUND_UP_FROM = (0, 5, 6)
SOURCE = "sglang 0.5.3-0.5.10 python/sglang/srt/mem_cache/memory_pool_host.py (HostKVCache), server_args.py"


def hicache_tokens(host_size_gb: int, size_per_token: int, page: int, version: tuple[int, ...], *,
                   ratio: float = 2.0, gpu_tokens: int = 0) -> int:
    """Tokens of one rank's host pool for `--hicache-size host_size_gb` (0: `--hicache-ratio` times the GPU pool's
    `gpu_tokens`)."""
    size = int(host_size_gb * 10**9 // size_per_token) if host_size_gb > 0 else int(gpu_tokens * ratio)
    if version >= ROUND_UP_FROM:
        return (size // page + 1) * page
    return size - size % page


def hicache_tier(model: ModelSpec, alloc: Allocation, *, memory: int, disk: int | None, tp: int, page: int,
                 version: tuple[int, ...]) -> HostTier:
    """The host pool `memory` bytes over every rank make: `--hicache-size` per rank, in whole GB."""
    no_disk("sglang", "hicache", disk, "its third tier is an external storage backend (--hicache-storage-backend), "
            "not sized here")
    full_layers_only(model, alloc, "sglang", "hicache")
    if version < (0, 5, 3):
        raise EngineRuleError("offload_memory: SGLang's host pool is modelled from 0.5.3-0.5.10's source; give "
                              "engine sglang@0.5", param="offload_memory")
    gb = memory // tp // 10**9
    if gb < 1:
        raise EngineRuleError(f"offload_memory: SGLang sizes its host pool in whole GB per rank (hicache_size); "
                              f"{memory:,} bytes over {tp} rank(s) is less than 1 GB each", param="offload_memory")
    per_token = alloc.bytes_per_token
    tokens = hicache_tokens(gb, per_token, page, version)
    return HostTier(engine="sglang", backend="hicache", medium="host memory",
                    setting=f"--enable-hierarchical-cache --hicache-size {gb} (per rank)", unit="page",
                    unit_tokens=page, unit_bytes=page * per_token * tp, units=tokens // page, ranks=tp,
                    host_bytes=tokens * per_token * tp, pinned=True, partial_units=True,
                    policy="least recently used (--radix-eviction-policy lru)",
                    movement="write_through: a prefix is copied to host when the radix cache inserts it; a host "
                             "hit is loaded back layer by layer during the prefill",
                    source=SOURCE,
                    notes=("SGLang refuses a host pool no larger than the GPU pool, and one that leaves under 10 GiB "
                           "of the host's available memory",))


def hicache_rows(text: str, size_per_token: int, gpu_tokens: int, version: tuple[int, ...]) -> tuple[LogRow, ...]:
    """The host pool an SGLang log allocates ("Allocating X GB host memory for hierarchical KV cache.", 10^9
    bytes per rank) beside the pool its settings make; none where the log has no host pool."""
    m = re.search(r"Allocating ([\d.]+) GB host memory for hierarchical KV cache", text)
    if m is None:
        return ()
    size = int(g.group(1)) if (g := re.search(r"hicache_size=(\d+)", text)) else 0
    ratio = float(r.group(1)) if (r := re.search(r"hicache_ratio=([\d.]+)", text)) else 2.0
    page = int(p.group(1)) if (p := re.search(r"\bpage_size=(\d+)", text)) else 1
    tokens = hicache_tokens(size, size_per_token, page, version, ratio=ratio, gpu_tokens=gpu_tokens)
    ours = f"{tokens * size_per_token / 1e9:.2f}"
    how = (f"--hicache-size {size}" if size else f"--hicache-ratio {ratio:g} x the GPU pool's {gpu_tokens:,} tokens")
    rounding = "up past" if version >= ROUND_UP_FROM else "down to"
    return (LogRow("host pool per rank (HiCache)", f"{m.group(1)} GB", f"{ours} GB", m.group(1) == ours,
                   f"{tokens:,} tokens of {size_per_token:,} bytes ({how}, {rounding} whole pages of {page}); this "
                   "line's GB are 10^9 bytes"),)
