"""A needle test built from the user's own text: a random five-digit passkey stated once at a depth of the
context (10% to 90%), the user's text around it, and the question at the end. The model answers if its most
likely token at each position of the passkey's digits is the right one (scored in one pass, teacher-forced: the
same as greedy generation of the answer). Run with the untouched cache and with each format; transformers'
QuantizedCache formats read the prompt in one pass and the answer one token at a time, as they generate."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvbudget.errors import KVBudgetError
from kvbudget.quality.formats import Variant
from kvbudget.quality.load import Loaded
from kvbudget.quality.measure import decode_log_probs, log_probs

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
NEEDLE = " The secret passkey is {key}. Remember it: the passkey is {key}. "
QUESTION = "\nWhat is the secret passkey? The secret passkey is"


@dataclass(frozen=True)
class NeedleResult:
    variant: str  # "untouched" for the baseline
    context: int
    depths: tuple[float, ...]
    correct: tuple[int, ...]  # per depth, of `trials`
    trials: int

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / (self.trials * len(self.depths))

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "context": self.context, "trials": self.trials,
                "accuracy": self.accuracy,
                "by_depth": {f"{d:.0%}": c / self.trials for d, c in zip(self.depths, self.correct, strict=True)}}


def haystacks(loaded: Loaded, ids: Sequence[int], context: int, trials: int,
              depths: Sequence[float] = DEPTHS) -> list[tuple[float, list[int], int]]:
    """(depth, prompt ids ending with the answer's tokens, how many answer tokens) for each depth and trial:
    the user's tokens cut to fit, taken from a different place of the text for each trial."""
    tok = loaded.tokenizer
    question = tok(QUESTION, add_special_tokens=False)["input_ids"]
    rng = random.Random(1234)
    cases = []
    for t in range(trials):
        key = str(rng.randrange(10000, 100000))
        needle = tok(NEEDLE.format(key=key), add_special_tokens=False)["input_ids"]
        answer = tok(" " + key, add_special_tokens=False)["input_ids"]
        room = context - len(needle) - len(question) - len(answer)
        if room < 16:
            raise KVBudgetError(f"context {context}: too short for a needle test (needs about "
                                f"{context - room + 16} tokens)", param="context")
        if len(ids) < room:
            raise KVBudgetError(f"data: {len(ids):,} tokens, fewer than the {room:,} a needle test at this context "
                                "needs; give more text", param="data")
        start = (t * room) % max(1, len(ids) - room + 1)
        hay = list(ids[start:start + room])
        for depth in depths:
            at = int(room * depth)
            cases.append((depth, hay[:at] + needle + hay[at:] + question + answer, len(answer)))
    return cases


def needle(loaded: Loaded, ids: Sequence[int], context: int, variants: Sequence[Variant], trials: int = 2,
           progress: Callable[[int, int], None] | None = None) -> list[NeedleResult]:
    """Accuracy at each depth with the untouched cache, then with each variant."""
    cases = haystacks(loaded, ids, context, trials)
    runs: list[Variant | None] = [None, *variants]
    correct: dict[int, dict[float, int]] = {i: dict.fromkeys(DEPTHS, 0) for i in range(len(runs))}
    for n, (depth, prompt, answer) in enumerate(cases):
        target = prompt[-answer:]
        for i, v in enumerate(runs):
            if v is not None and v.backend is not None:  # the question in one pass, the answer token by token
                scores = decode_log_probs(loaded, prompt, v.backend, len(prompt) - answer)
            else:
                scores = log_probs(loaded, prompt, v)
            top = scores[-answer - 1:-1].argmax(dim=-1).tolist()
            correct[i][depth] += top == target
        if progress is not None:
            progress(n + 1, len(cases))
    return [NeedleResult(v.name if v is not None else "untouched", context, DEPTHS,
                         tuple(correct[i][d] for d in DEPTHS), trials) for i, v in enumerate(runs)]
