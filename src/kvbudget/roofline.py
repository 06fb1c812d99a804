"""The decode roofline: how fast one step can be at best, from the bytes it reads and the all-reduces it sends."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.errors import ConfigError
from kvbudget.estimator import Estimate
from kvbudget.gpus import GPU
from kvbudget.model.params import activation_widths
from kvbudget.model.spec import ModelSpec
from kvbudget.model.weights import Weights


@dataclass(frozen=True, kw_only=True)
class Roofline:
    context: int
    batch: int
    step_seconds: float  # memory time (bytes read per decode step / HBM bandwidth) + all_reduce_seconds
    tokens_per_second: float  # per sequence
    aggregate_tokens_per_second: float
    memory_seconds: float = 0.0  # the lower bound: weights and KV read once per step
    all_reduce_seconds: float = 0.0  # tensor parallel: two all-reduces per layer (an estimate; 0 without tp)


def all_reduce_seconds(model: ModelSpec, card: GPU, tp: int, sequences: int) -> float:
    """An estimate of one decode step's tensor-parallel communication: two all-reduces per layer (after attention
    and after the MLP) of one bf16 hidden vector per sequence, over the card's default link as `simulate` times
    them (kvbudget.interconnects: the link's latency per call plus the ring's traffic over its bus bandwidth)."""
    from kvbudget.interconnects import all_reduce

    link = all_reduce(card, card.link, tp) if card.link is not None else None
    if link is None:
        return 0.0
    return 2 * model.num_layers * link.seconds(sequences * activation_widths(model).hidden * 2)


def decode_roofline(result: Estimate, w: Weights, card: GPU, sequences: int, tp: int, max_len: int
                    ) -> tuple[Roofline, ...]:
    """The decode step's lower bound at a few contexts up to `max_len`: weights and KV read once per step, plus
    the tensor-parallel all-reduces."""
    if card.bandwidth_bytes_per_s is None:
        return ()
    try:
        comm = all_reduce_seconds(result.model, card, tp, sequences)
    except ConfigError:  # no hidden size to send: the memory bound alone
        comm = 0.0
    rows = []
    for context in sorted({1024, 4096, 16384, 32768, max_len}):
        if context > max_len:
            continue
        read = w.active_bytes / tp + result.allocation.kv_bytes(sequences, context)
        memory = read / card.bandwidth_bytes_per_s
        step = memory + comm
        rows.append(Roofline(context=context, batch=sequences, step_seconds=step, tokens_per_second=1 / step,
                             aggregate_tokens_per_second=sequences / step, memory_seconds=memory,
                             all_reduce_seconds=comm))
    return tuple(rows)
