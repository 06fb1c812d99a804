"""Beam search as vLLM's API layer runs it (vllm/entrypoints/generate/beam_search/online.py, vllm 0.32).

vLLM's engine has no beam search: the server asks it for one token at a time. A request of beam width w and
max_tokens L runs L rounds; round 0 sends the prompt alone, every later round sends one engine request per live
beam (the prompt plus that beam's tokens, max_tokens 1, 2w logprobs), all at once, and the next round starts when
the last of them has finished. The prefix cache is what makes this affordable: each beam's request finds its
parent's blocks cached and computes only the tokens past the last whole block.

Which beams survive a round depends on the model's logprobs; the simulator cannot know them, so each new beam
extends a parent drawn at random (seeded) from the live beams: the memory and scheduling of every round are
exact for that draw, and how beams share blocks across rounds is an estimate. Every beam is taken to reach L
tokens (as with ignore_eos): beams that end early at EOS would shorten the search.
"""

from __future__ import annotations

import random
from typing import Any

from kvbudget.engines.scheduling.workload import Request


class BeamSearch:
    """One beam-search request in flight: its round, its live beams and the engine requests still out."""

    def __init__(self, request: Request, key: Any, release: Any = None) -> None:
        self.request = request
        self.key = key
        self.release = release  # the guard's hold, released when the search ends
        shared = request.shared_tokens
        own = request.prompt_tokens - shared
        self.prompt = request.prefix + (((("prompt", key), own),) if own else ())
        self.beams: list[tuple[tuple[Any, int], ...]] = [()]  # each beam's generated tokens, one piece per token
        self.round = 0
        self.left = 0  # engine requests of this round not finished yet
        self.first_round_end: float | None = None
        self._rng = random.Random(repr(key))
        self._nodes = 0

    def requests(self, now: float) -> list[Request]:
        """The engine requests of the current round, sent at `now`."""
        r = self.request
        out = [Request(arrival=now, prompt_tokens=r.prompt_tokens + self.round, output_tokens=1,
                       prefix=self.prompt + beam, id=r.id) for beam in self.beams]
        self.left = len(out)
        return out

    def finished_one(self, now: float) -> list[Request] | None:
        """One engine request of this round finished at `now`: the next round's requests when it was the last
        of its round, [] while others are out, None when the search is over."""
        self.left -= 1
        if self.left:
            return []
        if self.first_round_end is None:
            self.first_round_end = now
        self.round += 1
        if self.round >= self.request.output_tokens:
            return None
        width = self.request.n
        parents = [self._rng.choice(self.beams) for _ in range(width)]
        self.beams = [(*parent, self._node()) for parent in parents]
        return self.requests(now)

    def _node(self) -> tuple[Any, int]:
        self._nodes += 1
        return (("beam", self.key, self._nodes), 1)
