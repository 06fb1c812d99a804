"""SGLang's hierarchical cache in the scheduler model (`--enable-hierarchical-cache`, write_through, from
python/sglang/srt/mem_cache/hiradix_cache.py of the 0.5.6 wheel; not run here):

- write_through: a finished request's tokens, inserted into the radix cache, are copied to the host pool too
  (`_inc_hit_count` backs a node up at its first hit; a chunked request's partial inserts are not);
- a new request matches its prefix on the GPU and then on host memory (`match_prefix`: the evicted nodes on its
  path that keep a host copy); what the host holds right after the GPU's prefix is loaded back, all of it or none
  (`init_load_back`, `load_back`: at least `load_back_threshold` 10 tokens, and room on the GPU, evicting the GPU
  cache as needed) and counts as cached;
- the copy runs layer by layer beside the forward pass of the batch that prefills it (the cache controller's
  load stream): the step takes the longer of its compute and the load (`Step.overlapped_load`);
- the host pool evicts its least recently used entries when a copy needs room (`evict_host`).

Simplified: SGLang's host pool evicts only nodes the GPU has let go, and a match refreshes a node on both tiers;
here the host is one least-recently-used list of the radix tree's pieces, refreshed when stored or loaded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, Step
from kvbudget.engines.sglang.scheduler import Node, RadixCache, SGLangScheduler
from kvbudget.engines.tiers import OffloadTotals

LOAD_BACK_THRESHOLD = 10  # HiRadixCache.load_back_threshold


class HostPool:
    """Host copies of the radix tree's pieces, by their path from the root: tokens held, least recently used
    first, at most `capacity` tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[int, int] = OrderedDict()
        self.size = self.stored = 0

    def put(self, key: int, tokens: int) -> None:
        had = self.held.pop(key, 0)
        self.size -= had
        if tokens > self.capacity:
            return
        while self.size + tokens > self.capacity and self.held:
            self.size -= self.held.popitem(last=False)[1]
        self.held[key] = tokens
        self.size += tokens
        self.stored += max(tokens - had, 0)


def _chain(path: list[tuple[Any, int]]) -> list[tuple[int, int]]:
    """Each piece of a path as (its key from the root, its tokens)."""
    out, chain = [], 0
    for key, n in path:
        chain = hash((chain, key))
        out.append((chain, n))
    return out


class HiCacheScheduler(SGLangScheduler):
    """SGLang's scheduler with HiCache's host pool behind its radix cache."""

    def __init__(self, config: SchedulerConfig, *, host_tokens: int, token_seconds: float, page_bytes: int,
                 page: int) -> None:
        super().__init__(config)
        self.host = HostPool(host_tokens)
        self.token_seconds = token_seconds
        self.page_bytes, self.page = page_bytes, page
        self.step_load = 0.0
        self.host_hit_tokens = self.loaded_tokens = 0

    def schedule(self) -> Step:
        self.step_load = 0.0
        step = super().schedule()
        if self.step_load:
            return Step(scheduled=step.scheduled, preempted=step.preempted, free_blocks=step.free_blocks,
                        usage=step.usage, tokens=step.tokens, context=step.context, pairs=step.pairs,
                        failed=step.failed, overlapped_load=self.step_load)
        return step

    def offload_totals(self) -> OffloadTotals:
        per_token = self.page_bytes / self.page
        return OffloadTotals(hit_tokens=self.host_hit_tokens, loaded_blocks=self.loaded_tokens,
                             stored_blocks=self.host.stored, block_bytes=round(per_token))

    def _release(self, s: Seq, keep: bool) -> None:
        super()._release(s, keep)
        if keep and self.cfg.prefix_caching:  # write_through: the finished request's pieces go to host too
            for key, n in _chain(RadixCache.path(s, s.computed)):
                self.host.put(key, n)

    def _load_back(self, s: Seq, prefix: int, node: Node) -> tuple[int, Node]:
        limit = s.num_tokens - 1
        gain, at = 0, 0
        for key, n in _chain(RadixCache.path(s, limit)):
            if at + n <= prefix:
                at += n
                continue
            held = min(self.host.held.get(key, 0), n)
            if at + held <= prefix + gain:
                break
            self.host.held.move_to_end(key)
            gain = at + held - prefix
            if held < n:
                break
            at += n
        gain = min(gain, limit - prefix)
        if gain < LOAD_BACK_THRESHOLD:
            return prefix, node
        self.tree.lock(node)  # the GPU prefix stays while room is made (load_back's inc_lock_ref)
        if self.available < gain:
            self.tree.evict(gain - self.available)
        self.tree.unlock(node)
        if self.available < gain:
            return prefix, node  # no room on the GPU: computed instead
        node = self.tree.insert(s, prefix + gain)
        self.step_load += gain * self.token_seconds
        self.loaded_tokens += gain
        if s.preemptions == 0:
            self.host_hit_tokens += gain
        return prefix + gain, node
