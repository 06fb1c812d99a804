"""The memory map: token tax and KV bytes by batch and context, for one model on one engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kvbudget.engines import Allocation, Capacity, EngineOptions, get_engine
from kvbudget.engines.base import pipeline_stages
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec

DEFAULT_CONTEXTS = (1024, 4096, 8192, 16384)


@dataclass(frozen=True)
class Point:
    batch: int  # requests
    sequences: int  # batch x beams: the sequences actually cached
    context: int  # tokens per sequence
    kv_bytes: int  # what the engine holds, caps and fixed state included
    uncapped_kv_bytes: int  # the same without any window or chunk cap


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    allocation: Allocation
    beams: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    points: tuple[Point, ...]
    notes: tuple[str, ...]
    capacity: Capacity | None = None  # what the engine makes of a KV budget, when one was given

    @property
    def bytes_per_token(self) -> int:
        """Bytes one sequence adds per token before any window cap (the token tax at batch 1)."""
        return self.allocation.bytes_per_token

    @property
    def fixed_bytes_per_sequence(self) -> int:
        return self.allocation.fixed_bytes_per_sequence

    def token_tax(self, batch: int) -> int:
        """Bytes a batch adds per generated token (every beam is a sequence), before window caps."""
        return batch * self.beams * self.bytes_per_token

    def to_dict(self) -> dict:
        """The JSON contract of `kvbudget estimate --json` (bytes throughout)."""
        alloc = self.allocation
        return {
            "model": self.model.name,
            "model_type": self.model.model_type,
            "source": self.model.source,
            "engine": alloc.engine,
            "kv_dtype": alloc.kv_dtype.name,
            "tp": alloc.tp,
            "beams": self.beams,
            "exact": alloc.exact,
            "max_position_embeddings": self.model.max_position_embeddings,
            "bytes_per_token": self.bytes_per_token,
            "fixed_bytes_per_sequence": self.fixed_bytes_per_sequence,
            "token_tax": [{"batch": b, "sequences": b * self.beams, "bytes_per_token": self.token_tax(b)}
                          for b in self.batches],
            "points": [asdict(p) for p in self.points],
            "layers": [
                {"kind": g.kind, "layers": g.layers, "bytes_per_token_per_layer": g.bytes_per_token,
                 "token_cap": g.token_cap, "fixed_bytes_per_layer": g.fixed_bytes, "detail": g.detail}
                for g in alloc.groups
            ],
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "notes": list(self.notes),
        }


def _positive(values, what: str) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise KVBudgetError(f"{what}: give at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise KVBudgetError(f"{what}: {v!r} is not a positive integer")
    return values


def default_contexts(model: ModelSpec) -> tuple[int, ...]:
    """1024, 4096, 8192, 16384 and the model's own maximum length."""
    extra = (model.max_position_embeddings,) if model.max_position_embeddings else ()
    return tuple(sorted(set(DEFAULT_CONTEXTS + extra)))


def estimate(
    model: ModelSpec,
    engine: str = "hf",
    kv_dtype: str = "auto",
    batch: tuple[int, ...] | list[int] = (1,),
    context: tuple[int, ...] | list[int] | None = None,
    beams: int = 1,
    tp: int = 1,
    options: EngineOptions = EngineOptions(),
    kv_memory: int | None = None,
    max_model_len: int | None = None,
    pp: int = 1,
) -> Estimate:
    """KV memory of `model` on `engine` for every batch x context (per GPU under tensor parallelism).

    With `kv_memory` (bytes for the KV cache on one GPU), also what the engine makes of that budget for
    requests of `max_model_len` tokens (default: the model's maximum).
    """
    batches = _positive(batch, "--batch")
    contexts = _positive(context, "--context") if context is not None else default_contexts(model)
    (beams,) = _positive((beams,), "--beams")
    chosen = get_engine(engine)
    full_model = model
    if pp != 1:
        model = _most_loaded_stage(model, chosen, pp, kv_dtype, tp, options)
    allocation = chosen.allocate(model, kv_dtype=kv_dtype, tp=tp, options=options)
    capacity = None
    if kv_memory is not None:
        (kv_memory,) = _positive((kv_memory,), "--kv-memory")
        if max_model_len is None:
            if not model.max_position_embeddings:
                raise KVBudgetError(f"{model.name}: config has no max_position_embeddings; pass --max-model-len")
            max_model_len = model.max_position_embeddings
        (max_model_len,) = _positive((max_model_len,), "--max-model-len")
        capacity = chosen.capacity(model, kv_memory, max_model_len, kv_dtype=kv_dtype, tp=tp, options=options)
    points = tuple(
        Point(b, b * beams, t, allocation.kv_bytes(b * beams, t), allocation.kv_bytes(b * beams, t, capped=False))
        for b in batches for t in contexts
    )
    notes = list(model.warnings) + list(allocation.notes)
    if pp != 1:
        stage_layers = sorted({spec.layer for spec in model.layers})
        notes.append(f"pipeline parallel {pp}: figures for the most loaded stage, layers {stage_layers[0]}-"
                     f"{stage_layers[-1]} (vLLM's get_pp_indices split)")
    longest = max(contexts)
    if model.max_position_embeddings and longest > model.max_position_embeddings:
        notes.append(f"context {longest} is beyond the model's max_position_embeddings "
                     f"({model.max_position_embeddings})")
    if capacity is not None:
        notes.extend(capacity.notes)
    return Estimate(full_model, allocation, beams, batches, contexts, points, tuple(notes), capacity)


def _most_loaded_stage(model: ModelSpec, engine, pp: int, kv_dtype: str, tp: int,
                       options: EngineOptions) -> ModelSpec:
    if not getattr(engine, "pipeline_parallel", False):
        raise KVBudgetError(f"--pp: kvbudget models pipeline parallelism for vllm and sglang, not {engine.name}")
    stages = [replace(model, layers=tuple(s for s in model.layers if s.layer in rng))
              for rng in pipeline_stages(model.num_layers, pp)]

    def load(stage: ModelSpec) -> tuple[int, int]:
        alloc = engine.allocate(stage, kv_dtype=kv_dtype, tp=tp, options=options)
        return alloc.bytes_per_token, alloc.fixed_bytes_per_sequence

    return max(stages, key=load)
