"""vLLM V1's scheduler and KV block pool (vllm 0.32), step for step, for one full-attention cache group.

What it follows, from vllm/v1/core in the 0.32 wheel (sched/scheduler.py `schedule`, kv_cache_manager.py
`allocate_slots` / `get_computed_blocks`, block_pool.py, single_type_kv_cache_manager.py):
- one token budget per step (`max_num_batched_tokens`); running requests first, in order, then waiting ones
  (FCFS) while fewer than `max_num_seqs` run; chunked prefill; `long_prefill_token_threshold` only while more
  than one request is eligible;
- a running request that cannot get its blocks preempts the last running request (freed, its computed tokens
  reset to 0, put at the front of the waiting queue), itself if it is the last; after a preemption nothing
  waiting is admitted in that step;
- a waiting request is admitted only if its whole prompt fits (`scheduler_reserve_full_isl`, on by default),
  counting cache hits it would take off the free queue;
- prefix-cache hits are whole blocks looked up by chained content key, never covering the last known token;
  blocks are keyed as soon as they are full of scheduled tokens (generated ones too);
- freed blocks go back to the free queue in reverse order: unkeyed ones to its front, keyed ones to its tail;
  new blocks come from the front, evicting their key (least recently used first);
- the usage gauge: 1 - free / (blocks - 1) (one block is vLLM's null block; idle cached blocks count as free).
The block pool itself is in pool.py. Several KV cache groups (sliding-window, chunked-local, Mamba /
linear-attention state) are `hybrid.HybridScheduler` and `cached.CachedHybridScheduler`. Speculative decoding
(`specdecode.SpecScheduler`) uses the hooks here: a running request's drafts scheduled with its next token, the
drafter's lookahead slots allocated past them, and the input budget's slots per request (`draft_slots`).
"""

from __future__ import annotations

from collections.abc import Callable, Sized

from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step, attended_pairs, commit
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.pool import NO_HITS, CountingPool, Hits, RunPool
from kvbudget.units import cdiv


class VLLMScheduler(Queues):
    """The reference: one schedule() and one update() per engine step, exactly as vLLM 0.32 decides them; and
    `decode_run`, which takes a run of pure decode steps at once with the same outcome."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.caching = config.prefix_caching  # (counts hits; the hybrid scheduler caches with its own pool)
        self.pool = self._new_pool()
        self.cache = self.pool if isinstance(self.pool, RunPool) else None  # this scheduler's caching pool
        self._align: Callable[[Seq, int, int], int] | None = None  # clips chunks: (request, tokens, hit tokens)

    def _new_pool(self) -> CountingPool:
        return RunPool(self.cfg.num_blocks) if self.caching else CountingPool(self.cfg.num_blocks)

    beam_search = True
    lookahead = 0  # KV slots allocated past a request's scheduled tokens (the drafter's: num_lookahead_tokens)
    draft_slots = 0  # input slots each scheduled request takes beyond its tokens (max_num_new_slots_for_drafting)

    def usage(self) -> float:
        return self.pool.usage()

    def free_blocks(self) -> tuple[int, int]:
        return self.pool.nfree, self.pool.usable

    def memory(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) in token slots: cached tokens of the running
        requests, nothing reserved ahead, and the unfilled rest of the blocks in use."""
        states = sum(s.computed for s in self.running)
        held = (self.pool.usable - self.pool.nfree) * self.cfg.block_size
        return states, 0, max(0, held - states)

    # -- allocation (KVCacheManager.allocate_slots for one full-attention group) --------------------------------

    def _cache(self, s: Seq, tokens: int) -> None:
        """Key the blocks that `tokens` fill (cache_blocks)."""
        cache = self.cache
        assert cache is not None
        bs = self.cfg.block_size
        full = tokens // bs
        if full <= s.ncached:
            return
        cache.store(s, s.segments(s.ncached, full, bs))
        s.ncached = full

    def _grow(self, s: Seq, n: int) -> bool:
        """Blocks for a running request's next n tokens; False when the pool cannot give them."""
        cfg = self.cfg
        need = cdiv(min(s.computed + n + self.lookahead, cfg.max_model_len), cfg.block_size) - s.nblocks
        if need > self.pool.nfree:
            return False
        if need > 0:
            self.pool.take(s, need)
            s.nblocks += need
        if self.cache is not None:
            self._cache(s, min(s.computed + n, s.num_tokens))  # (drafts are not keyed: only known tokens)
        return True

    def _needs(self, s: Seq, n: int, hits: Sized) -> tuple[int, int]:
        """Free blocks a waiting request needs: for its whole sequence, and for the n tokens it computes now
        (cache hits sitting idle in the free queue count: taking them removes them from it)."""
        cfg = self.cfg
        bs = cfg.block_size
        hit = len(hits)
        evictable = 0
        if hit and self.cache is not None:
            assert isinstance(hits, Hits)
            evictable = self.cache.evictable(hits)
        whole = max(cdiv(min(s.num_tokens, cfg.max_model_len), bs) - hit, 0) + evictable
        now = max(cdiv(min(hit * bs + n + self.lookahead, cfg.max_model_len), bs) - hit, 0) + evictable
        return whole, now

    def _admit(self, s: Seq, n: int, hits: Sized) -> bool:
        """A waiting request with `hits` cached blocks and n tokens to compute now; its whole sequence must fit."""
        cfg, pool = self.cfg, self.pool
        whole, now = self._needs(s, n, hits)
        if whole > pool.nfree or now > pool.nfree:
            return False
        hit = len(hits)
        if hit:
            assert self.cache is not None and isinstance(hits, Hits)
            self.cache.touch(s, hits)
        s.nblocks = s.ncached = hit
        end = hit * cfg.block_size + n  # tokens computed after this step
        new = cdiv(min(end + self.lookahead, cfg.max_model_len), cfg.block_size) - hit
        if new > 0:
            pool.take(s, new)
            s.nblocks += new
        if self.cache is not None:
            self._cache(s, min(end, s.num_tokens))
        return True

    def _first_chunk(self, s: Seq, hits: Sized, budget: int, threshold: int) -> int:
        n = s.num_tokens - len(hits) * self.cfg.block_size
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def _hits(self, s: Seq) -> Sized:
        """The longest run of cached blocks from the start, never covering the last known token."""
        cache = self.cache
        if cache is None:
            return NO_HITS
        bs = self.cfg.block_size
        return cache.find(s.segments(0, (s.num_tokens - 1) // bs, bs))

    def cached_prefix(self, request: Request) -> int:
        """The hits the request would find now (`_hits`, on a sequence under the uid the next request gets: no
        block is keyed under it yet), in tokens; the pool is only read."""
        if not self.caching:
            return 0
        return len(self._hits(Seq(self._uid, request))) * self.cfg.block_size

    def _free(self, s: Seq) -> None:
        self.pool.release(s, s.nblocks)
        s.nblocks = s.ncached = 0

    def _preempt(self, s: Seq) -> None:
        self._free(s)
        s.recomputed += s.computed
        s.computed = 0
        s.preemptions += 1
        s.drafts = 0  # (vLLM drops a preempted request's draft tokens)
        self.preemptions += 1
        self.waiting.appendleft(s)

    def _moves(self, s: Seq, end: int) -> bool:
        """Whether allocating for a running request's step to `end` tokens may change anything (else the step
        skips `_grow`): for one full-attention group, when it needs a block (its lookahead slots too) or fills one
        (`end` passes the known tokens only by drafts, which `_grow` does not key)."""
        bs = self.cfg.block_size
        return end + self.lookahead > s.nblocks * bs or (self.caching and end // bs > s.ncached)

    # -- one step -----------------------------------------------------------------------------------------------

    def schedule(self) -> Step:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens  # vLLM's input budget (its token budget is never the lower one)
        slots = self.draft_slots
        drafted = 0
        scheduled: list[tuple[Seq, int]] = []
        preempted: list[Seq] = []
        eligible = len(self.running) + len(self.waiting)
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        running = self.running
        last = cfg.max_model_len - 1
        align = self._align
        i = 0
        while i < len(running) and budget > slots:
            s = running[i]
            c = s.computed
            n = s.prompt + s.out + s.drafts - c
            if 0 < threshold < n:
                n = threshold
            if n > budget - slots:
                n = budget - slots
            if n > last - c:
                n = last - c
            if align is not None:
                n = align(s, n, 0)
            if n <= 0:
                i += 1
                continue
            if self._moves(s, c + n):
                ok = self._grow(s, n)
                while not ok:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is s:
                        break
                    ok = self._grow(s, n)
                if not ok:
                    break
            scheduled.append((s, n))
            budget -= n + slots
            if s.drafts:  # the drafts that fit are verified; the rest dropped (new ones come after the step)
                s.drafts = max(c + n - s.prompt - s.out, 0)
                drafted += s.drafts
            i += 1

        if not preempted:
            self._admit_waiting(scheduled, budget, threshold)

        tokens, context = commit(scheduled)
        return Step(scheduled=tuple(scheduled), preempted=tuple(preempted), free_blocks=self.pool.nfree,
                    usage=self.pool.usage(), tokens=tokens,
                    context=context, pairs=attended_pairs(scheduled), drafted=drafted)

    def _admit_waiting(self, scheduled: list[tuple[Seq, int]], budget: int, threshold: int) -> None:
        """Admit waiting requests in order while the step has tokens and seats left (none after a preemption)."""
        waiting, running = self.waiting, self.running
        slots = self.draft_slots
        while budget > slots and waiting and len(running) < self.cfg.max_num_seqs:
            n = self._admit_head(waiting[0], budget - slots, threshold)
            if n is None:
                break
            scheduled.append((waiting.popleft(), n))
            budget -= n + slots

    def _admit_head(self, s: Seq, budget: int, threshold: int) -> int | None:
        """The head of the queue with its cache hits, to run with the tokens returned; None where it cannot."""
        hits = self._hits(s)
        bs = self.cfg.block_size
        n = self._first_chunk(s, hits, budget, threshold)
        if not n:
            return None  # (speculative decoding's padding that does not fit: vLLM stops admitting)
        if self._align is not None:
            n = self._align(s, n, len(hits) * bs)
            if n == 0:
                return None
        if not self._admit(s, n, hits):
            return None
        hit = len(hits) * bs
        if s.preemptions == 0 and self.caching:
            s.hit_tokens = hit
            self.hit_tokens += hit
            self.queried_tokens += s.num_tokens
        self.running.append(s)
        s.computed = hit
        return n

    # -- the fast path: runs of pure decode steps ------------------------------------------------------------

    def decode_run_limit(self) -> int:
        """How many steps from now are certain to be pure decode — every running request computes its one new
        token, nothing is admitted or preempted — so they can be taken at once (0 when none). The last of them
        may finish requests."""
        cfg, running = self.cfg, self.running
        r = len(running)
        if not r or r > cfg.max_num_batched_tokens:
            return 0
        limit = cfg.max_model_len
        for s in running:
            out = s.out
            if s.computed != s.prompt + out - 1 or not out:  # (a prefill chunk can end one token short)
                return 0
            if s.end - out < limit:
                limit = s.end - out
        if self.waiting and r < cfg.max_num_seqs and cfg.max_num_batched_tokens > r:
            # the head of the queue must stay blocked: free blocks only fall during a decode run
            head = self.waiting[0]
            hits = self._hits(head)
            threshold = cfg.long_prefill_token_threshold  # more than one request is eligible here
            whole, now = self._needs(head, self._first_chunk(head, hits, cfg.max_num_batched_tokens - r, threshold),
                                     hits)
            if whole <= self.pool.nfree and now <= self.pool.nfree:
                return 0
        free = self.pool.nfree
        if self._blocks_for(limit) <= free:
            return limit
        lo, hi = 0, limit  # the longest run whose new blocks fit: a preemption is taken one step at a time
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_for(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _blocks_for(self, k: int) -> int:
        bs = self.cfg.block_size
        total = 0
        for s in self.running:
            need = -(-(s.computed + k) // bs) - s.nblocks
            if need > 0:
                total += need
        return total

    def context_tokens(self) -> int:
        """Tokens every running request attends over in its next decode step, summed."""
        return sum(s.computed for s in self.running) + len(self.running)

    def block_phases(self) -> list[int] | None:
        """The step at which each running request's next token first needs a new block (its blocks' free slots)."""
        bs = self.cfg.block_size
        return [max(0, s.nblocks * bs - s.computed) for s in self.running]

    def new_blocks_by_step(self, k: int) -> list[int]:
        """Blocks taken in each of the next k decode steps."""
        bs = self.cfg.block_size
        counts = [0] * k
        for s in self.running:
            j = s.nblocks * bs - s.computed  # (its phase, as block_phases has it: inline, for the loop's speed)
            if j < 0:
                j = 0
            while j < k:
                counts[j] += 1
                j += bs
        return counts

    def decode_run(self, k: int, now: float = 0.0) -> list[Seq]:
        """Take k pure decode steps at once (k from `decode_run_limit`, or fewer): the same blocks in the same
        order, the same cache keys, and the same requests finished (in the last step, at `now`) as k calls of
        schedule() and update()."""
        bs = self.cfg.block_size
        running, cache, pool = self.running, self.cache, self.pool
        for s in running:  # no hits during the run: all its new blocks first (the same ones evicted; once taken,
            # which request has which cannot be told apart)
            need = -(-(s.computed + k) // bs) - s.nblocks
            if need > 0:
                pool.take(s, need)
                s.nblocks += need
        for s in running:
            s.computed += k
            s.out += k
            if cache is not None and s.computed // bs > s.ncached:
                self._cache(s, s.computed)
        return self._end_run(now)

    def _end_run(self, now: float) -> list[Seq]:
        """The requests a decode run took to their output length finish at its last step, in running order."""
        done = [s for s in self.running if s.out >= s.end]
        if done:
            for s in done:
                s.finished = now
            self._free_finished(done)
            self.running = [s for s in self.running if s.finished is None]
        return done
