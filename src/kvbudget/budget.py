"""The memory stack of one GPU before launch: what the engine takes of the card, the weights, the activation
peak of its profiling pass, other memory, and the KV budget left; each term says where it comes from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.choices import Choice
from kvbudget.engines.base import Serving
from kvbudget.errors import KVBudgetError, flag, named
from kvbudget.gpus import GPU
from kvbudget.model.params import activation_widths
from kvbudget.model.spec import ModelSpec
from kvbudget.model.weights import Weights

if TYPE_CHECKING:
    from kvbudget.budgetbands import BudgetBand

GIVEN_WEIGHTS = "given (weights)"  # the weights' basis when the bytes were given


class TermKey(Choice):
    """The memory stack's terms, top to bottom."""

    GPU = "gpu"
    SHARE = "share"
    WEIGHTS = "weights"
    ACTIVATION = "activation"
    OVERHEAD = "overhead"
    KV = "kv"


@dataclass(frozen=True, kw_only=True)
class Term:
    """One slice of GPU memory in the plan."""

    key: TermKey
    name: str
    bytes: int
    estimate: bool
    note: str  # where the figure comes from (after "given (param)" when given)
    param: str | None = None  # the parameter that gave this figure, or that would override it
    given: bool = False

    def text(self, command_line: bool = False) -> str:
        """The note with the parameter named in the library's words, or the command line's (its flag)."""
        if self.param is None:
            return self.note
        named = flag(self.param) if command_line else self.param
        if self.given:
            return (named if command_line else f"given ({named})") + self.note
        return f"{self.note}; {named} overrides"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "bytes": self.bytes, "estimate": self.estimate,
                "note": self.text()}


def activation_estimate(model: ModelSpec, tokens: int, sampled_rows: int, logit_bytes: int = 4,
                        sampler_apart: bool = False, held: int = 0, forward_values: tuple[int, int] = (4, 2)) -> int:
    """Peak activation of a profiling pass over `tokens` tokens (an estimate): per token `forward_values` (so many
    hidden-wide and MLP-wide values: hidden states, attention and MLP intermediates) in 2 bytes per value, and the
    sampler's `logit_bytes` per logit of the sampled sequences; the two added, or the larger where the sampler runs
    after the forward pass freed its activations but for `held` bytes it keeps."""
    w = activation_widths(model)
    forward = tokens * (forward_values[0] * w.hidden + forward_values[1] * w.mlp) * 2
    sampler = min(tokens, sampled_rows) * w.vocab * logit_bytes
    return max(forward, sampler + held) if sampler_apart else forward + sampler


def check_given(*, gpu_memory: int | None, gpus: int | None, tp: int, pp: int, concurrency: int, beams: int,
                max_model_len: int | None, weights: int | None, activation: int | None, overhead: int | None,
                utilization: float | None, kv_memory: int | None) -> None:
    """A plan's numbers, each in its range, and no setting that a given KV budget would leave unused."""
    for value, param, least in ((gpu_memory, "gpu_memory", 1), (weights, "weights", 0), (activation, "activation", 0),
                                (overhead, "overhead", 0), (kv_memory, "kv_memory", 1)):
        if value is not None:
            validate.size(value, param, least)
    for value, param, what in ((tp, "tp", "tensor parallel size"), (pp, "pp", "pipeline parallel size"),
                               (concurrency, "concurrency", "requests at once"), (beams, "beams", "beams"),
                               (gpus, "gpus", "GPUs"), (max_model_len, "max_model_len", "tokens")):
        if value is not None:
            validate.positive(value, param, what)
    if utilization is not None:
        validate.fraction(utilization, "utilization")
    unused = next((p for p, v in (("utilization", utilization), ("activation", activation), ("overhead", overhead))
                   if v is not None), None)
    if kv_memory is not None and unused:
        raise KVBudgetError(f"{unused}: a given {named('kv_memory')} is the KV budget itself, which {named(unused)} "
                            "would only help derive; give one of them", param=unused)


def memory_stack(model: ModelSpec, serving: Serving, card: GPU, w: Weights, activation: int | None,
                 overhead: int | None, utilization: float | None, band: BudgetBand | None = None
                 ) -> tuple[tuple[Term, ...], int]:
    """The memory stack of one GPU and the KV budget the engine derives from it; the budget's note gives its error
    band where one is known (kvbudget.budgetbands), else how the engine's budget was checked, if it was."""
    util = serving.memory_fraction if utilization is None else utilization * serving.given_fraction_scale
    tokens = serving.prefill_tokens
    activation_note = serving.prefill_note
    if activation is not None:
        activation_bytes = activation
    elif serving.compute_buffer is not None:
        activation_bytes, activation_note = serving.compute_buffer(model)
    else:
        activation_bytes = max(activation_estimate(model, tokens, serving.max_num_seqs, serving.logit_bytes,
                                                   serving.sampler_apart, serving.held_bytes,
                                                   serving.forward_values) if tokens else 0,
                               serving.encoder_peak_bytes)
    other = serving.overhead_bytes + math.ceil(util * serving.preload_bytes) if overhead is None else overhead
    usable = math.ceil(card.memory_bytes * util)  # vLLM's request_memory rounds up
    share_note = (serving.memory_knob if utilization is None else "" if serving.given_fraction_scale == 1 else
                  f"{utilization:g} as given, times {serving.given_fraction_scale:g} (what the engine does to it)")
    cap = serving.free_cap.limit(card.memory_bytes, activation_bytes) if serving.free_cap else None
    capped = cap is not None and cap < usable
    if serving.free_cap is not None and cap is not None and capped:  # sized from what start-up leaves free
        usable = cap
        share_note += f"{', ' if share_note else '; '}capped by {serving.free_cap.note}"
    if serving.free_share != 1:  # the engine leaves part of what is free after its warm-up unused
        left = usable - w.per_gpu_bytes - activation_bytes - other
        usable -= max(0, math.ceil(left * (1 - serving.free_share)))
        share_note += f"{', ' if share_note else '; '}less {1 - serving.free_share:.2g} of what its warm-up leaves free"
    kv = usable - w.per_gpu_bytes - activation_bytes - other
    weights_given = w.basis.startswith(GIVEN_WEIGHTS)
    stack = (
        Term(key=TermKey.GPU, name="GPU memory", bytes=card.memory_bytes,
             estimate=card.memory_basis.startswith("nominal"), note=f"{card.name}, {card.memory_basis}"),
        Term(key=TermKey.SHARE, name=f"engine share ({util:g})", bytes=usable,
             estimate=capped or (utilization is None and (util != 1.0 or serving.free_share != 1)),
             note=share_note,
             param="utilization" if utilization is not None else None, given=utilization is not None),
        Term(key=TermKey.WEIGHTS, name="weights", bytes=w.per_gpu_bytes, estimate=not w.exact,
             note=w.basis.removeprefix(GIVEN_WEIGHTS), param="weights" if weights_given else None,
             given=weights_given),
        Term(key=TermKey.ACTIVATION, name="activation peak", bytes=activation_bytes, estimate=activation is None,
             note="" if activation is not None else activation_note, param="activation",
             given=activation is not None),
        Term(key=TermKey.OVERHEAD, name="overhead", bytes=other, estimate=overhead is None,
             note="" if overhead is not None else serving.overhead_note, param="overhead",
             given=overhead is not None),
        Term(key=TermKey.KV, name="KV budget", bytes=kv, estimate=activation is None or overhead is None or not w.exact,
             note="what is left for the KV cache" + (f"; {band.text(kv, usable)}" if band and kv > 0 else "")),
    )
    return stack, kv
