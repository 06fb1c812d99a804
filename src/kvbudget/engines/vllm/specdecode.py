"""vLLM's speculative decoding, step for step, for one full-attention cache group (vllm 0.32's wheel).

What it follows:
- v1/core/sched/scheduler.py `schedule`: a running request schedules its known tokens not yet computed plus the
  draft tokens proposed after its last step (`num_tokens_with_spec - num_computed_tokens`: 1 + k in decoding),
  cut by the token budget and by `max_model_len - num_computed_tokens - 1`; the drafts that do not fit are dropped;
  the input budget takes `max_num_new_slots_for_drafting` more per scheduled request (config/speculative.py: 1 for
  a draft model, 0 for EAGLE, EAGLE-3, MTP and n-gram drafting one token at a time);
- `allocate_slots(..., num_lookahead_tokens)` allocates blocks for `num_lookahead_tokens` slots past the scheduled
  tokens (config/vllm.py: k for EAGLE, EAGLE-3, MTP and draft models, whose drafter writes KV there; 0 for n-gram
  and suffix lookup); drafts are never keyed in the prefix cache (only known tokens are);
- `update_from_output`: of d drafts verified, a accepted, the step samples a + 1 tokens and rolls
  `num_computed_tokens` back by the d - a rejected ones (their slots stay allocated and are written again); tokens
  past the request's end are dropped; `update_draft_token_ids`: a request that sampled gets k new drafts (a prefill
  chunk that samples nothing gets none); `_preempt_request` drops a preempted request's drafts;
- `schedule`, waiting requests: one with a single token to compute (a prompt of one token, or all but one held by
  the prefix cache) is padded to 1 + k tokens with k placeholder drafts (never accepted), where a running request
  was scheduled in the step (or the cache held some of it), none of them is a prefill chunk, and the padded tokens
  and the one sampled fit `max_model_len`; where they do not fit the step's budget, admission stops there;
- v1/core/single_type_kv_cache_manager.py: with EAGLE, EAGLE-3 and MTP (`use_eagle_block_drop`, on by default) a
  prefix-cache hit gives up its last block (the drafter needs the hidden states before the generation point).

How many drafts a verification accepts (`Speculative.draw`, `Speculative.replayed`):
- drawn (the default): one uniform number a verification from a numpy Generator seeded with `Speculative.seed`,
  drawn in the order the run verifies; of d drafts, a = how many of the chain's probabilities (at least the first
  i + 1 accepted: the products of the per-position rates) lie above it, which gives each count its probability
  under the rates (rates 1.0 and 0.0 exact). The same seed gives the same run; the spread is a real run's shape
  (runs of rejections, then of acceptances), so single requests' latencies and the tails are not optimistic;
- expected: each request adds the expected accepted drafts of each verification to what it carries (`Seq.credit`)
  and takes that rounded to a whole number (at most the drafts): the mean, with no spread;
- replayed: a recorded run's counts, request by request in order (each request's drafts proposed after each step
  that sampled, and accepted at each verification), so that the schedule can be checked step for step against the
  run's (tests/engines/test_speculative_real.py).
There is no fast path: runs of decode steps are taken one step at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from dataclasses import replace

import numpy as np

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, SpecTotals, Step
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.pool import Hits
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.errors import KVBudgetError
from kvbudget.speculative import AcceptanceDraw, SpecMethod, Speculative

WRITES_AHEAD = frozenset({SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP, SpecMethod.DRAFT_MODEL})
DROPS_HIT_BLOCK = frozenset({SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP})  # SpeculativeConfig.use_eagle()
TAKEN = 1e-9  # a carry within this of the half rounds up (sums of rates round off in the last bits)
DRAWS = 4096  # uniform numbers drawn at a time (one a verification)


def lookahead(spec: Speculative) -> int:
    """vLLM's num_lookahead_tokens: KV slots allocated past the scheduled tokens for the drafter."""
    return spec.num_tokens if spec.method in WRITES_AHEAD else 0


def draft_slots(spec: Speculative) -> int:
    """vLLM's max_num_new_slots_for_drafting (sequential drafting): input-budget slots per scheduled request."""
    return 1 if spec.method is SpecMethod.DRAFT_MODEL else 0


class SpecScheduler(VLLMScheduler):
    """VLLMScheduler with speculative decoding; counts the drafts verified and accepted, and the steps that
    verified any (vLLM's num_drafts)."""

    def __init__(self, config: SchedulerConfig, spec: Speculative) -> None:
        super().__init__(config)
        self.spec = spec
        self.lookahead = lookahead(spec)
        self.draft_slots = draft_slots(spec)
        self._expected = [spec.expected_accepted(d) for d in range(spec.num_tokens + 1)]
        self._chain = spec.chain()
        self._drops = spec.method in DROPS_HIT_BLOCK
        self.drafted = 0
        self.accepted = 0
        self.verified = 0
        self._rng = np.random.default_rng(spec.seed)
        self._uniform: list[float] = []
        self._pad: Seq | None = None  # the waiting request being admitted with placeholder drafts
        self._pads: list[Seq] = []  # those admitted so in this step
        self._chunked: set[int] = set()  # requests whose last step was a prefill chunk (vLLM's is_prefill_chunk)
        self._running_scheduled = False  # in this step (vLLM's scheduled_running_reqs)
        self._prefill_scheduled = False  # ... and one of them a prefill chunk
        self._replayed: tuple[list[Iterator[int]], list[Iterator[int]]] | None = None
        if spec.replayed is not None:
            self._replayed = ([iter(c) for c in spec.replayed.proposed], [iter(c) for c in spec.replayed.accepted])
            self._accept = self._replay
        elif spec.draw is AcceptanceDraw.DRAWN:
            self._accept = self._drawn
        else:
            self._accept = self._carried

    def spec_totals(self) -> SpecTotals:
        return SpecTotals(drafted=self.drafted, accepted=self.accepted, verified=self.verified)

    def decode_run_limit(self) -> int:
        return 0  # (no fast path: every step decides its acceptance)

    def _hits(self, s: Seq) -> Sized:
        hits = super()._hits(s)
        if not self._drops or not len(hits):
            return hits
        assert isinstance(hits, Hits)
        parts = list(hits.parts)
        run, a, b = parts[-1]
        if b - 1 > a:
            parts[-1] = (run, a, b - 1)
        else:
            parts.pop()
        return Hits(parts, hits.count - 1)

    def schedule(self) -> Step:
        self._pads = []
        step = super().schedule()
        if not self._pads:
            return step
        return replace(step, drafted=step.drafted + self.spec.num_tokens * len(self._pads))

    def _admit_waiting(self, scheduled: list[tuple[Seq, int]], budget: int, threshold: int) -> None:
        self._running_scheduled = bool(scheduled)  # (only the running requests are scheduled so far)
        self._prefill_scheduled = any(s.uid in self._chunked for s, _ in scheduled)
        super()._admit_waiting(scheduled, budget, threshold)

    def _first_chunk(self, s: Seq, hits: Sized, budget: int, threshold: int) -> int:
        """As vLLM's, a request with one token to compute padded to 1 + k (0: the padding does not fit the
        budget, and vLLM stops admitting)."""
        self._pad = None
        hit = len(hits) * self.cfg.block_size
        padded = 1 + self.spec.num_tokens
        if (s.num_tokens - hit == 1 and not self._prefill_scheduled and (self._running_scheduled or hit)
                and hit + padded + 1 <= self.cfg.max_model_len):
            if padded > budget:
                return 0
            self._pad = s
            return padded
        return super()._first_chunk(s, hits, budget, threshold)

    def _admit(self, s: Seq, n: int, hits: Sized) -> bool:
        if not super()._admit(s, n, hits):
            return False
        if self._pad is s:
            s.drafts = self.spec.num_tokens
            self._pads.append(s)
        return True

    def cached_prefix(self, request: Request) -> int:
        """What the cache holds, as its KV events report it (the block EAGLE gives up at a hit is still held)."""
        if not self.caching:
            return 0
        return len(VLLMScheduler._hits(self, Seq(self._uid, request))) * self.cfg.block_size

    def _carried(self, s: Seq, d: int) -> int:
        """Expected acceptance: the carry of expected accepted drafts, rounded (the carry stays within half)."""
        s.credit += self._expected[d]
        a = min(max(math.floor(s.credit + 0.5 + TAKEN), 0), d)
        s.credit -= a
        return a

    def _drawn(self, s: Seq, d: int) -> int:
        """Drawn acceptance: how many of the first d chain probabilities lie above the next uniform number."""
        if not self._uniform:
            self._uniform = self._rng.random(DRAWS).tolist()[::-1]
        u = self._uniform.pop()
        chain = self._chain
        a = 0
        while a < d and u < chain[a]:
            a += 1
        return a

    def _replay(self, s: Seq, d: int) -> int:
        """A recorded run's next accepted count for this request."""
        assert self._replayed is not None
        a = self._next(self._replayed[1], s, "accepted")
        if a > d:
            raise KVBudgetError(f"replayed: request {s.uid} accepted {a} drafts in the recorded run where the "
                                f"simulation verifies {d}: the schedules differ", param="replayed")
        return a

    def _next(self, counts: list[Iterator[int]], s: Seq, what: str) -> int:
        n = next(counts[s.uid], None) if s.uid < len(counts) else None
        if n is None:
            raise KVBudgetError(f"replayed: the recorded run has no more drafts {what} for request {s.uid}; replay "
                                "the run's own requests, in the order it added them", param="replayed")
        return n

    def update(self, step: Step, now: float = 0.0) -> list[Seq]:
        """As Queues.update, a request that verified drafts taking its accepted ones and the token after them,
        its computed tokens rolled back by the rejected; every request that sampled drafts k new ones (a replay:
        the run's)."""
        done: list[Seq] = []
        k = self.spec.num_tokens
        replayed = self._replayed
        chunked: set[int] = set()
        for s, _ in step.scheduled:
            if s.computed < s.prompt + s.out:
                chunked.add(s.uid)
                continue  # a prefill chunk: nothing sampled, no drafts
            d = s.drafts
            if d:  # (placeholders are never accepted: a replay's record says 0, and is taken)
                a = 0 if replayed is None and s in self._pads else self._accept(s, d)
                s.computed -= d - a
                self.drafted += d
                self.accepted += a
                self.verified += 1
                s.out = min(s.out + a + 1, s.end)
            else:
                s.out += 1
            s.drafts = k if replayed is None or s.out >= s.end else self._next(replayed[0], s, "proposed")
            self._sampled(s, now, done)
        self._chunked = chunked
        return self._end_step(done)
