"""Speculative decoding as every command takes it: the method, the tokens drafted per step, the drafter (a model
of its own for `draft-model`, EAGLE and EAGLE-3 heads; the model's own layers for `mtp`; none for `ngram` and
`suffix`), and the acceptance the simulator assumes. No engine is named here: each engine says in its own package
which methods it runs, how it sizes the drafter's memory and how it schedules the verified tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbudget import validate
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


class AcceptanceDraw(Choice):
    """How a simulated verification's accepted drafts follow from the per-position rates."""

    DRAWN = "drawn"  # drawn at random (seeded) from the rates: each verification accepts a whole number, with the
    # spread a real run has (runs of rejections, runs of acceptances), so the latencies' tails are not optimistic
    EXPECTED = "expected"  # the expected accepted count carried per request and rounded: the mean, with no spread


@dataclass(frozen=True, kw_only=True)
class Replayed:
    """A recorded run's drafts, replayed: per request (in the order the engine added them), the drafts proposed
    after each step that sampled and left it unfinished (`proposed`; vLLM's n-gram lookup proposes fewer than k, or
    none, where the context has no match) and the drafts accepted at each verification (`accepted`), in order."""

    proposed: tuple[tuple[int, ...], ...]
    accepted: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.proposed) != len(self.accepted):
            raise KVBudgetError(f"replayed: drafts proposed for {len(self.proposed)} requests, accepted for "
                                f"{len(self.accepted)}; give both for every request", param="replayed")
        for counts in (*self.proposed, *self.accepted):
            for n in counts:
                validate.count(n, "replayed", 0, MAX_SPECULATIVE_TOKENS)

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> Replayed:
        """The drafts of a run that kvbudget.simulation.recorder logged (its records, as JSON objects in order):
        its `add`, `proposed` and `verified` records."""
        order: dict[str, int] = {}
        proposed: list[list[int]] = []
        accepted: list[list[int]] = []
        for i, rec in enumerate(records):
            try:
                if "add" in rec:
                    order[rec["add"]] = len(order)
                    proposed.append([])
                    accepted.append([])
                for r, n in rec.get("proposed", {}).items():
                    proposed[order[r]].append(n)
                for r, (_, a) in rec.get("verified", {}).items():
                    accepted[order[r]].append(a)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise KVBudgetError(f"replayed: record {i + 1} is not one kvbudget.simulation.recorder writes (or "
                                    f"names a request not added before it: {e!r}); give the recorder's log as it "
                                    "wrote it", param="replayed") from None
        return cls(proposed=tuple(map(tuple, proposed)), accepted=tuple(map(tuple, accepted)))


@dataclass(frozen=True, kw_only=True)
class Speculative:
    """Speculative decoding as asked: `num_tokens` drafted per step (k), verified as k + 1 query tokens per
    sequence; `draft` the drafter's spec where the method has one of its own (`draft_id` what it was loaded from);
    `acceptance` the probability that the draft token at each position is accepted given the ones before it were
    (empty: the method's default, an assumption the output says); `draw` how a simulated verification's accepted
    count follows from them (drawn with `seed` by default); `replayed` a recorded run's drafts and acceptances
    instead (the rates then unused by the simulator)."""

    method: SpecMethod
    num_tokens: int
    draft: ModelSpec | None = None
    draft_id: str | None = None
    acceptance: tuple[float, ...] = ()
    acceptance_note: str = ""  # where the rates given come from, in words ("read from FILE: ..."; empty: given)
    draw: AcceptanceDraw = AcceptanceDraw.DRAWN
    seed: int = 0
    replayed: Replayed | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_tokens <= MAX_SPECULATIVE_TOKENS:
            raise KVBudgetError(f"num_speculative_tokens {self.num_tokens}: give 1 to {MAX_SPECULATIVE_TOKENS}",
                                param="num_speculative_tokens")
        validate.count(self.seed, "seed", 0, validate.MAX_SEED)
        self.method.check_draft(self.draft is not None)
        for p in self.acceptance:
            if not 0.0 <= p <= 1.0:
                raise KVBudgetError(f"acceptance {p}: each position's acceptance rate is a fraction in [0, 1]",
                                    param="acceptance")
        if len(self.acceptance) > self.num_tokens:
            raise KVBudgetError(f"acceptance: {len(self.acceptance)} rates for {self.num_tokens} draft tokens; give "
                                "at most one per draft position", param="acceptance")

    def rates(self, tokens: int | None = None) -> tuple[float, ...]:
        """Each draft position's conditional acceptance rate, for `tokens` positions (default: num_tokens): the
        rates given, else the method's default (`DEFAULT_ACCEPTANCE`); a position past the last rate given takes
        the last."""
        given = self.acceptance or DEFAULT_ACCEPTANCE[self.method][0]
        n = self.num_tokens if tokens is None else tokens
        return tuple(given[min(i, len(given) - 1)] for i in range(n))

    @property
    def acceptance_source(self) -> str:
        """Where the acceptance rates come from, in words (an assumption unless the user gave them)."""
        if self.acceptance:
            return self.acceptance_note or "given"
        return f"assumed: the default for {self.method}, {DEFAULT_ACCEPTANCE[self.method][1]}"

    def chain(self, drafted: int | None = None) -> tuple[float, ...]:
        """The probability that at least the first i + 1 of `drafted` drafts (default: num_tokens) are accepted,
        for each i (each accepted only if every one before it was): the products of the rates up to each
        position, falling."""
        out, run = [], 1.0
        for p in self.rates(drafted):
            run *= p
            out.append(run)
        return tuple(out)

    def expected_accepted(self, drafted: int) -> float:
        """Expected draft tokens accepted of `drafted`: the sum of `chain` (the mean of a count is the sum of the
        probabilities that it reaches each value)."""
        return sum(self.chain(drafted))

    @property
    def draw_source(self) -> str:
        """How the simulator turns the rates into each verification's accepted drafts, in words."""
        if self.replayed is not None:
            return "replayed: a recorded run's drafts and accepted counts, request by request"
        if self.draw is AcceptanceDraw.DRAWN:
            return f"drawn at random for each verification from the per-position rates (seed {self.seed})"
        return "the expected count of the per-position rates, carried per request and rounded (no spread)"

    def label(self) -> str:
        """In words, as a search's candidates show it: 'eagle3 k=2'."""
        return f"{self.method} k={self.num_tokens}"

    def to_dict(self) -> dict[str, Any]:
        """As JSON shows it: the method, the draft tokens per step, the drafter as given."""
        return {"method": self.method.value, "num_speculative_tokens": self.num_tokens, "draft_model": self.draft_id}

    def with_tokens(self, num_tokens: int) -> Speculative | None:
        """The same speculation drafting `num_tokens` a step (0: none, None returned), as a sweep varies it."""
        if num_tokens == 0:
            return None
        return replace(self, num_tokens=num_tokens, acceptance=self.acceptance[:num_tokens],
                       replayed=self.replayed if num_tokens == self.num_tokens else None)


def conditional_rates(per_position: Sequence[float]) -> tuple[float, ...]:
    """The conditional acceptance rates (`Speculative.acceptance`) of the per-position acceptance vLLM and llama.cpp
    print ("acceptance at token i": the share of drafts whose first i + 1 tokens were all accepted), position by
    position their ratios (a position after one never accepted: 0)."""
    out, before = [], 1.0
    for i, p in enumerate(per_position):
        if not 0.0 <= p <= before:
            raise KVBudgetError(f"acceptance at token {i}: {p}; per-position acceptance is a fraction no higher than "
                                "the position's before it", param="acceptance")
        out.append(p / before if before else 0.0)
        before = p
    return tuple(out)


def constant_rate(mean_length: float, num_tokens: int) -> float:
    """The one conditional acceptance rate p, the same at every position, whose chain of `num_tokens` drafts gives
    `mean_length` tokens a verification (the bonus token included): 1 + p + p^2 + ... + p^k = mean_length, solved by
    bisection (the sum grows with p)."""
    if not 1.0 <= mean_length <= num_tokens + 1:
        raise KVBudgetError(f"acceptance_from: a mean acceptance length of {mean_length:g} cannot come from "
                            f"{num_tokens} draft tokens a step; it lies in [1, {num_tokens + 1}] (draft tokens + 1): "
                            "give the k the log was run with", param="acceptance_from")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid ** i for i in range(num_tokens + 1)) < mean_length:
            low = mid
        else:
            high = mid
    return round((low + high) / 2, 6)


@dataclass(frozen=True, kw_only=True)
class LoggedAcceptance:
    """Acceptance as an engine's own metrics line printed it (read by each engine's package): `per_position` the
    share of drafts whose first i + 1 tokens were all accepted (vLLM's "Per-position acceptance rate"; empty where
    the engine prints none), `mean_length` the tokens a verification gave, the bonus token included (vLLM's "Mean
    acceptance length", SGLang's "accept len"), `line` the line read, `lines` how many such lines the log had."""

    per_position: tuple[float, ...] = ()
    mean_length: float | None = None
    line: str = ""
    lines: int = 1

    def rates(self, num_tokens: int) -> tuple[tuple[float, ...], str]:
        """The conditional rates for `num_tokens` drafts a step, and how they were had, in words: the per-position
        shares turned conditional (`conditional_rates`; past the last position logged, the last rate), else the
        constant rate whose chain gives the mean length for `num_tokens`."""
        if self.per_position:
            rates = conditional_rates(self.per_position)[:num_tokens]
            how = "per-position acceptance " + ", ".join(f"{p:g}" for p in self.per_position) + " made conditional"
            if num_tokens > len(self.per_position):
                how += f" (positions past the {len(self.per_position)} logged take the last)"
            return rates, how
        if self.mean_length is None:
            raise KVBudgetError("acceptance_from: the metrics line gives neither a per-position acceptance nor a "
                                "mean acceptance length", param="acceptance_from")
        p = constant_rate(self.mean_length, num_tokens)
        return (p,), (f"mean acceptance length {self.mean_length:g} alone: {p:.3g} at each position, the constant "
                      f"rate whose chain gives it at k={num_tokens}")


# Per-position conditional acceptance rates assumed when none are given, with where they come from (a position past
# the last rate takes the last). vLLM's and llama.cpp's logs print "acceptance at token i" unconditionally (the
# share of drafts whose first i + 1 tokens were all accepted); the rates here are their ratios, position by position.
NGRAM_RATES = conditional_rates((0.81, 0.74, 0.70, 0.68, 0.66))
DEFAULT_ACCEPTANCE: dict[SpecMethod, tuple[tuple[float, ...], str]] = {
    SpecMethod.EAGLE: ((0.56,), "0.56 a position: the rate whose chain gives the mean acceptance length 1.89 at k=2 "
                                "that vLLM measured for EAGLE-LLaMA3-Instruct-8B on MT-Bench (vllm-project/vllm "
                                "pull request 16035)"),
    SpecMethod.EAGLE3: (conditional_rates((0.805, 0.632, 0.483)),
                        "0.805, 0.785, 0.764 (then 0.764): llama.cpp's per-position acceptance 0.805, 0.632, 0.483 for "
                        "an EAGLE-3 head (ggml-org/llama.cpp pull request 24536)"),
    SpecMethod.DRAFT_MODEL: ((0.6,), "0.6 a position: within the 0.5 to 0.8 that Leviathan et al. (2023, "
                                     "'Fast inference from transformers via speculative decoding') measured for "
                                     "their draft and target pairs"),
    SpecMethod.MTP: ((0.85,), "0.85 a position: the low end of the 85 to 90% second-token acceptance the "
                              "DeepSeek-V3 technical report gives for its MTP module (later positions assumed alike)"),
    SpecMethod.NGRAM: (NGRAM_RATES, "0.81, 0.91, 0.95, 0.97, 0.97: vLLM's ngram proposer's per-position acceptance "
                                    "0.81, 0.74, 0.70, 0.68, 0.66 on an editing dataset (blazedit; vllm-project/vllm "
                                    "pull request 24344): lookup pays where answers repeat the prompt, far less in "
                                    "chat"),
    SpecMethod.SUFFIX: (NGRAM_RATES, "ngram's (no published per-position figures for suffix decoding were found)"),
}

@dataclass(frozen=True, kw_only=True)
class LoggedSpeculative:
    """Speculative decoding as an engine's start-up log states it (read by each engine's package, for check-log):
    `engine_method` the engine's own name for it ('eagle3', 'EAGLE', 'NEXTN', '[ngram]'; '' where the log shows
    drafting without naming the method), `method` kvbudget's name (None where it has none: medusa, dflash, ...);
    the draft tokens per step where the log states them (`num_tokens` k for a chain; SGLang's steps, top-k and draft
    tokens apart), the draft model; the drafter's weights as the engine printed them (`drafter_weights_gib`, or
    `weights_include_drafter` where its one weights line counts the drafter too); the pools where the drafter's is
    sized apart (`pool_tokens` the target's, `draft_pool_tokens` and `draft_pool_gib` the drafter's, per rank);
    `lines` the log lines this was read from."""

    engine_method: str
    method: SpecMethod | None
    num_tokens: int | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    draft: str | None = None
    drafter_weights_gib: float | None = None
    weights_include_drafter: bool = False
    shares: tuple[str, ...] = ()  # what the drafter takes from the target, as the log says ('embedding', 'lm_head')
    pool_tokens: int | None = None
    draft_pool_tokens: int | None = None
    draft_pool_gib: float | None = None
    lines: tuple[str, ...] = ()
