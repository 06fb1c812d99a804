"""The capacity planner: weights + engine budget + engine capacity + what to change.

Every figure comes from the model description, the engines' allocators and the GPU catalog; the terms
that are estimates (activation peak, non-torch overhead, CUDA graphs, default memory fractions) say so
and each has an override.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvbudget.engines import Capacity, EngineOptions
from kvbudget.engines.base import largest_fitting
from kvbudget.errors import KVBudgetError
from kvbudget.estimate import Estimate, estimate
from kvbudget.gpus import GPU, find_gpu, gpus as all_gpus
from kvbudget.model.config import Fields, model_type_of, text_config_of
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB, format_bytes
from kvbudget.weights import Weights, model_weights

# Defaults of the engines' memory knobs (vLLM 0.32 gpu_memory_utilization; SGLang mem_fraction_static on
# large cards; TGI's 0.9 x cuda_memory_fraction; llama.cpp and transformers take what is free).
DEFAULT_UTILIZATION = {"vllm": 0.92, "sglang": 0.88, "tgi": 0.9, "llamacpp": 1.0, "hf": 1.0, "hf-static": 1.0}
NON_TORCH_ESTIMATE = GIB // 2  # CUDA context, cuBLAS workspaces, NCCL buffers
CUDA_GRAPH_ESTIMATE = GIB // 2  # vLLM's captured graphs
MAX_NUM_SEQS = 256  # vLLM's default: the profiling run samples this many sequences
LEVELS = ((0.70, "warn", "cap_max_tokens", "log a warning and lower max_new_tokens"),
          (0.85, "single-beam", "force_single_sample", "force a single beam / sample (n=1, no beam search)"),
          (0.95, "reject", "reject_503", "reject new requests with 503 and alert"))


@dataclass(frozen=True)
class Term:
    """One slice of GPU memory in the plan."""

    name: str
    bytes: int
    estimate: bool
    note: str


@dataclass(frozen=True)
class Level:
    name: str
    fraction: float
    kv_bytes: int
    tokens: int  # tokens in the cache at this level
    requests: float  # concurrent requests of max_model_len at this level
    action: str  # machine name the guard acts on
    meaning: str  # for people


@dataclass(frozen=True)
class Roofline:
    context: int
    batch: int
    step_seconds: float  # lower bound: bytes read per decode step / HBM bandwidth
    tokens_per_second: float  # per sequence
    aggregate_tokens_per_second: float


@dataclass(frozen=True)
class Recommendation:
    change: str
    effect: str
    gain: float  # factor on maximum concurrency (1.0 = no change)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    engine: str
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

    @property
    def fits(self) -> bool:
        return self.capacity.fits

    def to_dict(self) -> dict:
        return {
            "model": self.model.name, "engine": self.engine, "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes, "tp": self.tp, "pp": self.pp,
            "parameters": {"total": self.weights.total_params, "active": self.weights.active_params,
                           "mtp": self.weights.mtp_params},
            "weights_bytes": self.weights.per_gpu_bytes,
            "weights": self.weights.to_dict(),
            "stack": [{"name": t.name, "bytes": t.bytes, "estimate": t.estimate, "note": t.note} for t in self.stack],
            "kv_memory_bytes": self.kv_memory_bytes,
            "capacity": self.capacity.to_dict(),
            "fits": self.fits,
            "bytes_per_token": self.estimate.bytes_per_token,
            "fixed_bytes_per_sequence": self.estimate.fixed_bytes_per_sequence,
            "concurrency": self.concurrency,
            "longest_context_for_concurrency": self.longest_context,
            "roofline": [r.__dict__ for r in self.roofline],
            "degradation": [l.__dict__ for l in self.levels],
            "recommendations": [r.__dict__ for r in self.recommendations],
            "notes": list(self.notes),
        }


def activation_estimate(model: ModelSpec, tokens: int) -> int:
    """Peak activation of a profiling forward pass over `tokens` tokens (an estimate): hidden states,
    attention and MLP intermediates in 2 bytes per value, plus float32 logits for the sampled sequences."""
    cfg = text_config_of(model.config)
    f = Fields(cfg, model_type_of(model.config) or "", model.name)
    hidden = f.int("hidden_size", "n_embd", "d_model")
    vocab = f.int("vocab_size", "padded_vocab_size")
    inter = f.get("intermediate_size", "ffn_hidden_size", "ffn_dim", default=4 * hidden) or 4 * hidden
    moe_inter = f.get("moe_intermediate_size")
    top_k = f.get("num_experts_per_tok", "experts_per_token")
    if moe_inter and top_k:
        inter = max(inter if not f.get("n_routed_experts") else 0, moe_inter * top_k)
    per_token = (4 * hidden + 2 * inter) * 2
    return tokens * per_token + min(tokens, MAX_NUM_SEQS) * vocab * 4


def plan(
    model: ModelSpec,
    engine: str = "vllm",
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
) -> Plan:
    """Will `model` fit on this GPU with this engine, how many requests, how long a context, what to change."""
    card = _card(gpu, gpu_memory)
    if tp <= 0 or pp <= 0 or concurrency <= 0 or beams <= 0:
        raise KVBudgetError("--tp, --pp, --concurrency and --beams must be positive")
    gpus = gpus or tp * pp
    if tp * pp > gpus:
        raise KVBudgetError(f"--gpus {gpus}: tensor parallel {tp} x pipeline parallel {pp} needs {tp * pp} GPUs")
    max_len = max_model_len or model.max_position_embeddings
    if not max_len:
        raise KVBudgetError(f"{model.name}: config has no max_position_embeddings; pass --max-model-len")
    notes: list[str] = []

    w = model_weights(model, tp, pp)
    if weights is not None:
        w = replace(w, per_gpu_bytes=weights, exact=True, basis="given with --weights")
    stack, kv_budget = _budget(model, engine, card, w, max_len, options, activation, overhead, utilization)
    if kv_memory is not None:
        stack = (stack[0], Term("KV budget (given)", kv_memory, False, "--kv-memory"))
        kv_budget = kv_memory
    if kv_budget <= 0:
        raise KVBudgetError(
            f"{model.name} on {card.name}: weights ({format_bytes(w.per_gpu_bytes)} per GPU) and the engine's other "
            f"memory leave no KV budget out of {format_bytes(card.memory_bytes)}; try --tp {tp * 2}, a larger "
            "--gpu, or a quantized checkpoint"
        )
    result = estimate(model, engine=engine, kv_dtype=kv_dtype, batch=[concurrency], beams=beams,
                      context=sorted({1024, 4096, 16384, max_len} - {0}), tp=tp, pp=pp, options=options,
                      kv_memory=kv_budget, max_model_len=max_len)
    cap = result.capacity
    longest = _longest_context(model, engine, kv_budget, concurrency * beams, max_len, kv_dtype, tp, pp, options)
    roof = _roofline(result, w, card, concurrency * beams, tp, max_len)
    levels = tuple(Level(name, frac, int(kv_budget * frac), int(cap.physical_token_slots * frac),
                         cap.max_concurrency * frac / beams, action, meaning)
                   for frac, name, action, meaning in LEVELS)
    recs = _recommend(model, engine, card, tp, pp, kv_dtype, max_len, beams, options, cap, result,
                      dict(weights=weights, activation=activation, overhead=overhead, utilization=utilization)) \
        if recommend else ()
    notes += list(result.notes)
    if card.bandwidth_bytes_per_s is None:
        notes.append(f"{card.name}: no bandwidth figure, so no decode roofline")
    return Plan(model, engine, card.name, card.memory_bytes, tp, pp, w, stack, kv_budget, cap, result,
                concurrency, longest, roof, levels, recs, tuple(notes))


def _card(gpu: str | None, gpu_memory: int | None) -> GPU:
    if gpu_memory is not None:
        base = find_gpu(gpu) if gpu else None
        return GPU(base.name if base else "custom", gpu_memory, "given with --gpu-memory",
                   base.bandwidth_bytes_per_s if base else None, base.bf16_tflops if base else None,
                   base.fp8_tflops if base else None, "--gpu-memory")
    if gpu is None:
        raise KVBudgetError("name a GPU with --gpu NAME (kvbudget gpus lists them) or give --gpu-memory SIZE")
    return find_gpu(gpu)


def _budget(model, engine, card, w, max_len, options, activation, overhead, utilization):
    """The memory stack of one GPU and the KV budget the engine derives from it."""
    util = DEFAULT_UTILIZATION[engine] if utilization is None else utilization
    if not 0 < util <= 1:
        raise KVBudgetError(f"--utilization {util}: must be in (0, 1]")
    # Tokens of the largest forward pass the engine plans for: vLLM's max_num_batched_tokens, TGI's
    # max_batch_prefill_tokens (4096), llama.cpp's n_ubatch (512), transformers' prompt; SGLang keeps
    # activations in the (1 - mem_fraction_static) it leaves aside.
    tokens = {"vllm": options.max_num_batched_tokens or 2048, "tgi": 4096, "llamacpp": 512,
              "sglang": 0}.get(engine, min(max_len, 4096))
    act = (activation_estimate(model, tokens) if tokens else 0) if activation is None else activation
    default_other = 0 if engine == "sglang" else NON_TORCH_ESTIMATE + (CUDA_GRAPH_ESTIMATE if engine == "vllm" else 0)
    other = default_other if overhead is None else overhead
    usable = int(card.memory_bytes * util)
    kv = usable - w.per_gpu_bytes - act - other
    stack = (
        Term("GPU memory", card.memory_bytes, card.memory_basis.startswith("nominal"), f"{card.name}, {card.memory_basis}"),
        Term(f"engine share ({util:g})", usable, utilization is None and util != 1.0,
             "gpu_memory_utilization / mem_fraction_static / cuda_memory_fraction default" if utilization is None
             else "--utilization"),
        Term("weights", w.per_gpu_bytes, not w.exact, w.basis),
        Term("activation peak", act, activation is None,
             f"profiling pass over {tokens} tokens (estimate; --activation overrides)" if activation is None
             else "--activation"),
        Term("overhead", other, overhead is None,
             "non-torch memory and CUDA graphs (estimate; --overhead overrides)" if overhead is None else "--overhead"),
        Term("KV budget", kv, activation is None or overhead is None or not w.exact, "what is left for the KV cache"),
    )
    return stack, kv


def _similar_models(model, engine, card, tp, pp, kv_dtype, max_len, options, result, base, overrides):
    """Catalog models of similar size (+-35% parameters) whose KV cache per token is at least 25% smaller."""
    from kvbudget import catalog
    from kvbudget.model.load import load_model
    from kvbudget.model.params import count_parameters

    size = count_parameters(model).total
    found = []
    for entry in catalog.entries():
        other = load_model(entry.name)
        if (entry.name == model.name or (other.max_position_embeddings or 0) < max_len
                or not 0.65 <= count_parameters(other).total / size <= 1.35):
            continue
        try:
            alt = plan(other, engine=engine, gpu=card.name if card.source != "--gpu-memory" else None,
                       gpu_memory=card.memory_bytes if card.source == "--gpu-memory" else None, tp=tp, pp=pp,
                       kv_dtype=kv_dtype, max_model_len=max_len,
                       options=options, recommend=False, weights=overrides.get("weights"),
                       activation=overrides.get("activation"), overhead=overrides.get("overhead"),
                       utilization=overrides.get("utilization"))
        except KVBudgetError:
            continue
        if alt.estimate.bytes_per_token <= 0.75 * result.bytes_per_token and base:
            gain = alt.capacity.max_concurrency / base
            if gain > 1.0001:
                kinds = ", ".join(sorted(other.kinds()))
                found.append(Recommendation(
                    f"a model of similar size: {entry.name}",
                    f"{alt.estimate.bytes_per_token:,} bytes per token ({kinds}); "
                    f"{alt.capacity.max_concurrency:.2f}x requests of {alt.capacity.max_model_len:,} tokens", gain))
    return sorted(found, key=lambda r: -r.gain)[:2]


def _longest_context(model, engine, kv_budget, sequences, max_len, kv_dtype, tp, pp, options) -> int | None:
    """The longest request length at which `sequences` requests fit at once."""
    def ok(n: int) -> bool:
        try:
            c = estimate(model, engine=engine, kv_dtype=kv_dtype, context=[n], tp=tp, pp=pp, options=options,
                         kv_memory=kv_budget, max_model_len=n).capacity
        except KVBudgetError:
            return False
        return c.fits and c.max_concurrency >= sequences

    best = largest_fitting(ok, max_len)
    return best or None


def _roofline(result: Estimate, w: Weights, card: GPU, sequences: int, tp: int, max_len: int) -> tuple[Roofline, ...]:
    if card.bandwidth_bytes_per_s is None:
        return ()
    rows = []
    for context in sorted({1024, 4096, 16384, 32768, max_len}):
        if context > max_len:
            continue
        read = w.active_bytes / tp + result.allocation.kv_bytes(sequences, context)
        step = read / card.bandwidth_bytes_per_s
        rows.append(Roofline(context, sequences, step, 1 / step, sequences / step))
    return tuple(rows)


def _recommend(model, engine, card, tp, pp, kv_dtype, max_len, beams, options, cap, result, overrides):
    """Concrete changes and their computed effect on the maximum concurrency, best first."""
    base = cap.max_concurrency
    recs: list[Recommendation] = []

    def alt(**changes):
        args = dict(model=model, engine=engine, gpu=card.name if card.source != "--gpu-memory" else None,
                    gpu_memory=card.memory_bytes if card.source == "--gpu-memory" else None, tp=tp, pp=pp,
                    kv_dtype=kv_dtype, max_model_len=max_len, beams=1, options=options, recommend=False, **overrides)
        args.update(changes)
        try:
            return plan(**args)
        except KVBudgetError:
            return None

    def add(change: str, other, extra: str = "") -> None:
        if other is None:
            return
        gain = other.capacity.max_concurrency / base if base else float("inf")
        if gain > 1.0001 or (not cap.fits and other.capacity.fits):
            effect = f"{other.capacity.max_concurrency:.2f}x requests of {other.capacity.max_model_len:,} tokens " \
                     f"(now {base:.2f}x)"
            recs.append(Recommendation(change, effect + extra, gain))

    if result.allocation.kv_dtype.block_bytes > 1:
        fp8 = "q8_0" if engine == "llamacpp" else "fp8"
        add(f"--kv-dtype {fp8}", alt(kv_dtype=fp8), "; check quality on your own data first (KV quantization)")
    if not cap.fits and cap.estimated_max_model_len:
        shorter = alt(max_model_len=cap.estimated_max_model_len)
        if shorter is not None:
            recs.append(Recommendation(f"--max-model-len {cap.estimated_max_model_len}",
                                       "the longest request that fits on this budget", 1.0))
    for new_tp in (2 * tp, 4 * tp):
        add(f"--tp {new_tp} ({new_tp * pp} GPUs)", alt(tp=new_tp))
    vendor = card.source.split()[0]
    bigger = sorted((g for g in all_gpus() if g.memory_bytes >= 1.4 * card.memory_bytes
                     and (card.source == "--gpu-memory" or g.source.split()[0] == vendor)),
                    key=lambda g: g.memory_bytes)
    if bigger:
        add(f"--gpu {bigger[0].name}", alt(gpu=bigger[0].name, gpu_memory=None))
    windowed = any(s.kind in ("sliding_window", "chunked_local") for s in model.layers)
    if windowed and engine in ("sglang", "tgi"):
        add("--engine vllm (honours the model's sliding window)", alt(engine="vllm"))
    recs.extend(_similar_models(model, engine, card, tp, pp, kv_dtype, max_len, options, result, base, overrides))
    if beams > 1:
        recs.append(Recommendation("no beam search (--beams 1)", f"{beams}x the requests: every beam is a sequence",
                                   float(beams)))
    recs.sort(key=lambda r: -r.gain)
    return tuple(recs)


def guard_config_yaml(p: Plan) -> str:
    """The degradation plan as YAML for `kvbudget guard` (written without a YAML library; plain scalars)."""
    lines = [
        "# kvbudget guard configuration, written by `kvbudget plan --guard-config`",
        f"# {p.model.name} on {p.gpu} with {p.engine}; thresholds are fractions of the KV budget.",
        f"model: {p.model.name}",
        f"engine: {p.engine}",
        f"gpu: {p.gpu}",
        f"tp: {p.tp}",
        f"kv_budget_bytes: {p.kv_memory_bytes}",
        f"kv_cache_tokens: {p.capacity.physical_token_slots}",
        f"bytes_per_token: {p.estimate.bytes_per_token}",
        f"fixed_bytes_per_sequence: {p.estimate.fixed_bytes_per_sequence}",
        f"max_model_len: {p.capacity.max_model_len}",
        "hysteresis: 0.05",
        "levels:",
    ]
    for level in p.levels:
        lines += [
            f"  - name: {level.name}",
            f"    threshold: {level.fraction}",
            f"    action: {level.action}",
            f"    kv_bytes: {level.kv_bytes}",
            f"    tokens: {level.tokens}",
            f"    requests: {level.requests:.2f}",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Comparison:
    """One model's row in `kvbudget compare`."""

    model: str
    cache: dict  # layer kinds and how many
    bytes_per_token: int
    fixed_bytes_per_sequence: int
    kv_bytes_at_context: int  # one sequence of `context` tokens
    context: int
    kv_memory_bytes: int | None  # with a GPU: the KV budget on it
    max_concurrency: float | None  # requests of `context` tokens at once
    longest_context: int | None  # the longest single request on one GPU (up to the model's maximum)
    note: str = ""


def compare(models: list[ModelSpec], engine: str = "vllm", gpu: str | None = None, gpu_memory: int | None = None,
            context: int = 8192, kv_dtype: str = "auto", options: EngineOptions = EngineOptions()) -> tuple:
    """Models side by side: bytes per token, and with a GPU, capacity and the longest context that fits."""
    rows = []
    for model in models:
        est = estimate(model, engine=engine, kv_dtype=kv_dtype, context=[context], options=options)
        budget = concurrency = longest = None
        note = ""
        if gpu or gpu_memory:
            try:
                p = plan(model, engine=engine, gpu=gpu, gpu_memory=gpu_memory, kv_dtype=kv_dtype,
                         max_model_len=context, options=options, recommend=False)
                budget, concurrency = p.kv_memory_bytes, p.capacity.max_concurrency
                top = model.max_position_embeddings or context
                longest = _longest_context(model, engine, budget, 1, top, kv_dtype, 1, 1, options)
            except KVBudgetError as exc:
                note = str(exc)
        rows.append(Comparison(model.name, model.kinds(), est.bytes_per_token, est.fixed_bytes_per_sequence,
                               est.points[0].kv_bytes, context, budget, concurrency, longest, note))
    return tuple(rows)
