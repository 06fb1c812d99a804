"""The memory map: token tax and KV bytes by batch and context, for one model on one engine."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

from kvbudget import validate
from kvbudget.engines import Allocation, Capacity, Engine, EngineOptions, get_engine
from kvbudget.errors import ConfigError, EngineRuleError, KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.offload import HostReport
from kvbudget.validate import positive_int, positive_ints

DEFAULT_CONTEXTS = (1024, 4096, 8192, 16384)
T = TypeVar("T")


class Point(NamedTuple):  # a tuple: sweeps build hundreds of thousands of these
    batch: int  # requests
    sequences: int  # batch x beams: the sequences actually cached
    context: int  # tokens per sequence
    kv_bytes: int  # what the engine holds, caps and fixed state included
    uncapped_kv_bytes: int  # the same without any window or chunk cap


@dataclass(frozen=True, init=False, kw_only=True)
class Estimate:
    model: ModelSpec
    allocation: Allocation
    beams: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    points: tuple[Point, ...]
    notes: tuple[str, ...]
    capacity: Capacity | None = None  # what the engine makes of a KV budget, when one was given
    host: HostReport | None = None  # the tiers beyond the GPU, when host memory was given for them

    def __init__(self, model: ModelSpec, allocation: Allocation, beams: int, batches: tuple[int, ...],
                 contexts: tuple[int, ...], points: tuple[Point, ...], notes: tuple[str, ...],
                 capacity: Capacity | None = None, host: HostReport | None = None) -> None:
        # written out: the generated frozen __init__ sets each field with its own object.__setattr__ call, a third
        # of a one-point estimate(); one dict update costs half as much (sweeps call estimate() thousands of times)
        self.__dict__.update(model=model, allocation=allocation, beams=beams, batches=batches, contexts=contexts,
                             points=points, notes=notes, capacity=capacity, host=host)

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

    def to_dict(self) -> dict[str, Any]:
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
            "points": [p._asdict() for p in self.points],
            "layers": [g.to_dict() for g in alloc.groups],
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "host_tiers": self.host.to_dict() if self.host else None,
            "notes": list(self.notes),
        }


# Inputs beyond these are typos, not deployments (10M-token contexts exist; a billion does not).
MAX_CONTEXT = 2**30
MAX_BATCH = 2**24


# What engines make of a model depends only on these immutable inputs; sweeps (the planner's advice, `simulate
# --sweep`, the web page's sliders) ask for the same ones thousands of times. Keyed by identity, with the objects
# kept in the entry so an id cannot be reused while it is cached (equal options in another object: a miss).
_CACHE_SIZE = 256
_allocations: dict[tuple[Any, ...], tuple[tuple[Any, ...], Allocation]] = {}
_capacities: dict[tuple[Any, ...], tuple[tuple[Any, ...], Capacity]] = {}


def _remember(table: dict[tuple[Any, ...], tuple[tuple[Any, ...], T]], key: tuple[Any, ...],
              kept: tuple[Any, ...], value: T) -> T:
    """Keep `value` under `key` (`kept` holds the objects whose ids are in the key) and return it."""
    if len(table) >= _CACHE_SIZE:
        table.clear()
    table[key] = (kept, value)
    return value


def allocation_of(engine: Engine, model: ModelSpec, kv_dtype: str = "auto", tp: int = 1,
                  options: EngineOptions = EngineOptions()) -> Allocation:
    """`engine.allocate(...)`, remembered for the same engine, model object, dtype, tp and options."""
    key = (id(engine), id(model), kv_dtype, tp, id(options))
    hit = _allocations.get(key)
    if hit is not None:
        return hit[1]
    return _remember(_allocations, key, (engine, model, options),
                     engine.allocate(model, kv_dtype=kv_dtype, tp=tp, options=options))


def capacity_of(engine: Engine, model: ModelSpec, kv_memory: int, max_model_len: int, kv_dtype: str = "auto",
                tp: int = 1, options: EngineOptions = EngineOptions()) -> Capacity:
    """`engine.capacity(...)`, remembered like `allocation_of`."""
    key = (id(engine), id(model), kv_memory, max_model_len, kv_dtype, tp, id(options))
    hit = _capacities.get(key)
    if hit is not None:
        return hit[1]
    return _remember(_capacities, key, (engine, model, options),
                     engine.capacity(model, kv_memory, max_model_len, kv_dtype=kv_dtype, tp=tp, options=options))


def default_contexts(model: ModelSpec) -> tuple[int, ...]:
    """1024, 4096, 8192, 16384 up to the model's own maximum length, and that length."""
    top = model.max_position_embeddings
    if not top:
        return DEFAULT_CONTEXTS
    return tuple(sorted({c for c in DEFAULT_CONTEXTS if c < top} | {top}))


def estimate(
    model: ModelSpec,
    engine: str | Engine = "vllm",
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
    batches = positive_ints(batch, "batch")
    contexts = positive_ints(context, "context") if context is not None else default_contexts(model)
    longest = max(contexts)
    most_batch = max(batches)
    if most_batch > MAX_BATCH or longest > MAX_CONTEXT:
        param, most, limit = (("batch", most_batch, MAX_BATCH) if most_batch > MAX_BATCH
                              else ("context", longest, MAX_CONTEXT))
        raise KVBudgetError(f"{param}: {most:,} is beyond any deployment kvbudget sizes (at most {limit:,}); "
                            "check the units", param=param)
    beams = positive_int(beams, "beams")
    chosen = get_engine(engine)
    tp = positive_int(tp, "tp")
    heads = model.attention_heads
    if heads and heads % tp:  # every engine here splits the query heads evenly across ranks
        fits = [t for t in range(1, heads + 1) if heads % t == 0 and t <= tp]
        raise EngineRuleError(f"tp: tensor parallel size {tp} does not divide {model.name}'s {heads} attention heads "
                              f"(the nearest that does: {fits[-1]})", param="tp")
    full_model = model
    if pp != 1 or options.pp_layer_partition is not None:
        if options.num_speculative_tokens or options.speculative is not None:
            raise KVBudgetError("num_speculative_tokens: speculative decoding under pipeline parallelism (which stage "
                                "holds the drafter's caches) is not modelled; give pp 1", param="pp")
        model = most_loaded_stage(model, chosen, pp, kv_dtype, tp, options)
    allocation = allocation_of(chosen, model, kv_dtype, tp, options)
    capacity = None
    asked_len = max_model_len
    if kv_memory is not None:
        kv_memory = validate.size(kv_memory, "kv_memory")
        if max_model_len is None:
            if not model.max_position_embeddings:
                raise ConfigError(f"max_model_len: {model.name}'s config has no max_position_embeddings; give "
                                  "max_model_len", param="max_model_len")
            max_model_len = model.max_position_embeddings
        max_model_len = positive_int(max_model_len, "max_model_len")
        capacity = capacity_of(chosen, model, kv_memory, max_model_len, kv_dtype, tp, options)
        checked = chosen.checked_model(full_model, model, options) if pp != 1 else model
        if checked is not model:  # the start-up check weighs the whole model against this rank's budget
            whole = chosen.capacity(checked, kv_memory, max_model_len, kv_dtype=kv_dtype, tp=tp, options=options)
            said = f"{chosen.name} weighs the whole model's KV against one rank's budget at start-up (vLLM 0.14-0.16):"
            capacity = replace(capacity, fits=whole.fits, estimated_max_model_len=whole.estimated_max_model_len,
                               notes=(*capacity.notes, said, *whole.notes))
    held = [(t, allocation.sequence_bytes(t), allocation.sequence_bytes(t, capped=False)) for t in contexts]
    points = tuple(Point(b, b * beams, t, b * beams * capped, b * beams * uncapped)  # Allocation.kv_bytes, per row
                   for b in batches for t, capped, uncapped in held)
    notes = [*model.warnings, *allocation.notes]
    if pp != 1:
        stage_layers = sorted({spec.layer for spec in model.layers})
        notes.append(f"pipeline parallel {pp}: figures for the most loaded stage, layers {stage_layers[0]}-"
                     f"{stage_layers[-1]} ({chosen.name}'s split)")
    beyond: dict[int, str] = {}  # only what was asked (the contexts, the max model length), always that
    if context is not None:
        beyond[longest] = "context"
    if kv_memory is not None and asked_len is not None:
        beyond[asked_len] = "max model length"
    trained = model.max_position_embeddings
    notes += [f"{what} {n:,} is beyond the model's max_position_embeddings ({trained:,})"
              for n, what in beyond.items() if trained and n > trained]
    if capacity is not None:
        notes.extend(capacity.notes)
    return Estimate(model=full_model, allocation=allocation, beams=beams, batches=batches, contexts=contexts,
                    points=points, notes=tuple(notes), capacity=capacity)


def most_loaded_stage(model: ModelSpec, engine: Engine, pp: int, kv_dtype: str, tp: int,
                      options: EngineOptions) -> ModelSpec:
    """The pipeline stage (as the engine splits layers) whose cache is largest."""
    stages = [model.stage(rng) for rng in engine.pipeline_stages(model.num_layers, pp, options.pp_layer_partition)]

    def load(stage: ModelSpec) -> tuple[int, int]:
        alloc = engine.allocate(stage, kv_dtype=kv_dtype, tp=tp, options=options)
        return alloc.bytes_per_token, alloc.fixed_bytes_per_sequence

    return max(stages, key=load)
