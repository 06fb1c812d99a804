"""The drafter's time in a simulation of speculative decoding: a draft model's or head's own steps from the same
kernel model as the target's, an MTP layer as its share of the target's step, or a lookup on the CPU."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.engines.scheduling.setup import Drafting, SimulationAsk
from kvbudget.engines.scheduling.timing import NOMINAL, TimeModel
from kvbudget.errors import KVBudgetError, named

if TYPE_CHECKING:
    from kvbudget.gpus import GPU
    from kvbudget.planner import Plan

# An assumption, not measured: the CPU seconds a prompt-lookup (n-gram) or suffix-tree proposer spends per
# sequence per step (a match over the context's recent tokens). Small beside a GPU step of milliseconds.
LOOKUP_SECONDS = 20e-6
DRAFT_KV = 1 << 30  # the KV budget the drafter's plan is made with: only its weights and bytes per token are read


def drafting_for(ask: SimulationAsk, p: Plan, card: GPU | None, target: TimeModel, max_len: int) -> Drafting | None:
    """The drafter of `ask.speculative` and its time on the plan's GPUs (`target`: the target's step time,
    `max_len` the target's max_model_len)."""
    spec = ask.speculative
    if spec is None:
        return None
    if not spec.method.drafter_weights:
        return Drafting(spec=spec, time_model=None, cpu_per_seq=LOOKUP_SECONDS,
                        basis=f"{spec.method} lookup on the CPU, {LOOKUP_SECONDS * 1e6:.0f} µs a sequence a step (an "
                              "assumption, not measured)")
    if spec.draft is None:  # MTP: the model's own layers, one a draft token
        layers = max(ask.model.num_layers, 1)
        share = 1.0 / layers
        tm = replace(target.scaled(share, share, target.basis), pace=0.0, pace_per_seq=0.0, request_per_token=0.0)
        return Drafting(spec=spec, time_model=tm,
                        basis=f"one MTP layer a draft token, timed as 1/{layers} of the target's step (its "
                              f"{target.basis}): an estimate")
    from kvbudget.planner import plan
    from kvbudget.simulation import steptimes

    draft = spec.draft
    longest = draft.max_position_embeddings or max_len
    dp = plan(draft, engine=ask.engine, gpu=ask.gpu, gpu_memory=p.gpu_memory_bytes, tp=p.tp, kv_dtype=ask.kv_dtype,
              max_model_len=min(longest, max_len), kv_memory=DRAFT_KV, recommend=False)
    tm = steptimes.default_time_model(draft, dp, card, ask.interconnect)
    if tm.basis == NOMINAL:
        raise KVBudgetError(f"speculative: the drafter's step time needs a GPU from the catalog ({named('gpu')}); "
                            "a calibration times the target only", param="speculative")
    name = spec.draft_id or draft.name
    return Drafting(spec=spec, time_model=tm, basis=f"the drafter {name}'s own steps on {tm.basis}: an estimate")
