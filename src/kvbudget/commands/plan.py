"""`plan` (will it fit: weights, KV budget, capacity, what to change) and `compare` (models side by side)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbudget.commands.options import (
    MAX_NUM_SEQS,
    UTILIZATION,
    CountedLength,
    EngineKnobs,
    OffloadKnobs,
    SpeculativeKnobs,
    StartupKnobs,
    counted_context,
    engine_field,
    engine_options,
    engine_release,
    force_field,
    fraction,
    host_tiers_of,
    kv_dtype_field,
    load,
    model_field,
    one,
    option,
    optional_one,
    part,
    size,
    size_or_zero,
)
from kvbudget.errors import KVBudgetError, named

if TYPE_CHECKING:
    from kvbudget.comparison import Comparison
    from kvbudget.engines import Capacity
    from kvbudget.gpus import GPU
    from kvbudget.planner import NoBudget, Plan
    from kvbudget.reuse import ReuseCurve, TierAdvice
    from kvbudget.simulation.pdsizing import PDSizing


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What `plan` is asked, as given."""

    model: str = model_field()
    engine: str = engine_field("vllm")
    kv_dtype: str = kv_dtype_field()
    gpu: str | None = option("GPU from `kvbudget gpus` (e.g. H100-80GB)")
    gpu_memory: str | None = option("memory of one GPU (overrides --gpu's), e.g. 24GiB")
    gpus: str | None = option("GPUs in the deployment: replicas of tp x pp (data parallel; default tp x pp)")
    expert_parallel: bool = option("with --gpus: the replicas are data-parallel attention ranks sharing an MoE's "
                                   "experts (vLLM --data-parallel-size N --enable-expert-parallel; SGLang "
                                   "--enable-dp-attention)", False)
    tp: str = option("tensor parallel size (default 1)", "1")
    pp: str = option("pipeline parallel size (default 1)", "1")
    max_model_len: str | None = option("request length (default: the model's maximum)")
    concurrency: str = option("requests at once, for the longest-context answer", "1")
    beams: str = option("beams or samples per request (default 1)", "1")
    weights: str | None = option("weight bytes per GPU (overrides the computed figure)")
    activation: str | None = option("activation peak (overrides the estimate)")
    overhead: str | None = option("non-torch memory and CUDA graphs (overrides the estimate)")
    utilization: str | None = option(UTILIZATION)
    kv_memory: str | None = option("use this KV budget per GPU instead of deriving it")
    knobs: EngineKnobs = part(EngineKnobs)
    speculative: SpeculativeKnobs = part(SpeculativeKnobs)
    max_num_seqs: str | None = option(MAX_NUM_SEQS)
    startup: StartupKnobs = part(StartupKnobs)
    offload: OffloadKnobs = part(OffloadKnobs)
    trace: str | None = option("traffic whose prefix reuse decides whether a host tier pays, and how big: a trace "
                               "with prefix ids (mooncake-conv, or JSON Lines with prefix and prefix_tokens)",
                               web=False)
    guard_config: str | None = option("write the degradation plan as YAML for `kvbudget guard`", web=False)
    plot: str | None = option("write a picture (.png or .svg): GPU memory and KV bytes against context", web=False)
    force: bool = force_field()
    counted: CountedLength = part(CountedLength)
    json: bool = option("print JSON (bytes) instead of tables", False, web=False)
    check: bool = option("exit 1 when the deployment does not fit (for CI): no KV budget, or one request of "
                         "--max-model-len (--concurrency of them at once) does not fit the planned budget or the "
                         "low end of its error band; the reason on stderr", False)
    pd_rate: str | None = option("disaggregated prefill and decode: size the prefill and decode replicas of this "
                                 "deployment for this many requests per second (with --pd-prompt-tokens, "
                                 "--pd-output-tokens and --kv-link)", web=False)
    pd_prompt_tokens: str | None = option("--pd-rate: the traffic's mean prompt length", web=False)
    pd_output_tokens: str | None = option("--pd-rate: the traffic's mean output length", web=False)
    kv_link: str | None = option("--pd-rate: the link the KV crosses: nvlink, infiniband, roce, pcie, tcp, a rate "
                                 "(25GB/s) or NAME:RATE", web=False)


@dataclass(frozen=True, kw_only=True)
class CompareRequest:
    """What `compare` is asked, as given."""

    models: tuple[str, ...] = model_field(many=True)
    engine: str = engine_field("vllm")
    kv_dtype: str = kv_dtype_field()
    gpu: str | None = option("GPU from `kvbudget gpus`: adds KV budget, concurrency and longest context")
    gpu_memory: str | None = option("memory of one GPU instead of --gpu")
    context: str = option("request length to compare at (default 8192)", "8192")
    tp: str = option("tensor parallel size for every model (default 1)", "1")
    utilization: str | None = option(UTILIZATION)
    max_num_seqs: str | None = option(MAX_NUM_SEQS)
    startup: StartupKnobs = part(StartupKnobs)
    speculative: SpeculativeKnobs = part(SpeculativeKnobs)
    json: bool = option("print JSON", False, web=False)


def answer(ask: PlanRequest) -> Plan | NoBudget:
    """The plan a request asks for, or (a deployment that leaves no KV budget) the answer saying so with the
    changes that make room. `as_json` of it is what --json prints and the web page serves."""
    from kvbudget.planner import NoKVBudget, plan

    _check_outputs(ask)
    _check_pd(ask)
    engine, options = engine_options(ask.engine, ask.knobs, ask.startup, ask.max_num_seqs,
                                     ask.speculative)  # first: NAME@VERSION
    counted, counted_note = counted_context(ask.counted, ask.model, engine, "max_model_len", ask.max_model_len)
    utilization = fraction(ask.utilization, "utilization")
    model = load(ask.model)
    curve = _reuse(ask, engine)
    try:
        result = plan(
            model, engine=engine, gpu=ask.gpu, gpu_memory=size(ask.gpu_memory, "gpu_memory"),
            gpus=optional_one(ask.gpus, "gpus"), tp=one(ask.tp, "tp"), pp=one(ask.pp, "pp"),
            kv_dtype=ask.kv_dtype, max_model_len=counted or optional_one(ask.max_model_len, "max_model_len"),
            concurrency=one(ask.concurrency, "concurrency"), beams=one(ask.beams, "beams"),
            options=options, weights=size(ask.weights, "weights"),
            activation=size_or_zero(ask.activation, "activation"),
            overhead=size_or_zero(ask.overhead, "overhead"), utilization=utilization,
            kv_memory=size(ask.kv_memory, "kv_memory"), expert_parallel=ask.expert_parallel,
        )
    except NoKVBudget as exc:  # "does not fit" is an answer: said in full
        return exc.answer
    result = _host_tiers(ask, result, curve)
    return replace(result, notes=(*result.notes, counted_note)) if counted_note else result


PD = ("pd_rate", "pd_prompt_tokens", "pd_output_tokens", "kv_link")


def _check_pd(ask: PlanRequest) -> bool:
    """Whether the P:D sizing is asked for; all its settings given, or none."""
    given = [p for p in PD if getattr(ask, p) is not None]
    if not given:
        return False
    missing = [p for p in PD if p not in given]
    if missing:
        raise KVBudgetError(f"{missing[0]}: the P:D sizing needs {', '.join(named(p) for p in PD)}",
                            param=missing[0])
    if ask.gpu is None:
        raise KVBudgetError(f"pd_rate: the sizing times the steps on a catalog GPU; give {named('gpu')}",
                            param="pd_rate")
    return True


def pd_sizing(ask: PlanRequest) -> PDSizing | None:
    """The static P:D answer of --pd-rate (simulation/pdsizing.py) for the deployment the request plans."""
    if not _check_pd(ask):
        return None
    from kvbudget.commands.options import positive
    from kvbudget.gpus import find_gpu
    from kvbudget.interconnects import kv_link
    from kvbudget.simulation.pdsizing import MAX_RATE, size_disaggregated
    from kvbudget.simulation.run import setup_for

    assert ask.gpu is not None and ask.kv_link is not None and ask.pd_rate is not None
    rate = positive(ask.pd_rate, "pd_rate", MAX_RATE)
    prompt = one(str(ask.pd_prompt_tokens), "pd_prompt_tokens")
    output = one(str(ask.pd_output_tokens), "pd_output_tokens")
    link = kv_link(ask.kv_link, [find_gpu(ask.gpu)])
    engine, options = engine_options(ask.engine, ask.knobs, ask.startup, ask.max_num_seqs, ask.speculative)
    setup = setup_for(load(ask.model), engine=engine, gpu=ask.gpu, gpu_memory=size(ask.gpu_memory, "gpu_memory"),
                      kv_memory=size(ask.kv_memory, "kv_memory"), tp=one(ask.tp, "tp"), pp=one(ask.pp, "pp"),
                      kv_dtype=ask.kv_dtype, max_model_len=optional_one(ask.max_model_len, "max_model_len"),
                      block_size=options.block_size, max_num_seqs=optional_one(ask.max_num_seqs, "max_num_seqs"),
                      max_num_batched_tokens=options.max_num_batched_tokens, prefix_caching=options.prefix_caching,
                      weights=size(ask.weights, "weights"), utilization=fraction(ask.utilization, "utilization"))
    return size_disaggregated(setup, rate, prompt, output, link)


def _check_outputs(ask: PlanRequest) -> None:
    """The files the request writes, checked before any work (kvbudget.files.check_target)."""
    from kvbudget.files import check_targets

    if ask.plot:
        from kvbudget.plot import plot_target

        plot_target(ask.plot, ask.force)
    check_targets(((ask.guard_config, "guard_config"), (ask.plot, "plot")), ask.force)


def _reuse(ask: PlanRequest, engine: str) -> ReuseCurve | None:
    """The trace's reuse curve, read before any planning (a bad trace, or an engine without tiers, fails first)."""
    if ask.trace is None:
        return None
    from kvbudget.engines import get_engine
    from kvbudget.engines.scheduling.workload import read_trace
    from kvbudget.engines.tiers import OffloadsKV
    from kvbudget.reuse import reuse_curve

    if not isinstance(get_engine(engine), OffloadsKV):
        raise KVBudgetError(f"trace: kvbudget models no KV tier beyond the GPU for {engine}, so a trace's reuse "
                            f"cannot size one; leave {named('trace')} out or plan vllm, sglang or llamacpp",
                            param="trace")
    return reuse_curve(read_trace(ask.trace), ask.trace)


def _host_tiers(ask: PlanRequest, p: Plan, curve: ReuseCurve | None) -> Plan:
    """The plan with the host tiers asked for and, given a trace, whether a tier pays for it."""
    from kvbudget.gpus import find_gpu
    from kvbudget.planner import Recommendation, with_recommendation
    from kvbudget.units import size_setting

    card = find_gpu(ask.gpu) if ask.gpu else None
    lengths = (p.capacity.max_model_len, *([curve.mean_hit] if curve and curve.mean_hit else []))
    host = host_tiers_of(ask.offload, p.engine.name, p.model, kv_dtype=ask.kv_dtype, tp=p.tp, options=p.options,
                         lengths=tuple(sorted(set(lengths))), gpu=card)
    if host is not None:
        p = replace(p, host=host)
    if curve is None:
        return p
    offload = ask.offload
    advice = _tier_advice(p, curve, card, kv_dtype=ask.kv_dtype, backend=offload.offload_backend,
                          disk=size(offload.offload_disk, "offload_disk"),
                          given=size(offload.offload_memory, "offload_memory"))
    p = replace(p, reuse=advice)
    if advice.recommended is None:
        return p
    return with_recommendation(p, Recommendation(
        parameters={"offload_memory": size_setting(advice.recommended)}, note="", gain=1.0,
        effect=f"on {curve.trace}: {advice.reason} (estimates)"))


def _tier_advice(p: Plan, curve: ReuseCurve, card: GPU | None, *, kv_dtype: str, backend: str | None,
                disk: int | None, given: int | None) -> TierAdvice:
    """`advise` for a plan: its engine's tier at each size, its GPU's host link, its step-time model."""
    from kvbudget.engines.scheduling.timing import NOMINAL
    from kvbudget.engines.tiers import OffloadsKV, host_link
    from kvbudget.offload import host_report
    from kvbudget.reuse import CANDIDATES, advise, prefill_seconds
    from kvbudget.simulation.steptimes import default_time_model

    assert isinstance(p.engine, OffloadsKV)  # the command refuses others before reading the trace
    def report(memory: int) -> Any:
        return host_report(p.engine, p.model, memory=memory, disk=disk, backend=backend,
                           kv_dtype=kv_dtype, tp=p.tp, options=p.options, gpu=card)

    def tier_tokens(memory: int) -> int | None:
        try:
            return int(report(memory).tiers[0].tokens)
        except KVBudgetError:
            return None

    link = host_link(card)
    first = report(given or CANDIDATES[0])

    def load_seconds(tokens: int) -> float | None:
        return first.load_seconds(first.tiers[0], tokens)

    model = default_time_model(p.model, p, card)
    timed = model.basis != NOMINAL
    chunk = p.options.max_num_batched_tokens

    def recompute_seconds(tokens: int) -> float | None:
        return prefill_seconds(model, tokens, chunk) if timed else None

    basis = (f"computing from {model.basis}; loading over {link.name} at {link.bytes_per_s / 1e9:,.0f} GB/s"
             if timed and link is not None else "give a GPU from the table (kvbudget gpus) for load and compute "
             "times")
    return advise(curve, gpu_tokens=p.capacity.physical_token_slots, tier_tokens=tier_tokens,
                  load_seconds=load_seconds, recompute_seconds=recompute_seconds, basis=basis, given=given)


def check_failure(result: Plan | NoBudget) -> str | None:
    """Why `plan --check` fails, in one line; None where it passes. It fails where the weights leave no KV budget,
    where one request of max_model_len (`concurrency` of them at once, every beam a sequence) does not fit the
    planned budget, and where it does not fit the low end of the budget's error band (kvbudget.budgetbands: the
    budget were the plan as optimistic as the band has measured)."""
    from kvbudget.planner import NoBudget
    from kvbudget.units import format_bytes

    if isinstance(result, NoBudget):
        return result.reason.split(";")[0]  # what follows names a change in the library's words
    cap, want = result.capacity, result.concurrency * result.estimate.beams
    if cap.fits and cap.max_concurrency >= want:
        return low_end_shortfall(result)
    at_low = _low_end(result)[1] if result.band else cap
    longest = at_low.estimated_max_model_len if at_low is not None and want == 1 else None
    return (f"{_asked(result)} does not fit the planned KV budget, {format_bytes(result.kv_memory_bytes)}"
            + (f"; the longest request that passes: {longest:,} tokens" if longest else ""))


def _asked(p: Plan) -> str:
    """What --check asks of the plan, in words."""
    want, length = p.concurrency * p.estimate.beams, p.capacity.max_model_len
    return f"one request of {length:,} tokens" if want == 1 else f"{want:,} sequences of {length:,} tokens at once"


def _low_end(p: Plan) -> tuple[int, Capacity | None]:
    """The low end of the plan's error band and what the engine makes of it for requests of max_model_len (None
    where it is too little for the engine to plan at all)."""
    from kvbudget.estimator import estimate

    assert p.band is not None
    from kvbudget.budget import TermKey

    low, length = p.band.budget_range(p.kv_memory_bytes, p.term_bytes(TermKey.SHARE))[0], p.capacity.max_model_len
    if low <= 0:
        return low, None
    try:
        return low, estimate(p.model, engine=p.engine, kv_dtype=p.estimate.allocation.kv_dtype.name, context=[length],
                             tp=p.tp, pp=p.pp, options=p.options, kv_memory=low, max_model_len=length).capacity
    except KVBudgetError:
        return low, None


def low_end_shortfall(p: Plan) -> str | None:
    """Where the plan's requests (one of max_model_len, or `concurrency` at once) fit its KV budget but not the low
    end of the budget's error band: why, naming the band, and the longest request the low end holds; else None."""
    from kvbudget.units import format_bytes

    band, cap, want = p.band, p.capacity, p.concurrency * p.estimate.beams
    if band is None or not cap.fits or cap.max_concurrency < want:  # no band, or the plan itself falls short
        return None
    low, at_low = _low_end(p)
    if at_low is not None and at_low.fits and at_low.max_concurrency >= want:
        return None
    longest = (f"; the longest request it holds: {at_low.estimated_max_model_len:,} tokens"
               if want == 1 and at_low is not None and at_low.estimated_max_model_len else "")
    return (f"{_asked(p)} fits the planned KV budget, {format_bytes(p.kv_memory_bytes)}, but not the low end of its "
            f"error band, {format_bytes(low)}: the band of {band.era} on {band.family} was up to {band.high:+.1%} of "
            f"the engine share optimistic on {band.cases} check start-up{'s' if band.cases > 1 else ''}"
            + ("" if band.checked else f" ({band.basis})") + longest)


def as_json(result: Plan | NoBudget) -> dict[str, Any]:
    return result.to_dict()


def compare_rows(ask: CompareRequest) -> tuple[Comparison, ...]:
    """The comparison a request asks for (each row's `__dict__` is what --json prints and the web page serves)."""
    from kvbudget.comparison import compare

    if len(ask.models) < 2:
        raise KVBudgetError("compare: name at least two models")
    engine, release = engine_release(ask.engine)
    models = [load(m) for m in ask.models]
    gpu_memory, context = size(ask.gpu_memory, "gpu_memory"), one(ask.context, "context")
    tp, utilization = one(ask.tp, "tp"), fraction(ask.utilization, "utilization")
    options = ask.speculative.options(replace(ask.startup.options(ask.max_num_seqs), engine_version=release))
    return compare(models, engine=engine, gpu=ask.gpu, gpu_memory=gpu_memory, context=context, kv_dtype=ask.kv_dtype,
                   tp=tp, utilization=utilization, options=options)
