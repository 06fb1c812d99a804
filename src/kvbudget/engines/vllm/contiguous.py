"""Serving on a contiguous KV cache: the baselines of the PagedAttention paper (Kwon et al., SOSP'23, §2.3, §6).

Before paging, a request reserved one contiguous run of token slots for its whole life when it was admitted. The
paper's Orca variants (§6.1) differ in how much a request reserves:
- `max`: max_model_len slots (Orca (Max));
- `pow2`: its prompt plus its output length rounded up to a power of two (Orca (Pow2), "over-reserves the space
  for outputs by at most 2x": 25 output tokens reserve 32);
- `oracle`: exactly prompt + output (Orca (Oracle): output lengths known in advance).
The paper's own Orca places every reservation with the buddy allocation algorithm, so all three do here: a
reservation takes the power-of-two block that holds it, and the rest of that block is lost to the run.
Scheduling is iteration-level as in Orca: every step, each running request decodes one token and waiting ones
are admitted first come, first served while their reservation can be placed, their whole prompt fits in the
step's token budget and fewer than max_num_seqs run. A reservation always has room, so nothing is preempted.
Memory is reported as the paper's Fig. 2 splits it: token states (cached tokens), reservation (slots kept for
the request's future tokens), internal fragmentation (reserved beyond its final length) and the rest (free
slots, the buddy blocks' rounding and external fragmentation: holes no waiting request fits). With these two
readings of the paper the reproduction lands within 4 points of its Fig. 2 (benchmarks/paged_attention_fig2.py).
"""

from __future__ import annotations

from kvbudget.choices import Reservation
from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step, attended_pairs, commit
from kvbudget.errors import KVBudgetError


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


class Buddy:
    """A binary buddy allocator over `slots` (split into power-of-two arenas, largest first)."""

    def __init__(self, slots: int) -> None:
        self.largest = 1 << (slots.bit_length() - 1) if slots else 0  # the largest block there is
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

    def __init__(self, config: SchedulerConfig, slots: int, policy: Reservation) -> None:
        super().__init__(config)
        self.slots, self.policy = slots, Reservation(policy)
        self.space = Buddy(slots)
        self.where: dict[int, tuple[int, int]] = {}  # uid -> (start, reserved slots)
        self.held = 0  # slots in the buddy blocks given out

    def reservation(self, s: Seq) -> int:
        if self.policy is Reservation.MAX:
            return self.cfg.max_model_len
        if self.policy is Reservation.POW2:  # (never past the model's maximum length)
            return min(s.prompt + _pow2(s.end), self.cfg.max_model_len)
        return s.prompt + s.end

    def usage(self) -> float:
        """The share of slots in blocks given out (a block holds its reservation and the rounding to its size)."""
        return self.held / self.slots

    def memory(self) -> tuple[int, int, int]:
        """(token states, reservation for future tokens, internal fragmentation), in token slots."""
        states = sum(s.computed for s in self.running)
        final = sum(s.prompt + s.end for s in self.running)
        reserved = sum(size for _, size in self.where.values())
        return states, final - states, reserved - final

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
            if _pow2(size) > self.space.largest:
                raise KVBudgetError(f"allocator contiguous-{self.policy}: a request of {s.prompt} + {s.end} tokens "
                                    f"reserves {size} slots, a buddy block of {_pow2(size)}: more than the largest "
                                    f"the cache's {self.slots} slots hold ({self.space.largest})", param="allocator")
            start = self.space.alloc(size)
            if start is None:
                break
            self.waiting.popleft()
            self.where[s.uid] = (start, size)
            self.held += _pow2(size)
            self.running.append(s)
            scheduled.append((s, s.prompt))
            budget -= s.prompt
        tokens, context = commit(scheduled)
        return Step(scheduled=tuple(scheduled), preempted=(), free_blocks=self.slots - self.held, usage=self.usage(),
                    tokens=tokens, context=context, pairs=attended_pairs(scheduled))

    def _free(self, s: Seq) -> None:
        start, size = self.where.pop(s.uid)
        self.space.free(start, size)
        self.held -= _pow2(size)
