"""What the simulator's tests share: the model, random workloads, setups and the command line."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import kvbudget
from kvbudget.traces import find as bundled_trace

TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package

LLAMA = kvbudget.load_model("llama-3.1-8b")

def cli(capsys, *argv: str) -> tuple[int, str, str]:
    from kvbudget.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err

AZURE = str(TRACES / "AzureLLMInferenceTrace_conv.csv")

class QueuePool:
    """vLLM's free block queue and hash map block by block (the oracle for `BlockPool` and, through
    `BlockByBlock`, `RunPool`): one ordered queue of every free block, unkeyed ones freed to its front, keyed ones
    to its tail, blocks taken from its front with their key evicted."""

    def __init__(self, num_blocks: int) -> None:
        from collections import OrderedDict

        self.nfree = self.usable = num_blocks - 1
        self.ref = [0] * num_blocks
        self.key: list = [None] * num_blocks
        self.free = OrderedDict((b, None) for b in range(1, num_blocks))
        self.cached: dict = {}  # key -> its holders in insertion order

    def usage(self) -> float:
        return 1.0 - self.nfree / self.usable

    def lookup(self, key):
        holders = self.cached.get(key)
        return holders[0] if holders else None

    def find(self, keys) -> list[int]:
        out = []
        for k in keys:
            if k not in self.cached:
                break
            out.append(self.cached[k][0])
        return out

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            if self.key[b] is not None:
                self.cached[self.key[b]].remove(b)
                if not self.cached[self.key[b]]:
                    del self.cached[self.key[b]]
                self.key[b] = None
            self.ref[b] = 1
            out.append(b)
        self.nfree -= n
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
                self.nfree -= 1
            self.ref[b] += 1

    def store(self, b: int, key) -> None:
        self.key[b] = key
        self.cached.setdefault(key, []).append(b)

    def store_many(self, blocks, keys) -> None:
        for b, k in zip(blocks, keys, strict=True):
            self.store(b, k)

    def release(self, ordered: list[int]) -> None:
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.key[b] is None else last).append(b)
        for b in reversed(first):
            self.free[b] = None
            self.free.move_to_end(b, last=False)
        for b in last:
            self.free[b] = None
        self.nfree += len(first) + len(last)

    def evictable(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.ref[b] == 0)

class BlockByBlock:
    """`RunPool`'s interface over the block-by-block queue: block ids in per-request tables, one key (line, j)
    per block."""

    caching = True

    def __init__(self, num_blocks: int) -> None:
        self.q = QueuePool(num_blocks)
        self.usable = self.q.usable
        self.tables: dict[int, list[int]] = {}  # request uid -> its block ids
        self.keyed: dict[int, int] = {}  # request uid -> how many of its blocks are keyed

    @property
    def nfree(self) -> int:
        return self.q.nfree

    def usage(self) -> float:
        return self.q.usage()

    def find(self, segments):
        from kvbudget.engines.vllm.pool import Hits

        found = []
        for line, a, b in segments:
            for j in range(a, b):
                block = self.q.lookup((line, j))
                if block is None:
                    return Hits(found, len(found))
                found.append(block)
        return Hits(found, len(found))

    def evictable(self, hits) -> int:
        return self.q.evictable(hits.parts)

    def touch(self, s, hits) -> None:
        self.q.touch(hits.parts)
        self.tables[s.uid] = list(hits.parts)
        self.keyed[s.uid] = len(hits.parts)

    def take(self, s, n: int) -> None:
        self.tables.setdefault(s.uid, []).extend(self.q.take(n))

    def store(self, s, segments) -> None:
        keys = [(line, j) for line, a, b in segments for j in range(a, b)]
        lo = self.keyed.get(s.uid, 0)
        self.q.store_many(self.tables[s.uid][lo:lo + len(keys)], keys)
        self.keyed[s.uid] = lo + len(keys)

    def release(self, s, blocks: int) -> None:
        table = self.tables.pop(s.uid, [])
        assert len(table) == blocks
        self.keyed.pop(s.uid, None)
        self.q.release(table[::-1])


def close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Whether two results are the same but for rounding: equal field for field, floats within `rel` of each other
    (or both below 1e-12: sums of the same terms in another order). A decode run in closed form adds its steps'
    seconds in one sum where the reference adds them one by one (simulation/closedrun.py)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=rel,
                                                                                          abs_tol=1e-12)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(close(getattr(a, f.name), getattr(b, f.name), rel)
                                          for f in dataclasses.fields(a))
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[x], b[x], rel) for x in a)
    return bool(a == b)


def run_to_end(sched: Any) -> list[Any]:
    """Every step a scheduler takes until it has no work, each updated as the engine would: the steps."""
    steps = []
    while sched.has_work():
        step = sched.schedule()
        steps.append(step)
        sched.update(step)
    return steps
