"""Run a real model over the user's text with its KV cache passed through each format, against the same run
with the cache untouched, and measure what changed in the next-token distributions.

The model runs in transformers on the CPU in float32. Every layer's K and V go through the format as they are
written to the cache (after RoPE, as engines store them); attention then reads the stored values, the current
tokens' included, as llama.cpp and vLLM do. The baseline uses the same cache class with nothing changed, so it
reproduces the model's own logits exactly.
"""

from __future__ import annotations

import math
import random
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from kvbudget.model.spec import Attention, ModelSpec
from kvbudget.quality.formats import Variant, as_llamacpp_keeps, query_store, store
from kvbudget.quality.hf_cache import Backend
from kvbudget.quality.load import Loaded

Store = Callable[[torch.Tensor], torch.Tensor]


class StoredLayer(DynamicLayer):
    """A transformers cache layer that keeps K and V as the engine's cache would give them back."""

    def __init__(self, k: Store | None, v: Store | None) -> None:
        super().__init__()
        self.k, self.v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is not None:
            key_states = self.k(key_states)
        if self.v is not None:
            value_states = self.v(value_states)
        return super().update(key_states, value_states, *args, **kwargs)


def cache_for(spec: ModelSpec, variant: Variant | None, only: int | None = None,
              base: Variant | None = None) -> Cache:
    """A cache for one forward pass: every attention layer through the variant's formats (None: untouched), or
    only layer `only` and the others in `base`'s."""
    layers: list[Any] = []
    for s in spec.layers:
        use = _layer_use(s.layer, variant, only, base)
        if use is None or not isinstance(s, Attention):
            layers.append(StoredLayer(None, None))
        else:
            layers.append(StoredLayer(store(use.k, s.k_dim, "k", use.scale(s.layer, "k")),
                                      store(use.v, s.v_dim, "v", use.scale(s.layer, "v"))))
    return Cache(layers=layers)


def _layer_use(layer: int, variant: Variant | None, only: int | None, base: Variant | None) -> Variant | None:
    """The variant layer `layer` stores in: `variant`, or with `only` set, `base` everywhere but that layer."""
    return base if only is not None and layer != only else variant


def _forward(model: Any, ids: Sequence[int], cache: Cache) -> torch.Tensor:
    """One forward pass over `ids` (batch 1) into `cache`: the logits [tokens, vocab]."""
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (transformers renames past_key_values in 5.40)
        return model(input_ids=torch.tensor([list(ids)]), past_key_values=cache, use_cache=True).logits[0]


# vLLM's divisors for scales computed at run time (vllm/envs.py K_SCALE_CONSTANT, V_SCALE_CONSTANT)
K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200.0, 100.0


def dynamic_scales(loaded: Loaded, ids: Sequence[int]) -> tuple[tuple[float, float], ...]:
    """Per-layer (K, V) scales as vLLM's `calculate_kv_scales` computed them (Attention.calc_kv_scales in vLLM
    0.6-0.11; gone by 0.32, which runs with scale 1.0 or the checkpoint's): max|K| / 200 and max|V| / 100 over
    the first batch the engine runs (K after RoPE), then fixed. Here the first batch is the window `ids`."""
    peaks: list[list[float]] = [[0.0, 0.0] for _ in loaded.spec.layers]

    def recorder(layer: int, half: int) -> Store:
        def record(x: torch.Tensor) -> torch.Tensor:
            peaks[layer][half] = max(peaks[layer][half], float(x.detach().abs().max()))
            return x
        return record

    cache = Cache(layers=[StoredLayer(recorder(i, 0), recorder(i, 1)) for i in range(len(loaded.spec.layers))])
    _use_our_attention(loaded.model)
    _forward(loaded.model, ids, cache)
    return tuple((k / K_SCALE_CONSTANT or 1.0, v / V_SCALE_CONSTANT or 1.0) for k, v in peaks)


# what the attention of the forward pass running now does to Q, by layer index
_QUERY: list[dict[int, Store | None]] = [{}]


def _attention(module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """transformers' sdpa attention, with Q passed through the engine's conversion first (if any)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    convert = _QUERY[0].get(getattr(module, "layer_idx", -1))
    return sdpa_attention_forward(module, convert(query) if convert is not None else query, *args, **kwargs)


_OURS: weakref.WeakSet[Any] = weakref.WeakSet()  # models already switched to our attention


def _use_our_attention(model: Any) -> None:
    from transformers import AttentionInterface

    if "kvbudget" not in AttentionInterface._global_mapping:
        AttentionInterface.register("kvbudget", _attention)
    if model not in _OURS:
        model.set_attn_implementation("kvbudget")
        _OURS.add(model)


def effective(loaded: Loaded, variant: Variant | None) -> Variant | None:
    """The variant as the engine keeps it (None: the untouched cache, which is `loaded.baseline`)."""
    if not loaded.as_llamacpp:
        return variant
    v = variant or Variant(loaded.baseline, loaded.baseline)
    return replace(v, k=as_llamacpp_keeps(v.k), v=as_llamacpp_keeps(v.v))


def _queries(loaded: Loaded, variant: Variant | None, only: int | None = None,
             base: Variant | None = None) -> dict[int, Store | None]:
    """Q's conversion in each attention layer, following that layer's K format (as cache_for assigns them)."""
    out: dict[int, Store | None] = {}
    for s in loaded.spec.layers:
        if isinstance(s, Attention):
            use = _layer_use(s.layer, variant, only, base)
            out[s.layer] = query_store(use.k, s.k_dim, loaded.as_llamacpp) if use is not None else None
    return out


def log_probs(loaded: Loaded, ids: Sequence[int], variant: Variant | None, only: int | None = None) -> torch.Tensor:
    """Log-softmax of the next-token logits at every position of one window, float32 [tokens, vocab]; `only`:
    the variant in that layer alone, the others untouched."""
    model, spec = loaded.model, loaded.spec
    _use_our_attention(model)
    variant, base = effective(loaded, variant), effective(loaded, None)
    _QUERY[0] = _queries(loaded, variant, only, base)
    try:
        return torch.log_softmax(_forward(model, ids, cache_for(spec, variant, only, base)).to(torch.float32), dim=-1)
    finally:
        _QUERY[0] = {}


@dataclass
class Tally:
    """One variant's per-token figures, window by window."""

    kl: list[torch.Tensor] = field(default_factory=list)  # KL(base || variant) per position
    agree: list[torch.Tensor] = field(default_factory=list)  # top-1 equal per position
    nll: list[torch.Tensor] = field(default_factory=list)  # -log p(next token) per predicted position
    base_nll: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Interval:
    value: float
    low: float  # 95% bootstrap interval over windows
    high: float


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    variant: str
    tokens: int
    windows: int
    kl_mean: Interval
    kl_p99: float
    kl_max: float
    top1: Interval  # share of positions whose most likely token is unchanged
    perplexity: float
    base_perplexity: float
    kl_by_position: tuple[float, ...] = ()  # mean KL over windows at each scored position, in order

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.base_perplexity - 1

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "tokens": self.tokens, "windows": self.windows,
                "kl_mean": self.kl_mean.value, "kl_mean_ci95": [self.kl_mean.low, self.kl_mean.high],
                "kl_p99": self.kl_p99, "kl_max": self.kl_max, "top1_agreement": self.top1.value,
                "top1_ci95": [self.top1.low, self.top1.high], "perplexity": self.perplexity,
                "base_perplexity": self.base_perplexity, "perplexity_change": self.perplexity_change,
                "kl_by_position": list(self.kl_by_position)}


def windows(ids: Sequence[int], context: int, limit: int | None = None) -> Iterator[list[int]]:
    """Consecutive whole windows of `context` tokens (the tail shorter than a window is left out)."""
    count = len(ids) // context
    if limit is not None:
        count = min(count, limit)
    for i in range(count):
        yield list(ids[i * context:(i + 1) * context])


def decode_log_probs(loaded: Loaded, ids: Sequence[int], backend: Backend | None, start: int) -> torch.Tensor:
    """Log-softmax at every position of one window as transformers' generate() computes them, teacher-forced:
    ids[:start] in one pass (the prompt), then one token per step, in `backend`'s QuantizedCache (None: an
    untouched cache, the same steps). [tokens, vocab], float32."""
    model = loaded.model
    _use_our_attention(model)
    _QUERY[0] = {}
    cache = backend.cache(loaded.spec) if backend is not None else cache_for(loaded.spec, None)
    rows = [_forward(model, ids[:start], cache)] + [_forward(model, [token], cache) for token in ids[start:]]
    return torch.log_softmax(torch.cat(rows).to(torch.float32), dim=-1)


def compare(loaded: Loaded, chunks: Sequence[Sequence[int]], variants: Sequence[Variant], first: int = 0,
            progress: Callable[[int, int], None] | None = None) -> list[VariantResult]:
    """Each variant against the untouched cache over the windows; the baseline runs once per window. Positions
    before `first` in each window are context only (llama-perplexity scores the second half); the last position
    has no next token, so perplexity stops before it."""
    tallies = {v: Tally() for v in variants}
    for w, chunk in enumerate(chunks):
        target = torch.tensor(chunk[first + 1:])
        n = len(target)
        split = first or len(chunk) // 2  # where transformers' QuantizedCache formats start decoding
        bases: dict[bool, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for v in variants:
            decoded = v.backend is not None  # transformers' QuantizedCache: against the same protocol untouched
            if decoded not in bases:
                base = (decode_log_probs(loaded, chunk, None, split) if decoded else log_probs(loaded, chunk, None))
                base = base[first:]
                bases[decoded] = (base, base.exp(), base.argmax(dim=-1), -base[:n].gather(1, target[:, None])[:, 0])
            base, p, top, base_nll = bases[decoded]
            q = (decode_log_probs(loaded, chunk, v.backend, split) if v.backend is not None
                 else log_probs(loaded, chunk, v))[first:]
            t = tallies[v]
            t.kl.append((p * (base - q)).sum(dim=-1).clamp(min=0))
            t.agree.append((q.argmax(dim=-1) == top).to(torch.float32))
            t.nll.append(-q[:n].gather(1, target[:, None])[:, 0])
            t.base_nll.append(base_nll)
        if progress is not None:
            progress(w + 1, len(chunks))
    return [_result(v, tallies[v]) for v in variants]


def _result(variant: Variant, t: Tally) -> VariantResult:
    kl = torch.cat(t.kl)
    by_position = torch.stack(t.kl).mean(dim=0).tolist() if len({len(x) for x in t.kl}) == 1 else []
    return VariantResult(variant=variant.name, tokens=len(kl), windows=len(t.kl), kl_mean=_bootstrap(t.kl),
                         kl_p99=float(torch.quantile(kl, 0.99)), kl_max=float(kl.max()), top1=_bootstrap(t.agree),
                         perplexity=math.exp(float(torch.cat(t.nll).mean())),
                         base_perplexity=math.exp(float(torch.cat(t.base_nll).mean())),
                         kl_by_position=tuple(by_position))


def _bootstrap(per_window: list[torch.Tensor], rounds: int = 1000) -> Interval:
    """The mean over all positions, with a 95% interval from resampling whole windows (seeded: repeatable)."""
    sums = [float(x.sum()) for x in per_window]
    counts = [len(x) for x in per_window]
    value = sum(sums) / sum(counts)
    if len(per_window) < 2:
        return Interval(value, value, value)
    rng = random.Random(0)
    n = len(per_window)
    means = []
    for _ in range(rounds):
        pick = [rng.randrange(n) for _ in range(n)]
        means.append(sum(sums[i] for i in pick) / sum(counts[i] for i in pick))
    means.sort()
    return Interval(value, means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1])


def layer_kl(loaded: Loaded, chunks: Sequence[Sequence[int]], variant: Variant, first: int = 0,
             progress: Callable[[int, int], None] | None = None) -> list[float]:
    """Mean KL against the untouched cache with the variant in one layer at a time (the others untouched), for
    each attention layer in order: which layers carry the loss."""
    layers = [s.layer for s in loaded.spec.layers if isinstance(s, Attention)]
    bases = [log_probs(loaded, chunk, None)[first:] for chunk in chunks]
    out = []
    for i, layer in enumerate(layers):
        total, count = 0.0, 0
        for chunk, base in zip(chunks, bases, strict=True):
            q = log_probs(loaded, chunk, variant, only=layer)[first:]
            total += float((base.exp() * (base - q)).sum(dim=-1).clamp(min=0).sum())
            count += len(base)
        out.append(total / count)
        if progress is not None:
            progress(i + 1, len(layers))
    return out


@dataclass(frozen=True)
class Divergence:
    """Where greedy generation with the variant's cache first leaves the untouched cache's."""

    variant: str
    prompts: int
    tokens: int  # tokens generated per prompt
    first: tuple[int | None, ...]  # per prompt: index of the first different token, None if none in `tokens`

    @property
    def median(self) -> float | None:
        """The median first difference, counting a prompt that never differs as `tokens` (None: none differ)."""
        if all(f is None for f in self.first):
            return None
        values = sorted(self.tokens if f is None else f for f in self.first)
        mid = len(values) // 2
        return float(values[mid]) if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "prompts": self.prompts, "tokens": self.tokens,
                "first_difference": list(self.first), "median": self.median}


def greedy(loaded: Loaded, prompt: Sequence[int], tokens: int, variant: Variant | None = None,
           plain: bool = False) -> list[int]:
    """Greedy generation as a server runs it: the prompt in one pass, then one token at a time, every K and V
    stored in the variant's format (None: untouched, as the engine keeps it; with `plain`, as transformers does)."""
    model, spec = loaded.model, loaded.spec
    _use_our_attention(model)
    if variant is not None and variant.backend is not None:
        _QUERY[0], cache = {}, variant.backend.cache(spec)
    elif plain:
        _QUERY[0], cache = {}, cache_for(spec, None)
    else:
        use = effective(loaded, variant)
        _QUERY[0], cache = _queries(loaded, use), cache_for(spec, use)
    out: list[int] = []
    try:
        ids = list(prompt)
        for _ in range(tokens):
            ids = [int(_forward(model, ids, cache)[-1].argmax())]
            out.extend(ids)
    finally:
        _QUERY[0] = {}
    return out


def divergence(loaded: Loaded, prompts: Sequence[Sequence[int]], variants: Sequence[Variant], tokens: int,
               progress: Callable[[int, int], None] | None = None) -> list[Divergence]:
    """For each prompt, greedy generation of `tokens` tokens with the untouched cache and with each variant's:
    the index of the first token that differs."""
    firsts: dict[Variant, list[int | None]] = {v: [] for v in variants}
    for n, prompt in enumerate(prompts):
        engine = greedy(loaded, prompt, tokens)
        plain = greedy(loaded, prompt, tokens, plain=True) if any(v.backend for v in variants) else engine
        for v in variants:
            own = greedy(loaded, prompt, tokens, v)
            base = plain if v.backend is not None else engine
            firsts[v].append(next((i for i, (a, b) in enumerate(zip(own, base, strict=True)) if a != b), None))
        if progress is not None:
            progress(n + 1, len(prompts))
    return [Divergence(v.name, len(prompts), tokens, tuple(firsts[v])) for v in variants]
