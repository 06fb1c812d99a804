"""`estimate`: the memory map of one model on one engine."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvbudget.commands.options import (
    CountedLength,
    EngineKnobs,
    OffloadKnobs,
    SpeculativeKnobs,
    counted_context,
    engine_field,
    engine_options,
    host_tiers_of,
    kv_dtype_field,
    load,
    model_field,
    one,
    option,
    optional_one,
    part,
    size,
)
from kvbudget.errors import KVBudgetError, named
from kvbudget.estimator import Estimate, estimate
from kvbudget.units import parse_positive_ints


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """What `estimate` is asked, as given."""

    model: str = model_field()
    engine: str = engine_field("vllm")
    kv_dtype: str = kv_dtype_field()
    batch: str = option("batch sizes, comma-separated (default 1)", "1")
    beams: str = option("beams or samples per request (default 1)", "1")
    context: str | None = option("context lengths in tokens, e.g. 1024,4096,32k (default 1024,4096,8192,16384 and "
                                 "the model's maximum)")
    tp: str = option("tensor parallel size: numbers are per GPU (default 1)", "1")
    pp: str = option("pipeline parallel size (vllm, sglang): numbers for the most loaded stage (default 1)", "1")
    kv_memory: str | None = option("KV budget per GPU (e.g. 3.81GiB, 24GB, bytes): adds the engine's capacity")
    max_model_len: str | None = option("request length for --kv-memory (default: the model's maximum)")
    knobs: EngineKnobs = part(EngineKnobs)
    speculative: SpeculativeKnobs = part(SpeculativeKnobs)
    offload: OffloadKnobs = part(OffloadKnobs)
    gpu: str | None = option("with --offload-memory: the GPU whose host link a load crosses (kvbudget gpus)")
    layers: bool = option("show the per-layer-kind breakdown", False, web=False)
    counted: CountedLength = part(CountedLength)
    json: bool = option("print JSON (bytes) instead of tables", False, web=False)


def answer(ask: EstimateRequest) -> Estimate:
    """The estimate a request asks for (its `to_dict()` is what --json prints and the web page serves)."""
    engine, options = engine_options(ask.engine, ask.knobs, speculative=ask.speculative)  # first: NAME@VERSION
    counted, counted_note = counted_context(ask.counted, ask.model, engine, "context", ask.context)
    if ask.gpu and ask.offload.offload_memory is None:
        raise KVBudgetError(f"gpu: estimate uses the GPU for the host link of an offload tier; give "
                            f"{named('offload_memory')} too (plan sizes a GPU)", param="gpu")
    gpu = None
    if ask.gpu:
        from kvbudget.gpus import find_gpu  # only here: a plain estimate loads no GPU table

        gpu = find_gpu(ask.gpu)
    model = load(ask.model)
    result = estimate(
        model,
        engine=engine,
        kv_dtype=ask.kv_dtype,
        batch=parse_positive_ints(ask.batch, "batch"),
        context=(counted,) if counted else None if ask.context is None else parse_positive_ints(ask.context, "context"),
        beams=one(ask.beams, "beams"),
        tp=one(ask.tp, "tp"),
        options=options,
        kv_memory=size(ask.kv_memory, "kv_memory"),
        max_model_len=optional_one(ask.max_model_len, "max_model_len"),
        pp=one(ask.pp, "pp"),
    )
    host = host_tiers_of(ask.offload, engine, model, kv_dtype=ask.kv_dtype, tp=one(ask.tp, "tp"), options=options,
                         lengths=result.contexts, gpu=gpu)
    if host is not None:
        result = replace(result, host=host)
    return replace(result, notes=(*result.notes, counted_note)) if counted_note else result
