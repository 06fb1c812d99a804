"""vLLM's KV cache groups as its scheduler allocates them (vllm/v1/core/single_type_kv_cache_manager.py, 0.32):
what each group keeps of a request, for the simulator. One class per kind of group, as vLLM has one manager per
cache spec (`spec_manager_map`); each spec of specs.py makes its group (`KVSpec.block_group`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from kvbudget.units import cdiv


@dataclass(frozen=True, kw_only=True)
class BlockGroup:
    """One KV cache group as vLLM's scheduler allocates it: full attention (every token; MLA too), the base the
    other kinds override."""

    kind: ClassVar[str] = "full"  # the group's kind as messages name it
    span: int = 0  # window or chunk (0 for full and state)
    block_size: int  # tokens per block (max_model_len for state groups: vLLM's mamba_block_size then)
    admission_cap: int | None = None  # blocks a request is admitted against at most (sliding and chunked)
    checkpoint: bool = False  # a state group that keeps a prefill checkpoint block (Mamba-2 mixers, align mode)
    chunk_align: int = 0  # state groups with prefix caching: the tokens prefill chunks are cut at multiples of
    #                       (the scheduler's cache_config.block_size at run time)

    def to_dict(self) -> dict[str, object]:
        """The group as the setup's JSON writes it: its kind, then its fields."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @property
    def keeps_state(self) -> bool:
        """Whether the group holds a recurrent state per request rather than tokens (Mamba / linear attention)."""
        return False

    @property
    def keeps_all(self) -> bool:
        """Whether the group holds every token's block for the request's whole life (full attention)."""
        return True

    def skipped_tokens(self, computed: int) -> int:
        """Leading tokens the group no longer needs once `computed` are computed (vLLM's get_num_skipped_tokens):
        those before the window, or before the current chunk."""
        return 0

    def admission_blocks(self, tokens: int) -> int:
        """Blocks a waiting request of `tokens` is admitted against (capped for windowed groups)."""
        blocks = cdiv(tokens, self.block_size)
        return blocks if self.admission_cap is None else min(blocks, self.admission_cap)

    def next_skip_change(self, computed: int) -> int | None:
        """The smallest computed-token count above `computed` at which the group lets one more block go
        (skipped_tokens // block_size grows); None when it never does (full attention, state)."""
        return None

    @property
    def hit_run(self) -> int | None:
        """With prefix caching, how many cached blocks a hit must end with, found from the right; None: the whole
        prefix from the first block (full attention)."""
        return None

    def chunk_start(self, tokens: int) -> int | None:
        """For a chunked group, the first block of the chunk a hit of `tokens` ends in: blocks before it count
        as computed without a lookup (ChunkedLocalAttentionManager); None for other groups."""
        return None

    def keyed_blocks(self, start: int, end: int, boundaries: tuple[int, ...]) -> range | list[int]:
        """Which of the full blocks [start, end) vLLM keys for prefix caching: every one for full attention; for
        a sliding window only the `hit_run` blocks ending at each replay boundary (the last prompt token, and a
        shared-prefix junction), a state group only the block whose state ends there — prefix_cache_retention_
        interval is 0 by default (reachable_block_mask)."""
        run = self.hit_run
        if run is None:
            return range(start, end)
        out: set[int] = set()
        for boundary in boundaries:
            last = boundary // self.block_size
            out.update(range(max(start, last - run), min(end, last)))
        return sorted(out)


@dataclass(frozen=True, kw_only=True)
class SlidingGroup(BlockGroup):
    """A sliding window: keeps the last span - 1 tokens (SlidingWindowManager)."""

    kind: ClassVar[str] = "sliding"

    @property
    def keeps_all(self) -> bool:
        return False

    def skipped_tokens(self, computed: int) -> int:
        return max(0, computed - self.span + 1)

    def next_skip_change(self, computed: int) -> int | None:
        return max(computed + 1, (self.skipped_tokens(computed) // self.block_size + 1) * self.block_size
                   + self.span - 1)

    @property
    def hit_run(self) -> int | None:
        """A hit ends with the window less one token (SlidingWindowManager)."""
        return cdiv(self.span - 1, self.block_size)


@dataclass(frozen=True, kw_only=True)
class ChunkedGroup(BlockGroup):
    """Chunked local attention: keeps the current chunk (ChunkedLocalAttentionManager)."""

    kind: ClassVar[str] = "chunked"

    @property
    def keeps_all(self) -> bool:
        return False

    def skipped_tokens(self, computed: int) -> int:
        return computed // self.span * self.span

    def next_skip_change(self, computed: int) -> int | None:
        return (computed // self.span + 1) * self.span

    def chunk_start(self, tokens: int) -> int | None:
        return (tokens // self.span * self.span if tokens > 0 else 0) // self.block_size


@dataclass(frozen=True, kw_only=True)
class StateGroup(BlockGroup):
    """Mamba / linear attention: one state block per request without prefix caching (MambaManager)."""

    kind: ClassVar[str] = "state"

    @property
    def keeps_state(self) -> bool:
        return True

    @property
    def keeps_all(self) -> bool:
        return False

    @property
    def hit_run(self) -> int | None:
        """Only the block whose state ends at the boundary is keyed."""
        return 1
