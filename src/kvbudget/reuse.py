"""How much of a trace's prompts a prefix cache of a given size serves, and whether a host tier pays for it.

The reuse curve is exact for one idealised cache: least recently used, by whole prefix pieces of the trace (512
tokens in Mooncake's), seeing the requests in arrival order, holding everything a request writes (its prompt's
shared pieces, the rest of its prompt, its output) and serving a prompt's leading pieces while every one of them
is held. It follows from each piece's stack distance, in tokens (Mattson et al., 1970), so one pass over the trace
gives the hits at every size at once. An engine's GPU pool also holds its running requests' blocks, evicts by
block and caches only full blocks; its host tier keeps a copy of what it stores. So for an engine the curve is an
estimate: the accuracy page gives its error against `simulate`, which runs the engine's scheduler.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.errors import KVBudgetError
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.timing import TimeModel
    from kvbudget.engines.scheduling.workload import Request

GiB = 1 << 30
# host memory a tier is tried at: 16 GiB to 2 TiB (a two-socket server's memory), over every rank
CANDIDATES = tuple(GiB << k for k in range(4, 12))
# a tier pays when it serves at least this share of the prompt tokens beyond what the GPU already serves ...
MIN_GAIN = 0.05
# ... and the size recommended is the smallest that gets this share of what the largest candidate gets
ENOUGH = 0.9


@dataclass(frozen=True, kw_only=True)
class ReuseCurve:
    """Prompt tokens an LRU prefix cache of any size serves on one trace (see the module's docstring)."""

    trace: str
    requests: int
    prompt_tokens: int
    needs: tuple[int, ...]  # per reusable piece, ascending: the cache size (tokens) at which it and its prefix hit
    served: tuple[int, ...]  # tokens served by the pieces up to each need, cumulative
    reusing: int  # requests that reuse a prefix in an unbounded cache

    def hit_tokens(self, capacity: int) -> int:
        """Prompt tokens served from a cache of `capacity` tokens."""
        i = bisect_right(self.needs, capacity)
        return self.served[i - 1] if i else 0

    def share(self, capacity: int) -> float:
        return self.hit_tokens(capacity) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reusable(self) -> int:
        """Prompt tokens an unbounded cache serves."""
        return self.served[-1] if self.served else 0

    @property
    def mean_hit(self) -> int:
        """Tokens an unbounded cache serves a request that reuses a prefix, on average."""
        return self.reusable // self.reusing if self.reusing else 0


class _Stack:
    """Tokens held above each position of an LRU stack (a Fenwick tree over access times)."""

    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)
        self.total = 0

    def add(self, at: int, tokens: int) -> None:
        self.total += tokens
        i = at + 1
        while i < len(self.tree):
            self.tree[i] += tokens
            i += i & -i

    def above(self, at: int) -> int:
        """Tokens accessed after position `at` (each item counted at its latest access)."""
        i, below = at + 1, 0
        while i > 0:
            below += self.tree[i]
            i -= i & -i
        return self.total - below


def reuse_curve(requests: Iterable[Request], trace: str) -> ReuseCurve:
    """The reuse curve of `requests` (in arrival order); refuses a trace that names no shared prefixes."""
    reqs = list(requests)
    if not any(r.prefix for r in reqs):
        raise KVBudgetError(f"trace: {trace} names no shared prefixes (the Azure traces carry lengths only), so its "
                            "reuse cannot be measured; give a trace with prefix ids (mooncake-conv, or JSON Lines "
                            "with \"prefix\" and \"prefix_tokens\")", param="trace")
    stack = _Stack(sum(len(r.prefix) + 2 for r in reqs))
    last: dict[tuple[int, Any, int], tuple[int, int]] = {}  # piece -> (latest access, tokens)
    found: list[tuple[int, int]] = []
    now = reusing = 0
    for r in reqs:
        chain, worst, reused = 0, 0, 0
        for pid, n in r.prefix:
            key = (chain, pid, n)
            chain = hash(key)
            seen = last.get(key)
            if seen is None:
                worst = math.inf  # type: ignore[assignment]  # a miss ends the prefix
            else:
                worst = max(worst, stack.above(seen[0]) + n)
                stack.add(seen[0], -n)
            stack.add(now, n)
            last[key] = (now, n)
            now += 1
            if worst != math.inf:
                found.append((worst, n))
                reused += n
        reusing += reused > 0
        for fresh in (r.prompt_tokens - r.shared_tokens, r.output_tokens):
            if fresh:
                stack.add(now, fresh)
                now += 1
    found.sort()
    served, total = [], 0
    for _, n in found:
        total += n
        served.append(total)
    return ReuseCurve(trace=trace, requests=len(reqs), prompt_tokens=sum(r.prompt_tokens for r in reqs),
                      needs=tuple(w for w, _ in found), served=tuple(served), reusing=reusing)


@dataclass(frozen=True, kw_only=True)
class TierSize:
    """One host-tier size on the trace: what the tier holds and the share of prompt tokens served from cache."""

    memory: int  # host memory asked, over every rank
    tokens: int  # tokens the engine's tier holds in it
    share: float  # of prompt tokens, GPU and tier together (the tier keeps a copy of what the GPU holds)


@dataclass(frozen=True, kw_only=True)
class TierAdvice:
    """Whether a host tier pays for a trace's prefix reuse on one deployment (estimates: see the module)."""

    trace: str
    requests: int
    prompt_tokens: int
    gpu_tokens: int  # the GPU pool of one replica
    gpu_share: float  # of prompt tokens served from the GPU alone
    reusable_share: float  # from an unbounded cache
    sizes: tuple[TierSize, ...]
    mean_hit: int  # tokens a reusing request gets from an unbounded cache, on average
    load_seconds: float | None  # bringing `mean_hit` tokens back over the host link
    recompute_seconds: float | None  # computing them again (a lone prefill, the step-time model)
    recommended: int | None  # host memory recommended, over every rank (None: a tier does not pay here)
    given: int | None  # the size asked about, where one was
    reason: str
    basis: str  # where the times come from

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("trace", "requests", "prompt_tokens", "gpu_tokens", "gpu_share",
                                              "reusable_share", "mean_hit", "load_seconds", "recompute_seconds",
                                              "recommended", "given", "reason", "basis")}
        return {**out, "estimate": True, "sizes": [s.__dict__ for s in self.sizes]}


def advise(curve: ReuseCurve, *, gpu_tokens: int, tier_tokens: Callable[[int], int | None],
           load_seconds: Callable[[int], float | None], recompute_seconds: Callable[[int], float | None],
           basis: str, given: int | None = None) -> TierAdvice:
    """The tier sizes tried on the trace (`CANDIDATES` above the GPU pool, and `given`) and the one recommended.

    `tier_tokens(memory)`: what the engine's tier holds in `memory` bytes (None where it refuses the size);
    `load_seconds(tokens)` and `recompute_seconds(tokens)`: a prefix's time back over the link and to compute."""
    gpu_share = curve.share(gpu_tokens)
    sizes = []
    for memory in sorted({*CANDIDATES, *([given] if given else [])}):
        tokens = tier_tokens(memory)
        if tokens is not None and (tokens > gpu_tokens or memory == given):
            sizes.append(TierSize(memory=memory, tokens=tokens, share=curve.share(max(tokens, gpu_tokens))))
    load, recompute = load_seconds(curve.mean_hit), recompute_seconds(curve.mean_hit)
    tried = [s for s in sizes if s.memory in CANDIDATES]
    best = max((s.share for s in tried), default=gpu_share) - gpu_share
    recommended, reason = None, ""
    if best < MIN_GAIN:
        reason = (f"no tier up to {format_bytes(CANDIDATES[-1])} serves {MIN_GAIN:.0%} more of the prompt tokens "
                  f"than the GPU's {gpu_share:.1%} (an unbounded cache: {curve.share(2**62):.1%})")
    elif load is not None and recompute is not None and load >= recompute:
        reason = (f"loading a prefix of {curve.mean_hit:,} tokens back ({load * 1e3:,.1f} ms) takes longer than "
                  f"computing it again ({recompute * 1e3:,.1f} ms)")
    else:
        pick = next(s for s in tried if s.share - gpu_share >= ENOUGH * best)
        recommended = pick.memory
        timing = "" if load is None or recompute is None else (
            f"; a reused prefix of {curve.mean_hit:,} tokens loads in {load * 1e3:,.1f} ms against "
            f"{recompute * 1e3:,.1f} ms to compute it again")
        still = (f"an unbounded cache: {curve.share(2**62):.1%}" if pick is tried[-1] else
                 f"{ENOUGH:.0%} of the gain of {format_bytes(tried[-1].memory)}")
        reason = (f"{pick.share:.1%} of prompt tokens from cache (now {gpu_share:.1%} from the GPU alone; {still})"
                  f"{timing}")
    return TierAdvice(trace=curve.trace, requests=curve.requests, prompt_tokens=curve.prompt_tokens,
                      gpu_tokens=gpu_tokens, gpu_share=gpu_share, reusable_share=curve.share(2**62),
                      sizes=tuple(sizes), mean_hit=curve.mean_hit, load_seconds=load, recompute_seconds=recompute,
                      recommended=recommended, given=given, reason=reason, basis=basis)


def prefill_seconds(model: TimeModel, tokens: int, chunk: int | None) -> float:
    """Seconds to compute a prompt of `tokens` alone, in chunks of `chunk` tokens (None: one step)."""
    seconds, done = 0.0, 0
    while done < tokens:
        n = min(chunk or tokens, tokens - done)
        seconds += model.step_seconds(n, done + n, pairs=n * done + n * (n + 1) // 2, sequences=1)
        done += n
    return seconds
