"""Serving on a contiguous KV cache: the baselines of the PagedAttention paper (Kwon et al., SOSP'23, §2.3, §6).

Before paging, a request reserved one contiguous run of token slots for its whole life when it was admitted:
- `max`: max_model_len slots (Orca (Max));
- `pow2`: the next power of two at or above prompt + output, from a buddy allocator (Orca (Pow2));
- `oracle`: exactly prompt + output, first fit (Orca (Oracle): output lengths known in advance).
Scheduling is iteration-level as in Orca: every step, each running request decodes one token and waiting ones
are admitted first come, first served while their reservation can be placed, their whole prompt fits in the
step's token budget and fewer than max_num_seqs run. A reservation always has room, so nothing is preempted.
Memory is reported as the paper's Fig. 2 splits it: token states (cached tokens), reservation (slots kept for
the request's future tokens), internal fragmentation (reserved beyond its final length) and the rest (free,
including external fragmentation: holes no waiting request fits).
"""

from __future__ import annotations

from kvbudget.errors import KVBudgetError
from kvbudget.simulation.seq import Queues, SchedulerConfig, Seq, Step, commit

POLICIES = ("max", "pow2", "oracle")


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class FirstFit:
    """Free runs of slots, sorted by start; allocation takes the first run long enough."""

    def __init__(self, slots: int) -> None:
        self.runs: list[tuple[int, int]] = [(0, slots)] if slots else []

    def alloc(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.runs):
            if length >= n:
                if length == n:
                    del self.runs[i]
                else:
                    self.runs[i] = (start + n, length - n)
                return start
        return None

    def free(self, start: int, n: int) -> None:
        runs = self.runs
        i = 0
        while i < len(runs) and runs[i][0] < start:
            i += 1
        runs.insert(i, (start, n))
        if i + 1 < len(runs) and start + n == runs[i + 1][0]:  # merge with the next run
            runs[i] = (start, n + runs[i + 1][1])
            del runs[i + 1]
        if i > 0 and runs[i - 1][0] + runs[i - 1][1] == start:  # and with the previous one
            runs[i - 1] = (runs[i - 1][0], runs[i - 1][1] + runs[i][1])
            del runs[i]


class Buddy:
    """A binary buddy allocator over `slots` (split into power-of-two arenas, largest first)."""

    def __init__(self, slots: int) -> None:
        self.free_at: dict[int, set[int]] = {}  # order -> starts of free blocks of 2**order slots
        self.arena: dict[int, tuple[int, int]] = {}  # start of a free block -> (arena base, arena order)
        base = 0
        for order in range(slots.bit_length() - 1, -1, -1):
            if slots >> order & 1:
                self.free_at.setdefault(order, set()).add(base)
                self.arena[base] = (base, order)
                base += 1 << order

    def alloc(self, n: int) -> int | None:
        want = (n - 1).bit_length()
        order = next((o for o in sorted(self.free_at) if o >= want and self.free_at[o]), None)
        if order is None:
            return None
        start = min(self.free_at[order])
        self.free_at[order].discard(start)
        base, arena_order = self.arena.pop(start)
        while order > want:  # split, keeping the lower half
            order -= 1
            self.free_at.setdefault(order, set()).add(start + (1 << order))
            self.arena[start + (1 << order)] = (base, arena_order)
        self.arena[start] = (base, arena_order)
        return start

    def free(self, start: int, n: int) -> None:
        order = (n - 1).bit_length()
        base, arena_order = self.arena[start]
        while order < arena_order:
            buddy = base + ((start - base) ^ (1 << order))
            if buddy not in self.free_at.get(order, ()):
                break
            self.free_at[order].discard(buddy)
            self.arena.pop(buddy)
            start = min(start, buddy)
            order += 1
        self.free_at.setdefault(order, set()).add(start)
        self.arena[start] = (base, arena_order)


class ContiguousScheduler(Queues):
    """Orca-style scheduling over reservations; the same interface as VLLMScheduler for the clock loop."""

    def __init__(self, config: SchedulerConfig, slots: int, policy: str) -> None:
        if policy not in POLICIES:
            raise KVBudgetError(f"allocator contiguous-{policy}: choose one of "
                                f"{', '.join('contiguous-' + p for p in POLICIES)}", param="allocator")
        super().__init__(config)
        self.slots, self.policy = slots, policy
        self.space: FirstFit | Buddy = Buddy(slots) if policy == "pow2" else FirstFit(slots)
        self.where: dict[int, tuple[int, int]] = {}  # uid -> (start, reserved slots)
        self.reserved = 0

    def reservation(self, s: Seq) -> int:
        total = s.prompt + s.end
        if self.policy == "max":
            return self.cfg.max_model_len
        return _pow2(total) if self.policy == "pow2" else total

    def usage(self) -> float:
        return self.reserved / self.slots

    def memory(self) -> tuple[int, int, int]:
        """(token states, reservation for future tokens, internal fragmentation), in token slots."""
        states = sum(s.computed for s in self.running)
        final = sum(s.prompt + s.end for s in self.running)
        return states, final - states, self.reserved - final

    def schedule(self) -> Step:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = [(s, 1) for s in self.running[:budget]]
        budget -= len(scheduled)
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            s = self.waiting[0]
            if s.prompt > budget:
                break
            size = self.reservation(s)
            if size > self.slots:
                raise KVBudgetError(f"allocator contiguous-{self.policy}: a request of {s.prompt} + {s.end} tokens "
                                    f"reserves {size} slots, more than the {self.slots} the cache holds",
                                    param="allocator")
            start = self.space.alloc(size)
            if start is None:
                break
            self.waiting.popleft()
            self.where[s.uid] = (start, size)
            self.reserved += size
            self.running.append(s)
            scheduled.append((s, s.prompt))
            budget -= s.prompt
        tokens, context = commit(scheduled)
        return Step(tuple(scheduled), (), self.slots - self.reserved, self.usage(), tokens, context)

    def _free(self, s: Seq) -> None:
        start, size = self.where.pop(s.uid)
        self.space.free(start, size)
        self.reserved -= size
