"""What every simulated scheduler shares: the settings, a request inside the scheduler, one step's decisions,
and the queues with what happens after a step (tokens sampled, requests finished)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from kvbudget.engines.scheduling.workload import Request


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    num_blocks: int  # vLLM's num_gpu_blocks, the null block included
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefix_caching: bool = True
    long_prefill_token_threshold: int = 0


@dataclass(frozen=True, kw_only=True)
class TransferTotals:
    """The prefilled requests' KV a decode replica read: how many, their bytes (one GPU's shard), the seconds the
    reads took, and the seconds they waited in its queue for room to be allocated before the read could start."""

    count: int = 0
    bytes_per_gpu: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    max_wait_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SpecTotals:
    """What speculative decoding did over a run: draft tokens verified and accepted, and the verifications (vLLM's
    num_draft_tokens, num_accepted_tokens and num_drafts)."""

    drafted: int
    accepted: int
    verified: int

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens each verification gave, the one after the drafts included (vLLM's mean acceptance length)."""
        return 1.0 + self.accepted / self.verified if self.verified else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict[str, Any]:
        return {"drafted": self.drafted, "accepted": self.accepted, "verified": self.verified,
                "mean_acceptance_length": self.mean_acceptance_length, "acceptance_rate": self.acceptance_rate}


MASK = (1 << 64) - 1  # piece hashes as unsigned 64-bit numbers


class Seq:
    """One request inside the scheduler (mutable; the scheduler owns it)."""

    __slots__ = (
        "chains",
        "computed",
        "credit",
        "drafts",
        "end",
        "ends",
        "finished",
        "first_token",
        "group_blocks",
        "held",
        "hit_tokens",
        "junction",
        "line_ends",
        "lines",
        "nblocks",
        "ncached",
        "out",
        "pieces",
        "preemptions",
        "prompt",
        "recomputed",
        "request",
        "runs",
        "shared",
        "starts",
        "state",
        "tables",
        "uid",
    )

    def __init__(self, uid: int, request: Request) -> None:
        self.uid = uid
        self.request = request
        self.prompt = request.prompt_tokens
        self.end = request.output_tokens  # outputs at which it finishes (the scheduler caps it at max_model_len)
        self.out = 0  # tokens generated so far
        self.computed = 0  # vLLM's num_computed_tokens
        self.drafts = 0  # speculative decoding: draft tokens proposed for its next step (vLLM's spec_token_ids)
        self.credit = 0.0  # ... expected accepted draft tokens not yet taken (see engines/vllm/specdecode.py)
        self.nblocks = 0  # its block table's length (one full-attention group)
        self.ncached = 0  # blocks already keyed
        self.runs: list[Any] = []  # with prefix caching: its keyed blocks as runs of vLLM's pool (pool.Run)
        self.pieces = request.prefix
        self.chains: list[int] = []  # per piece: its base key (see key())
        self.starts: list[int] = []  # per piece: the token it starts at
        self.ends: list[int] = []  # per piece: the token it ends at
        self.lines: list[tuple[int, int, int]] = []  # the pieces' (line, first block, end block) (see segments())
        self.line_ends: list[int] = []  # ... their end blocks
        self.shared = request.shared_tokens
        self.preemptions = 0
        self.hit_tokens = 0  # prefix-cache hits at first admission
        self.recomputed = 0  # tokens computed again after preemptions
        self.first_token: float | None = None
        self.finished: float | None = None
        self.tables: list[int] = []  # hybrid models: per group, block-table length (freed entries included)
        self.held: list[int] = []  # ... and the blocks it really holds
        self.group_blocks: list[list[int]] = []  # hybrid models with prefix caching: per group, its block table
        self.junction = 0  # ... the shared-prefix junction vLLM pins (shared_prefix_boundary), in tokens
        self.state = [-1, 0, 0, 0]  # ... state groups (align mode): the previous state block's index (-1: none),
        #                              the blocks retired so far, and this step's checkpoint (tokens, index; 0)

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.out

    def key(self, j: int, block_size: int) -> int:
        """The content key of block j: equal for two requests exactly when their tokens agree up to the block's
        end (vLLM chains a hash over the tokens of every block; the same relation, from content ids). A block
        within the shared pieces is keyed by the chain of whole pieces before the one its end falls in, that
        piece's id (together: the piece's even base) and the offset of the end in it; a block reaching past the
        pieces holds tokens of this request only, so it can only ever equal this request's own block j
        (re-found after a preemption): an odd key from the request's id. (The hybrid scheduler's keys; `segments`
        gives the same relation by runs.)"""
        end = (j + 1) * block_size
        if end > self.shared:
            return ((self.uid << 24) + j) * 2 + 1
        if not self.chains:
            self._chain()
        q = bisect_left(self.ends, end)
        return self.chains[q] + 2 * (end - self.starts[q])

    def segments(self, lo: int, hi: int, block_size: int) -> list[tuple[int, int, int]]:
        """Blocks lo to hi - 1 by line, as (line, first block, end block): the blocks whose end falls in one shared
        piece are that piece's line (its base key: the same for every request with the same pieces up to it, and
        block j holds the same tokens in all of them); the blocks reaching past the pieces are the request's own
        line (~uid, negative). Block j of line L is the pool's content key (L, j)."""
        unique = min(self.shared // block_size, hi)  # blocks from here on reach past the pieces
        if lo >= unique:
            return [(~self.uid, lo, hi)] if lo < hi else []
        if not self.lines:
            self._lines(block_size)
        ends = self.line_ends
        first, last = bisect_right(ends, lo), bisect_left(ends, unique)
        out = self.lines[first:last + 1]
        line, a, b = out[0]
        if a < lo:
            out[0] = (line, lo, b)
        line, a, b = out[-1]
        if b > unique:
            out[-1] = (line, a, unique)
        if hi > unique:
            out.append((~self.uid, unique, hi))
        return out

    def _lines(self, block_size: int) -> None:
        """The shared pieces' lines over blocks 0 to shared // block_size, once (the block size is the run's)."""
        if not self.chains:
            self._chain()
        j, unique = 0, self.shared // block_size
        for base, end in zip(self.chains, self.ends, strict=True):
            stop = min(end // block_size, unique)
            if stop > j:
                self.lines.append((base, j, stop))
                self.line_ends.append(stop)
                j = stop

    def _chain(self) -> None:
        """Per piece: its base key (a hash of the whole pieces before it and its id, made even and shifted past
        every offset) and the tokens it starts and ends at."""
        at, chain = 0, 0
        for pid, n in self.pieces:
            self.chains.append((hash((chain, pid)) & MASK) << 33)
            self.starts.append(at)
            at += n
            self.ends.append(at)
            chain = hash((chain, pid, n))


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one schedule() call decided."""

    scheduled: tuple[tuple[Seq, int], ...]  # (request, tokens) in vLLM's order: running first, then admitted
    preempted: tuple[Seq, ...]
    free_blocks: int  # after scheduling
    usage: float  # vLLM's kv_cache_usage after scheduling
    tokens: int = 0  # scheduled, summed
    context: int = 0  # tokens the scheduled requests attend over (their computed tokens after the step), summed
    pairs: int = 0  # (query, key) pairs attention computes (causal); 0: one query per request, as in decoding
    failed: int = 0  # requests the engine answered with an error in this step
    load_seconds: float = 0.0  # KV loaded inside this step's forward pass (LMCache's synchronous retrieve)
    overlapped_load: float = 0.0  # KV loaded layer by layer alongside the forward pass (SGLang's HiCache)
    drafted: int = 0  # speculative decoding: draft tokens verified in this step (among `tokens`; the LM head and
    #                   sampler run on each, as on a sequence's next token: the time model counts them as sequences)


def commit(scheduled: list[tuple[Seq, int]]) -> tuple[int, int]:
    """Count the scheduled tokens as computed (vLLM's `_update_after_schedule`); (tokens, context) summed."""
    tokens = context = 0
    for s, n in scheduled:
        s.computed += n
        tokens += n
        context += s.computed
    return tokens, context


def attended_pairs(scheduled: list[tuple[Seq, int]]) -> int:
    """The (query, key) pairs causal attention computes in a committed step: n new tokens after c computed ones
    attend over n * c + n (n + 1) / 2 keys."""
    return sum(n * (s.computed - n) + n * (n + 1) // 2 for s, n in scheduled)


class Queues:
    """Running and waiting requests; a scheduler adds `schedule()`, `_free()`, `usage()` and `memory()`, and one
    with a fast path for runs of pure decode steps the methods after `decode_run_limit()`."""

    hybrid = False  # whether memory() counts every block in use as token states (several KV cache groups)
    beam_search: ClassVar[bool] = False  # runs beam search as vLLM's API layer does (rounds of engine requests)
    no_samples: ClassVar[str | None] = None  # why requests of n > 1 samples are not simulated here (None: they are)

    def __init__(self, config: SchedulerConfig) -> None:
        self.cfg = config
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()
        self._uid = 0
        self.preemptions = 0
        self.hit_tokens = 0  # prompt tokens served from the prefix cache (first admissions)
        self.queried_tokens = 0  # prompt tokens looked up (first admissions)
        self.failed: list[Seq] = []  # requests the engine answered with an error

    def add(self, request: Request) -> Seq:
        seq = self._seq(request)
        self.waiting.append(seq)
        return seq

    def _seq(self, request: Request) -> Seq:
        """The request as a sequence of this scheduler (its output capped at the model's maximum length)."""
        seq = Seq(self._uid, request)
        seq.end = min(seq.end, self.cfg.max_model_len - seq.prompt)
        self._uid += 1
        return seq

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    clock = 0.0  # the run's time, set before each step: what a scheduler waiting on a transfer reads

    def next_ready(self) -> float | None:
        """When the next transfer the scheduler waits on is done (None: it waits on none)."""
        return None

    def transfer_totals(self) -> TransferTotals | None:
        """What a decode replica read over its KV link (None: it reads nothing)."""
        return None

    def cached_prefix(self, request: Request) -> int:
        """Prompt tokens from the start of `request` that the prefix cache holds now, as the engine's KV events
        report its cache (blocks stored and not yet evicted; a prefix-aware router reads it): a lookup that
        changes nothing. 0: no prefix cache, or an engine that reports none."""
        return 0

    def offload_totals(self) -> Any:
        """What a host tier behind the cache did (None: there is none)."""
        return None

    def spec_totals(self) -> SpecTotals | None:
        """What speculative decoding did (None: none runs)."""
        return None

    def _free(self, s: Seq) -> None:
        raise NotImplementedError

    def schedule(self) -> Step:
        raise NotImplementedError

    def usage(self) -> float:
        """The engine's KV cache usage gauge (0..1)."""
        raise NotImplementedError

    def memory(self) -> tuple[int, int, int]:
        """(token states, reservation, internal fragmentation) in token slots."""
        raise NotImplementedError

    def decode_run_limit(self) -> int:
        """How many steps can be taken at once by the fast path (0: none; schedulers that have one say more)."""
        return 0

    def new_blocks_by_step(self, k: int) -> list[int]:
        """The fast path: blocks the running requests take at each of the next k decode steps."""
        raise NotImplementedError

    def block_phases(self) -> list[int] | None:
        """The fast path: the step (0: the next) at which each running request takes its first new block in a
        decode run, one more every `block_size` steps after; None where the blocks do not go so (the default)."""
        return None

    def context_tokens(self) -> int:
        """The fast path: tokens the running requests attend over."""
        raise NotImplementedError

    def free_blocks(self) -> tuple[int, int]:
        """The fast path: (free, usable) blocks of the pool."""
        raise NotImplementedError

    def decode_run(self, k: int, now: float = 0.0) -> list[Seq]:
        """The fast path: k pure decode steps at once; the requests that finished."""
        raise NotImplementedError

    def update(self, step: Step, now: float = 0.0) -> list[Seq]:
        """After the model ran the step: requests whose known tokens are all computed sample one token; those
        at their output length (or the model's maximum length) finish and free their memory, in step order."""
        done: list[Seq] = []
        for s, _ in step.scheduled:
            if s.computed >= s.prompt + s.out:
                s.out += 1
                self._sampled(s, now, done)
        return self._end_step(done)

    @staticmethod
    def _sampled(s: Seq, now: float, done: list[Seq]) -> None:
        """`s` sampled at `now`: its first token if it had none, and its end (into `done`) at its output length."""
        if s.first_token is None:
            s.first_token = now
        if s.out >= s.end:
            s.finished = now
            done.append(s)

    def _end_step(self, done: list[Seq]) -> list[Seq]:
        """The requests a step finished (`done`) free their memory and leave the running, in step order."""
        if done:
            self._free_finished(done)
            self.running = [s for s in self.running if s.finished is None]
        return done

    def _free_finished(self, done: list[Seq]) -> None:
        """Free the finished requests' memory, in step order."""
        for s in done:
            self._free(s)
