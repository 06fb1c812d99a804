"""check-log for llama.cpp: the cache lines every build prints (`llama_kv_cache: size = ...`, the 2024-25
`KV self size` line) and the output and compute buffers beside them, each set beside what kvbudget says for the
settings the log states."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvbudget.dtypes import Family, get_dtype
from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.engines.llamacpp import ctxlines, kvlines, ollama
from kvbudget.engines.llamacpp.releases import (
    CACHE_TYPES,
    LOG_TYPES,
    N_BATCH,
    N_UBATCH,
    NEWEST,
    Release,
    parse_build,
)
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import MIB, log_figure

if TYPE_CHECKING:
    from kvbudget.engines.llamacpp.engine import Buffer, LlamaCppEngine

_LLAMA_LINE = re.compile(r"(llama_kv_cache(?:_unified)?|llama_memory_recurrent): size = +([\d.]+) MiB "
                         r"\( *(\d+) cells, +(\d+) layers, +(\d+)(?:/ *(\d+))? seqs[^)]*\), "
                         r"(?:K|R) \((\w+)\): +([\d.]+) MiB, (?:V|S) "
                         r"\((\w+)\): +([\d.]+) MiB")


# Builds standing for each era when a log names no build (engines/llamacpp/releases.py), newest first.
_ERA_BUILDS = (NEWEST, Release(6900), Release(6300), Release(6000), Release(5700), Release(5500), Release(5000))
# llama.cpp's own `build: 5935 (2adf8d83)`; WasmEdge's GGML plugin prints `LLAMA_BUILD_NUMBER 5640`.
_BUILD_LINE = re.compile(r"(?:(?:^|\n)\s*(?:build|version): |LLAMA_BUILD_NUMBER )(\d+)\b")
_FLASH = {"0": False, "false": False, "disabled": False, "1": True, "true": True, "enabled": True, "auto": True}


def check_log(engine: LlamaCppEngine, text: str, model: ModelSpec, given: Mapping[str, Any]) -> LogCheck:
    """llama-server's `llama_kv_cache` / `llama_memory_recurrent` lines beside server_buffers() for its settings
    and build: the log's `build:` line, --engine-version, or else each era's rules in turn."""
    def setting(name: str) -> str | None:
        m = re.search(rf"llama_context: {name} += (\S+)", text)
        return m.group(1) if m else None

    build_text = given.get("engine_version")
    build_line = _BUILD_LINE.search(text)
    if build_text is None and build_line:
        build_text = build_line.group(1)
    releases = (Release(parse_build(str(build_text))),) if build_text else _ERA_BUILDS
    flash_text = setting("flash_attn") or (re.search(r"flash_attn\s+=\s+(\S+)", text) or [None, None])[1]
    if flash_text is not None and flash_text.lower() not in _FLASH:
        raise KVBudgetError(f"check-log: 'flash_attn = {flash_text}' in the llama.cpp log is not a value kvbudget "
                            "knows (0, 1, auto, enabled, disabled)")
    flash = _FLASH[flash_text.lower()] if flash_text is not None else None
    if (other := _other_format(engine, text, model, flash)) is not None:
        return other
    n_ctx, n_seq = setting("n_ctx"), setting("n_seq_max")
    implied = None if n_ctx and n_seq else _context_of(_LLAMA_LINE.findall(text))
    if implied:  # cut before the context's lines: what the cache's size lines state of it
        n_ctx, n_seq = str(implied[0]), str(implied[1])
    if n_ctx is None or n_seq is None:
        raise KVBudgetError("check-log: the llama.cpp log lacks 'llama_context: n_ctx' / 'n_seq_max' lines; "
                            "run llama-server with -lv 4 (or --verbose)")
    unified = setting("kv_unified") == "true" or bool(implied and implied[2])
    streams = setting("kv_unified") is not None or bool(implied and implied[3])
    n_ubatch = int(setting("n_ubatch") or N_UBATCH)
    n_batch = int(setting("n_batch") or N_BATCH)
    swa_full = "using full-size SWA cache" in text
    lines = _LLAMA_LINE.findall(text)
    if not lines:
        raise KVBudgetError("check-log: no 'llama_kv_cache: size = ...' line in the llama.cpp log")
    k_type = LOG_TYPES.get(lines[0][6], lines[0][6])
    kv_lines = [x for x in lines if x[0].startswith("llama_kv_cache")]  # llama_kv_cache_unified in 2025 builds
    logged_order = kv_lines + [x for x in lines if not x[0].startswith("llama_kv_cache")]
    # the log states these lines in every build that prints them; the era decides the rest
    plausible = [r for r in releases if streams == r.streams  # kv_unified and 's/S seqs' printed from #14363
                 and (setting("n_ctx_seq") is None or r.pads_total_first)
                 and (setting("n_ctx_per_seq") is None or not r.pads_total_first)
                 and ("_iswa" not in text or r.own_swa_cache)] or list(releases)
    def buffers_for(release: Release) -> tuple[Buffer, ...]:
        return engine.server_buffers(model, int(n_ctx), int(n_seq), k_type, unified=unified, swa_full=swa_full,
                                     n_ubatch=n_ubatch, release=release, flash_attn=flash, n_batch=n_batch)

    checked = [(r, b, _buffer_rows(b, logged_order)) for r in plausible for b in [buffers_for(r)]]
    # the first era that reproduces every line, else the newest
    release, buffers, rows = next((c for c in checked if all(x.matches for x in c[2])), checked[0])
    stream_cells = next((b.cells for b in buffers if b.name == "kv"), buffers[0].cells if buffers else int(n_ctx))
    rows = rows + _memory_rows(engine, text, model, int(n_seq), min(int(n_ctx), n_ubatch), flash, release, stream_cells,
                               unified,
                               get_dtype(k_type).family is Family.BLOCK if k_type in CACHE_TYPES else True)
    settings: dict[str, Any] = {"n_ctx": int(n_ctx), "n_seq_max": int(n_seq), "kv_unified": unified,
                                "swa_full": swa_full, "cache_type_k": k_type, "n_ubatch": n_ubatch}
    assumed: dict[str, Any] = {}
    if build_text:
        settings["build"] = f"b{release.build}"
    else:
        assumed["build"] = ("the newest" if release.build == _ERA_BUILDS[0].build
                            else f"an era like b{release.build} (the log names no build; --engine-version)")
    if implied:
        for name, value in (("n_ctx", int(n_ctx)), ("n_seq_max", int(n_seq)), ("kv_unified", unified)):
            settings.pop(name)
            assumed[name] = f"{value} (the log lacks its 'llama_context' lines: implied by the cache's size lines)"
    if flash is None:
        assumed["flash_attn"] = release.flash_attn_default
    else:
        settings["flash_attn"] = flash
    return LogCheck(engine="llamacpp", model_in_log=None, settings=settings, rows=tuple(rows), assumed=assumed)


def _context_of(lines: list[tuple[str, ...]]) -> tuple[int, int, bool, bool] | None:
    """n_ctx, n_seq_max, kv_unified and whether the build keeps streams, as the KV caches' size lines state them
    (`N cells, L layers, s/S seqs`: N cells a stream, s sequences over S streams; the largest cache is the full one,
    a sliding window's never larger), else None."""
    kv = [x for x in lines if x[0].startswith("llama_kv_cache")]
    if not kv:
        return None
    full = max(kv, key=lambda x: int(x[2]))
    seqs, streams = int(full[4]), int(full[5] or 1)
    return int(full[2]) * streams, seqs, bool(full[5]) and streams == 1 and seqs > 1, bool(full[5])


def _other_format(engine: LlamaCppEngine, text: str, model: ModelSpec, flash: bool | None) -> LogCheck | None:
    """A log without today's cache size lines, checked by the reader of its own format (ik_llama.cpp's MLA cache, a
    KV allocation refusal, Ollama's lines, 2024-25's KV self size, 2023's loaders, the context's lines alone), else
    None."""
    if mla := kvlines.MLA_KV_SELF.search(text):  # ik_llama.cpp's MLA cache (engines/llamacpp/kvlines.py)
        return kvlines.check_mla(text, model, mla)
    old = _OLD_KV_SELF.search(text)
    if kvlines.KV_ALLOC_FAILED.search(text) and not old and not _LLAMA_LINE.search(text):
        return _check_refusal(engine, text, model, flash)
    if not old and not _LLAMA_LINE.search(text) and (alone := ollama.check(text, model)):  # Ollama's own lines
        return alone
    if old and not _LLAMA_LINE.search(text):
        return _check_old_log(engine, text, model, old, flash)
    if not _LLAMA_LINE.search(text) and (_LEGACY_KV.search(text) or _GGML_MEMORY.search(text)
                                         or kvlines.metal_kv_mib(text)):  # 2023's loaders
        return _check_legacy(engine, text, model)
    if not _LLAMA_LINE.search(text) and ctxlines.found(text):  # cut after the context's lines, before the cache's
        return LogCheck(engine="llamacpp", model_in_log=None, rows=tuple(ctxlines.rows_with_model(text, model)),
                        settings={"format": "the context's lines alone (no cache size line)"})
    return None


_OUTPUT = re.compile(r"(\w+)\s+output buffer size =\s+([\d.]+) MiB")
_COMPUTE = re.compile(r"(\w+)\s+compute buffer size =\s+([\d.]+) MiB")


def _memory_rows(engine: LlamaCppEngine, text: str, model: ModelSpec, n_seq: int, n_tokens: int,
                 flash: bool | None, release: Release, cells: int, unified: bool, quantized: bool) -> list[LogRow]:
    """The buffers beside the cache: the output buffer (float32 logits of one output per sequence, checked) and
    the largest compute buffer beside the plan's for the same settings: checked where the graph is replayed and
    the log's buffer is the CPU backend's, else shown."""
    from kvbudget.model.params import activation_widths

    rows = []
    if out := _OUTPUT.search(text):
        vocab = activation_widths(model).vocab
        ours = f"{n_seq * vocab * 4 / MIB:.2f}"
        rows.append(LogRow("output buffer", f"{out.group(2)} MiB", f"{ours} MiB", f"{float(out.group(2)):.2f}" == ours,
                           f"{n_seq} sequence(s) x {vocab:,} float32 logits"))
    computed = _COMPUTE.findall(text)
    if computed:
        device, logged = max(computed, key=lambda m: float(m[1]))
        use_flash = release.flash_attn_default if flash is None else flash
        ours_bytes, replayed = engine.compute_buffer(model, cells, n_tokens, n_seq, use_flash, release, quantized,
                                                     unified)
        ours_mib = f"{ours_bytes / MIB:.2f}"
        checked = replayed and device == "CPU"
        note = ("the graph replayed through ggml's allocator (llama.cpp's CPU backend)" if checked else
                "the CPU backend's buffer, the graph replayed; a GPU's alignment and input copies move it a little"
                if replayed else "kvbudget plan's activation term for these settings (an estimate beyond the part "
                "that grows with the context)")
        rows.append(LogRow(f"memory: compute buffer ({device})", f"{logged} MiB", f"{ours_mib} MiB",
                           f"{float(logged):.2f}" == ours_mib if checked else None, note))
    return rows


def _buffer_rows(ours: tuple[Buffer, ...], logged_order: list[tuple[str, ...]]) -> list[LogRow]:
    kv_ours = [b for b in ours if b.name != "recurrent"] + [b for b in ours if b.name == "recurrent"]
    rows = []
    if len(logged_order) != len(kv_ours):
        rows.append(LogRow("caches", str(len(logged_order)), str(len(kv_ours)), False,
                           "different cache structure (windows or recurrent layers handled differently)"))
    for line, buf in zip(logged_order, kv_ours, strict=False):  # a cache too few is a row above
        label = {"kv": "KV cache", "kv_swa": "SWA KV cache", "recurrent": "recurrent state"}[buf.name]
        rows.append(LogRow(f"{label}: cells", line[2], str(buf.cells), int(line[2]) == buf.cells))
        rows.append(LogRow(f"{label}: layers", line[3], str(buf.layers), int(line[3]) == buf.layers))
        logged_mib = line[1]
        ours_mib = f"{buf.total_bytes / MIB:.2f}"
        rows.append(LogRow(f"{label}: size", f"{logged_mib} MiB", f"{ours_mib} MiB",
                           f"{float(logged_mib):.2f}" == ours_mib, "llama.cpp prints two decimals of MiB"))
    return rows


# Builds of 2024 to mid-2025 (before llama_kv_cache_unified): one cache of kv_size cells for every sequence. The
# lines were `llama_kv_cache_init:` / `llama_new_context_with_model:` until the llama_context refactor of spring
# 2025, then `init:` / `llama_context:` for a few weeks before llama_kv_cache_unified.
_OLD_KV_INIT = re.compile(r"(?:llama_kv_cache_)?init: kv_size = (\d+),.*?type_k = '(\w+)', type_v = '(\w+)', "
                          r"n_layer = (\d+)")
_OLD_KV_SELF = re.compile(r"KV self size\s*=\s*([\d.]+) MiB, K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB")


def _check_old_log(engine: LlamaCppEngine, text: str, model: ModelSpec, kv_self: re.Match,
                   flash: bool | None) -> LogCheck:
    """llama.cpp's `llama_new_context_with_model: KV self size` line (one unified cache of kv_size cells; no
    SWA cache in those builds' log)."""
    init = _OLD_KV_INIT.search(text)
    n_ctx_line = re.search(r"(?:llama_new_context_with_model|llama_context): n_ctx\s+=\s*(\d+)", text)
    cells = int(init.group(1)) if init else int(n_ctx_line.group(1)) if n_ctx_line else None
    k_type, v_type = kv_self.group(2), kv_self.group(4)
    if k_type != v_type:
        raise KVBudgetError(f"check-log: K ({k_type}) and V ({v_type}) cache types differ; kvbudget checks one type")
    read = cells is not None
    if cells is None:  # cut before the context's lines: the cells the K part holds at the model's width
        cells = _cells_of(engine, model, LOG_TYPES.get(k_type, k_type), kv_self.group(3), flash)
    buffers = engine.server_buffers(model, cells, 1, LOG_TYPES.get(k_type, k_type), unified=True,
                                    release=_ERA_BUILDS[-1], flash_attn=flash)
    kv = [b for b in buffers if b.name != "recurrent"]
    k_mib, v_mib = sum(b.k_bytes for b in kv) / MIB, sum(b.v_bytes for b in kv) / MIB
    if read:
        rows = [LogRow("cells", f"{cells:,}", f"{kv[0].cells:,}" if kv else "-", bool(kv) and kv[0].cells == cells)]
    else:
        rows = [LogRow("cells (from the K part)", "-", f"{cells:,}", cells % 32 == 0,
                       f"the K part over {model.name}'s K bytes a cell (the log states no n_ctx): a whole number of "
                       "llama_kv_cache_get_padding's 32 (256 with flash attention)"), *_layer_widths(text, model)]
    if init:
        layers = sum(b.layers for b in kv)
        rows.append(LogRow("layers", init.group(4), str(layers), int(init.group(4)) == layers))
    for label, logged, ours in (("K", kv_self.group(3), k_mib), ("V", kv_self.group(5), v_mib),
                                ("KV self size", kv_self.group(1), k_mib + v_mib)):
        rows.append(LogRow(f"{label} ({k_type})", f"{logged} MiB", f"{ours:.2f} MiB",
                           f"{log_figure(logged, 'cache size'):.2f}" == f"{ours:.2f}",
                           "llama.cpp prints two decimals of MiB"))
    return LogCheck(engine="llamacpp", model_in_log=None,
                    settings={**({"n_ctx": cells} if read else {}), "cache_type": k_type,
                              "format": "llama_kv_cache_init (2024-25)"},
                    rows=tuple(rows), assumed={} if read else {"n_ctx": f"{cells} (the cells the K part holds)"})


# llama_kv_cache_init (src/llama.cpp, 2024-25): `layer N: n_embd_k_gqa = K, n_embd_v_gqa = V` for each layer
_LAYER_WIDTH = re.compile(r"layer +(\d{1,4}): n_embd_k_gqa = (\d{1,7}), n_embd_v_gqa = (\d{1,7})")


def _layer_widths(text: str, model: ModelSpec) -> list[LogRow]:
    """The per-layer K and V widths the log prints beside the model's (KV heads x head size, plain attention)."""
    from kvbudget.model.spec import Attention

    logged = {(k, v) for _, k, v in _LAYER_WIDTH.findall(text)}
    ours = {(a.kv_heads * a.k_dim, a.kv_heads * a.v_dim) for a in model.layers if isinstance(a, Attention)}
    if not logged or not ours:
        return []
    shown = ", ".join(f"{k}/{v}" for k, v in sorted(logged))
    mine = ", ".join(f"{k}/{v}" for k, v in sorted(ours))
    return [LogRow("n_embd_k_gqa / n_embd_v_gqa", shown, mine, {(int(k), int(v)) for k, v in logged} <= ours,
                   "the layers' K and V widths: KV heads x head size")]


def _cells_of(engine: LlamaCppEngine, model: ModelSpec, k_type: str, k_mib: str, flash: bool | None) -> int:
    """The cells a K part of `k_mib` MiB holds for the model (one cache, no window): a whole number, or the log's
    lines are not this model's at that type."""
    from kvbudget.engines.llamacpp.engine import CELL_PAD

    kv = [b for b in engine.server_buffers(model, CELL_PAD, 1, k_type, unified=True, release=_ERA_BUILDS[-1],
                                           flash_attn=flash) if b.name == "kv"]
    per_cell = sum(b.k_bytes for b in kv) / CELL_PAD if kv else 0
    cells = round(float(k_mib) * MIB / per_cell) if per_cell else 0
    if not cells or abs(cells * per_cell / MIB - float(k_mib)) > 0.01 or len(kv) != 1:
        raise KVBudgetError("check-log: the llama.cpp log has a 'KV self size' line but neither 'kv_size =' nor "
                            "'n_ctx =': include the llama_kv_cache_init or llama_new_context_with_model lines")
    return ctxlines.within(cells, f"K part of {k_mib} MiB ({cells:,} cells of {model.name})")


def _check_refusal(engine: LlamaCppEngine, text: str, model: ModelSpec, flash: bool | None) -> LogCheck:
    """'failed to allocate buffer for kv cache': the buffer refused against the one cache of n_ctx cells those
    builds allocate (the cache type the log names, else llama.cpp's default f16)."""
    cells = kvlines.n_ctx(text)
    init = _OLD_KV_INIT.search(text)
    k_type = LOG_TYPES.get(init.group(2), init.group(2)) if init else "f16"
    kv = [b for b in engine.server_buffers(model, cells, 1, k_type, unified=True, release=_ERA_BUILDS[-1],
                                           flash_attn=flash) if b.name != "recurrent"] if cells else []
    check = kvlines.check_refusal(text, sum(b.total_bytes for b in kv) if kv else None, sum(b.layers for b in kv))
    return replace(check, settings={**check.settings, **({"n_ctx": cells} if cells else {})},
                   assumed={} if cells else {"n_ctx": "not in the log: the refused buffer is shown, not checked"})


# a device's KV buffer: CUDA0, Vulkan1, Metal, CPU, an RPC server's 'RPC[host:port]', the 2026 meta-backend's
# 'Meta()' over several devices
_KV_BUFFER = re.compile(r"llama_kv_cache(?:_init|_unified)?:\s+(\w+(?:\[[^\]\s]{1,80}\]|\([^)\s]{0,80}\))?) KV buffer "
                        r"size =\s+"
                        r"(\d{1,12}\.\d{2}) MiB")
_LEGACY_KV = re.compile(r"kv self size\s*=\s*([\d.]+) MB")  # 2023 builds (ggjt files): one f16 or f32 cache
# ggml's example loaders of 2023 (ggml examples/gpt-j, gpt-2, gpt-neox main.cpp; llama.cpp's first llama_model_load;
# koboldcpp's otherarch copies): n_mem = n_layer x n_ctx, K and V each n_embd x n_mem of memory_type (f16 or f32),
# printed "memory_size = %8.2f MB, n_mem = %d" (gpt-2's: "memory size", some "kv_cache memory size"; memory_size /
# 1024 / 1024: MiB), the shape above it per loader
_GGML_MEMORY = re.compile(r"_model_load: (?:kv_cache )?memory[_ ]size\s*=\s*(\d{1,9}\.\d{2}) MB, n_mem = (\d{1,12})")
_LEGACY_SHAPE = {k: re.compile(rf"\w{{0,40}}_model_load(?:_internal)?: {k}\s+=\s+(\d{{1,9}})")
                 for k in ("n_ctx", "n_layer", "n_embd")}


def check_without_model(text: str) -> LogCheck:
    """The rows of a llama.cpp log that need no model: each cache's size against its K and V (or R and S) parts, the
    devices' KV buffers against the cache, the cells and layers it states shown."""
    rows = []
    for line in _LLAMA_LINE.findall(text):
        what = "recurrent state" if line[0] == "llama_memory_recurrent" else "KV cache"
        rows.append(LogRow(f"{what}: cells, layers", f"{int(line[2]):,}, {line[3]}", "-", None, "read from the log"))
        rows.append(kvlines.sum_row(f"{what}: size", line[1], [line[7], line[9]],
                                    "its two parts added (two decimals of MiB)"))
    if old := _OLD_KV_SELF.search(text):
        if init := _OLD_KV_INIT.search(text):
            rows.append(LogRow("cells, layers", f"{int(init.group(1)):,}, {init.group(4)}", "-", None,
                               "read from the log"))
        rows.append(kvlines.sum_row("KV self size", old.group(1), [old.group(3), old.group(5)], "K and V added"))
        buffers = _KV_BUFFER.findall(text)
        if buffers and not any("Split" in device for device, _ in buffers):  # a split buffer pads its rows
            rows.append(kvlines.sum_row("KV self size over the devices", old.group(1), [size for _, size in buffers],
                                 "the devices' KV buffers added (" + ", ".join(d for d, _ in buffers) + ")"))
    elif init := _OLD_KV_INIT.search(text):
        rows.append(LogRow("cells, layers", f"{int(init.group(1)):,}, {init.group(4)}", "-", None,
                           f"K {init.group(2)}, V {init.group(3)}: read from the log (no size line)"))
    rows += _legacy_rows(text)
    rows += kvlines.rows_without_model(text)  # ik_llama.cpp's MLA cache, the KV allocation refusal
    rows += ollama.rows_without_model(text)  # Ollama's scheduler line
    if not rows and (buffers := _KV_BUFFER.findall(text)):  # the devices' buffers alone, cut before the size line
        total = sum(log_figure(size, "size") for _, size in buffers)
        rows.append(LogRow(f"KV buffers over {len(buffers)} device{'s' * (len(buffers) > 1)}", f"{total:.2f} MiB",
                           "-", None, "read from the log (" + ", ".join(f"{d} {s}" for d, s in buffers) + " MiB); "
                           "the size line and n_ctx, with the model, check them"))
    if not rows:  # a log cut after the context's lines (n_ctx, n_seq_max), before any cache line
        rows += ctxlines.rows_without_model(text)
    if not rows and kvlines.RS_ALLOC_FAILED.search(text):  # the recurrent state refused, nothing beside it
        raise KVBudgetError(kvlines.RS_REFUSED)
    return LogCheck(engine="llamacpp", model_in_log=None, settings={}, rows=tuple(rows))


# llama.cpp's 2023 loader (llama.cpp, llama_model_load_internal, ggjt files) loaded only LLaMA shapes and named each
# by its layers ("model size = 30B"): OpenLLaMA 3B and the LLaMA paper's four (Touvron et al. 2023, table 2), as
# (n_layer, n_embd); its MEM_REQ_KV_SELF table printed "(+ N MB per state)": the f16 cache of 2048 cells rounded up,
# twice that for an f32 cache (memory_f16 off)
_LLAMA_1 = {"3B": (26, 3200), "7B": (32, 4096), "13B": (40, 5120), "30B": (60, 6656), "65B": (80, 8192)}
_MODEL_SIZE = re.compile(r"_model_load_internal: model size = (\d{1,2}B)\b")
_PER_STATE = re.compile(r"\(\+ *(\d{1,9}\.\d{2}) MB per state\)")


def _legacy_rows(text: str) -> list[LogRow]:
    """2023's one cache of n_ctx cells a layer, f16 or f32: llama.cpp's `kv self size` and ggml's example loaders'
    `memory_size`/`n_mem` against the shape the loader printed (its LLaMA model size standing for n_layer and n_embd
    where those lines are cut; the cells implied where n_ctx is), shown alone where it printed neither."""
    legacy, ggml = _LEGACY_KV.search(text), _GGML_MEMORY.search(text)
    if not (legacy or ggml):
        return []
    found = {name: int(m.group(1)) for name, p in _LEGACY_SHAPE.items() if (m := p.search(text))}
    if legacy and (named := _MODEL_SIZE.search(text)) and named.group(1) in _LLAMA_1:
        found = dict(zip(("n_layer", "n_embd"), _LLAMA_1[named.group(1)], strict=True)) | found
    if not {"n_layer", "n_embd"} <= found.keys() or ("n_ctx" not in found and not legacy):
        return [LogRow("memory_size, n_mem", f"{ggml.group(1)} MB, {int(ggml.group(2)):,}", "-", None,
                       "read from the log (n_mem: n_layer x n_ctx; the loader's shape lines are not in it)")] if ggml \
            else []
    layers, width = found["n_layer"], found["n_embd"]
    logged = legacy.group(1) if legacy else ggml.group(1)  # type: ignore[union-attr]
    if "n_ctx" not in found:  # the cells the size implies, in the type the loader's per-state figure names
        per_state = _PER_STATE.search(text)
        share = float(per_state.group(1)) * MIB / (2 * 2048 * layers * width * 2) if per_state else 1.0
        name, width_bytes = ("f32", 4) if share > 1.5 else ("f16", 2)
        per_cell = 2 * layers * width * width_bytes
        cells = float(logged) * MIB / per_cell
        return [LogRow(f"kv self size ({name}): cells", f"{logged} MB", f"{cells:,.2f} cells",
                       abs(cells - round(cells)) * per_cell <= 0.005 * MIB and round(cells) > 0,
                       f"K and V of {layers} layers x {width} wide ('MB' are MiB): a whole number of cells, n_ctx, "
                       "where the shape is the log's (its n_ctx line is not in it)")]
    ctx = found["n_ctx"]
    sizes = {name: 2 * ctx * layers * width * size / MIB for name, size in (("f16", 2), ("f32", 4))}
    name, ours = min(sizes.items(), key=lambda kv: abs(kv[1] - float(logged)))
    rows = [LogRow("kv self size" if legacy else "memory_size", f"{logged} MB", f"{ours:.2f} MiB ({name})",
                   f"{ours:.2f}" == f"{float(logged):.2f}",
                   f"K and V of {ctx:,} cells x {layers} layers x {width} wide ('MB' are MiB)")]
    if ggml and not legacy:
        rows.append(LogRow("n_mem", f"{int(ggml.group(2)):,}", f"{layers * ctx:,}", int(ggml.group(2)) == layers * ctx,
                           "n_layer x n_ctx: the cells of every layer's cache"))
    return rows


def _check_legacy(engine: LlamaCppEngine, text: str, model: ModelSpec) -> LogCheck:
    """2023's one cache (`kv self size = X MB`, ggml loaders' `memory_size`): the log's own shape (_legacy_rows),
    then its size beside the model's K and V for the loader's n_ctx, in f16 or f32, whichever it is (the loaders
    kept one n_ctx cells a layer, unpadded)."""
    found = _LEGACY_KV.search(text) or _GGML_MEMORY.search(text)
    logged = found.group(1) if found else str(kvlines.metal_kv_mib(text))
    rows = _legacy_rows(text) + kvlines.metal_rows(text)
    per_cell = {name: sum(b.total_bytes for b in engine.server_buffers(model, 256, 1, name, unified=True,
                                                                        release=_ERA_BUILDS[-1])
                          if b.name != "recurrent") / 256 for name in ("float16", "float32")}
    per_cell = {("f16" if name == "float16" else "f32"): cell for name, cell in per_cell.items()}
    ctx_line = _LEGACY_SHAPE["n_ctx"].search(text)
    if ctx_line is None:  # the cells the size holds at the model's width
        name, cell = min(per_cell.items(), key=lambda kv: abs(float(logged) * MIB / kv[1] - round(float(logged) *
                                                                                                  MIB / kv[1])))
        cells = float(logged) * MIB / cell
        rows.append(LogRow(f"{'kv self size' if found else 'KV cache (Metal)'} ({model.name}): cells", f"{logged} MB",
                           f"{cells:,.2f} cells",
                           abs(cells - round(cells)) * cell <= 0.005 * MIB,
                           f"{cell:,.0f} bytes a cell ({name}): a whole number of cells where the model is the log's"))
    else:
        ctx = int(ctx_line.group(1))
        name, ours = min(((n, c * ctx / MIB) for n, c in per_cell.items()), key=lambda x: abs(x[1] - float(logged)))
        label = "kv self size" if found else "KV cache (Metal)"
        rows.append(LogRow(f"{label} ({name})", f"{logged} MB", f"{ours:.2f} MiB",
                           f"{ours:.2f}" == f"{float(logged):.2f}",
                           f"{model.name}'s K and V of {ctx:,} cells ('MB' are MiB)"))
    return LogCheck(engine="llamacpp", model_in_log=None, rows=tuple(rows),
                    settings={"format": "2023 loader (kv self size, memory_size)",
                              **({"n_ctx": int(ctx_line.group(1))} if ctx_line else {})})

