"""Two llama.cpp cache lines beyond the size lines of logs.py: ik_llama.cpp's MLA cache and the KV allocation refusal.

- ik_llama.cpp (src/llama.cpp, llama_new_context_with_model, 2025) caches an MLA model's compressed latent and rope
  key as one row a cell, `c^KV`, and prints `KV self size  = X MiB, c^KV (f16): X MiB, kv^T: not used` (or
  `kv^T (f16): 0.00 MiB`), after the devices' `llama_kv_cache_init: CUDAn KV buffer size = N MiB` lines.
- llama.cpp's llama_kv_cache_init (src/llama.cpp, b3184 and on) prints `failed to allocate buffer for kv cache`
  when ggml could not allocate the cache's one buffer, after ggml-backend's `ggml_backend_cpu_buffer_type_alloc_
  buffer: failed to allocate buffer of size N` (CUDA: `allocating X MiB on device d: cudaMalloc failed`): the
  whole cache in bytes, its K and V tensors each aligned (ggml_backend_buft_get_alignment)."""

from __future__ import annotations

import itertools
import re

from kvbudget.dtypes import get_dtype
from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import LatentAttention, ModelSpec
from kvbudget.units import GIB, MIB, log_figure

_MIB = r"(\d{1,12}\.\d{2})"  # a size as llama.cpp prints it (%7.2f MiB)
MLA_KV_SELF = re.compile(r"KV self size\s*=\s*" + _MIB + r" MiB, c\^KV \((\w+)\):\s*" + _MIB + " MiB, "
                         r"kv\^T(?: \((\w+)\))?:\s*(?:" + _MIB + " MiB|not used)")
KV_ALLOC_FAILED = re.compile(r"failed to allocate buffer for kv cache")
# src/llama-memory-recurrent.cpp (llama_memory_recurrent, b5700 on; LM Studio's runtimes print it as 'Failed to
# initialize the context: ...'): the recurrent state's cache of n_seq_max cells refused, its size not printed
RS_ALLOC_FAILED = re.compile(r"failed to allocate buffer for rs cache")
RS_REFUSED = ("check-log: llama.cpp could not allocate the recurrent state ('rs cache': one cell of each layer's "
              "state per sequence), and the log states neither its size nor n_seq_max to check it by; pass the log "
              "from its 'llama_context: n_seq_max' lines on (llama-server -lv 4), or fewer parallel sequences (-np)")
_ALLOC_SIZE = re.compile(r"_buffer_type_alloc_buffer: failed to allocate buffer of size (\d{1,20})")
# ggml-cuda.cu's ggml_backend_cuda_buffer_type_alloc_buffer (ROCm and MUSA builds the same source): "allocating %.2f
# MiB on device %d: cudaMalloc failed: ..." (the HIP build's text keeps "cudaMalloc", some forks print hipMalloc)
_ALLOC_MIB = re.compile(r"_buffer_type_alloc_buffer: allocating (\d{1,12}\.\d{2}) MiB on device \d{1,3}: "
                        r"\w{1,20} failed")
NO_SIZE = ("check-log: llama.cpp could not allocate the KV cache ('failed to allocate buffer for kv cache'), and the "
           "log states no size of the buffer refused ('failed to allocate buffer of size N', 'allocating X MiB on "
           "device d'): nothing to check; pass the log from its 'llama_context: n_ctx' lines through the backend's "
           "line naming that size")
_DEVICE = re.compile(r"llama_kv_cache(?:_init|_unified)?:\s+(\w+) KV buffer size =\s+" + _MIB + " MiB")
_N_CTX = re.compile(r"(?:llama_new_context_with_model|llama_context|llama_kv_cache_init|init): "
                    r"(?:n_ctx|kv_size)\s+=\s*(\d{1,12})")
ALIGNMENT = 256  # the widest a backend aligns one tensor to (ggml's CUDA and Metal; the CPU's 32 or 64)


def complete_devices(text: str) -> list[tuple[str, str]]:
    """The devices' KV buffers where the log lists them all (numbered devices from 0 on, none skipped; a CPU
    buffer beside them), else none: a paste that starts after CUDA0 holds only some of the cache."""
    found = _DEVICE.findall(text)
    numbered = sorted(int(m.group(1)) for d, _ in found if (m := re.search(r"(\d+)$", d)))
    if not found or (numbered and numbered != list(range(len(numbered)))):
        return []
    return found


def sum_row(label: str, total: str, parts: list[str], note: str) -> LogRow:
    """A size the log prints (two decimals of MiB) against its parts added, each part's rounding allowed."""
    ours = f"{sum(log_figure(p, 'size') for p in parts):.2f}"
    return LogRow(label, f"{total} MiB", f"{ours} MiB",
                  abs(log_figure(total, "size") - float(ours)) <= 0.011 * len(parts), note)


# llama_kv_cache_unified_iswa / llama_kv_cache_iswa (src/llama-kv-cache-*iswa.cpp, 2025-26) names each cache's cells
# before its size line: n_ctx's (padded) for the non-SWA cache, or one stream's where the streams are apart
_ISWA_CELLS = re.compile(r"creating\s+(non-SWA|SWA) KV cache, size = (\d{1,12}) cells")


# llama.cpp's 2023 Metal backend (ggml-metal.m, ggml_metal_add_buffer): "allocated '%-16s' buffer, size = %8.2f MB,
# (%8.2f / %8.2f)": each buffer, then the device's running total over its recommendedMaxWorkingSetSize (MB: MiB). The
# 'kv' buffer is the cache llama_kv_cache_init made: K and V of n_ctx cells a layer plus 2 MiB of slack
# (llama.cpp, 2023: cache.buf.resize(2u*n_elements*ggml_type_size(wtype) + 2u*MB))
METAL_BUFFER = re.compile(r"ggml_metal_add_buffer: allocated '(\w{1,16}) *' buffer, size = *(\d{1,9}\.\d{2}) MB, "
                          r"\( *(\d{1,9}\.\d{2}) / *(\d{1,9}\.\d{2})\)")
METAL_SLACK_MIB = 2


def metal_kv_mib(text: str) -> str | None:
    """The cache in the 2023 Metal log's 'kv' buffer (the buffer less its 2 MiB of slack), MiB as text, else None."""
    kv = next((m for m in METAL_BUFFER.finditer(text) if m.group(1) == "kv"), None)
    return f"{float(kv.group(2)) - METAL_SLACK_MIB:.2f}" if kv else None


def metal_rows(text: str) -> list[LogRow]:
    """The 2023 Metal buffers: each running total against the one before plus the buffer (two decimals each), and
    the cache in the 'kv' buffer shown."""
    found = list(METAL_BUFFER.finditer(text))
    rows = [LogRow(f"Metal '{b.group(1)}' buffer: running total", f"{b.group(3)} MB",
                   f"{float(a.group(3)) + float(b.group(2)):.2f} MiB",
                   abs(float(a.group(3)) + float(b.group(2)) - float(b.group(3))) <= 0.02,
                   f"the total before ({a.group(3)}) plus this buffer ({b.group(2)})"
                   + ("; over the recommended working set" if float(b.group(3)) > float(b.group(4)) else ""))
            for a, b in itertools.pairwise(found)]
    if kv := metal_kv_mib(text):
        rows.append(LogRow("KV cache (Metal 'kv' buffer)", f"{kv} MiB", "-", None,
                           f"the buffer less llama.cpp's {METAL_SLACK_MIB} MiB of slack; the model and n_ctx check it"))
    return rows


def rows_without_model(text: str) -> list[LogRow]:
    """The rows these lines check without the model: the MLA cache's size against its parts and the devices'
    buffers; the refused buffer's size (and, with the cells, its bytes a cell) shown; an iswa log cut before its
    size lines, each cache's cells shown."""
    rows = metal_rows(text)
    if not re.search(r"llama_kv_cache\w*: size = ", text):
        for which, cells in dict(_ISWA_CELLS.findall(text)).items():
            rows.append(LogRow(f"{which} KV cache: cells", f"{int(cells):,}", "-", None,
                               "read from the log (the log stops before its size line)"))
    if mla := MLA_KV_SELF.search(text):
        rows.append(sum_row("KV self size", mla.group(1), [mla.group(3), mla.group(5) or "0"], "c^KV and kv^T added"))
        if devices := complete_devices(text):
            rows.append(sum_row("KV self size over the devices", mla.group(1), [s for _, s in devices],
                                 f"the {len(devices)} devices' KV buffers added"))
    if KV_ALLOC_FAILED.search(text) and (size := refused_bytes(text)):
        refused = size[0]
        cells = n_ctx(text)
        per_cell = f"; {refused // cells:,} bytes a cell at n_ctx {cells:,}" if cells else ""
        rows.append(LogRow("refused: KV cache buffer", f"{refused / GIB:.2f} GiB", "-", None,
                           f"{refused:,} bytes ggml could not allocate{per_cell}: lower -c (n_ctx) or quantize the "
                           "cache (-ctk/-ctv)"))
    return rows


def check_mla(text: str, model: ModelSpec, mla: re.Match) -> LogCheck:
    """ik_llama.cpp's c^KV: one row of latent and rope key a cell and layer, in the type it names; the cells from
    the log's n_ctx (kv_size), else implied by the size (whole cells, padded as llama.cpp pads n_ctx)."""
    latent = [layer for layer in model.layers if isinstance(layer, LatentAttention)]
    if not latent:
        raise KVBudgetError(f"check-log: the log's 'c^KV' cache is ik_llama.cpp's MLA cache, and {model.name} has no "
                            "latent attention layer; pass the log's own model with --model")
    dtype = get_dtype(mla.group(2))
    per_cell = sum(dtype.bytes_for(layer.values_per_token) for layer in latent)
    logged = float(mla.group(3))
    rows = rows_without_model(text)
    cells = n_ctx(text)
    if cells:
        ours = f"{cells * per_cell / MIB:.2f}"
        rows.append(LogRow(f"c^KV ({mla.group(2)})", f"{mla.group(3)} MiB", f"{ours} MiB", f"{logged:.2f}" == ours,
                           f"{cells:,} cells x {len(latent)} layers x {per_cell // len(latent):,} bytes"))
    else:
        implied = logged * MIB / per_cell
        whole = round(implied)
        fits = abs(implied - whole) * per_cell <= 0.005 * MIB and whole % 32 == 0
        rows.append(LogRow(f"c^KV ({mla.group(2)}): cells", f"{mla.group(3)} MiB", f"{implied:,.2f} cells",
                           fits, f"{per_cell:,} bytes a cell ({len(latent)} layers of latent and rope key): a whole "
                           "number of cells, padded as llama.cpp pads n_ctx, where the model is the log's"))
    return LogCheck(engine="llamacpp", model_in_log=None, settings={"format": "ik_llama.cpp MLA (c^KV)"},
                    rows=tuple(rows), assumed={} if cells else {"n_ctx": "not in the log: implied by c^KV"})


def n_ctx(text: str) -> int | None:
    """The cells the log's context states (n_ctx, or kv_size), else None."""
    return int(m.group(1)) if (m := _N_CTX.search(text)) else None


def refused_bytes(text: str) -> tuple[int, int] | None:
    """The buffer ggml could not allocate, in bytes, and how far its printed figure may be from them (0: exact; a
    MiB figure: its rounding), else None."""
    if size := _ALLOC_SIZE.search(text):
        return int(size.group(1)), 0
    if mib := _ALLOC_MIB.search(text):
        return round(float(mib.group(1)) * MIB), MIB // 200
    return None


def check_refusal(text: str, kv_bytes: int | None, layers: int) -> LogCheck:
    """The KV allocation refusal: the buffer ggml could not allocate against the cache kvbudget sizes for the log's
    n_ctx (`kv_bytes`: None where the log states no n_ctx), each of its K and V tensors aligned."""
    rows = rows_without_model(text)
    size = refused_bytes(text)
    if size and kv_bytes is not None:
        (refused, rounding), slack = size, 2 * layers * ALIGNMENT
        rows.append(LogRow("refused: KV cache buffer (bytes)", f"{refused:,}", f"{kv_bytes:,}",
                           -rounding <= refused - kv_bytes <= slack + rounding,
                           f"the cache kvbudget sizes for n_ctx (K and V of {layers} layers, each tensor aligned to at "
                           f"most {ALIGNMENT} bytes)"))
    if not rows:
        raise KVBudgetError(NO_SIZE)
    return LogCheck(engine="llamacpp", model_in_log=None, settings={"format": "KV allocation refusal"},
                    rows=tuple(rows))
