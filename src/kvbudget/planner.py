"""The capacity planner: weights + engine budget + engine capacity + what to change.

Every figure comes from the model description, the engines' allocators and the GPU catalog; the terms
that are estimates (activation peak, non-torch overhead, CUDA graphs, default memory fractions) say so
and each has an override.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbudget.budget import GIVEN_WEIGHTS, Term, TermKey, check_given, memory_stack
from kvbudget.budgetbands import BudgetBand, budget_band
from kvbudget.drafter import DrafterAdvice, drafter_advice
from kvbudget.engines import Capacity, Engine, EngineOptions, get_engine, serving_engines
from kvbudget.engines.base import largest_fitting
from kvbudget.errors import BudgetError, ConfigError, EngineRuleError, KVBudgetError
from kvbudget.estimator import Estimate, estimate
from kvbudget.gpus import GPU, gpu_card
from kvbudget.gpus import gpus as all_gpus
from kvbudget.levels import LEVELS
from kvbudget.model.params import count_parameters
from kvbudget.model.spec import ModelSpec
from kvbudget.model.weights import Weights, model_weights
from kvbudget.roofline import Roofline, decode_roofline
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.offload import HostReport
    from kvbudget.reuse import TierAdvice

# Recommendation heuristics (kvbudget's choices, not engine facts):
# a catalog model counts as "of similar size" within this fraction of the parameters active per token (and of the
# total, for mixture-of-experts models), and only beside models of its own class (dense or MoE) ...
SIMILAR_SIZE = 0.35
# ... and is worth naming when its cache per token is at most this fraction of the model's.
SMALLER_CACHE = 0.75
# The "larger GPU" offered is the smallest card of the same vendor with at least this much more memory: a step
# worth a migration (it skips near-twins such as H100-80GB -> H100-NVL's 94 GB).
BIGGER_GPU_STEP = 1.4


@dataclass(frozen=True, kw_only=True)
class Level:
    name: str
    fraction: float
    kv_bytes: int
    tokens: int  # tokens in the cache at this level
    requests: int  # whole requests of max_model_len held at once at this level (rounded down)
    action: str  # machine name the guard acts on
    meaning: str  # for people


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    parameters: dict[str, Any]  # what to change, in plan()'s parameter names ({"tp": 4}, {"model": "..."})
    note: str  # what else to know about the change ("4 GPUs", "a model of similar size")
    effect: str
    gain: float  # factor on maximum concurrency (1.0 = no change)
    makes_it_fit: bool = False  # the deployment does not fit (or start) now and would with this change
    more_gpus: int = 0  # GPUs the change adds to the deployment (0: a setting, another model, or other GPUs)

    @property
    def cost(self) -> str:
        """What the change costs in hardware, in words."""
        if self.more_gpus:
            return f"{self.more_gpus} more GPU{'s' if self.more_gpus > 1 else ''}"
        if "offload_memory" in self.parameters:
            return "host memory"
        return "other GPUs" if "gpu" in self.parameters else "no new hardware"

    @property
    def change(self) -> str:
        text = ", ".join(f"{key}={value}" for key, value in self.parameters.items())
        return f"{text} ({self.note})" if self.note else text

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": self.parameters, "note": self.note, "change": self.change, "effect": self.effect,
                "gain": self.gain, "makes_it_fit": self.makes_it_fit, "more_gpus": self.more_gpus, "cost": self.cost}


@dataclass(frozen=True, kw_only=True)
class NoBudget:
    """A deployment whose weights and other memory leave nothing for the KV cache: what was asked, the memory
    stack, and the changes that would make it fit (an answer, not an error: `plan` says it in full)."""

    model: str
    engine: str
    gpu: str
    gpu_memory_bytes: int
    tp: int
    pp: int
    weights: Weights
    stack: tuple[Term, ...]
    kv_memory_bytes: int
    reason: str
    recommendations: tuple[Recommendation, ...]

    fits = False

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "engine": self.engine, "gpu": self.gpu,
                "gpu_memory_bytes": self.gpu_memory_bytes, "tp": self.tp, "pp": self.pp,
                "weights_bytes": self.weights.per_gpu_bytes, "weights": self.weights.to_dict(),
                "stack": [t.to_dict() for t in self.stack],
                "kv_memory_bytes": self.kv_memory_bytes, "fits": False, "reason": self.reason,
                "recommendations": [r.to_dict() for r in self.recommendations]}


class NoKVBudget(BudgetError):
    """`plan` asked of a deployment that leaves no KV budget: the error carries the answer (`answer`, a NoBudget)
    for callers that say it rather than fail (the plan command)."""

    def __init__(self, answer: NoBudget):
        super().__init__(answer.reason)
        self.answer = answer


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: ModelSpec
    engine: Engine
    gpu: str
    gpu_memory_bytes: int
    tp: int
    pp: int
    weights: Weights
    stack: tuple[Term, ...]
    kv_memory_bytes: int
    capacity: Capacity
    estimate: Estimate
    concurrency: int
    longest_context: int | None  # for `concurrency` requests at once
    roofline: tuple[Roofline, ...]
    levels: tuple[Level, ...]
    recommendations: tuple[Recommendation, ...]
    notes: tuple[str, ...]
    options: EngineOptions = EngineOptions()  # what the plan ran with, the engine's defaults for the GPU filled in
    replicas: int = 1  # data-parallel copies of the deployment: gpus // (tp x pp)
    host: HostReport | None = None  # the tiers beyond the GPU, when host memory was given for them
    reuse: TierAdvice | None = None  # whether a host tier pays for a trace's prefix reuse, when a trace was given
    drafter: DrafterAdvice | None = None  # what speculative decoding's drafter costs, when the options draft
    band: BudgetBand | None = None  # the KV budget's error band (kvbudget.budgetbands); None: given, or unmeasured

    @property
    def fits(self) -> bool:
        return self.capacity.fits

    @property
    def total_concurrency(self) -> float:
        """Requests of max-model-len at once over every replica (each replica has its own KV cache)."""
        return self.replicas * self.capacity.max_concurrency

    def deployment(self) -> dict[str, Any]:
        """The whole deployment, every replica: `capacity` and `kv_memory_bytes` are one replica's (one GPU's)."""
        n = self.replicas * self.tp * self.pp
        return {"gpus": n, "replicas": self.replicas, "kv_memory_bytes": self.kv_memory_bytes * n, "max_concurrency":
                self.total_concurrency, "physical_token_slots": self.capacity.physical_token_slots * self.replicas}

    def term_bytes(self, key: TermKey) -> int:
        """Bytes of one slice of the memory stack (0 when the plan has no such slice, e.g. with kv_memory)."""
        return next((t.bytes for t in self.stack if t.key == key), 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name, "engine": self.engine.name, "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes, "tp": self.tp, "pp": self.pp,
            "parameters": {"total": self.weights.total_params, "active": self.weights.active_params,
                           "mtp": self.weights.mtp_params},
            "weights_bytes": self.weights.per_gpu_bytes,
            "weights": self.weights.to_dict(),
            "stack": [t.to_dict() for t in self.stack],
            "kv_memory_bytes": self.kv_memory_bytes,
            "exact": self.estimate.allocation.exact,  # the engine's allocation (False: labelled an estimate)
            "capacity": self.capacity.to_dict(),
            "fits": self.fits,
            "bytes_per_token": self.estimate.bytes_per_token,
            "fixed_bytes_per_sequence": self.estimate.fixed_bytes_per_sequence,
            "concurrency": self.concurrency,
            "gpus": self.replicas * self.tp * self.pp, "replicas": self.replicas,
            "total_max_concurrency": self.total_concurrency,
            "deployment": self.deployment(),
            "longest_context_for_concurrency": self.longest_context,
            "roofline": [r.__dict__ for r in self.roofline],
            "degradation": [level.__dict__ for level in self.levels],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "notes": list(self.notes),
            "host_tiers": self.host.to_dict() if self.host else None,
            "host_tier_advice": self.reuse.to_dict() if self.reuse else None,
            "speculative": self.drafter.to_dict() if self.drafter else None,
            "kv_band": self.band.to_dict(self.kv_memory_bytes, self.term_bytes(TermKey.SHARE)) if self.band else None}


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """What a plan was asked, so that alternatives can be planned with one thing changed."""

    model: ModelSpec
    engine: Engine
    gpu: str | None
    gpu_memory: int | None
    tp: int
    pp: int
    kv_dtype: str
    max_model_len: int
    options: EngineOptions
    weights: int | None
    activation: int | None
    overhead: int | None
    utilization: float | None
    gpus: int | None = None
    expert_parallel: bool = False

    @property
    def replicas(self) -> int:
        return (self.gpus or self.tp * self.pp) // (self.tp * self.pp)

    def with_tp(self, tp: int, node: int) -> tuple[dict[str, Any], str, Plan | None, int]:
        """Tensor parallel `tp` for as many replicas as now: its parameters, its GPUs in words, its plan (None where
        refused), and how many GPUs it adds."""
        gpus, replicas = tp * self.pp * self.replicas, self.replicas
        return ({"tp": tp, **({"gpus": gpus} if replicas > 1 else {})}, _gpus_note(tp, self.pp, node, replicas),
                self.plan(tp=tp, gpus=gpus if replicas > 1 else None), gpus - self.tp * self.pp * replicas)

    def plan(self, **changes: Any) -> Plan | None:
        """The plan with `changes` (no recommendations), or None where the engine refuses it."""
        args: dict[str, Any] = dict(
            model=self.model, engine=self.engine, gpu=self.gpu, gpu_memory=self.gpu_memory, tp=self.tp, pp=self.pp,
            kv_dtype=self.kv_dtype, max_model_len=self.max_model_len, options=self.options, weights=self.weights,
            activation=self.activation, overhead=self.overhead, utilization=self.utilization, beams=1,
            recommend=False, gpus=self.gpus if "tp" not in changes else None, expert_parallel=self.expert_parallel)
        args.update(changes)
        try:
            return plan(**args)
        except KVBudgetError:
            return None


def plan(
    model: ModelSpec,
    engine: str | Engine = "vllm",
    gpu: str | None = None,
    gpu_memory: int | None = None,
    gpus: int | None = None,
    tp: int = 1,
    pp: int = 1,
    kv_dtype: str = "auto",
    max_model_len: int | None = None,
    concurrency: int = 1,
    beams: int = 1,
    options: EngineOptions = EngineOptions(),
    weights: int | None = None,
    activation: int | None = None,
    overhead: int | None = None,
    utilization: float | None = None,
    kv_memory: int | None = None,
    recommend: bool = True,
    expert_parallel: bool = False,
) -> Plan:
    """Will `model` fit on this GPU with this engine, how many requests, how long a context, what to change.

    `gpu` names a card of the catalog (`kvbudget.gpus.gpus()`); `gpu_memory` (bytes) overrides its memory or
    stands alone. `weights`, `activation`, `overhead` (bytes) and `utilization` (the engine's memory fraction)
    override the computed or estimated terms; `kv_memory` skips the budget arithmetic altogether.
    `gpus` beyond tp x pp are data-parallel replicas, each with its own KV cache; with `expert_parallel` they are the
    data-parallel attention ranks of one expert-parallel group (an MoE model's routed experts spread over all
    `gpus`, the rest of the model on every rank: vLLM --data-parallel-size --enable-expert-parallel, SGLang
    --enable-dp-attention).
    """
    chosen = get_engine(engine)
    check_given(gpu_memory=gpu_memory, gpus=gpus, tp=tp, pp=pp, concurrency=concurrency, beams=beams,
                max_model_len=max_model_len, weights=weights, activation=activation, overhead=overhead,
                utilization=utilization, kv_memory=kv_memory)
    card = gpu_card(gpu, gpu_memory)
    gpus = gpus or tp * pp
    replicas = _replicas(gpus, tp, pp)
    max_len = max_model_len or model.max_position_embeddings
    if not max_len:
        raise KVBudgetError(f"max_model_len: {model.name}'s config has no max_position_embeddings; give "
                            "max_model_len", param="max_model_len")
    notes: list[str] = []

    given_options = options  # alternatives on other GPUs take their own defaults
    options = replace(options, compute_capability=options.compute_capability or card.compute_capability,
                      kv_cache_dtype=kv_dtype)  # both decide kernels (MLA blocks, attention)
    serving = chosen.serving(card.memory_bytes, max_len, options, gpu_name=card.name, tp=tp, model=model)
    options = serving.options
    w = _weights(model, chosen, tp, pp, options, replicas if expert_parallel else None, weights)
    band = budget_band(chosen, options, card) if kv_memory is None else None
    stack, kv_budget = memory_stack(model, serving, card, w, activation, overhead, utilization, band)
    if kv_memory is not None:
        stack = (stack[0], Term(key=TermKey.KV, name="KV budget (given)", bytes=kv_memory, estimate=False, note="",
                                param="kv_memory", given=True))
        kv_budget = kv_memory
    inputs = _Inputs(model=model, engine=chosen, gpu=gpu, gpu_memory=gpu_memory, tp=tp, pp=pp, kv_dtype=kv_dtype,
                     max_model_len=max_len, options=given_options, weights=weights, activation=activation,
                     overhead=overhead, utilization=utilization, gpus=gpus if gpus != tp * pp else None,
                     expert_parallel=expert_parallel)
    if kv_budget <= 0:
        raise _no_budget(inputs, card, w, stack, kv_budget, recommend)
    result = estimate(model, engine=chosen, kv_dtype=kv_dtype, batch=[concurrency], beams=beams, context=[max_len],
                      tp=tp, pp=pp, options=options, kv_memory=kv_budget, max_model_len=max_len)
    cap = result.capacity
    assert cap is not None  # a budget was given
    longest = longest_context(model, chosen, kv_budget, concurrency * beams, max_len, kv_dtype, tp, pp, options)
    roof = decode_roofline(result, w, card, concurrency * beams, tp, max_len)
    degradation = levels(kv_budget, cap.physical_token_slots, cap.max_concurrency, beams)
    recs = _recommend(inputs, card, beams, cap, result) if recommend else ()
    drafter = drafter_advice(chosen, inputs.plan, kv_memory, kv_budget, w, result, options) if recommend else None
    notes += list(result.notes)
    if card.bandwidth_bytes_per_s is None:
        notes.append(f"{card.name}: no bandwidth figure, so no decode roofline")
    if replicas > 1:
        notes.append(_replicas_note(gpus, replicas, tp * pp, replicas * cap.max_concurrency, max_len, expert_parallel))
    return Plan(model=model, engine=chosen, gpu=card.name, gpu_memory_bytes=card.memory_bytes, tp=tp, pp=pp, weights=w,
                stack=stack, kv_memory_bytes=kv_budget, capacity=cap, estimate=result, levels=degradation,
                concurrency=concurrency, longest_context=longest, roofline=roof, recommendations=recs,
                notes=tuple(dict.fromkeys(notes)), options=options, replicas=replicas, drafter=drafter, band=band)


def _replicas(gpus: int, tp: int, pp: int) -> int:
    """How many copies of tp x pp GPUs `gpus` make (data parallel)."""
    if tp * pp > gpus:
        raise KVBudgetError(f"gpus {gpus}: tensor parallel {tp} x pipeline parallel {pp} needs {tp * pp} GPUs",
                            param="gpus")
    if gpus % (tp * pp):
        raise KVBudgetError(f"gpus {gpus}: not a whole number of replicas of tensor parallel {tp} x pipeline "
                            f"parallel {pp} ({tp * pp} GPUs each); give a multiple of {tp * pp}", param="gpus")
    return gpus // (tp * pp)


def levels(kv_budget: int, token_slots: int, concurrency: float, beams: int = 1) -> tuple[Level, ...]:
    """The guard's degradation levels of a KV budget of `token_slots` tokens holding `concurrency` requests of
    max_model_len tokens, in bytes, tokens and requests (the plan's table; `kvbudget.deploy` from a Setup)."""
    return tuple(Level(name=lv.name, fraction=lv.threshold, kv_bytes=int(kv_budget * lv.threshold),
                       tokens=int(token_slots * lv.threshold), requests=int(concurrency * lv.threshold / beams),
                       action=lv.action, meaning=lv.meaning)
                 for lv in LEVELS)


def _replicas_note(gpus: int, replicas: int, each: int, requests: float, max_len: int, expert_parallel: bool) -> str:
    """What data parallelism over `gpus` gives: `replicas` copies of `each` GPUs, `requests` in all."""
    if expert_parallel:
        return (f"{gpus} GPUs: {replicas} data-parallel attention ranks of {each}, each with its own KV cache, "
                f"sharing the routed experts (expert parallel over {gpus}): {requests:.2f}x requests of "
                f"{max_len:,} tokens in all (vLLM --data-parallel-size {replicas} --enable-expert-parallel; SGLang "
                f"--enable-dp-attention --dp {replicas})")
    return (f"{gpus} GPUs: {replicas} replicas of {each} (data parallel), each with its own KV cache: {requests:.2f}x "
            f"requests of {max_len:,} tokens in all, behind a load balancer (vLLM --data-parallel-size, or one "
            "server per replica)")


def _weights(model: ModelSpec, chosen: Engine, tp: int, pp: int, options: EngineOptions, ep: int | None,
             weights: int | None) -> Weights:
    """The weights on each GPU: counted from the config, or `weights` bytes where given; `ep` spreads the routed
    experts over that many ranks."""
    try:
        if ep is not None and not chosen.expert_parallel:
            raise EngineRuleError(f"expert_parallel: {chosen.name} has no expert parallelism kvbudget models (vLLM "
                                  "and SGLang do)", param="expert_parallel")
        w = model_weights(model, tp, chosen.pipeline_stages(model.num_layers, pp, options.pp_layer_partition),
                          ep=ep or 1)
        if ep is not None and not any(g.part == "experts" for g in count_parameters(model).groups):
            raise EngineRuleError(f"expert_parallel: {model.name} has no routed experts to spread",
                                  param="expert_parallel")
    except ConfigError:
        if weights is None:
            raise
        # a family whose parameters kvbudget cannot count: the given bytes are all there is (read in full per step)
        w = Weights(total_params=0, active_params=0, mtp_params=0, total_bytes=weights * tp * pp, per_gpu_bytes=weights,
                    active_bytes=weights * tp * pp, exact=True,
                    basis=f"{GIVEN_WEIGHTS}; {model.model_type} parameters not counted")
    if weights is not None:
        w = replace(w, per_gpu_bytes=weights, exact=True, basis=w.basis if w.total_params == 0 else GIVEN_WEIGHTS)
    return chosen.as_loaded(w, model, options, tp, pp, ep or 1)


def _no_budget(inputs: _Inputs, card: GPU, w: Weights, stack: tuple[Term, ...], kv_budget: int,
               recommend: bool) -> NoKVBudget:
    """The error for weights and other memory that leave no KV budget, with what makes room."""
    model, chosen = inputs.model, inputs.engine
    advice = _make_room(inputs, card) if recommend else ()
    first = (f"; {advice[0].change}: {advice[0].effect}" if advice else
             "; no larger tensor parallel size or GPU makes room: a quantized checkpoint (give its size as weights)"
             if recommend else "; `kvbudget plan` says what makes room")
    message = (f"{model.name} on {card.name}: weights ({format_bytes(w.per_gpu_bytes)} per GPU) and the engine's "
               f"other memory leave no KV budget out of {format_bytes(card.memory_bytes)}{first}")
    return NoKVBudget(NoBudget(model=model.name, engine=chosen.name, gpu=card.name, gpu_memory_bytes=card.memory_bytes,
                               tp=inputs.tp, pp=inputs.pp, weights=w, stack=stack, kv_memory_bytes=kv_budget,
                               reason=message, recommendations=tuple(advice)))


def _similar_models(inputs: _Inputs, result: Estimate, base: float) -> list[Recommendation]:
    """Catalog models of similar size whose KV cache per token is clearly smaller."""
    from kvbudget import catalog
    from kvbudget.model.load import load_model

    model = inputs.model
    try:
        own = count_parameters(model)
    except ConfigError:  # no size of its own to compare with
        return []
    moe = own.active < own.total
    found = []
    for entry in catalog.entries():
        other = load_model(entry.name)
        if entry.name == model.name or (other.max_position_embeddings or 0) < inputs.max_model_len:
            continue
        try:
            theirs = count_parameters(other)
        except ConfigError:  # a family kvbudget cannot count yet has no size to compare
            continue
        if (theirs.active < theirs.total) != moe or abs(theirs.active / own.active - 1) > SIMILAR_SIZE or \
                (moe and abs(theirs.total / own.total - 1) > SIMILAR_SIZE):
            continue
        alt = inputs.plan(model=other)
        if alt is None:
            continue
        if alt.estimate.bytes_per_token <= SMALLER_CACHE * result.bytes_per_token and base:
            gain = alt.capacity.max_concurrency / base
            if gain > 1.0001:
                kinds = ", ".join(sorted(other.kinds()))
                found.append(Recommendation(
                    parameters={"model": entry.name}, note=f"a {'MoE' if moe else 'dense'} model of similar size "
                                                           f"({theirs.active / 1e9:.1f}B active)",
                    effect=f"{alt.estimate.bytes_per_token:,} bytes per token ({kinds}); "
                           f"{alt.capacity.max_concurrency:.2f}x requests of {alt.capacity.max_model_len:,} tokens",
                    gain=gain))
    return sorted(found, key=lambda r: -r.gain)[:2]


def longest_context(model: ModelSpec, engine: Engine, kv_budget: int, sequences: int, max_len: int, kv_dtype: str,
                     tp: int, pp: int, options: EngineOptions) -> int | None:
    """The longest request length at which `sequences` requests fit at once."""
    def ok(n: int) -> bool:
        try:
            c = estimate(model, engine=engine, kv_dtype=kv_dtype, context=[n], tp=tp, pp=pp, options=options,
                         kv_memory=kv_budget, max_model_len=n).capacity
        except KVBudgetError:
            return False
        return c is not None and c.fits and c.max_concurrency >= sequences

    best = largest_fitting(ok, max_len)
    return best or None


def _gpus_note(tp: int, pp: int, node: int = 8, replicas: int = 1) -> str:
    """'4 GPUs', '2 replicas of 4 GPUs', or, past one server of `node` GPUs, '16 GPUs on 2 nodes of 8: tensor
    parallel across nodes ...'."""
    n = tp * pp
    gpus = f"{replicas} replicas of {n} GPUs" if replicas > 1 else f"{n} GPUs"
    if n <= node:
        return gpus
    nodes = -(-n // node)
    across = "tensor parallel across nodes needs InfiniBand-class links; pipeline parallel across nodes is the " \
             "usual split" if tp > node else "pipeline stages on separate nodes"
    return f"{gpus}{', each' if replicas > 1 else ''} on {nodes} nodes of {node}: {across}"


# A larger card is offered in the card's own segment or a higher one: never a consumer card for a datacenter one.
_SEGMENT_RANK = {"consumer": 0, "workstation": 1, "datacenter": 2}


def _larger_gpus(card: GPU) -> list[GPU]:
    """Cards of the same vendor with clearly more memory, no older (NVIDIA: a compute capability at least the
    card's, so no V100 for an L4) and of no lower segment (no RTX-5090 for an L4), smallest first."""
    def newer(g: GPU) -> bool:
        if not (card.compute_capability and g.compute_capability):
            return True
        return tuple(map(int, g.compute_capability.split("."))) >= tuple(map(int, card.compute_capability.split(".")))

    def same_or_higher_segment(g: GPU) -> bool:
        return _SEGMENT_RANK.get(g.segment, 0) >= _SEGMENT_RANK.get(card.segment, 0)
    return sorted((g for g in all_gpus() if g.memory_bytes >= BIGGER_GPU_STEP * card.memory_bytes
                   and (not card.vendor or g.vendor == card.vendor) and newer(g) and same_or_higher_segment(g)),
                  key=lambda g: g.memory_bytes)


def _tp_steps(inputs: _Inputs, card: GPU) -> list[int]:
    """Larger tensor parallel sizes worth trying (powers of two up to 4 nodes) that divide the attention heads."""
    heads = inputs.model.attention_heads
    return [t for t in (inputs.tp * 2 ** k for k in range(1, 8)) if t * inputs.pp <= 4 * card.gpus_per_node
            and (not heads or heads % t == 0)]


def _make_room(inputs: _Inputs, card: GPU) -> tuple[Recommendation, ...]:
    """With no KV budget at all: the smallest tensor parallel size, and the smallest larger GPU, that leave one."""
    recs: list[Recommendation] = []
    if inputs.engine.serves:  # a library (transformers) runs on one device here
        for new_tp in _tp_steps(inputs, card):
            parameters, note, other, more = inputs.with_tp(new_tp, card.gpus_per_node)
            if other is not None:
                recs.append(Recommendation(parameters=parameters, note=note, effect=_fit_effect(other), gain=1.0,
                                           makes_it_fit=other.fits, more_gpus=more))
                break
    for g in _larger_gpus(card):
        other = inputs.plan(gpu=g.name, gpu_memory=None)
        if other is not None:
            recs.append(Recommendation(parameters={"gpu": g.name}, note="", effect=_fit_effect(other), gain=1.0,
                                       makes_it_fit=other.fits))
            break
    recs.extend(_offload(inputs, card))
    return tuple(sorted(recs, key=_order))


def _offload(inputs: _Inputs, card: GPU) -> list[Recommendation]:
    """Where the engine can keep part of the model in host memory: the most of it that fits on this GPU."""
    off = inputs.engine.offload(inputs.model, card.memory_bytes, inputs.max_model_len, inputs.kv_dtype,
                                inputs.options)
    if off is None:
        return []
    return [Recommendation(parameters={off.parameter: off.value}, note=off.note, gain=1.0, makes_it_fit=True,
                           effect=f"one request of {inputs.max_model_len:,} tokens with {off.value} of {off.of} on "
                                  "the GPU")]


def _fit_effect(other: Plan) -> str:
    cap = other.capacity
    if cap.fits and other.replicas > 1:
        return (f"{cap.max_concurrency:.2f}x requests of {cap.max_model_len:,} tokens per replica, "
                f"{other.total_concurrency:.2f}x in all")
    return (f"{cap.max_concurrency:.2f}x requests of {cap.max_model_len:,} tokens" if cap.fits else
            f"a KV budget of {format_bytes(other.kv_memory_bytes)}, requests up to {cap.estimated_max_model_len:,} "
            "tokens")


def _recommend(inputs: _Inputs, card: GPU, beams: int, cap: Capacity, result: Estimate) -> tuple[Recommendation, ...]:
    """Concrete changes and their computed effect on the maximum concurrency, best first."""
    engine, pp = inputs.engine, inputs.pp
    base = cap.max_concurrency * inputs.replicas  # requests at once over every replica
    recs: list[Recommendation] = []

    def add(parameters: dict[str, Any], note: str, other: Plan | None, extra: str = "", more_gpus: int = 0) -> None:
        if other is None:
            return
        gain = other.total_concurrency / base if base else float("inf")
        makes_it_fit = not cap.fits and other.capacity.fits
        if gain > 1.0001 or makes_it_fit:
            effect = f"{other.total_concurrency:.2f}x requests of {other.capacity.max_model_len:,} tokens " \
                     f"(now {base:.2f}x)"
            recs.append(Recommendation(parameters=parameters, note=note, effect=effect + extra, gain=gain,
                                       makes_it_fit=makes_it_fit, more_gpus=more_gpus))

    if not cap.fits:
        recs.extend(_offload(inputs, card))
    if not cap.fits and cap.estimated_max_model_len:  # the one change that makes the engine start as it is
        if inputs.plan(max_model_len=cap.estimated_max_model_len) is not None:
            recs.append(Recommendation(parameters={"max_model_len": cap.estimated_max_model_len}, note="",
                                       effect="the longest request that fits on this budget", gain=1.0,
                                       makes_it_fit=True))
    cheaper = engine.cheaper_kv_dtype(result.allocation.kv_dtype)
    if cheaper:
        add({"kv_dtype": cheaper}, "", inputs.plan(kv_dtype=cheaper),
            "; check quality on your own data first (KV quantization)")
    if engine.serves:  # tensor parallelism is a serving engine's (kvbudget runs transformers on one device)
        for new_tp in _tp_steps(inputs, card)[:2]:
            parameters, note, wider, more = inputs.with_tp(new_tp, card.gpus_per_node)
            add(parameters, note, wider, more_gpus=more)
    bigger = _larger_gpus(card)
    if bigger:
        add({"gpu": bigger[0].name}, "", inputs.plan(gpu=bigger[0].name, gpu_memory=None))
    if engine.expert_parallel and inputs.tp > 1 and not inputs.expert_parallel:
        # the same GPUs as data-parallel attention ranks sharing the experts: each keeps its own KV cache
        gpus = inputs.tp * pp * inputs.replicas
        add({"tp": 1, "gpus": gpus, "expert_parallel": True}, f"data-parallel attention over {gpus} GPUs with "
            f"expert parallelism: vLLM --data-parallel-size {gpus // pp} --enable-expert-parallel, SGLang "
            "--enable-dp-attention", inputs.plan(tp=1, gpus=gpus, expert_parallel=True))
    if inputs.model.has_windows and not engine.honours_windows(inputs.model):
        for other in serving_engines():
            if other.honours_windows(inputs.model):
                add({"engine": other.name}, "honours the model's sliding window", inputs.plan(engine=other))
                break
    recs.extend(_similar_models(inputs, result, base))
    if beams > 1:
        recs.append(Recommendation(parameters={"beams": 1}, note="no beam search",
                                   effect=f"{beams}x the requests: every beam is a sequence",
                                   gain=float(beams)))
    recs.sort(key=_order)
    return tuple(recs)


# What a change costs, cheapest first: a setting of the engine (on the same GPUs), then other or more hardware,
# then another model.
_COST = {"max_model_len": 0, "kv_dtype": 1, "engine": 1, "beams": 1, "expert_parallel": 1, "n_gpu_layers": 1, "tp": 2,
         "gpu": 2, "offload_memory": 2, "model": 3}


def with_recommendation(p: Plan, rec: Recommendation) -> Plan:
    """The plan with one more change, in its place among the others."""
    return replace(p, recommendations=tuple(sorted((*p.recommendations, rec), key=_order)))


def _order(r: Recommendation) -> tuple[bool, int, int, float]:
    """First the changes that make the deployment start (or fit) at all; then the rest. Each part cheapest first:
    settings before hardware, fewer added GPUs before more, then the largest gain."""
    cost = min((_COST.get(key, 2) for key in r.parameters), default=2)
    return (not r.makes_it_fit, cost, r.more_gpus, -r.gain)
