"""Step times fitted on public per-operation measurements of real GPUs (data/steptimes/).

Each measurement is one kernel of a real engine on a real GPU (a projection, an attention call, a normalisation,
the sampler, an all-reduce) with the work it did: FLOPs, bytes moved, sequences. Per GPU and kind of operation
the fit finds the seconds a kernel takes for its work:

- projections and MoE experts: `fixed + max(weight bytes / bandwidth, FLOPs / throughput)` (a kernel reads its
  weights and computes at the same time; the slower wins),
- everything else: `fixed + bytes / bandwidth + FLOPs / throughput + sequences x per_sequence`,

by least squares on relative error with no negative part; projections and experts once per weight format measured
(16-bit, and fp8 or 4-bit where a table has them: each part of a model's weights runs on its own format's kernels,
the 16-bit ones standing in, labelled, where a GPU has none). A model's step is then the sum of its kernels, counted
from its config: because each term is in FLOPs and bytes, a fit transfers to models that were not profiled (how
far, the accuracy page says). A GPU without measurements takes the measured GPUs' efficiencies (each kernel's
fitted bandwidth and throughput as a share of their datasheet peaks) on its own datasheet, labelled an estimate:
those of its own architecture (the same compute capability: an A100 PCIe from the A100 SXM) where one is
measured, else every measured GPU's.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from kvbudget.engines.scheduling.timing import NOMINAL, TimeModel, nonnegative_fit
from kvbudget.errors import ConfigError
from kvbudget.interconnects import all_gather, all_reduce
from kvbudget.model.params import ParamGroup, activation_widths, count_parameters
from kvbudget.model.spec import Attention, LatentAttention, ModelSpec
from kvbudget.model.weights import WeightFormat, param_bytes, weight_formats
from kvbudget.simulation.bands import Basis, basis_of

if TYPE_CHECKING:
    from kvbudget.choices import Interconnect
    from kvbudget.gpus import GPU
    from kvbudget.planner import Plan

# kernels a vLLM decoder layer launches, beside its attention: QKV and output projections, the gated MLP's two
# (an MoE layer: the router and the fused experts); two norms, the activation and the rotary embedding
GEMMS_PER_LAYER = 4
ELEMENTWISE_PER_LAYER = 4
ALL_REDUCES_PER_LAYER = 2  # after attention and after the MLP, under tensor parallelism


@dataclass(frozen=True, kw_only=True)
class OpFit:
    """How long one kernel of a kind takes for its work, fitted on `rows` measurements."""

    op: str
    fixed: float  # seconds per call
    bandwidth: float  # bytes per second (0: no memory term)
    throughput: float  # FLOPs per second (0: no compute term)
    per_sequence: float  # seconds per sequence
    overlapped: bool  # memory and compute overlap: the slower of the two counts
    rows: int
    median_error: float  # median |predicted / measured - 1| over the rows fitted

    def seconds(self, flops: float, nbytes: float, sequences: float = 0.0) -> float:
        read = nbytes / self.bandwidth if self.bandwidth else 0.0
        compute = flops / self.throughput if self.throughput else 0.0
        work = max(read, compute) if self.overlapped else read + compute
        return self.fixed + work + sequences * self.per_sequence


@dataclass(frozen=True, kw_only=True)
class Measurement:
    op: str
    tp: int
    tokens: int
    sequences: int
    flops: float
    nbytes: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class GpuFit:
    """The fitted kernels of one GPU (by operation; all-reduces by TP degree) and what they rest on."""

    gpu: str
    ops: dict[str, OpFit]
    all_reduce: dict[int, OpFit]
    engine: str  # what ran the kernels (the sources are in data/steptimes/index.json and its README)

    def label(self) -> str:
        return f"kernels measured on {self.gpu} ({self.engine})"


def _index() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((resources.files("kvbudget") / "data" / "steptimes" / "index.json")
                                      .read_text(encoding="utf-8"))
    return data


def fitted_gpus() -> tuple[str, ...]:
    """Catalog names of the GPUs with per-operation measurements."""
    return tuple(_index()["gpus"])


def step_times_basis(gpu: str) -> str:
    """What `simulate`'s step times on `gpu` (a catalog name) rest on, in a few words."""
    from kvbudget.gpus import find_gpu

    entry = _index()["gpus"].get(gpu)
    if entry:
        return f"measured ({entry['engine']})"
    card = find_gpu(gpu)
    if not card.bandwidth_bytes_per_s or not card.half_tflops:
        return "roofline (no datasheet peaks to transfer to)"
    names = donors(card, "gemm")
    every = set(names) == set(fitted_gpus()) - {gpu}
    return f"transferred from {'every measured GPU' if every else ', '.join(names)} (estimate)"


def donors(card: GPU, op: str, without: Sequence[str] = ()) -> list[str]:
    """The measured GPUs `card` takes kernel `op` from: those of its architecture (compute capability) that
    measured it, else every GPU that did. `without`: GPUs left out."""
    from kvbudget.gpus import find_gpu

    have = [g for g in fitted_gpus() if g != card.name and g not in without
            if (f := gpu_fit(g)) is not None and op in f.ops]
    same = [g for g in have if card.compute_capability is not None
            and find_gpu(g).compute_capability == card.compute_capability]
    return same or have


def measurements(gpu: str) -> list[Measurement]:
    entry = _index()["gpus"][gpu]
    text = (resources.files("kvbudget") / "data" / "steptimes" / entry["file"]).read_text(encoding="utf-8")
    return [Measurement(op=r["op"], tp=int(r["tp"]), tokens=int(r["tokens"]), sequences=int(r["seqs"]),
                        flops=float(r["flops"]), nbytes=float(r["bytes"]), seconds=float(r["time_us"]) * 1e-6)
            for r in csv.DictReader(text.splitlines())]


TERMS = ("fixed", "bytes", "flops", "sequences")  # the terms a kernel's time can have


@cache
def gpu_fit(gpu: str) -> GpuFit | None:
    """The fitted kernels of `gpu` (a catalog name), or None where no measurements exist."""
    entry = _index()["gpus"].get(gpu)
    if entry is None:
        return None
    rows = measurements(gpu)
    ops = {}
    # projections and experts per weight format (ops gemm_<format>, moe_<format>: quantized weights' kernels)
    quantized = sorted({m.op for m in rows if m.op.startswith(("gemm_", "moe_"))})
    for op, overlapped, terms in (("gemm", True, TERMS[:3]), ("moe", True, TERMS[:3]),
                                  ("elementwise", False, TERMS[:2]), ("sampler", False, TERMS[:2]),
                                  *((q, True, TERMS[:3]) for q in quantized)):
        mine = [m for m in rows if m.op == op]
        if mine:
            ops[op] = fit_op(op, mine, overlapped, terms)
    # attention apart for decoding (one query per sequence: reading the KV cache) and for prefill chunks
    decode = [m for m in rows if m.op == "attention" and m.sequences == m.tokens]
    prefill = [m for m in rows if m.op == "attention" and m.sequences != m.tokens]
    if decode:
        ops["decode_attention"] = fit_op("decode_attention", decode, False, ("fixed", "bytes", "sequences"))
    if prefill:
        ops["prefill_attention"] = fit_op("prefill_attention", prefill, False, TERMS)
    reduce = {}
    for tp in sorted({m.tp for m in rows if m.op == "allreduce"}):
        reduce[tp] = fit_op("allreduce", [m for m in rows if m.op == "allreduce" and m.tp == tp], False, TERMS[:2])
    return GpuFit(gpu=gpu, ops=ops, all_reduce=reduce, engine=entry["engine"])


def fit_op(op: str, rows: Sequence[Measurement], overlapped: bool, terms: Sequence[str] = TERMS) -> OpFit:
    """Least squares on relative error over `terms`, no negative part. Overlapped: each row is memory- or
    compute-bound, assigned by the previous fit until the assignment settles."""
    varies = (True, any(m.nbytes for m in rows), any(m.flops for m in rows), len({m.sequences for m in rows}) > 1)
    columns = [j for j, t in enumerate(TERMS) if t in terms and varies[j]]

    def features(m: Measurement, bound: str | None) -> list[float]:
        full = [1.0, m.nbytes if bound != "compute" else 0.0, m.flops if bound != "memory" else 0.0,
                float(m.sequences)]
        return [full[j] / m.seconds for j in columns]

    def solve(bounds: list[str | None]) -> dict[int, float]:
        coef = nonnegative_fit([features(m, b) for m, b in zip(rows, bounds, strict=True)], [1.0] * len(rows))
        return dict(zip(columns, coef, strict=True))

    bounds: list[str | None] = [None] * len(rows)
    coef = solve(bounds)
    for _ in range(30 if overlapped else 0):
        new: list[str | None] = ["memory" if m.nbytes * coef.get(1, 0.0) >= m.flops * coef.get(2, 0.0) else "compute"
                                 for m in rows]
        if new == bounds:
            break
        bounds, coef = new, solve(new)
    fit = OpFit(op=op, fixed=coef.get(0, 0.0), bandwidth=1 / coef[1] if coef.get(1) else 0.0,
                throughput=1 / coef[2] if coef.get(2) else 0.0, per_sequence=coef.get(3, 0.0), overlapped=overlapped,
                rows=len(rows), median_error=0.0)
    errors = sorted(abs(fit.seconds(m.flops, m.nbytes, m.sequences) / m.seconds - 1) for m in rows)
    return replace(fit, median_error=errors[len(errors) // 2])


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """What one GPU's share of a model does per step, counted from the config (see `step_work`)."""

    layers: int
    attention_layers: int
    weight_bytes: float  # linear weights every step reads (routed experts apart)
    expert_bytes: float  # every routed expert's weights
    expert_share: float  # the share of the routed experts one token runs through
    lm_head_bytes: float
    flops_per_token: float  # linear layers' FLOPs per token (the LM head apart)
    lm_head_flops: float  # per sampled sequence
    elementwise_bytes_per_token: float  # per layer: norms, activation, rotary
    kv_bytes_per_token: float  # per attention layer, per cached token
    query_width: int  # query heads x head dim on this GPU
    hidden: int
    vocab: int
    tp: int
    dense_format: WeightFormat = WeightFormat.BF16  # how the quantizable linear weights are stored
    expert_format: WeightFormat = WeightFormat.BF16  # how the routed experts are


LINEAR_PARTS = ("attention", "mlp", "experts", "shared_expert", "mixer", "router")
DENSE_PARTS = tuple(p for p in LINEAR_PARTS if p != "experts")


def step_work(model: ModelSpec, plan: Plan) -> StepWork | None:
    """What one GPU of `plan` does per step for `model`, or None where its parameters are not counted."""
    try:
        groups = count_parameters(model).groups
        widths = activation_widths(model)
    except ConfigError:
        return None
    tp, w = plan.tp, plan.weights
    rate = _part_bytes(model, groups, w.total_bytes, w.total_params)
    attention = {s.layer: s for s in model.layers if isinstance(s, Attention | LatentAttention)}
    first = next(iter(attention.values()), None)
    heads = model.attention_heads or 0
    head_dim = first.k_dim if isinstance(first, Attention) else (first.expanded_k_dim if first is not None else 0)
    query = heads * head_dim // tp
    kv_width = first.kv_values(tp, "gpu")[0] if isinstance(first, Attention) else 0
    experts = [g for g in groups if g.part == "experts"]
    stored = sum(g.count for g in experts)
    formats = weight_formats(model)
    return StepWork(layers=model.num_layers, attention_layers=len(attention),
                    weight_bytes=sum(g.count * rate(g) for g in groups if g.part in DENSE_PARTS) / tp,
                    expert_bytes=sum(g.count * rate(g) for g in experts) / tp,
                    expert_share=sum(g.active for g in experts) / stored if stored else 0.0,
                    lm_head_bytes=widths.vocab * widths.hidden * rate(ParamGroup(part="lm_head", count=1, active=1))
                    / tp,
                    flops_per_token=2 * sum(g.active for g in groups if g.part in LINEAR_PARTS) / tp,
                    lm_head_flops=2 * widths.vocab * widths.hidden / tp,
                    elementwise_bytes_per_token=2 * (4 * widths.hidden + 3 * widths.mlp / tp + 2 * (query + kv_width)),
                    kv_bytes_per_token=plan.estimate.bytes_per_token / max(1, len(attention)), query_width=query,
                    hidden=widths.hidden, vocab=widths.vocab, tp=tp, dense_format=formats[0],
                    expert_format=formats[1])


def _part_bytes(model: ModelSpec, groups: Sequence[ParamGroup], total_bytes: float,
                total_params: int) -> Callable[[ParamGroup], float]:
    """Bytes per parameter of each part: its own format's (MXFP4 experts beside 16-bit attention, say), scaled so
    the parts add up to the weights' total bytes (exact where read from the checkpoint); where the checkpoint's
    format is not modelled, the weights' average over every part."""
    try:
        rate = param_bytes(model)
    except ConfigError:
        average = total_bytes / total_params if total_params else 2.0
        return lambda _: average
    counted = sum(g.count * rate(g) for g in groups if g.part != "mtp")
    scale = total_bytes / counted if counted else 1.0
    return lambda g: rate(g) * scale


# the kernels a step is built from; a GPU lacking one takes it from the GPUs that have it (MoE experts excepted:
# without their own measurements they run as projections do)
KERNELS = ("gemm", "elementwise", "sampler", "decode_attention", "prefill_attention")
# projections of quantized weights, transferred from GPUs of the same architecture only (else the 16-bit ones
# stand in, labelled: see time_model); their experts, as the 16-bit ones, are not transferred
QUANTIZED_GEMMS = tuple(f"gemm_{f.value}" for f in WeightFormat if f not in (WeightFormat.BF16, WeightFormat.OTHER))
# formats whose projections no measurement times (data/steptimes/README.md says why), and the format whose
# projection kernels stand in for them
STAND_IN = {WeightFormat.FP8_BLOCK: WeightFormat.FP8}
# the kernels most of a step's time is spent in: where a transferred card takes them from names its error band's
# basis (bands.basis_of; the norms and the sampler are measured on few GPUs and transferred to nearly all)
MAIN_KERNELS = ("gemm", "decode_attention", "prefill_attention")


@dataclass(frozen=True, kw_only=True)
class Kernels:
    """The kernels a step model uses on one card, and where each came from."""

    ops: dict[str, OpFit]
    all_reduce: dict[int, OpFit]
    label: str
    basis: Basis  # which held-out validation's error band applies (simulation/bands.py)
    quantized_from: dict[str, tuple[str, ...]] = field(default_factory=dict)  # transferred QUANTIZED_GEMMS: donors


def kernels_for(card: GPU, without: Sequence[str] = ()) -> Kernels | None:
    """`card`'s kernels: its own fits where it has measurements, the rest transferred from the GPUs that have
    them as fractions of their datasheet peaks (bandwidth, dense 16-bit FLOPS) applied to `card`'s datasheet,
    fixed costs their median. None where the card has no datasheet figures (the roofline's nominal case).
    `without`: GPUs whose measurements are left out (to check how well the transfer predicts them)."""
    from kvbudget.gpus import find_gpu

    if not card.bandwidth_bytes_per_s or not card.half_tflops:
        return None
    own = gpu_fit(card.name) if card.name not in without else None
    ops = dict(own.ops) if own is not None else {}
    moved: dict[str, list[str]] = {}
    for op in KERNELS:
        names = donors(card, op, without)
        if op not in ops and names:
            ops[op] = _transfer(op, [(f, find_gpu(g)) for g in names if (f := gpu_fit(g)) is not None], card)
            moved[op] = names
    quantized: dict[str, tuple[str, ...]] = {}
    for op in QUANTIZED_GEMMS:  # (from the same architecture only: an A100 has no fp8 units an H100's rate says)
        names = [g for g in donors(card, op, without) if find_gpu(g).compute_capability == card.compute_capability]
        if op not in ops and names:
            ops[op] = _transfer(op, [(f, find_gpu(g)) for g in names if (f := gpu_fit(g)) is not None], card)
            quantized[op] = tuple(names)
    if own is not None:
        label = own.label() + (f"; {_kinds(list(moved))} from {_names(moved)}" if moved else "")
    else:
        label = f"kernel efficiencies of {_names(moved)} on {card.name}'s datasheet (estimate)"
    return Kernels(ops=ops, all_reduce=own.all_reduce if own is not None else {}, label=label, quantized_from=quantized,
                   basis=basis_of(card, own is not None,
                                  [find_gpu(g) for op in MAIN_KERNELS for g in moved.get(op, [])]))


def _names(moved: dict[str, list[str]]) -> str:
    return ", ".join(dict.fromkeys(g for names in moved.values() for g in names))


def _kinds(ops: list[str]) -> str:
    """Kernel kinds in a few words: "attention" for both of its kinds, "norms" for the elementwise ones."""
    words = {"gemm": "projections", "elementwise": "norms", "sampler": "sampler", "decode_attention": "attention",
             "prefill_attention": "attention"}
    return ", ".join(dict.fromkeys(words.get(op) or f"{op.removeprefix('gemm_')} projections" for op in ops))


def _peaks(card: GPU) -> tuple[float, float]:
    """The card's datasheet bandwidth (bytes/s) and dense 16-bit TFLOPS, which every measured card and every card
    kernels are transferred to has."""
    assert card.bandwidth_bytes_per_s and card.half_tflops, card.name
    return card.bandwidth_bytes_per_s, card.half_tflops


def _transfer(op: str, fitted: list[tuple[GpuFit, GPU]], card: GPU) -> OpFit:
    fits = [(f.ops[op], _peaks(c)) for f, c in fitted]
    bandwidth = statistics.fmean(o.bandwidth / peak_bandwidth for o, (peak_bandwidth, _) in fits)
    throughput = statistics.fmean(o.throughput / (tflops * 1e12) for o, (_, tflops) in fits)
    card_bandwidth, card_tflops = _peaks(card)
    return OpFit(op=op, fixed=statistics.median(o.fixed for o, _ in fits), bandwidth=bandwidth
                 * card_bandwidth, throughput=throughput * card_tflops * 1e12,
                 per_sequence=statistics.median(o.per_sequence for o, _ in fits), overlapped=fits[0][0].overlapped,
                 rows=0, median_error=float("nan"))


def time_model(work: StepWork, kernels: Kernels, card: GPU, link: Interconnect | None = None) -> TimeModel:
    """The step time of `work` on `card`, as a TimeModel: the projections' weight read and compute overlapped,
    plus what is added per step, per token, per cached token, per attended pair and per sequence. Tensor
    parallelism all-reduces over `link` (None: the card's own, `GPU.link`)."""
    ops = kernels.ops
    gemm, elementwise = ops["gemm"], ops["elementwise"]
    dense, dense_note = quantized_kernel(kernels, work.dense_format, ("gemm",), "projections")
    experts, expert_note = quantized_kernel(kernels, work.expert_format, ("moe", "gemm"), "experts") if (
        work.expert_bytes) else (dense, "")
    decode, prefill, sampler = ops["decode_attention"], ops["prefill_attention"], ops["sampler"]
    overhead = work.layers * (GEMMS_PER_LAYER * dense.fixed + ELEMENTWISE_PER_LAYER * elementwise.fixed
                              + decode.fixed)
    overhead += gemm.fixed + 2 * elementwise.fixed + sampler.fixed  # LM head, embedding, final norm, sampler
    token_cost = _per((work.layers + 1) * work.elementwise_bytes_per_token, elementwise.bandwidth)
    # per sequence: its LM head row, its logits through the sampler, its attention call in every layer
    seq_cost = (_per(work.lm_head_flops, gemm.throughput) + _per(4 * work.vocab, sampler.bandwidth)
                + work.attention_layers * decode.per_sequence)
    basis = kernels.label + "".join(f"; {note}" for note in dict.fromkeys((dense_note, expert_note)) if note)
    if work.tp > 1:
        # each call reduces one 16-bit hidden vector per token: measured over the card's own link where its
        # table has the tp, else the link's public figures (interconnects.py)
        link = link or card.link
        measured = kernels.all_reduce.get(work.tp) if link is not None and link is card.link else None
        reduce = all_reduce(card, link, work.tp) if link is not None and measured is None else None
        calls = ALL_REDUCES_PER_LAYER * work.layers
        if measured is not None:
            basis += f"; all-reduce measured over {link}"
            overhead += calls * measured.fixed
            token_cost += _per(calls * 2 * work.hidden, measured.bandwidth)
        elif reduce is not None:
            basis += f"; {reduce.label}"
            overhead += calls * reduce.latency
            token_cost += calls * 2 * work.hidden / reduce.bandwidth
        else:
            basis += f"; no all-reduce (the catalog states no link figures for {card.name})"
    # (the LM head stays 16-bit in every checkpoint format modelled)
    weights = _per(work.weight_bytes, dense.bandwidth) + _per(work.lm_head_bytes, gemm.bandwidth)
    return TimeModel(weights=weights, per_context=0.0,
                     per_token=_per(work.flops_per_token, experts.throughput), overhead=overhead, bound="max",
                     token_cost=token_cost,
                     context_cost=_per(work.attention_layers * work.kv_bytes_per_token, decode.bandwidth),
                     pair_cost=_per(work.attention_layers * 4 * work.query_width, prefill.throughput),
                     seq_cost=seq_cost, experts=_per(work.expert_bytes, experts.bandwidth),
                     expert_share=work.expert_share, basis=basis, band_basis=kernels.basis.value)


GATHERS_PER_MOE_LAYER = 2  # vLLM's default all2all backend: an all-gather before the experts, a reduce-scatter after


def expert_parallel(tm: TimeModel, model: ModelSpec, card: GPU | None, link: Interconnect | None,
                    ranks: int) -> tuple[TimeModel, float, float]:
    """One rank's step in an expert-parallel group of `ranks` data-parallel ranks (vLLM --data-parallel-size
    --enable-expert-parallel), `tm` being its step alone at its tensor-parallel size: (the rank's time model, the
    group's all-gathers' seconds per step, and per token of the other ranks). As vLLM runs it (its default all2all
    backend `allgather_reducescatter`, vllm/distributed/device_communicators/all2all.py): each rank holds 1/ranks
    of the routed experts and runs them over every rank's tokens, so its expert FLOPs per token are those of the
    step alone (the routing taken as even) while the experts it reads are those the group's tokens route to (the
    share per token raised as if every rank ran as many tokens as this one: vLLM pads the ranks' steps to the
    largest under CUDA graphs); every MoE layer all-gathers the group's 16-bit hidden states before its experts and
    reduce-scatters them after, each rank receiving the other ranks' tokens each time over `link` (None: the
    card's own)."""
    if ranks < 2 or not tm.experts:
        return tm, 0.0, 0.0
    moe_layers = len({g.layer for g in count_parameters(model).groups if g.part == "experts"})
    link = link or (card.link if card is not None else None)
    gather = all_gather(card, link, ranks) if card is not None and link is not None else None
    basis = f"{tm.basis}; routed experts over {ranks} ranks"
    latency = per_token = 0.0
    if gather is not None:
        calls = GATHERS_PER_MOE_LAYER * moe_layers
        latency = calls * gather.latency
        per_token = calls * 2 * activation_widths(model).hidden / gather.bandwidth
        basis += f"; {gather.label}"
    else:
        basis += "; no all-gather time (the catalog states no link figures)"
    return (replace(tm, experts=tm.experts / ranks, expert_share=1.0 - (1.0 - tm.expert_share) ** ranks,
                    basis=basis), latency, per_token)


def quantized_kernel(kernels: Kernels, fmt: WeightFormat, kinds: Sequence[str],
                     what: str) -> tuple[OpFit, str]:
    """The fit that runs weights of format `fmt`: the first of `kinds` measured on that format, else (16-bit weights'
    kernels standing in) the first measured at all, with a note saying so ("" where none is needed)."""
    name = "quantized" if fmt is WeightFormat.OTHER else fmt.name.lower().replace("_", "-")
    if fmt is not WeightFormat.BF16:
        for kind in kinds:
            if (op := f"{kind}_{fmt.value}") in kernels.ops:
                donors = kernels.quantized_from.get(op)
                return kernels.ops[op], f"{name} {what} from {', '.join(donors)} (estimate)" if donors else ""
        stand_in = STAND_IN.get(fmt)
        if stand_in is not None and (op := f"gemm_{stand_in.value}") in kernels.ops:
            donors = kernels.quantized_from.get(op)
            return kernels.ops[op], (f"{name} {what} from {stand_in.name.lower()} per-tensor kernels"
                                     f"{' of ' + ', '.join(donors) if donors else ''} (estimate)")
    kind = next(k for k in kinds if k in kernels.ops)
    return kernels.ops[kind], "" if fmt is WeightFormat.BF16 else f"{name} {what} from bf16 kernels (estimate)"


def _per(amount: float, rate: float) -> float:
    """Seconds for `amount` at `rate` per second (0 where the fit found no such term)."""
    return amount / rate if rate else 0.0


def default_time_model(model: ModelSpec, p: Plan, card: GPU | None, link: Interconnect | None = None) -> TimeModel:
    """Kernels fitted on measurements (the card's own, or transferred from measured GPUs) where the card has
    datasheet figures and the model's parameters are counted; else the roofline. `link`: what tensor
    parallelism's GPUs are linked by (None: the card's own)."""
    kernels = kernels_for(card) if card is not None else None
    work = step_work(model, p) if kernels is not None else None
    if card is not None and kernels is not None and work is not None:
        return time_model(work, kernels, card, link)
    return _roofline(p, card)


def _roofline(p: Plan, card: GPU | None) -> TimeModel:
    """The roofline over the card's datasheet peaks; without them, nominal peaks (only a calibration helps)."""
    bandwidth, tflops = (card.bandwidth_bytes_per_s, card.half_tflops) if card is not None else (None, None)
    figures = bool(bandwidth and tflops)
    return TimeModel.roofline(p.weights.active_bytes / p.tp, p.estimate.bytes_per_token,
                              2 * p.weights.active_params / p.tp, bandwidth if bandwidth and tflops else 1e12,
                              tflops * 1e12 if bandwidth and tflops else 1e12,
                              "roofline estimate" if figures else NOMINAL)
