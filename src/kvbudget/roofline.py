"""The decode roofline: how fast one step can be at best, from the bytes it reads and the all-reduces it sends."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.errors import ConfigError
from kvbudget.estimator import Estimate
from kvbudget.gpus import GPU
from kvbudget.model.params import activation_widths
from kvbudget.model.spec import ModelSpec
from kvbudget.model.weights import Weights

# Fixed cost of one small all-reduce in a decode step (seconds): kvbudget's assumption for NVLink / Infinity Fabric
# and for GPUs that only share a PCIe switch, not a measurement; the roofline labels its all-reduce term an estimate.
ALL_REDUCE_LATENCY = {"link": 10e-6, "pcie": 25e-6}


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
    and after the MLP) of one bf16 hidden vector per sequence, each a ring (2 (tp - 1) / tp of it sent each way
    over half the card's both-ways link) plus a fixed latency (ALL_REDUCE_LATENCY: kvbudget's assumption)."""
    if tp == 1 or card.interconnect_bytes_per_s is None:
        return 0.0
    hidden = activation_widths(model).hidden
    message = sequences * hidden * 2
    latency = ALL_REDUCE_LATENCY["pcie" if "PCIe" in (card.interconnect or "").split(" (")[0] else "link"]
    one = 2 * (tp - 1) / tp * message / (card.interconnect_bytes_per_s / 2) + latency
    return 2 * model.num_layers * one


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
