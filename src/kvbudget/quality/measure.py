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
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from kvbudget.model.spec import Attention, ModelSpec
from kvbudget.quality.formats import Variant, query_store, store
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


def cache_for(spec: ModelSpec, variant: Variant | None, only: int | None = None) -> Cache:
    """A cache for one forward pass: every attention layer through the variant's formats (None: untouched), or
    only layer `only`."""
    layers: list[Any] = []
    for s in spec.layers:
        if variant is None or not isinstance(s, Attention) or (only is not None and s.layer != only):
            layers.append(StoredLayer(None, None))
        else:
            layers.append(StoredLayer(store(variant.k, s.k_dim, "k"), store(variant.v, s.v_dim, "v")))
    return Cache(layers=layers)


_QUERY: list[Store | None] = [None]  # what the attention of the forward pass running now does to Q


def _attention(module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """transformers' sdpa attention, with Q passed through the engine's conversion first (if any)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    convert = _QUERY[0]
    return sdpa_attention_forward(module, convert(query) if convert is not None else query, *args, **kwargs)


_OURS: weakref.WeakSet[Any] = weakref.WeakSet()  # models already switched to our attention


def _use_our_attention(model: Any) -> None:
    from transformers import AttentionInterface

    if "kvbudget" not in AttentionInterface._global_mapping:
        AttentionInterface.register("kvbudget", _attention)
    if model not in _OURS:
        model.set_attn_implementation("kvbudget")
        _OURS.add(model)


def log_probs(loaded: Loaded, ids: Sequence[int], variant: Variant | None, only: int | None = None) -> torch.Tensor:
    """Log-softmax of the next-token logits at every position of one window, float32 [tokens, vocab]."""
    model, spec = loaded.model, loaded.spec
    _use_our_attention(model)
    k_dims = {s.k_dim for s in spec.layers if isinstance(s, Attention)}
    _QUERY[0] = query_store(variant.k, k_dims.pop()) if variant is not None and len(k_dims) == 1 else None
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # (transformers renames past_key_values in 5.40)
            out = model(input_ids=torch.tensor([list(ids)]), past_key_values=cache_for(spec, variant, only),
                        use_cache=True)
            return torch.log_softmax(out.logits[0].to(torch.float32), dim=-1)
    finally:
        _QUERY[0] = None


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


@dataclass(frozen=True)
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

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.base_perplexity - 1

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "tokens": self.tokens, "windows": self.windows,
                "kl_mean": self.kl_mean.value, "kl_mean_ci95": [self.kl_mean.low, self.kl_mean.high],
                "kl_p99": self.kl_p99, "kl_max": self.kl_max, "top1_agreement": self.top1.value,
                "top1_ci95": [self.top1.low, self.top1.high], "perplexity": self.perplexity,
                "base_perplexity": self.base_perplexity, "perplexity_change": self.perplexity_change}


def windows(ids: Sequence[int], context: int, limit: int | None = None) -> Iterator[list[int]]:
    """Consecutive whole windows of `context` tokens (the tail shorter than a window is left out)."""
    count = len(ids) // context
    if limit is not None:
        count = min(count, limit)
    for i in range(count):
        yield list(ids[i * context:(i + 1) * context])


def compare(loaded: Loaded, chunks: Sequence[Sequence[int]], variants: Sequence[Variant], first: int = 0,
            progress: Callable[[int, int], None] | None = None) -> list[VariantResult]:
    """Each variant against the untouched cache over the windows; the baseline runs once per window. Positions
    before `first` in each window are context only (llama-perplexity scores the second half); the last position
    has no next token, so perplexity stops before it."""
    tallies = {v: Tally() for v in variants}
    for w, chunk in enumerate(chunks):
        base = log_probs(loaded, chunk, None)[first:]
        target = torch.tensor(chunk[first + 1:])
        n = len(target)
        base_nll = -base[:n].gather(1, target[:, None])[:, 0]
        top = base.argmax(dim=-1)
        p = base.exp()
        for v in variants:
            q = log_probs(loaded, chunk, v)[first:]
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
    return VariantResult(variant.name, len(kl), len(t.kl), _bootstrap(t.kl), float(torch.quantile(kl, 0.99)),
                         float(kl.max()), _bootstrap(t.agree), math.exp(float(torch.cat(t.nll).mean())),
                         math.exp(float(torch.cat(t.base_nll).mean())))


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
