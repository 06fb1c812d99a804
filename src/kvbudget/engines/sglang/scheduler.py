"""SGLang's scheduler (0.5.23, default settings), from its source; not run here (no CPU build), so this is an
estimate of SGLang's scheduling, labelled so wherever it is shown.

What it follows (python/sglang/srt/managers/scheduler.py `get_next_batch_to_run`, `update_running_batch`;
schedule_policy.py `PrefillAdder`; mem_cache/prefill_budget.py; schedule_batch.py `retract_decode`;
mem_cache/radix_cache.py; new_token_ratio_tracker.py):
- one pool of `max_total_num_tokens` token slots (page size 1); a radix cache keeps finished requests' tokens
  (prompt and output) for reuse, evicting unlocked leaves least recently used first when slots run short;
- a step is either a prefill batch or a decode batch: a new prefill batch is formed first whenever it can be
  (the chunked request's next chunk, then waiting requests first come first served), else every running
  request decodes one token;
- admission: a request fits if its uncached prompt plus its expected output (max_new_tokens clipped at 4,096)
  plus one is below the free and evictable slots less what the running requests are expected to still generate
  (their remaining max_new_tokens, clipped, times the new-token ratio); the first that does not fit stops the
  queue. Prompts longer than the chunk left (`chunked_prefill_size`, 8,192 on 80-160 GB GPUs) are chunked, one
  chunked request at a time; a batch holds at most `max_prefill_tokens` (16,384) prompt tokens;
- decode: when the pool cannot hold one more token per running request after evicting the cache, requests are
  retracted (freed, recomputed later from the back of the queue) shortest output first, then longest prompt,
  until it can; the new-token ratio is then re-estimated from the running requests, and otherwise decays from
  0.7 to 0.098 over 600 decode steps;
- the usage gauge (`sglang:token_usage`): slots neither free nor held by evictable cache, over the pool.
Not followed: priorities, LoRA, speculative decoding, overlap scheduling's one-step lag,
mixed chunks, data-parallel attention.
"""

from __future__ import annotations

import heapq
from typing import Any

from kvbudget.engines.scheduling.seq import Queues, SchedulerConfig, Seq, Step, attended_pairs, commit
from kvbudget.engines.scheduling.workload import Request

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (x schedule_conservativeness 1.0)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
MAX_PREFILL_TOKENS = 16384


class Node:
    __slots__ = ("children", "key", "last", "lock", "parent", "tokens")

    def __init__(self, key: Any, parent: Node | None) -> None:
        self.key = key  # (piece id, piece length)
        self.parent = parent
        self.children: dict[Any, Node] = {}
        self.tokens = 0  # tokens of the piece held here
        self.lock = 0
        self.last = 0  # last access (a counter)


class RadixCache:
    """A radix tree over the requests' content pieces: two requests share tokens exactly where their pieces
    agree; a request's own tokens (the rest of its prompt, and its output) form one piece only it has."""

    def __init__(self) -> None:
        self.root = Node(None, None)
        self.root.lock = 1
        self.size = 0  # tokens held
        self.evictable = 0  # ... in unlocked nodes
        self.clock = 0

    @staticmethod
    def path(s: Seq, tokens: int) -> list[tuple[Any, int]]:
        """The first `tokens` of s as pieces."""
        out = []
        left = tokens
        for pid, n in s.pieces:
            if left <= 0:
                break
            out.append(((pid, n), min(n, left)))
            left -= n
        if left > 0:
            out.append(((("own", s.uid), 0), left))
        return out

    def match(self, s: Seq, limit: int, touch: bool = True) -> tuple[int, Node]:
        """Tokens of s cached from its start (at most `limit`), and the deepest node reached; `touch` marks the
        nodes used now (off: a look that changes nothing)."""
        if touch:
            self.clock += 1
        node, matched = self.root, 0
        for key, n in self.path(s, limit):
            child = node.children.get(key)
            if child is None or not child.tokens:
                break
            if touch:
                child.last = self.clock
            take = min(child.tokens, n)
            matched += take
            node = child
            if take < n or child.tokens < (key[1] or n):
                break
        return matched, node

    def insert(self, s: Seq, tokens: int) -> Node:
        """Cache the first `tokens` of s (those already cached stay as they are); the last node."""
        self.clock += 1
        node, added = self.root, 0
        for key, n in self.path(s, tokens):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = Node(key, node)
            if n > child.tokens:
                added += n - child.tokens
                if child.lock == 0:
                    self.evictable += n - child.tokens
                child.tokens = n
            child.last = self.clock
            node = child
        self.size += added
        return node

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable -= node.tokens
            node.lock += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable += node.tokens
            assert node.parent is not None
            node = node.parent

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` (or all that can be): unlocked leaves, least recently used first."""
        heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.lock == 0 and node is not self.root:
                heap.append((node.last, id(node), node))
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, node = heapq.heappop(heap)
            freed += node.tokens
            self.evictable -= node.tokens
            self.size -= node.tokens
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.last, id(parent), parent))
        return freed


class SGLangScheduler(Queues):
    """`cfg.num_blocks` token slots (block size 1), `cfg.max_num_seqs` requests at most, chunked prefill of
    `cfg.max_num_batched_tokens`; prefix caching (the radix cache) unless `cfg.prefix_caching` is off."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.tree = RadixCache()
        self.total = config.num_blocks
        self.owned = 0  # slots held by running requests outside the cache
        self.chunked: Seq | None = None
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.min_ratio = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay = (self.ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.nodes: dict[int, Node] = {}  # uid -> the cache node it holds locked
        self.cached: dict[int, int] = {}  # uid -> its tokens that are in the cache (its locked prefix)

    def cached_prefix(self, request: Request) -> int:
        """The radix tree's match for the request's prompt now (as its KV events report the tree), untouched."""
        if not self.cfg.prefix_caching:
            return 0
        return self.tree.match(Seq(self._uid, request), request.prompt_tokens, touch=False)[0]

    # -- slots -----------------------------------------------------------------------------------------------

    @property
    def available(self) -> int:
        return self.total - self.tree.size - self.owned

    @property
    def used(self) -> int:
        """Slots neither free nor held by evictable cache (sglang:num_used_tokens)."""
        return self.total - self.available - self.tree.evictable

    def usage(self) -> float:
        return self.used / self.total

    def _alloc(self, tokens: int) -> None:
        """Slots for `tokens`, evicting the cache as needed (admission has made sure they exist)."""
        if self.available < tokens:
            self.tree.evict(tokens - self.available)
        if self.available < tokens:
            raise AssertionError("SGLang admission let in a prefill the pool cannot hold")
        self.owned += tokens

    def _max_new(self, s: Seq) -> int:
        asked = s.request.max_tokens or s.end
        return min(max(asked - s.out, 0), CLIP_MAX_NEW_TOKENS)

    def _release(self, s: Seq, keep: bool) -> None:
        """Give back a request's slots; `keep` puts its computed tokens in the cache first (a finished one)."""
        node = self.nodes.pop(s.uid, None)
        mine = s.computed - self.cached.pop(s.uid, 0)  # the slots it holds outside the cache
        if keep and self.cfg.prefix_caching:
            # its tokens go into the cache (those another request cached meanwhile are duplicates, freed)
            self.tree.insert(s, s.computed)
        self.owned -= mine
        if node is not None:
            self.tree.unlock(node)

    # -- one step --------------------------------------------------------------------------------------------

    def schedule(self) -> Step:
        prefill = self._prefill()
        if prefill:
            tokens, context = commit(prefill)
            return Step(scheduled=tuple(prefill), preempted=(), free_blocks=self.available, usage=self.usage(),
                        tokens=tokens, context=context, pairs=attended_pairs(prefill))
        return self._decode()

    def _prefill(self) -> list[tuple[Seq, int]]:
        cfg = self.cfg
        running = [s for s in self.running if s is not self.chunked]
        offset = sum(self._max_new(s) * self.ratio for s in running)
        current = 0.0
        rem_input, rem_chunk = MAX_PREFILL_TOKENS, cfg.max_num_batched_tokens
        batch: list[tuple[Seq, int]] = []

        def remaining_total() -> float:
            return self.available + self.tree.evictable - offset

        if self.chunked is not None:
            s = self.chunked
            room = min(rem_chunk, int(remaining_total()))
            n = min(s.num_tokens - s.computed, room if room > 0 else rem_chunk)
            done = s.computed + n >= s.num_tokens
            offset += n + 1 + (self._max_new(s) if done else 0)
            current += n + 1
            rem_input -= n
            rem_chunk -= n
            batch.append((s, n))
            if done:
                self.chunked = None
        free_rows = cfg.max_num_seqs - len(self.running)
        admitted = 0
        while self.waiting and rem_input > 0 and rem_chunk > 0 and admitted < free_rows:
            s = self.waiting[0]
            prefix, node = (self.tree.match(s, s.num_tokens - 1) if cfg.prefix_caching else (0, self.tree.root))
            extend = s.num_tokens - prefix
            max_new = self._max_new(s)
            if not extend + max_new + 1 < remaining_total():
                break
            hit = prefix  # the GPU's own
            if cfg.prefix_caching:  # a host tier's tokens after the GPU's prefix come back instead of being computed
                prefix, node = self._load_back(s, prefix, node)
                extend = s.num_tokens - prefix
            chunked = extend > rem_chunk
            n = rem_chunk if chunked else extend
            if n > min(self.available + self.tree.evictable - current, remaining_total()):
                break
            offset += n + 1 + (0 if chunked else max_new)
            current += n + 1
            rem_input -= n
            rem_chunk -= n
            self.waiting.popleft()
            if s.preemptions == 0 and cfg.prefix_caching:
                s.hit_tokens = hit
                self.hit_tokens += hit
                self.queried_tokens += s.num_tokens
            s.computed = prefix
            self.cached[s.uid] = prefix
            self.nodes[s.uid] = node
            self.tree.lock(node)
            self.running.append(s)
            admitted += 1
            batch.append((s, n))
            if chunked:
                self.chunked = s
                break
            if remaining_total() <= 0 or self.available + self.tree.evictable - current <= 0:
                break  # no capacity left (budget_state: NO_TOKEN)
        for _, n in batch:
            self._alloc(n)
        return batch

    def _load_back(self, s: Seq, prefix: int, node: Node) -> tuple[int, Node]:
        """The request's cached prefix once a host tier has loaded what it holds (none here)."""
        return prefix, node

    def _decode(self) -> Step:
        running = [s for s in self.running if s is not self.chunked]
        retracted: list[Seq] = []
        if running:
            need = len(running)
            if self.available < need:
                self.tree.evict(need - self.available)
            if self.available < need:
                order = sorted(running, key=lambda s: (s.out, -s.prompt), reverse=True)
                while self.available < len(order) and len(order) > 1:
                    victim = order.pop()
                    self._retract(victim, len(order))
                    retracted.append(victim)
                    if self.available < len(order):
                        self.tree.evict(len(order) - self.available)
                if self.available < len(order):  # even one request cannot go on: SGLang aborts it
                    last = order.pop()
                    self._release(last, keep=False)
                    self.running.remove(last)
                    self.failed.append(last)
                kept = order
                decoded = sum(s.out for s in kept)
                asked = sum(s.request.max_tokens or s.end for s in kept)
                self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (asked + 1))
                running = kept
            else:
                self.ratio = max(self.ratio - self.decay, self.min_ratio)
            self.owned += len(running)
        scheduled = [(s, 1) for s in running]
        tokens, context = commit(scheduled)
        return Step(scheduled=tuple(scheduled), preempted=tuple(retracted), free_blocks=self.available,
                    usage=self.usage(), tokens=tokens, context=context, pairs=attended_pairs(scheduled))

    def _retract(self, s: Seq, remaining: int) -> None:
        self._release(s, keep=False)
        self.tree.evict(remaining * RETRACT_DECODE_STEPS)
        self.running.remove(s)
        s.recomputed += s.computed
        s.computed = 0
        s.preemptions += 1
        self.preemptions += 1
        self.waiting.append(s)  # to the back of the queue (first come first served by position)

    # -- after a step ----------------------------------------------------------------------------------------

    def _free(self, s: Seq) -> None:
        self._release(s, keep=True)

    def update(self, step: Step, now: float = 0.0) -> list[Seq]:
        for s, _ in step.scheduled:  # a chunk leaves the request's computed tokens in the cache
            if s is self.chunked and self.cfg.prefix_caching:
                mine = s.computed - self.cached[s.uid]
                node = self.tree.insert(s, s.computed)
                self.owned -= mine
                self.tree.lock(node)
                self.tree.unlock(self.nodes[s.uid])
                self.nodes[s.uid] = node
                self.cached[s.uid] = s.computed
        return super().update(step, now)

    def memory(self) -> tuple[int, int, int]:
        return self.used, 0, 0
