"""Ollama's scheduler line before it starts its llama.cpp runner (logfmt: `msg=offload ... memory.required.kv="19.5
GiB"`, `msg="offload to cuda" ...` before), read as check-log reads llama.cpp's own lines.

Ollama v0.5.11 llm/memory.go (EstimateGPULayers, logged by (MemoryEstimate).LogValue as `memory.required.kv`,
`memory.required.partial`, `memory.required.allocations`, ...) and llm/ggml.go (GraphSize): the cache is
`context x block_count x (head_dim_k + head_dim_v) x kv_heads x bytes` (bytes 2 for f16, 1 for q8_0, 0.5 for q4_0,
kvCacheBytesPerElement; the type only with flash attention, passed to the runner as --kv-cache-type), the context
the runner's --ctx-size (the scheduler's num_ctx times --parallel); memory.required.partial is the GPUs' allocations
added. v0.11 (fs/ggml/ggml.go) sizes each layer the same way, except Gemma 3's sliding layers. Every figure is
printed by format.HumanBytes2: one decimal of GiB, MiB or KiB."""

from __future__ import annotations

import re

from kvbudget.engines.base import LogRow
from kvbudget.model.spec import Attention, ModelSpec, SlidingWindow

_FIGURE = r"\d{1,9}(?:\.\d{1,3})? (?:GiB|MiB|KiB|B)"  # a HumanBytes2 figure
# v0.1-0.5 log it as msg="offload to cuda" (llm/memory.go, MemoryEstimate.log), later releases as msg=offload
OFFLOAD = re.compile(r"msg=\"?offload\b[^\n]*?memory\.required\.kv=\"?(" + _FIGURE + ")")
SIGNATURES = (r"memory\.required\.kv=",)
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}
_BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5}  # kvCacheBytesPerElement


def _bytes(text: str) -> tuple[float, float]:
    """A HumanBytes2 figure in bytes, and half its last digit (the rounding)."""
    value, unit = text.split()
    scale = _UNITS[unit]
    return float(value) * scale, (0.05 if unit != "B" else 0.5) * scale


def human(b: float) -> str:
    """format.HumanBytes2."""
    unit = next(u for u in ("GiB", "MiB", "KiB", "B") if b >= _UNITS[u] or u == "B")
    return f"{b / _UNITS[unit]:.1f} {unit}" if unit != "B" else f"{int(b)} B"


def settings(text: str) -> tuple[int | None, int, str]:
    """The runner's --ctx-size, --parallel and --kv-cache-type (f16 where it names none)."""
    ctx = re.search(r"--ctx-size[ =](\d{1,12})", text)
    parallel = re.search(r"--parallel[ =](\d{1,6})", text)
    kv_type = re.search(r"--kv-cache-type[ =](\w+)", text)
    return (int(ctx.group(1)) if ctx else None, int(parallel.group(1)) if parallel else 1,
            kv_type.group(1) if kv_type else "f16")


def rows_without_model(text: str) -> list[LogRow]:
    """The offload line's KV estimate shown, and the GPUs' allocations against memory.required.partial."""
    m = OFFLOAD.search(text)
    if m is None:
        return []
    ctx, parallel, kv_type = settings(text)
    said = f" for --ctx-size {ctx:,} (--parallel {parallel}), {kv_type}" if ctx else ""
    rows = [LogRow("Ollama: memory.required.kv", m.group(1), "-", None, f"Ollama's estimate of the cache{said}")]
    line = text[m.start():text.find("\n", m.start())]
    partial = re.search(r"memory\.required\.partial=\"?(" + _FIGURE + ")", line)
    allocations = re.search(r"memory\.required\.allocations=\"?\[([^\]\n]{1,400})\]", line)
    if partial and allocations:
        parts = [_bytes(p) for p in re.findall(_FIGURE, allocations.group(1))]
        total, slack = _bytes(partial.group(1))
        added = sum(p for p, _ in parts)
        rows.append(LogRow("Ollama: GPU allocations added", human(added), partial.group(1),
                           abs(added - total) <= slack + sum(s for _, s in parts),
                           f"memory.required.partial is the {len(parts)} GPU(s)' allocations added (one decimal each)"))
    return rows


def model_row(text: str, model: ModelSpec) -> LogRow | None:
    """memory.required.kv against the source's rule for this model at the runner's context (a model with sliding
    layers shown: Ollama sizes those by architecture)."""
    m = OFFLOAD.search(text)
    ctx, _, kv_type = settings(text)
    if m is None or ctx is None:
        return None
    per_value = _BYTES_PER_VALUE.get(kv_type, 2.0)
    layers = [layer for layer in model.layers if isinstance(layer, Attention)]
    ours = sum(int(ctx * (layer.k_dim + layer.v_dim) * layer.kv_heads * per_value) for layer in layers)
    # sliding layers (Ollama sizes them per architecture) or layers of other kinds: shown
    windowed = len(layers) != len(model.layers) or any(isinstance(layer, SlidingWindow) for layer in layers)
    logged = m.group(1)
    return LogRow("Ollama: memory.required.kv", logged, human(ours), None if windowed else human(ours) == logged,
                  f"{ctx:,} x {len(layers)} layers x (K + V) x KV heads x {per_value:g} bytes (llm/ggml.go GraphSize)"
                  + ("; sliding or non-attention layers, sized by Ollama per architecture: shown" if windowed else ""))
