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

import re
from typing import TYPE_CHECKING

from kvbudget.engines.base import Allocation, EngineOptions, LogRow
from kvbudget.errors import EngineRuleError, KVBudgetError
from kvbudget.model.spec import LatentAttention, ModelSpec, NoCache
from kvbudget.offload import HostTier, full_layers_only, no_disk
from kvbudget.units import GIB, cdiv

if TYPE_CHECKING:
    from kvbudget.engines.vllm.engine import VLLMEngine

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


# --- startup logs --------------------------------------------------------------------------------------------
# 0.32 prints the settings in its "non-default args" ({'kv_offloading_size': 64.0, ...}) and the native region as
# "Created mmap file /dev/shm/vllm_offload_<id>.mmap (%.2f GB)" in 10^9 bytes (shared_offload_region.py);
# LMCache 0.5.6 prints "LMCache Configuration: {...}" with 'max_local_cpu_size': '5.0 GB' in 2^30 bytes
# (v1/config.py _log_config; per worker).
MMAP_LINE = re.compile(r"Created mmap file \S*vllm_offload_\S* \(([\d.]+) GB\)")
LMCACHE_LINE = re.compile(r"(?:LMCache Configuration: \{|Creating LMCacheEngine with config: "
                          r"LMCacheEngineConfig\()(.*)")


def offload_rows(engine: VLLMEngine, model: ModelSpec, text: str, *, size: str | None, backend: str | None,
                 kv_dtype: str, tp: int, options: EngineOptions) -> list[LogRow]:
    """The offload tiers a vLLM log sets up (`size` and `backend`: its kv_offloading settings as read), beside
    kvbudget's sizing of them (none where it sets none up)."""
    rows: list[LogRow] = []
    direct = re.search(r"""["']cpu_bytes_to_use["']:\s*(\d+)""", text)  # the connector configured by hand
    if size is not None and size != "None":
        backend = backend or "native"
        rows.append(_native_row(engine, model, text, int(float(size) * GIB), f"--kv-offloading-size {size}",
                                kv_dtype=kv_dtype, tp=tp, options=options) if backend == "native" else
                    LogRow("KV offloading (lmcache)", f"--kv-offloading-size {size}", "-", None,
                           "vLLM starts LMCache's multi-process mode, sized on the LMCache server: check its log"))
    elif direct and "OffloadingConnector" in text:
        rows.append(_native_row(engine, model, text, int(direct.group(1)), f"cpu_bytes_to_use {direct.group(1)}",
                                kv_dtype=kv_dtype, tp=tp, options=options))
    if m := LMCACHE_LINE.search(text):
        rows += _lmcache_rows(engine, model, m.group(1), kv_dtype=kv_dtype, tp=tp, options=options)
    return rows


def _native_row(engine: VLLMEngine, model: ModelSpec, text: str, memory: int, setting: str, *, kv_dtype: str,
                tp: int, options: EngineOptions) -> LogRow:
    try:
        tier = engine.host_tiers(model, memory=memory, disk=None, backend="native", kv_dtype=kv_dtype, tp=tp,
                                 options=options)[0]
    except KVBudgetError as exc:
        return LogRow("CPU offload region (native)", setting, "-", None, str(exc))
    ours = f"{tier.host_bytes / 1e9:.2f}"
    how = (f"{tier.units:,} chunks of {tier.unit_bytes:,} bytes ({tier.tokens:,} tokens) from {setting}; this "
           "line's GB are 10^9 bytes")
    if m := MMAP_LINE.search(text):
        return LogRow("CPU offload region (native)", f"{m.group(1)} GB", f"{ours} GB", m.group(1) == ours, how)
    return LogRow("CPU offload region (native)", "-", f"{ours} GB", None,
                  how + "; the log has no 'Created mmap file' line to check it against")


def _lmcache_rows(engine: VLLMEngine, model: ModelSpec, config: str, *, kv_dtype: str, tp: int,
                  options: EngineOptions) -> list[LogRow]:
    def value(name: str) -> str | None:  # 'name': 'value' (0.3 on) or name=value (earlier releases)
        m = re.search(rf"\b{name}(?:': |=)'?([^',)]+)", config)
        return m.group(1) if m else None

    def gib(name: str) -> float:
        return float((value(name) or "0").removesuffix(" GB"))

    cpu = gib("max_local_cpu_size") if value("local_cpu") != "False" else 0.0
    disk = gib("max_local_disk_size") if value("local_disk") not in (None, "None") else 0.0
    chunk = value("chunk_size") or str(LMCACHE_CHUNK)
    if not cpu:
        return [LogRow("LMCache CPU tier per worker", "off", "-", None, "local_cpu off or max_local_cpu_size 0")]
    try:
        tiers = engine.host_tiers(model, memory=int(cpu * GIB) * tp, disk=int(disk * GIB) * tp or None,
                                  backend="lmcache", kv_dtype=kv_dtype, tp=tp, options=options)
    except KVBudgetError as exc:
        return [LogRow("LMCache CPU tier per worker", f"{cpu:g} GB", "-", None, str(exc))]
    rows = []
    for t in tiers:
        per = t.unit_bytes // t.ranks
        note = (f"LMCache's GB are GiB; {per:,}-byte chunks of {LMCACHE_CHUNK} tokens (not printed: from its "
                "layout)" + ("" if chunk == str(LMCACHE_CHUNK) else
                             f"; the log's chunk_size is {chunk}, kvbudget models {LMCACHE_CHUNK}"))
        rows.append(LogRow(f"LMCache {'CPU' if t.medium == 'host memory' else 'disk'} tier per worker",
                           f"{(cpu if t.medium == 'host memory' else disk):g} GB",
                           f"{t.units:,} chunks, {t.units * LMCACHE_CHUNK:,} tokens", None, note))
    return rows
