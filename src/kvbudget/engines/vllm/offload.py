"""vLLM's KV tiers beyond the GPU (0.32): the native CPU offloading connector and LMCache's local CPU and disk
backends.

Native (`--kv-offloading-size GiB`, `--kv-offloading-backend native`; vllm/config/vllm.py turns the size into the
OffloadingConnector's `cpu_bytes_to_use` = size x 2^30, the total over every rank):
- v1/kv_offload/cpu/spec.py: a chunk is `blocks_per_chunk` GPU blocks (1 unless set in kv_connector_extra_config);
  it holds `worker_kv_bytes_per_block` (one block of every layer group on one worker: the GPU pool's bytes per
  block, distributed/kv_transfer/kv_connector/v1/offloading/config.py) times the copies (every rank's, or one
  for a pure-MLA model under tensor parallelism: `replicated_layout`), padded to the page size (4,096 B,
  `mmap.PAGESIZE`); chunks = cpu_bytes_to_use // that.
- v1/kv_offload/cpu/shared_offload_region.py: the chunks are one file in /dev/shm, registered with CUDA (pinned),
  logged as "Created mmap file ... (X GB)" in 10^9 bytes.
- offloading/scheduler.py: every block is stored as soon as it is computed (asynchronously); a new request's
  blocks after its GPU prefix hit are looked up in order and loaded before it runs (WAITING_FOR_REMOTE_KVS);
  cpu/policies/lru.py evicts the least recently used chunk (`eviction_policy` "lru" by default, "arc" offered).
  No disk tier behind it in 0.32's settings.

LMCache (LMCacheConnectorV1 in vLLM's process, LMCache 0.5.6; `--kv-offloading-backend lmcache` instead starts
LMCache's multi-process mode, sized on the LMCache server): v1/config.py: `chunk_size` 256 tokens,
`max_local_cpu_size` 5 GiB and `max_local_disk_size` in GiB (x 1024^3, storage_backend/local_cpu_backend.py and
local_disk_backend.py), both per worker; a chunk is [2 (1 for MLA), layers, 256, heads x head size] in the KV
dtype (metadata.py get_shapes), allocated at 4,096-byte alignment (memory_management.py); `save_unfull_chunk`
False: a prompt's last partial chunk is not stored; LRU in the CPU backend, and the disk backend keeps a copy
of each chunk put.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.engines.base import Allocation
from kvbudget.engines.tiers import HostTier, full_layers_only, no_disk
from kvbudget.errors import EngineRuleError
from kvbudget.model.spec import LatentAttention, ModelSpec, NoCache
from kvbudget.units import GIB, cdiv

if TYPE_CHECKING:
    pass

PAGE = 4096  # mmap.PAGESIZE on x86-64 and arm64 Linux (4 KiB pages), and LMCache's allocation alignment
LMCACHE_CHUNK = 256
SOURCE = "vllm 0.32 v1/kv_offload/cpu/spec.py, shared_offload_region.py, kv_connector/v1/offloading/"
LMCACHE_SOURCE = "LMCache 0.5.6 v1/config.py, storage_backend/local_cpu_backend.py, local_disk_backend.py, metadata.py"


def _all_latent(model: ModelSpec) -> bool:
    return all(isinstance(s, LatentAttention) for s in model.layers if not isinstance(s, NoCache))


def native_tier(model: ModelSpec, *, memory: int, block_bytes: int, block_size: int, tp: int,
                blocks_per_chunk: int = 1) -> HostTier:
    """The native connector's CPU tier of `memory` bytes (--kv-offloading-size x 2^30) for a GPU pool whose block
    takes `block_bytes` on one rank."""
    copies = 1 if tp > 1 and _all_latent(model) else tp
    chunk = cdiv(block_bytes * copies * blocks_per_chunk, PAGE) * PAGE
    units = memory // chunk
    notes = ["the region is a file in /dev/shm: a container needs --shm-size above it (Docker gives 64 MiB)"]
    if copies == 1 and tp > 1:
        notes.append("an MLA model keeps one copy for all ranks (replicated_layout; single node, mp executor)")
    return HostTier(engine="vllm", backend="native", medium="host memory",
                    setting=f"--kv-offloading-size {memory / GIB:g}", unit="block" if blocks_per_chunk == 1 else
                    "chunk", unit_tokens=block_size * blocks_per_chunk, unit_bytes=chunk, units=units,
                    ranks=copies, host_bytes=units * chunk, pinned=True, partial_units=False,
                    policy="least recently used chunk (eviction_policy lru)",
                    movement="every full block stored as it is computed; on admission, the blocks after the GPU "
                             "prefix hit are loaded before the request runs",
                    source=SOURCE, notes=tuple(notes))


def lmcache_tiers(model: ModelSpec, alloc: Allocation, *, memory: int, disk: int | None, tp: int
                  ) -> tuple[HostTier, ...]:
    """LMCache's local CPU tier of `memory` bytes over every rank (max_local_cpu_size per worker), and its disk
    tier of `disk` bytes."""
    full_layers_only(model, alloc, "vllm", "lmcache")
    chunk = cdiv(alloc.bytes_per_token * LMCACHE_CHUNK, PAGE) * PAGE  # one rank's share of a chunk
    tiers = []
    for medium, total, knob in (("host memory", memory, "LMCACHE_MAX_LOCAL_CPU_SIZE"),
                                ("disk", disk, "LMCACHE_MAX_LOCAL_DISK_SIZE")):
        if not total:
            continue
        per_rank = total // tp
        units = per_rank // chunk
        if units == 0:
            raise EngineRuleError(f"offload_{'memory' if medium == 'host memory' else 'disk'}: {per_rank:,} bytes a "
                                  f"rank hold no LMCache chunk of {chunk:,} bytes; give more",
                                  param="offload_memory" if medium == "host memory" else "offload_disk")
        tiers.append(HostTier(
            engine="vllm", backend="lmcache", medium=medium, setting=f"{knob}={per_rank / GIB:g} (per rank)",
            unit="chunk", unit_tokens=LMCACHE_CHUNK, unit_bytes=chunk * tp, units=units, ranks=tp,
            host_bytes=units * chunk * tp, pinned=medium == "host memory", partial_units=False,
            policy="least recently used chunk" if medium == "host memory" else "least recently used file",
            movement="each full chunk stored as the prefill computes it (to CPU, and to disk when on); looked up on "
                     "admission, CPU first", source=LMCACHE_SOURCE,
            notes=("a prompt's last partial chunk is not stored (save_unfull_chunk False)",)))
    return tuple(tiers)


def host_tiers(model: ModelSpec, alloc: Allocation, block_bytes: int, block_size: int, *, memory: int,
               disk: int | None, backend: str, tp: int) -> tuple[HostTier, ...]:
    if backend == "native":
        no_disk("vllm", "native", disk, "0.32's --kv-offloading-size sizes host memory only")
        return (native_tier(model, memory=memory, block_bytes=block_bytes, block_size=block_size, tp=tp),)
    return lmcache_tiers(model, alloc, memory=memory, disk=disk, tp=tp)
