"""vLLM's KV block pool (vllm/v1/core/block_pool.py, 0.32) for one full-attention cache group, in runs of blocks.

What vLLM does, block by block: free blocks wait in one queue, those without a content key at its front (a freed
block without a key goes to the front) and keyed ones behind them, least recently freed first (a freed keyed block
goes to the tail, and keeps its key until it is taken); new blocks come from the front, their key evicted from the
map of cached blocks; a cache hit takes a keyed block back, from the queue or from another request (one more
holder); a key held by several blocks is found in its first holder.

`RunPool` keeps the same state in runs: a request's keyed blocks are runs of consecutive blocks of one *line*
(the blocks of one shared piece of prompt, or a request's own blocks, numbered by their position in the request:
key = (line, j)), each run with one set of holders; free runs wait in a linked queue, a run's highest block
first (a request frees its table last block first). Blocks without a key cannot be told apart by anything the
scheduler sees, so they are only counted. Every operation costs per run, not per block: a 12k-token prompt is a
few dozen runs rather than 800 blocks. A run is cut when part of it is hit or evicted; a request's last run grows
as its blocks are keyed, unless another run holds some of the same keys (the first holder of a key must stay the
one keyed first). `tests/unit/simulation/test_vllm_scheduler.py` checks it against vLLM's queue block by block.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import Protocol


class Holder(Protocol):
    """What the pool keeps on a request: its runs of keyed blocks, in table order."""

    runs: list[Run]


class Run:
    """Blocks j in [a, b) of `line`, held by `holders` (the same requests for all of them); when none, a free run
    linked into the queue by `prev` / `next`."""

    __slots__ = ("a", "b", "holders", "line", "next", "prev")

    def __init__(self, line: int, a: int, b: int, holders: list[Holder]) -> None:
        self.line, self.a, self.b, self.holders = line, a, b, holders
        self.prev: Run = self
        self.next: Run = self


class Hits:
    """A cache hit: (run, first block, end block) parts, in the request's order; len() is the blocks hit."""

    __slots__ = ("count", "parts")

    def __init__(self, parts: list[tuple[Run, int, int]], count: int) -> None:
        self.parts, self.count = parts, count

    def __len__(self) -> int:
        return self.count


NO_HITS = Hits([], 0)
NULL_BLOCKS = 1  # block 0 of vLLM's pool is its null block, never handed out (block_pool.py)


def usable_blocks(num_blocks: int) -> int:
    """The blocks of a pool of `num_blocks` that requests can hold: all but the null block."""
    return num_blocks - NULL_BLOCKS


class CountingPool:
    """The block pool without prefix caching: no block is ever looked up or kept for reuse, so which block is
    which changes nothing that can be observed, and the pool only counts."""

    caching = False

    def __init__(self, num_blocks: int) -> None:
        self.usable = usable_blocks(num_blocks)
        self.nfree = self.usable

    def usage(self) -> float:
        return 1.0 - self.nfree / self.usable

    def take(self, s: Holder, n: int) -> None:
        self.nfree -= n

    def release(self, s: Holder, blocks: int) -> None:
        """Free a request's `blocks` blocks (its whole table)."""
        self.nfree += blocks


class RunPool(CountingPool):
    """vLLM's block pool with prefix caching, in runs (see the module's docstring)."""

    caching = True

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.spare = self.usable  # free blocks without a key
        self.index: dict[int, list[Run]] = {}  # line -> the runs holding its blocks, first keyed first
        self.queue = Run(0, 0, 0, [])  # the free queue's sentinel: queue.next is evicted first

    def find(self, segments: Iterable[tuple[int, int, int]]) -> Hits:
        """The longest run of cached blocks from the request's first: `segments` are its (line, a, b) in order;
        each block found in the first run holding it."""
        parts: list[tuple[Run, int, int]] = []
        count = 0
        index = self.index
        for line, a, b in segments:
            runs = index.get(line)
            if runs is None:
                break
            j = a
            while j < b:
                for r in runs:
                    if r.a <= j < r.b:
                        break
                else:
                    return Hits(parts, count)
                hi = r.b if r.b < b else b
                parts.append((r, j, hi))
                count += hi - j
                j = hi
        return Hits(parts, count)

    def evictable(self, hits: Hits) -> int:
        """How many of the hit blocks sit in the free queue (no request holds them)."""
        return sum(hi - lo for r, lo, hi in hits.parts if not r.holders)

    def touch(self, s: Holder, hits: Hits) -> None:
        """Give a request with no blocks yet its hit blocks (taken off the free queue, or one more holder)."""
        runs = []
        for r, lo, hi in hits.parts:
            r = self._carve(r, lo, hi)
            if not r.holders:
                r.prev.next, r.next.prev = r.next, r.prev
                self.nfree -= r.b - r.a
            r.holders.append(s)
            runs.append(r)
        s.runs = runs

    def _carve(self, r: Run, lo: int, hi: int) -> Run:
        """Cut r so that it holds blocks [lo, hi) alone; the parts below and above become runs of their own in the
        same places (the index, the holders' tables, the queue: below after it, above before it)."""
        if lo > r.a:
            self._place(r, Run(r.line, r.a, lo, list(r.holders)), below=True)
            r.a = lo
        if hi < r.b:
            self._place(r, Run(r.line, hi, r.b, list(r.holders)), below=False)
            r.b = hi
        return r

    def _place(self, r: Run, part: Run, below: bool) -> None:
        runs = self.index[r.line]
        runs.insert(runs.index(r), part)
        for h in r.holders:
            table = h.runs
            i = table.index(r)
            table.insert(i if below else i + 1, part)
        if not r.holders:
            before, after = (r, r.next) if below else (r.prev, r)
            part.prev, part.next = before, after
            before.next = after.prev = part

    def take(self, s: Holder, n: int) -> None:
        """get_new_blocks: n blocks from the front of the free queue (unkeyed first; then keyed, their keys
        evicted, the front run's highest blocks first)."""
        self.nfree -= n
        if self.spare >= n:
            self.spare -= n
            return
        n -= self.spare
        self.spare = 0
        queue, index = self.queue, self.index
        while n:
            r = queue.next
            size = r.b - r.a
            if size > n:
                r.b -= n
                return
            queue.next, r.next.prev = r.next, queue
            runs = index[r.line]
            runs.remove(r)
            if not runs:
                del index[r.line]
            n -= size

    def store(self, s: Holder, segments: Iterable[tuple[int, int, int]]) -> None:
        """Key the request's next unkeyed blocks, `segments` (line, a, b) in order: its last run grows when it
        continues it and no other run holds any of the same blocks; else a new run, keyed after all others."""
        table, index = s.runs, self.index
        for line, a, b in segments:
            if table:
                last = table[-1]
                if last.line == line and last.b == a and len(last.holders) == 1:
                    runs = index[line]
                    if len(runs) == 1 or not any(x is not last and x.a < b and a < x.b for x in runs):
                        last.b = b
                        continue
            r = Run(line, a, b, [s])
            index.setdefault(line, []).append(r)
            table.append(r)

    def release(self, s: Holder, blocks: int) -> None:
        """free_blocks for a request's whole table of `blocks` blocks, last first: those no other request holds
        go back, unkeyed ones to the queue's front, keyed ones to its tail."""
        queue = self.queue
        unkeyed = blocks
        for r in reversed(s.runs):
            size = r.b - r.a
            unkeyed -= size
            holders = r.holders
            if len(holders) > 1:  # held by another request too: stays
                holders.remove(s)
                blocks -= size
                continue
            holders.clear()
            tail = queue.prev
            r.prev, r.next = tail, queue
            tail.next = queue.prev = r
        self.spare += unkeyed
        self.nfree += blocks
        s.runs = []


class BlockPool(CountingPool):
    """The same pool block by block, with block ids and hashed keys: what the hybrid scheduler with prefix caching
    uses (its windows key and free single blocks of a table). A free queue in eviction order and a map from
    content key to cached blocks.

    vLLM's free queue always holds the blocks without a key first (the pool starts with none keyed, and freed
    blocks without a key go to its front) and then the keyed ones, least recently freed first (freed keyed blocks
    go to its tail; a block keeps its key until it is taken). Blocks without a key cannot be told apart by
    anything the scheduler sees, so they are kept as a stack (`spare`); the keyed ones as a list read from `head`
    on, where a block taken back by a cache hit leaves its entry behind as a gap (`gaps`, absolute positions).
    Runs of blocks are taken, freed and keyed with list and dict operations rather than block by block.
    `tests/unit/simulation/test_vllm_scheduler.py` checks it against a block-by-block copy of vLLM's queue."""

    caching = True

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.key: list[int | None] = [None] * num_blocks
        self.shared: dict[int, int] = {}  # a held block -> how many requests hold it beyond one
        self.spare = list(range(num_blocks - 1, 0, -1))  # free blocks without a key
        self.queue: list[int] = []  # free keyed blocks in eviction order, from `head`, with gaps
        self.head = 0
        self.base = 0  # the absolute position of queue[0]
        self.at = [-1] * num_blocks  # a free keyed block's absolute position in the queue; -1 for the others
        self.gaps: list[int] = []  # absolute positions of entries whose block was taken back, sorted
        self.cached: dict[int, int] = {}  # key -> the first block that holds it
        self.more: dict[int, list[int]] = {}  # key -> the blocks that hold it after the first, in order

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def take_ids(self, n: int) -> list[int]:
        """get_new_blocks: n blocks from the front of the free queue, their keys evicted."""
        spare = self.spare
        if len(spare) >= n:
            out = spare[len(spare) - n:]
            del spare[len(spare) - n:]
        else:
            out = spare[:]
            spare.clear()
            out += self._evict(n - len(out))
        self.nfree -= n
        return out

    def _evict(self, n: int) -> list[int]:
        """The n blocks at the front of the keyed queue, their keys dropped."""
        queue, gaps = self.queue, self.gaps
        out: list[int] = []
        while len(out) < n:
            lo = self.head
            hi = lo + n - len(out)
            self.head = hi
            run = queue[lo:hi]
            start = self.base + lo
            if gaps and gaps[0] < start + len(run):  # skip the entries taken back
                cut = bisect_left(gaps, start + len(run))
                skip = set(gaps[:cut])
                del gaps[:cut]
                run = [b for i, b in enumerate(run, start) if i not in skip]
            out += run
        if self.head > 4096 and 2 * self.head > len(queue):
            del queue[:self.head]
            self.base += self.head
            self.head = 0
        key, at, cached, more = self.key, self.at, self.cached, self.more
        keys: list[int] = [key[b] for b in out]  # type: ignore[misc]  # queued blocks are all keyed
        if not more or more.keys().isdisjoint(keys):  # each block its key's only holder
            for k in keys:
                del cached[k]
        else:
            for b, k in zip(out, keys, strict=True):
                self._drop(b, k)
        for b in out:
            key[b] = None
            at[b] = -1
        return out

    def _drop(self, b: int, k: int) -> None:
        cached, more = self.cached, self.more
        later = more.get(k)
        if cached[k] == b:
            if later:
                cached[k] = later.pop(0)
                if not later:
                    del more[k]
            else:
                del cached[k]
        else:
            assert later is not None
            later.remove(b)
            if not later:
                del more[k]

    def touch(self, blocks: list[int]) -> None:
        at, gaps, shared = self.at, self.gaps, self.shared
        for b in blocks:
            if at[b] >= 0:  # a keyed block in the free queue
                insort(gaps, at[b])
                at[b] = -1
                self.nfree -= 1
            else:  # held already: one more holder
                shared[b] = shared.get(b, 0) + 1

    def store(self, b: int, key: int) -> None:
        self.store_many([b], [key])

    def unkey(self, b: int) -> None:
        """Drop a held block's key (vLLM's _maybe_evict_cached_block)."""
        k = self.key[b]
        if k is not None:
            self._drop(b, k)
            self.key[b] = None

    def store_many(self, blocks: list[int], keys: list[int]) -> None:
        """Key each block, in order; a key already held keeps its first holder (vLLM's map holds them all)."""
        own = self.key
        for b, k in zip(blocks, keys, strict=True):
            own[b] = k
        cached = self.cached
        if cached.keys().isdisjoint(keys):
            cached.update(zip(keys, blocks, strict=True))
            return
        for b, k in zip(blocks, keys, strict=True):
            first = cached.setdefault(k, b)
            if first != b:
                self.more.setdefault(k, []).append(b)

    def release_ids(self, ordered: list[int]) -> None:
        """free_blocks: `ordered` by eviction priority; unkeyed to the front, keyed to the tail."""
        shared = self.shared
        common = shared.keys() & ordered if shared else None
        if not common:  # each block held by this request alone
            freed = ordered
        else:  # blocks other requests hold too stay held
            for b in common:
                if shared[b] > 1:
                    shared[b] -= 1
                else:
                    del shared[b]
            freed = [b for b in ordered if b not in common]
        key = self.key
        keys = [key[b] for b in freed]
        unkeyed = keys.count(None)
        if not unkeyed:
            keyed = freed
        elif unkeyed == 1 and keys[0] is None:  # the usual: a request's last block, not yet full
            self.spare.append(freed[0])
            keyed = freed[1:]
        else:
            self.spare += [b for b, k in zip(freed, keys, strict=True) if k is None]
            keyed = [b for b, k in zip(freed, keys, strict=True) if k is not None]
        at, queue = self.at, self.queue
        p = self.base + len(queue)
        for b in keyed:
            at[b] = p
            p += 1
        queue += keyed
        self.nfree += len(freed)

    def evictable(self, blocks: list[int]) -> int:
        """How many of these keyed blocks sit in the free queue (no request holds them)."""
        at = self.at
        return sum(1 for b in blocks if at[b] >= 0)
