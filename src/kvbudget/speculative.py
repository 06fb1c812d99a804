"""Speculative decoding as every command takes it: the method, the tokens drafted per step, the drafter (a model
of its own for `draft-model`, EAGLE and EAGLE-3 heads; the model's own layers for `mtp`; none for `ngram` and
`suffix`), and the acceptance the simulator assumes. No engine is named here: each engine says in its own package
which methods it runs, how it sizes the drafter's memory and how it schedules the verified tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.choices import Choice
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.model.spec import ModelSpec

MAX_SPECULATIVE_TOKENS = 64  # the most draft tokens per step any command takes (engines' own ranges are narrower)


class SpecMethod(Choice):
    """How the draft tokens are proposed (the names vLLM's speculative_config takes as its method)."""

    EAGLE = "eagle"  # an EAGLE head: one decoder layer over the target's hidden states (its own KV cache)
    EAGLE3 = "eagle3"  # EAGLE-3: the head reads several of the target's layers
    DRAFT_MODEL = "draft-model"  # a smaller model of the same vocabulary (its own weights and KV cache)
    MTP = "mtp"  # the model's own multi-token-prediction layers
    NGRAM = "ngram"  # prompt lookup: n-grams of the context (no weights, no KV)
    SUFFIX = "suffix"  # suffix-tree lookup over the context and earlier answers (no weights, no KV)

    @property
    def drafter_weights(self) -> bool:
        """Whether the method loads weights of its own (a model or a head)."""
        return self in (SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.DRAFT_MODEL, SpecMethod.MTP)

    @property
    def needs_draft_model(self) -> bool:
        """Whether the user must name the drafter (`--draft-model`)."""
        return self in (SpecMethod.EAGLE, SpecMethod.EAGLE3, SpecMethod.DRAFT_MODEL)

    def check_draft(self, given: bool) -> None:
        """Refuse a missing drafter for a method that needs one, or one given to a method that takes none."""
        if self.needs_draft_model and not given:
            raise KVBudgetError(f"draft_model: speculative method {self} drafts with a model of its own; name it (a "
                                "config, catalog name or Hub id)", param="draft_model")
        if not self.needs_draft_model and given:
            raise KVBudgetError(f"draft_model: speculative method {self} takes no draft model; leave it out",
                                param="draft_model")


@dataclass(frozen=True, kw_only=True)
class Speculative:
    """Speculative decoding as asked: `num_tokens` drafted per step (k), verified as k + 1 query tokens per
    sequence; `draft` the drafter's spec where the method has one of its own (`draft_id` what it was loaded from);
    `acceptance` the probability that the draft token at each position is accepted given the ones before it were
    (empty: the method's default, an assumption the output says)."""

    method: SpecMethod
    num_tokens: int
    draft: ModelSpec | None = None
    draft_id: str | None = None
    acceptance: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise KVBudgetError(f"num_speculative_tokens {self.num_tokens}: give 1 to {MAX_SPECULATIVE_TOKENS}",
                                param="num_speculative_tokens")
        self.method.check_draft(self.draft is not None)
        for p in self.acceptance:
            if not 0.0 <= p <= 1.0:
                raise KVBudgetError(f"acceptance {p}: each position's acceptance rate is a fraction in [0, 1]",
                                    param="acceptance")
        if len(self.acceptance) > self.num_tokens:
            raise KVBudgetError(f"acceptance: {len(self.acceptance)} rates for {self.num_tokens} draft tokens; give "
                                "at most one per draft position", param="acceptance")
