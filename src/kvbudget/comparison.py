"""`kvbudget compare`: models side by side on one engine, and with a GPU, what each fits."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget import validate
from kvbudget.choices import Choice
from kvbudget.engines import Engine, EngineOptions, get_engine
from kvbudget.errors import KVBudgetError, named
from kvbudget.estimator import estimate
from kvbudget.gpus import gpu_card
from kvbudget.model.spec import ModelSpec
from kvbudget.planner import NoKVBudget, longest_context, plan
from kvbudget.validate import positive


class Budget(Choice):
    """What a GPU leaves one model for its KV cache in `compare`: none asked, a budget, none (the weights and the
    engine's other memory take it all), or not known (kvbudget cannot count the weights: `plan --weights` gives
    them). Any other refusal is of the settings every row shares: `compare` raises it."""

    NO_GPU = "no gpu"
    FITS = "fits"
    DOES_NOT_FIT = "does not fit"
    WEIGHTS_UNKNOWN = "weights unknown"


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One model's row in `kvbudget compare`."""

    model: str
    cache: dict[str, int]  # layer kinds and how many
    bytes_per_token: int
    fixed_bytes_per_sequence: int
    kv_bytes_at_context: int  # one sequence of `context` tokens
    context: int
    kv_memory_bytes: int | None  # with a GPU: the KV budget on it
    max_concurrency: float | None  # requests of `context` tokens at once
    longest_context: int | None  # the longest single request on one GPU (up to the model's maximum)
    note: str = ""
    budget: Budget = Budget.NO_GPU  # why kv_memory_bytes is None, where it is


def compare(models: list[ModelSpec], engine: str | Engine = "vllm", gpu: str | None = None,
            gpu_memory: int | None = None, context: int = 8192, kv_dtype: str = "auto",
            options: EngineOptions = EngineOptions(), tp: int = 1,
            utilization: float | None = None) -> tuple[Comparison, ...]:
    """Models side by side: bytes per token per GPU at tensor parallel size `tp`, and with a GPU, capacity and the
    longest context that fits, each budget as `plan` makes it for the same options and `utilization`. A model whose
    maximum length is below `context` is computed at `context` anyway, with a note saying so."""
    chosen = get_engine(engine)
    positive(context, "context", "tokens")
    if gpu or gpu_memory is not None:
        gpu_card(gpu, gpu_memory)  # an unknown GPU or a bad size is refused, as plan refuses it
        if utilization is not None:
            validate.fraction(utilization, "utilization")
    elif utilization is not None:
        raise KVBudgetError(f"utilization: goes with {named('gpu')} or {named('gpu_memory')} (the memory it is a "
                            "share of)", param="utilization")
    rows = []
    for model in models:
        est = estimate(model, engine=chosen, kv_dtype=kv_dtype, context=[context], options=options, tp=tp)
        budget = longest = None
        concurrency: float | None = None
        notes = []
        status = Budget.NO_GPU
        if model.max_position_embeddings and model.max_position_embeddings < context:
            notes.append(f"{model.name} is trained for {model.max_position_embeddings:,} tokens, fewer than the "
                         f"{context:,} compared here")
        if gpu or gpu_memory is not None:
            try:
                p = plan(model, engine=chosen, gpu=gpu, gpu_memory=gpu_memory, kv_dtype=kv_dtype, tp=tp,
                         max_model_len=context, options=options, utilization=utilization, recommend=False)
                budget, concurrency = p.kv_memory_bytes, p.capacity.max_concurrency
                top = model.max_position_embeddings or context
                longest = longest_context(model, chosen, budget, 1, top, kv_dtype, tp, 1, p.options)
                status = Budget.FITS
            except KVBudgetError as exc:  # this model's own answer is a note; bad settings are everyone's error
                if not isinstance(exc, NoKVBudget) and exc.param != "weights":
                    raise
                notes.append(str(exc))
                status = Budget.DOES_NOT_FIT if isinstance(exc, NoKVBudget) else Budget.WEIGHTS_UNKNOWN
        note = "; ".join(notes)
        rows.append(Comparison(model=model.name, cache=model.kinds(), bytes_per_token=est.bytes_per_token,
                               fixed_bytes_per_sequence=est.fixed_bytes_per_sequence,
                               kv_bytes_at_context=est.points[0].kv_bytes, context=context, kv_memory_bytes=budget,
                               max_concurrency=concurrency, longest_context=longest, note=note,
                               budget=status))
    return tuple(rows)
