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

from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import Attention, ModelSpec, SlidingWindow

_FIGURE = r"\d{1,9}(?:\.\d{1,3})? (?:GiB|MiB|KiB|B)"  # a HumanBytes2 figure
# v0.1-0.5 log it as msg="offload to cuda" (llm/memory.go, MemoryEstimate.log), later releases as msg=offload
OFFLOAD = re.compile(r"msg=\"?offload\b[^\n]*?memory\.required\.kv=\"?(" + _FIGURE + ")")
# v0.11 (ml/backend/ggml/ggml.go) and v0.12 on (ml/device.go) log what each device holds once loaded, then the
# total: msg="model weights" device=CUDA0 size="4.3 GiB", msg="kv cache" ..., msg="compute graph" ..., msg="total
# memory" size="5.9 GiB"; the runner's load request names the cache: "KvSize:8192 KvCacheType:" (num_ctx x parallel)
_DEVICE = re.compile(r"msg=\"(model weights|kv cache|compute graph)\" device=(\w{1,20}) size=\"(" + _FIGURE + ")\"")
_TOTAL = re.compile(r"msg=\"total memory\" size=\"(" + _FIGURE + ")\"")
_KV_SIZE = re.compile(r"KvSize:(\d{1,12}) KvCacheType:(\w{0,10})")
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


def _device_rows(text: str) -> list[LogRow]:
    """The devices' kv cache lines added (shown), and the total memory line against every device figure added."""
    found = _DEVICE.findall(text)
    kv = [(device, size) for what, device, size in found if what == "kv cache"]
    if not kv:
        return []
    added = sum(_bytes(size)[0] for _, size in kv)
    rows = [LogRow("Ollama: kv cache", human(added), "-", None, "the devices' kv cache lines added ("
                   + ", ".join(f"{device} {size}" for device, size in kv) + ")")]
    if total := _TOTAL.search(text):
        parts = [_bytes(size) for _, _, size in found]
        logged, slack = _bytes(total.group(1))
        everything = sum(p for p, _ in parts)
        rows.append(LogRow("Ollama: total memory", total.group(1), human(everything),
                           abs(everything - logged) <= slack + sum(r for _, r in parts),
                           f"the {len(parts)} device figures added (weights, kv cache, compute graph)"))
    return rows


def rows_without_model(text: str) -> list[LogRow]:
    """The offload line's KV estimate shown, and the GPUs' allocations against memory.required.partial; the devices'
    kv cache lines added, and their total memory against every figure."""
    m = OFFLOAD.search(text)
    if m is None:
        return _device_rows(text)
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
    logged = m.group(1) if m else None
    if m is None and (size := _KV_SIZE.search(text)) and (kv := _device_rows(text)):  # the devices' lines
        ctx, kv_type, logged = int(size.group(1)), size.group(2) or "f16", kv[0].logged
    if logged is None or ctx is None:
        return None
    per_value = _BYTES_PER_VALUE.get(kv_type, 2.0)
    layers = [layer for layer in model.layers if isinstance(layer, Attention)]
    ours = sum(int(ctx * (layer.k_dim + layer.v_dim) * layer.kv_heads * per_value) for layer in layers)
    # sliding layers (Ollama sizes them per architecture) or layers of other kinds: shown
    windowed = len(layers) != len(model.layers) or any(isinstance(layer, SlidingWindow) for layer in layers)
    return LogRow("Ollama: memory.required.kv" if m else "Ollama: kv cache", logged, human(ours),
                  None if windowed else human(ours) == logged,
                  f"{ctx:,} x {len(layers)} layers x (K + V) x KV heads x {per_value:g} bytes "
                  + ("(llm/ggml.go GraphSize)" if m else "(the load request's KvSize, each device's cache added)")
                  + ("; sliding or non-attention layers, sized by Ollama per architecture: shown" if windowed else ""))


def check(text: str, model: ModelSpec) -> LogCheck | None:
    """Ollama's scheduler line, or its devices' lines, without llama.cpp's cache lines beside them; None where the
    log has neither."""
    if OFFLOAD.search(text):
        rows = [r for r in (model_row(text, model),) if r] + rows_without_model(text)[1:]
        if not rows:
            raise KVBudgetError("check-log: the log has Ollama's offload line but not the runner's context size "
                                "to check memory.required.kv against; pass the log up to its 'starting llama "
                                "server' line")
        return LogCheck(engine="llamacpp", model_in_log=None, settings={"format": "Ollama offload (logfmt)"},
                        rows=tuple(rows))
    if devices := _device_rows(text):
        row = model_row(text, model)  # the kv cache against the model where the load request names KvSize
        return LogCheck(engine="llamacpp", model_in_log=None, settings={"format": "Ollama device lines (logfmt)"},
                        rows=(row, *devices[1:]) if row else tuple(devices))
    return None
