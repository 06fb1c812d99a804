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
Sliding windows, Mamba state and spec decoding are not modelled here (see `supports`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from kvbudget.simulate.workload import Request
from kvbudget.units import cdiv


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int  # vLLM's num_gpu_blocks, the null block included
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefix_caching: bool = True
    long_prefill_token_threshold: int = 0


class Seq:
    """One request inside the scheduler (mutable; the scheduler owns it)."""

    __slots__ = ("uid", "request", "prompt", "max_out", "out", "computed", "blocks", "ncached", "keys", "pieces",
                 "preemptions", "hit_tokens", "recomputed", "first_token", "finished", "scheduled_at")

    def __init__(self, uid: int, request: Request) -> None:
        self.uid = uid
        self.request = request
        self.prompt = request.prompt_tokens
        self.max_out = request.output_tokens
        self.out = 0  # tokens generated so far
        self.computed = 0  # vLLM's num_computed_tokens
        self.blocks: list[int] = []
        self.ncached = 0  # blocks already keyed
        self.keys: list[int] = []
        self.pieces = request.prefix
        self.preemptions = 0
        self.hit_tokens = 0  # prefix-cache hits at first admission
        self.recomputed = 0  # tokens computed again after preemptions
        self.first_token: float | None = None
        self.finished: float | None = None
        self.scheduled_at: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.out

    def key(self, j: int, block_size: int) -> int:
        """The chained content key of block j: equal for two requests exactly when their tokens agree up to the
        block's end (shared pieces by content id, the rest unique to this request)."""
        keys = self.keys
        while len(keys) <= j:
            i = len(keys)
            start, end = i * block_size, (i + 1) * block_size
            desc: list[tuple[Hashable, int, int]] = []
            at = 0
            for pid, n in self.pieces:
                if at >= end:
                    break
                if at + n > start:
                    desc.append((pid, max(start, at) - at, min(end, at + n) - at))
                at += n
            if end > at:
                desc.append((("seq", self.uid), max(start, at) - at, end - at))
            keys.append(hash((keys[-1] if keys else 0, tuple(desc))))
        return keys[j]


class BlockPool:
    """vLLM's block pool: a free queue in eviction order and a map from content key to cached blocks."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.ref = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))  # 0: null block
        self.cached: dict[int, list[int]] = {}
        self.usable = num_blocks - 1

    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.usable if self.usable else 0.0

    def lookup(self, key: int) -> int | None:
        blocks = self.cached.get(key)
        return blocks[0] if blocks else None

    def take(self, n: int) -> list[int]:
        """get_new_blocks: n blocks from the front of the free queue, their keys evicted."""
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            if self.caching and self.key[b] is not None:
                self._evict(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def _evict(self, b: int) -> None:
        k = self.key[b]
        assert k is not None
        holders = self.cached[k]
        holders.remove(b)
        if not holders:
            del self.cached[k]
        self.key[b] = None

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def store(self, b: int, key: int) -> None:
        self.key[b] = key
        self.cached.setdefault(key, []).append(b)

    def release(self, ordered: list[int]) -> None:
        """free_blocks: `ordered` by eviction priority; unkeyed to the front, keyed to the tail."""
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (last if self.caching and self.key[b] is not None else first).append(b)
        free = self.free
        for b in reversed(first):
            free[b] = None
            free.move_to_end(b, last=False)
        for b in last:
            free[b] = None

    def evictable(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.ref[b] == 0)


@dataclass(frozen=True)
class Step:
    """What one schedule() call decided."""

    scheduled: tuple[tuple[Seq, int], ...]  # (request, tokens) in vLLM's order: running first, then admitted
    preempted: tuple[Seq, ...]
    admitted: tuple[Seq, ...]
    free_blocks: int  # after scheduling
    usage: float  # vLLM's kv_cache_usage after scheduling

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class VLLMScheduler:
    """The reference: one schedule() and one update() per engine step, exactly as vLLM 0.32 decides them."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.cfg = config
        self.pool = BlockPool(config.num_blocks, config.prefix_caching)
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self._uid = 0
        self.preemptions = 0
        self.hit_tokens = 0  # prompt tokens served from the prefix cache (first admissions)
        self.queried_tokens = 0  # prompt tokens looked up (first admissions)

    def add(self, request: Request) -> Seq:
        seq = Seq(self._uid, request)
        self._uid += 1
        self.waiting.append(seq)
        return seq

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- allocation (KVCacheManager.allocate_slots for one full-attention group) --------------------------------

    def _cache(self, s: Seq, tokens: int) -> None:
        full = tokens // self.cfg.block_size
        bs = self.cfg.block_size
        for j in range(s.ncached, full):
            self.pool.store(s.blocks[j], s.key(j, bs))
        if full > s.ncached:
            s.ncached = full

    def _grow(self, s: Seq, n: int) -> bool:
        """A running request's next n tokens."""
        cfg = self.cfg
        need = cdiv(min(s.computed + n, cfg.max_model_len), cfg.block_size) - len(s.blocks)
        if need > len(self.pool.free):
            return False
        if need > 0:
            s.blocks += self.pool.take(need)
        if self.pool.caching:
            self._cache(s, min(s.computed + n, s.num_tokens))
        return True

    def _admit(self, s: Seq, n: int, hits: list[int]) -> bool:
        """A waiting request with `hits` cached blocks and n tokens to compute now; its whole sequence must fit."""
        cfg, pool = self.cfg, self.pool
        bs = cfg.block_size
        hit = len(hits) * bs
        evictable = pool.evictable(hits)
        whole = max(cdiv(min(s.num_tokens, cfg.max_model_len), bs) - len(hits), 0) + evictable
        now = max(cdiv(min(hit + n, cfg.max_model_len), bs) - len(hits), 0) + evictable
        free = len(pool.free)
        if whole > free or now > free:
            return False
        if hits:
            pool.touch(hits)
        s.blocks = list(hits)
        s.ncached = len(hits)
        new = cdiv(min(hit + n, cfg.max_model_len), bs) - len(s.blocks)
        if new > 0:
            s.blocks += pool.take(new)
        if pool.caching:
            self._cache(s, min(hit + n, s.num_tokens))
        return True

    def _hits(self, s: Seq) -> list[int]:
        if not self.pool.caching:
            return []
        bs = self.cfg.block_size
        out = []
        for j in range((s.num_tokens - 1) // bs):
            b = self.pool.lookup(s.key(j, bs))
            if b is None:
                break
            out.append(b)
        return out

    def _free(self, s: Seq) -> None:
        self.pool.release(s.blocks[::-1])
        s.blocks = []
        s.ncached = 0

    def _preempt(self, s: Seq) -> None:
        self._free(s)
        s.recomputed += s.computed
        s.computed = 0
        s.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(s)

    # -- one step -----------------------------------------------------------------------------------------------

    def schedule(self) -> Step:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        preempted: list[Seq] = []
        admitted: list[Seq] = []
        eligible = len(self.running) + len(self.waiting)
        threshold = cfg.long_prefill_token_threshold if eligible > 1 else 0
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = s.num_tokens - s.computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, cfg.max_model_len - s.computed - 1)
            if n <= 0:
                i += 1
                continue
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
                hit = len(hits) * cfg.block_size
                n = s.num_tokens - hit
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget)
                if not self._admit(s, n, hits):
                    break
                waiting.popleft()
                if s.preemptions == 0:
                    s.hit_tokens = hit
                    self.hit_tokens += hit
                    self.queried_tokens += s.num_tokens
                running.append(s)
                s.computed = hit
                admitted.append(s)
                scheduled.append((s, n))
                budget -= n

        for s, n in scheduled:
            s.computed += n
        return Step(tuple(scheduled), tuple(preempted), tuple(admitted), len(self.pool.free), self.pool.usage())

    def update(self, step: Step, now: float = 0.0) -> list[Seq]:
        """After the model ran the step: requests whose known tokens are all computed sample one token; those
        at their output length (or the model's maximum length) finish and free their blocks, in step order."""
        done = []
        max_len = self.cfg.max_model_len
        for s, _ in step.scheduled:
            if s.computed >= s.num_tokens:
                s.out += 1
                if s.first_token is None:
                    s.first_token = now
                if s.out >= s.max_out or s.num_tokens >= max_len:
                    s.finished = now
                    self._free(s)
                    done.append(s)
        if done:
            gone = {id(s) for s in done}
            self.running = [s for s in self.running if id(s) not in gone]
        return done


def supports(kinds: Any) -> str | None:
    """Why this scheduler cannot simulate a model with these layer kinds (None when it can)."""
    return None
