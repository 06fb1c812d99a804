"""llama.cpp's server (`llama-server`) loop, iteration for iteration: slots, not blocks.

What it follows, from tools/server/server-context.cpp and server-queue.cpp of the llama.cpp copy in
llama-cpp-python 0.3.36 (`process_single_task`, `get_available_slot`, `update_slots`, `decode`,
`try_clear_idle_slots`, `post_decode`, `release`):
- `-np N` slots, each serving one request start to finish; no preemption. A request arriving when no slot is idle
  is deferred (FIFO); each slot release moves the oldest deferred request to the *front* of the task queue, so
  two releases in one iteration serve the later-moved one first.
- An idle slot is chosen by prompt similarity first (the longest common prefix with the slot's cached tokens over
  the new prompt's length, above 0.1), else the least recently released (never-used slots tie; the last wins).
- Each iteration: one token for every generating slot (in slot order), then prompt tokens of the slots still
  processing their prompts, in slot order, until the batch holds `n_batch` (2,048) tokens. A slot's cached
  tokens are reused up to the common prefix with its new prompt, at least one token always computed.
- A request stops at its output length or when its cached tokens + 1 reach the slot's context (`n_ctx_slot`,
  truncated; context shift is off by default). A prompt of `n_ctx_slot` tokens or more is rejected at once.
- Own streams (the default with an explicit `-np`): a slot's cells are its own and never run out. A unified
  cache (`--kv-unified`, llama-server's default when `-np` is left to auto): one pool of cells shared by all
  slots, idle slots keeping their cached prompts; a sub-batch that does not fit purges one idle slot and retries,
  else halves the sub-batch, and at one token fails every busy slot ("Context size has been exceeded").
Not modelled: the host-RAM prompt cache (`--cache-ram`; run with `--cache-ram 0` to compare), speculative
decoding, context shift, multimodal chunks, child tasks (`n` > 1).
"""

from __future__ import annotations

from collections import deque

from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step
from kvbudget.engines.scheduling.workload import Request

SIMILARITY = 0.1  # --slot-prompt-similarity default


def _shared(a: Seq, b: Seq) -> int:
    """Tokens two requests' contents agree on from the start (their shared pieces)."""
    common = 0
    for (p, n), (q, m) in zip(a.pieces, b.pieces, strict=False):
        if p != q:
            break
        common += min(n, m)
        if n != m:
            break
    return min(common, a.shared, b.shared)


def common_prefix(content: Seq | None, cached: int, seq: Seq) -> int:
    """Tokens `cached` tokens of `content` share with the prompt of seq from the start."""
    if content is None or not cached:
        return 0
    return min(_shared(content, seq), cached, seq.prompt)


def contains(content: Seq, cached: int, other: Seq | None, other_cached: int) -> bool:
    """Whether the first `cached` tokens of content are a prefix of other's first `other_cached`."""
    if other is None or cached > other_cached:
        return False
    return content is other or _shared(content, other) >= cached


class PromptCache:
    """llama-server's host-RAM prompt cache (`--cache-ram`, 8,192 MiB by default; server_prompt_cache): slot
    caches saved when a slot is taken for a new task, the best saved one loaded into it (and dropped from
    RAM), the oldest dropped past the size limit. An entry's size is taken as its tokens times the KV bytes
    per token (llama.cpp adds a small header: an estimate)."""

    def __init__(self, limit_bytes: int, bytes_per_token: int) -> None:
        # a saved prompt's size is proportional to its tokens, so the byte limit is a token limit (it is always
        # the tighter of llama.cpp's two: its token limit is at least this one)
        self.max_tokens = limit_bytes // max(1, bytes_per_token)
        self.entries: deque[tuple[Seq, int]] = deque()  # (whose tokens, how many), oldest first
        self.tokens = 0  # held, summed

    def save(self, content: Seq | None, cached: int) -> None:
        """alloc: keep the slot's cache unless it is held whole already or larger than the cache; drop the
        saved ones it contains, then the oldest until it fits."""
        if content is None or not cached or cached > self.max_tokens:
            return
        if any(contains(content, cached, c, n) for c, n in self.entries):
            return
        kept = deque((c, n) for c, n in self.entries if not contains(c, n, content, cached))
        self.entries, self.tokens = kept, sum(n for _, n in kept)
        while self.entries and self.tokens + cached > self.max_tokens:
            self.tokens -= self.entries.popleft()[1]
        self.entries.append((content, cached))
        self.tokens += cached

    def load(self, content: Seq | None, cached: int, seq: Seq, room: int | None = None) -> tuple[Seq | None, int]:
        """The slot's cache after looking for a saved one that keeps more of itself and covers more of seq. A
        saved cache longer than `room` free cells cannot be restored: the load fails, the slot is cleared and
        the entry stays saved."""
        lcp = common_prefix(content, cached, seq)
        keep = lcp / cached if cached else -1.0
        sim = lcp / seq.prompt
        best = None
        for entry in self.entries:
            c, n = entry
            here = common_prefix(c, n, seq)
            keep_here = here / n
            if keep_here < 0.25:
                continue
            if keep < keep_here and sim < here / seq.prompt:
                keep, sim, best = keep_here, here / seq.prompt, entry
        if best is None:
            return content, cached
        if room is not None and best[1] > room:
            return None, 0
        self.entries.remove(best)
        self.tokens -= best[1]
        return best


class Slot:
    """One llama-server slot (mutable; the scheduler owns it). Ordered by id."""

    __slots__ = ("cached", "content", "id", "last_used", "seq", "started")

    def __init__(self, i: int) -> None:
        self.id = i
        self.seq: Seq | None = None  # the request it serves (None: idle)
        self.started = False  # True until its first prompt tokens are batched (SLOT_STATE_STARTED)
        self.cached = 0  # tokens in its cache (kept while idle)
        self.content: Seq | None = None  # whose tokens those are
        self.last_used: tuple[int, int] = (-1, 0)  # (iteration, slot) of its last release

    def __lt__(self, other: Slot) -> bool:
        return self.id < other.id


class LlamaServerScheduler(Queues):
    """`cfg.max_num_seqs` slots of `cfg.max_model_len` cells (n_ctx_slot), `cfg.max_num_batched_tokens` the
    logical batch (n_batch); `pool` the cells of the unified cache (0: every slot has its own stream)."""

    no_samples = "llama.cpp's child tasks (n > 1) are not simulated"

    def __init__(self, config: SchedulerConfig, pool: int = 0, ram: PromptCache | None = None) -> None:
        super().__init__(config)
        self.ram = ram  # the host-RAM prompt cache (--cache-ram), or None
        self.slots = [Slot(i) for i in range(config.max_num_seqs)]
        self.pool = pool
        self.cells = pool or config.max_num_seqs * config.max_model_len
        self.incoming: deque[Seq] = deque()  # the task queue: arrivals, and deferred tasks moved to its front
        self.slot_of: dict[int, Slot] = {}  # uid -> the slot serving it
        self.iteration = 0
        self.purges = 0

    # -- the task queue ---------------------------------------------------------------------------------------

    def add(self, request: Request) -> Seq:
        seq = self._seq(request)  # into the task queue; `waiting` holds the deferred tasks
        self.incoming.append(seq)
        return seq

    def has_work(self) -> bool:
        return bool(self.running or self.incoming)  # (deferred tasks wait for a release)

    def _lcp(self, slot: Slot, seq: Seq) -> int:
        """Tokens the slot's cache and the new prompt share from the start (shared prefix pieces only)."""
        if not self.cfg.prefix_caching:  # (cache_prompt off)
            return 0
        return common_prefix(slot.content, slot.cached, seq)

    def _available(self, seq: Seq) -> tuple[Slot | None, bool]:
        """get_available_slot: the slot, and whether the host-RAM prompt cache is consulted for it (a slot chosen
        least recently used, or by similarity but keeping less than half its cache)."""
        best, best_f = None, 0.0
        for slot in self.slots:
            if slot.seq is None and slot.cached:
                f = self._lcp(slot, seq) / seq.prompt
                if f > best_f and f > SIMILARITY:
                    best, best_f = slot, f
        if best is not None:
            return best, best_f * seq.prompt / best.cached < 0.5
        for slot in self.slots:
            if slot.seq is None and (best is None or slot.last_used <= best.last_used):
                best = slot
        return best, True

    def _process_tasks(self) -> None:
        while self.incoming:
            seq = self.incoming.popleft()
            slot, consult = self._available(seq)
            if slot is None:
                self.waiting.append(seq)
                continue
            if consult and self.ram is not None:
                self.ram.save(slot.content, slot.cached)
                room = self.pool - sum(o.cached for o in self.slots if o is not slot) if self.pool else None
                slot.content, slot.cached = self.ram.load(slot.content, slot.cached, seq, room)
            slot.seq, slot.started = seq, True
            self.slot_of[seq.uid] = slot
            self.running.append(seq)
            if self.ram is not None and self.pool:  # --cache-idle-slots: idle slots saved, and cleared (unified)
                for idle in self.slots:
                    if idle.seq is None:
                        self.ram.save(idle.content, idle.cached)
                        idle.content, idle.cached = None, 0

    # -- one iteration ----------------------------------------------------------------------------------------

    def schedule(self) -> Step:
        self.iteration += 1
        self._process_tasks()
        cfg = self.cfg
        n_batch = cfg.max_num_batched_tokens
        batch: list[tuple[Slot, int]] = []
        size = 0
        for slot in self.slots:  # generating slots: one token each
            s = slot.seq
            if s is not None and not slot.started and s.computed >= s.prompt:
                batch.append((slot, 1))
                size += 1
        for slot in self.slots:  # then prompts, until the batch is full
            if size >= n_batch:
                break
            s = slot.seq
            if s is None or (not slot.started and s.computed >= s.prompt):
                continue
            if slot.started:
                slot.started = False
                past = self._lcp(slot, s)
                if past == s.prompt:
                    past -= 1  # at least one token is evaluated
                slot.cached, slot.content = past, s  # the rest of its old cache is removed
                s.computed = s.hit_tokens = past
                self.hit_tokens += past
                self.queried_tokens += s.prompt
            n = min(s.prompt - s.computed, n_batch - size)
            batch.append((slot, n))
            size += n
        done = self._decode(size) if self.pool else size
        scheduled: list[tuple[Seq, int]] = []
        tokens = context = at = 0
        for slot, n in batch:
            s = slot.seq
            assert s is not None
            if at + n > done:  # its output token was not decoded: the iteration failed before it
                break
            at += n
            s.computed += n
            slot.cached += n
            tokens += n
            context += s.computed
            scheduled.append((s, n))
        failed = len(self.failed)
        if done < size:
            self._fail(scheduled)
        busy = sum(slot.seq.computed for slot in self.slots if slot.seq is not None)
        return Step(scheduled=tuple(scheduled), preempted=(), free_blocks=self.cells - busy, usage=busy / self.cells,
                    tokens=tokens, context=context, failed=len(self.failed) - failed)

    def _decode(self, size: int) -> int:
        """The batch through llama_decode in sub-batches of n_batch on the unified cache: tokens decoded."""
        full = self.cfg.max_num_batched_tokens
        used = sum(slot.cached for slot in self.slots)
        off, n_batch = 0, full
        while off < size:
            n = min(n_batch, size - off)
            if used + n <= self.pool:
                used += n
                off += n
                n_batch = full
            elif self._purge():
                used = sum(slot.cached for slot in self.slots)
            elif n_batch == 1:
                return off
            else:
                n_batch //= 2
        return size

    def _purge(self) -> bool:
        """try_clear_idle_slots: drop the first idle slot's cached tokens."""
        for slot in self.slots:
            if slot.seq is None and slot.cached:
                slot.cached, slot.content = 0, None
                self.purges += 1
                return True
        return False

    def _fail(self, decoded: list[tuple[Seq, int]]) -> None:
        """"Context size has been exceeded": every busy slot gets an error and is cleared, except the requests
        whose last token was sampled in a sub-batch that succeeded (they finished before the failure)."""
        finishing = {s.uid for s, _ in decoded if s.computed >= s.prompt + s.out and s.out + 1 >= s.end}
        for slot in self.slots:
            s = slot.seq
            if s is None or s.uid in finishing:
                continue
            self.failed.append(s)
            self.running.remove(s)
            del self.slot_of[s.uid]
            self._release(slot)
            slot.cached, slot.content = 0, None

    def _release(self, slot: Slot) -> None:
        slot.seq = None
        slot.started = False
        slot.last_used = (self.iteration, slot.id)
        if self.waiting:  # pop_deferred_task: the oldest deferred task to the front of the queue
            self.incoming.appendleft(self.waiting.popleft())

    def _free_finished(self, done: list[Seq]) -> None:
        """post_decode releases the finished requests' slots in slot order."""
        for slot in sorted(self.slot_of.pop(s.uid) for s in done):
            self._release(slot)

    def _free(self, s: Seq) -> None:  # (slots are released by _free_finished)
        raise AssertionError("llama.cpp slots are released in slot order by _free_finished()")

    def usage(self) -> float:
        return sum(slot.seq.computed for slot in self.slots if slot.seq is not None) / self.cells

    def memory(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) in cells. Own streams reserve a whole slot per
        request, as Orca's max allocation does: cells it will still fill, and cells past its final length;
        a unified pool reserves nothing."""
        states = reserved = internal = 0
        for slot in self.slots:
            s = slot.seq
            if s is None:
                continue
            states += s.computed
            if not self.pool:
                last = s.prompt + s.end - 1  # cached tokens when it stops (the last sampled is never fed)
                reserved += max(0, last - s.computed)
                internal += self.cfg.max_model_len - max(last, s.computed)
        return states, reserved, internal
