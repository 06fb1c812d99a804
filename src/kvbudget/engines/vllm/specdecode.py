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
- v1/core/single_type_kv_cache_manager.py: with EAGLE, EAGLE-3 and MTP (`use_eagle_block_drop`, on by default) a
  prefix-cache hit gives up its last block (the drafter needs the hidden states before the generation point).

The accepted count is not drawn at random: each request adds the expected accepted drafts of each verification to
what it carries (`Seq.credit`) and takes that rounded to a whole number (at most the drafts), so the schedule is
the same on every run, the mean acceptance length is the acceptance model's, and acceptance 1.0 and 0.0 are exact.
What a real run adds is the spread around that mean (a run of rejections, then a run of acceptances), which moves
single requests' latencies more than the means. There is no fast path: runs of decode steps are taken one step at
a time.
"""

from __future__ import annotations

import math
from collections.abc import Sized

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, SpecTotals, Step
from kvbudget.engines.scheduling.workload import Request
from kvbudget.engines.vllm.pool import Hits
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.speculative import SpecMethod, Speculative

WRITES_AHEAD = frozenset({SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP, SpecMethod.DRAFT_MODEL})
DROPS_HIT_BLOCK = frozenset({SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.MTP})  # SpeculativeConfig.use_eagle()
TAKEN = 1e-9  # a carry within this of the half rounds up (sums of rates round off in the last bits)


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
        self._drops = spec.method in DROPS_HIT_BLOCK
        self.drafted = 0
        self.accepted = 0
        self.verified = 0

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

    def cached_prefix(self, request: Request) -> int:
        """What the cache holds, as its KV events report it (the block EAGLE gives up at a hit is still held)."""
        if not self.caching:
            return 0
        return len(VLLMScheduler._hits(self, Seq(self._uid, request))) * self.cfg.block_size

    def update(self, step: Step, now: float = 0.0) -> list[Seq]:
        """As Queues.update, a request that verified drafts taking its accepted ones and the token after them,
        its computed tokens rolled back by the rejected; every request that sampled drafts k new ones."""
        done: list[Seq] = []
        k = self.spec.num_tokens
        for s, _ in step.scheduled:
            if s.computed < s.prompt + s.out:
                continue  # a prefill chunk: nothing sampled, no drafts
            d = s.drafts
            if d:
                s.credit += self._expected[d]
                a = min(max(math.floor(s.credit + 0.5 + TAKEN), 0), d)  # (rounded: the carry stays within half)
                s.credit -= a
                s.computed -= d - a
                self.drafted += d
                self.accepted += a
                self.verified += 1
                s.out = min(s.out + a + 1, s.end)
            else:
                s.out += 1
            s.drafts = k
            self._sampled(s, now, done)
        return self._end_step(done)
