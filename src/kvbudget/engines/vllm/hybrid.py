"""vLLM's scheduler over several KV cache groups in one pool (0.32), without prefix caching: sliding-window,
chunked-local and Mamba / linear-attention groups beside full attention, each with its own block table."""


from __future__ import annotations

from collections.abc import Sized

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq
from kvbudget.engines.vllm.blocks import BlockGroup
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.errors import KVBudgetError
from kvbudget.units import cdiv

LOOKAHEAD = 256  # hybrid decode runs: the most steps of block events computed in one call


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

    def block_phases(self) -> list[int] | None:
        return None  # (windows free blocks: see new_blocks_by_step)

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
