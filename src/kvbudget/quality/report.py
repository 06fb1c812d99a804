"""`kvbudget.quality.run`: the whole comparison as one call (what the CLI prints and `--json` writes).

The model and data come in; out come the transformers path's figures for each cache format, the real engine's
where one runs (`engine` names a kvbudget engine; llama.cpp runs `llama-perplexity` on a GGUF), the memory each
format takes in that engine (bytes per token from the engine's allocator, requests at once from the planner when
a GPU is given), and a one-line verdict on what the data supports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import kvbudget
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import Attention
from kvbudget.quality import llamacpp, load, measure, names, needle
from kvbudget.quality.formats import Variant, store
from kvbudget.quality.needle import NeedleResult

# engines whose real binary kvbudget quality can drive, by kvbudget engine name
REAL_ENGINES: dict[str, Callable[..., Any]] = {llamacpp.NAME: llamacpp.Perplexity}


@dataclass(frozen=True)
class Memory:
    """What one format costs in the engine: bytes per token (all layers), and requests at once on the GPU."""

    engine: str
    bytes_per_token: int | None  # None: the engine does not store this format
    gain: float | None  # tokens in the same memory, against the engine's default cache
    requests: float | None  # requests of max_model_len at once (a GPU given)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "bytes_per_token": self.bytes_per_token, "gain": self.gain,
                "requests": self.requests, "note": self.note}


@dataclass(frozen=True, kw_only=True)
class Report:
    model: str
    context: int
    data: tuple[str, ...]
    matmul: str  # how the linear layers took their inputs
    results: tuple[measure.VariantResult, ...]
    engine: str | None = None
    real: tuple[llamacpp.EngineResult, ...] | None = None  # the real engine's figures, same order
    memory: tuple[Memory, ...] | None = None
    first: int = 0  # positions before this in each window were context only
    max_model_len: int = 0  # the request length of the requests column
    notes: tuple[str, ...] = field(default=())
    divergence: tuple[measure.Divergence, ...] | None = None
    needle: tuple[NeedleResult, ...] | None = None  # the untouched cache first, then each format
    layers: tuple[float, ...] | None = None  # mean KL with `layers_variant` in one attention layer at a time
    layers_variant: str | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.results, self.context)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"model": self.model, "context": self.context, "data": list(self.data),
                               "matmul": self.matmul, "scored_from": self.first,
                               "results": [r.to_dict() for r in self.results], "verdict": self.verdict,
                               "notes": list(self.notes)}
        if self.memory is not None:
            doc["max_model_len"] = self.max_model_len
            for entry, mem in zip(doc["results"], self.memory, strict=True):
                entry["memory"] = mem.to_dict()
        if self.divergence is not None:
            doc["greedy_divergence"] = [d.to_dict() for d in self.divergence]
        if self.needle is not None:
            doc["needle"] = [n.to_dict() for n in self.needle]
        if self.layers is not None:
            doc["layers"] = {"variant": self.layers_variant, "kl_mean": list(self.layers)}
        if self.real is not None:
            doc["engine"] = self.engine
            doc["real_engine"] = [r.to_dict() for r in self.real]
        return doc


def verdict(results: Sequence[measure.VariantResult], context: int) -> str:
    """What the data supports: how often each format changes the most likely next token, and whether that is
    within the interval of the least costly format measured; how much data it was."""
    first = results[0]
    best = max(results, key=lambda r: r.top1.value)
    parts = []
    for r in results:
        part = f"{r.variant} {1 - r.top1.value:.1%}"
        if r is not best:
            part += f" (as {best.variant}, within the intervals)" if r.top1.high >= best.top1.low else \
                f" ({(best.top1.value - r.top1.value) * 100:.1f} points more than {best.variant})"
        parts.append(part)
    amount = f"{first.windows} window{'s' * (first.windows != 1)} of {context:,} tokens"
    caution = " Too little data for a firm answer: give more text." if first.windows < 4 else ""
    return f"Top token changed on {amount}: " + ", ".join(parts) + "." + caution


def check_model(spec: kvbudget.ModelSpec) -> None:
    """The transformers path passes attention K and V through the formats; other cache kinds it cannot."""
    others = sorted({s.kind for s in spec.layers if not isinstance(s, Attention)})
    if others:
        raise KVBudgetError(f"model: {spec.name} has {', '.join(others)} layers; kvbudget quality measures "
                            "attention K/V caches only", param="model")


def memory(spec: kvbudget.ModelSpec, variants: Sequence[Variant], engine: str, gpu: str | None,
           gpu_memory: int | None, max_model_len: int, weights: int | None) -> tuple[Memory, ...]:
    """Each format's memory in `engine` (its allocator and planner; K and V in different formats are not
    modelled by the engines here)."""
    reference = kvbudget.estimate(spec, engine=engine, kv_dtype="auto").bytes_per_token
    out = []
    for v in variants:
        if v.k != v.v:
            out.append(Memory(engine, None, None, None, "K and V apart: not modelled"))
            continue
        try:
            per_token = kvbudget.estimate(spec, engine=engine, kv_dtype=v.k).bytes_per_token
        except KVBudgetError as exc:
            out.append(Memory(engine, None, None, None, str(exc).split(";")[0]))
            continue
        requests = None
        if gpu is not None or gpu_memory is not None:
            plan = kvbudget.plan(spec, engine=engine, gpu=gpu, gpu_memory=gpu_memory, kv_dtype=v.k,
                                 max_model_len=max_model_len, weights=weights, recommend=False)
            requests = plan.capacity.max_concurrency if plan.capacity is not None else 0.0
        out.append(Memory(engine, per_token, reference / per_token, requests))
    return tuple(out)


def _check_counts(context: int, least: int, windows: int | None, data: Sequence[str], generate: int,
                  needle_trials: int) -> None:
    """Refuse a window shorter than `least` tokens, no windows or data, negative measures."""
    if context < least:
        raise KVBudgetError(f"context {context}: a window needs at least {least} tokens", param="context")
    if windows is not None and windows < 1:
        raise KVBudgetError(f"windows {windows}: give at least 1", param="windows")
    if not data:
        raise KVBudgetError("data: give at least one file", param="data")
    for value, param in ((generate, "generate"), (needle_trials, "needle_trials")):
        if value < 0:
            raise KVBudgetError(f"{param} {value}: give 0 (off) or more", param=param)


def _check_formats(spec: kvbudget.ModelSpec, variants: list[Variant], layers: str | None,
                   real_engine: str | None) -> None:
    """Refuse a format that cannot be stored before running anything."""
    attention = [s for s in spec.layers if isinstance(s, Attention)]
    for v in variants:
        if v.backend is not None:
            v.backend.cache(spec)  # the package is there and the model has full attention only
            if real_engine is not None:
                raise KVBudgetError(f"kv_dtype {v.name}: transformers' own cache; {real_engine} cannot run it "
                                    "(leave out the engine, or this format)", param="kv_dtype")
            continue
        for s in attention:
            store(v.k, s.k_dim, "k"), store(v.v, s.v_dim, "v")
    if layers is not None and Variant.parse(layers).backend is not None:
        raise KVBudgetError(f"layers {layers}: transformers' whole cache has no per-layer setting; give an "
                            "engine's format", param="layers")


def _check_header(head: load.Header, variants: list[Variant], context: int, max_model_len: int | None,
                  layers: str | None, engine: str | None, real: bool, gpu: str | None, gpu_memory: int | None
                  ) -> tuple[Memory, ...] | None:
    """Everything that needs only the model's header, refused before its weights load (half a minute); each
    format's memory in `engine` (a bad GPU or length fails here)."""
    spec, positions = head.spec, head.spec.max_position_embeddings
    check_model(spec)
    for value, param in ((context, "context"), (max_model_len, "max_model_len")):
        if value and positions and value > positions:
            raise KVBudgetError(f"{param} {value}: longer than {head.name}'s {positions:,} positions", param=param)
    _check_formats(spec, variants, layers, engine if real else None)
    if real and head.gguf is None:
        raise KVBudgetError(f"engine {engine}: {head.name} is not a .gguf file; llama.cpp runs GGUF models",
                            param="engine")
    if engine is None:
        return None
    weights = head.gguf.stat().st_size if head.gguf is not None else None
    return memory(spec, variants, engine, gpu, gpu_memory, max_model_len or context, weights)


def _run_engine(runner: Any, variants: list[Variant], step: Callable[[str], Callable[[int, int], None]]
                ) -> tuple[list[llamacpp.EngineResult], list[list[int]]]:
    """Each format through the real engine, and the token windows it scored."""
    step("llama-perplexity: baseline")(0, len(variants) + 1)
    try:
        results = []
        for i, v in enumerate(variants):
            step(f"llama-perplexity: {v.name}")(i + 1, len(variants) + 1)
            results.append(runner.compare(v))
        return results, [list(map(int, row)) for row in runner.tokens]
    finally:
        runner.close()


def _scaled(scales: tuple[tuple[float, float], ...], variants: list[Variant], layer_variant: Variant | None
            ) -> tuple[list[Variant], Variant | None]:
    """The formats that take scales, with `scales`."""
    if layer_variant is not None and layer_variant.scaled:
        layer_variant = replace(layer_variant, scales=scales)
    return [replace(v, scales=scales) if v.scaled else v for v in variants], layer_variant


def run(model: str | load.Loaded, data: Sequence[str], kv_dtypes: Sequence[str] = ("f16", "q8_0", "q4_0"),
        context: int = 512, windows: int | None = None, engine: str | None = None, gpu: str | None = None,
        gpu_memory: int | None = None, max_model_len: int | None = None, generate: int = 0,
        needle_trials: int = 0, layers: str | None = None, kv_scales: str = "1",
        progress: Callable[[str, int, int], None] | None = None) -> Report:
    """Compare each cache format in `kv_dtypes` with the untouched cache on the text of the `data` files.

    `model`: a model folder, a .gguf file, the bundled test model's name, or an already loaded model. `engine`
    (a kvbudget engine name) adds that engine's memory for each format and, where kvbudget can drive the real
    engine (llama.cpp on a GGUF), its own figures on the same windows. `progress(stage, done, total)` is called
    as the work advances. Optional measures: `generate` tokens of greedy generation from the first half of each
    window (where each format's generation first differs), a needle test with `needle_trials` passkeys per
    depth, and per-layer sensitivity of the format `layers` (one layer at a time, over at most two windows).
    `kv_scales`: "1" (vLLM's default for its fp8 formats: no calibration) or "dynamic" (per-layer scales from the
    first window, as vLLM's calculate_kv_scales computed them; measure.dynamic_scales)."""
    variants = [Variant.parse(v) for v in kv_dtypes]
    if not variants:
        raise KVBudgetError("kv_dtypes: give at least one format", param="kv_dtypes")
    names.check_scales(list(kv_dtypes), kv_scales)

    real = REAL_ENGINES.get(engine) if engine is not None else None
    if engine is not None:
        kvbudget.get_engine(engine)  # an unknown name fails here, before the model loads
    elif gpu is not None or gpu_memory is not None:
        raise KVBudgetError("gpu: requests at once need an engine too (e.g. vllm)", param="gpu")
    _check_counts(context, 4 if real is not None else 2, windows, data, generate, needle_trials)
    layer_variant = Variant.parse(layers) if layers is not None else None
    head = load.Header(model.name, model.spec, model.gguf) if isinstance(model, load.Loaded) else \
        load.read_header(model)
    mem = _check_header(head, variants, context, max_model_len, layers, engine, real is not None, gpu, gpu_memory)
    chats = any(str(name).endswith(".jsonl") for name in data)  # rendered with the model's tokenizer
    text = None if chats else load.read_text(None, list(data))  # plain text with nothing in it: refused now
    loaded = model if isinstance(model, load.Loaded) else load.load_model(model)
    text = text or load.read_text(loaded.tokenizer, list(data))
    notes = [f"linear layers without an input rule (left in float): {', '.join(loaded.unmodelled)}"] \
        if loaded.unmodelled else []

    def step(stage: str) -> Callable[[int, int], None]:
        return lambda done, total: progress(stage, done, total) if progress is not None else None

    engine_results = None
    first = 0
    if real is not None:
        assert loaded.gguf is not None
        engine_results, chunks = _run_engine(real(loaded.gguf, text, context, windows), variants, step)
        first = context // 2  # llama-perplexity scores the second half of each chunk
    else:
        ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < context:
            raise KVBudgetError(f"data: {len(ids):,} tokens, fewer than one window of {context}; give more text "
                                "or a shorter context", param="data")
        chunks = list(measure.windows(ids, context, windows))
        if any(v.backend for v in variants):  # score where transformers decodes one token at a time
            first = context // 2
    if kv_scales == "dynamic":  # per-layer scales from the first window
        variants, layer_variant = _scaled(measure.dynamic_scales(loaded, chunks[0]), variants, layer_variant)
    results = measure.compare(loaded, chunks, variants, first=first, progress=step("transformers"))
    div = measure.divergence(loaded, [c[:context // 2] for c in chunks], variants, generate,
                             step(f"greedy generation, {generate} tokens")) if generate else None
    hay = [t for c in chunks for t in c]
    found = needle.needle(loaded, hay, context, variants, needle_trials, step("needle test")) \
        if needle_trials else None
    per_layer = measure.layer_kl(loaded, chunks[:2], layer_variant, first, step(f"{layers}, layer by layer")) \
        if layer_variant is not None else None
    return Report(model=loaded.name, context=context, data=tuple(data), matmul=loaded.matmul, results=tuple(results),
                  engine=engine, real=tuple(engine_results) if engine_results is not None else None, memory=mem,
                  first=first, max_model_len=max_model_len or context, notes=tuple(notes),
                  divergence=tuple(div) if div is not None else None,
                  needle=tuple(found) if found is not None else None,
                  layers=tuple(per_layer) if per_layer is not None else None,
                  layers_variant=layer_variant.name if layer_variant is not None else None)
