"""The memory terms a vLLM start-up log prints before its cache (the engine's share, the profiling peak,
non-torch memory, the KV budget), beside `kvbudget plan`'s for the same settings: check-log shows them, and they
check the plan's estimates, not the cache."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvbudget.engines.base import EngineOptions, LogRow
from kvbudget.engines.vllm.logsettings import LogSettings, first_number, log_total_memory
from kvbudget.engines.vllm.memory import GraphCounts, encoder_profile, start_up_graphs
from kvbudget.engines.vllm.offload import LMCACHE_CHUNK
from kvbudget.engines.vllm.releases import release
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.engines.base import Serving
    from kvbudget.engines.vllm.engine import VLLMEngine


def memory_rows(engine: VLLMEngine, text: str, model: ModelSpec, s: LogSettings, budget_text: str
                ) -> list[LogRow]:
    """Where the log states the GPU's total and gpu_memory_utilization: each memory term it printed beside the
    plan's for the same settings (shown, never a mismatch of the cache: they check the plan's estimates)."""
    total = log_total_memory(text)
    util = first_number(text, (r"gpu_memory_utilization[ =(]+([\d.]+)",
                                r"Desired GPU memory utilization is \(([\d.]+),"))
    if total is None or util is None:
        return []
    from kvbudget.budget import memory_stack
    from kvbudget.gpus import custom_gpu
    from kvbudget.model.weights import model_weights

    options = s.options()
    serving = engine.serving(int(total * GIB), s.max_len, options, tp=s.tp, model=model)
    try:
        w = engine.as_loaded(model_weights(model, s.tp, engine.pipeline_stages(model.num_layers, s.pp, s.partition)),
                             model, options, s.tp, s.pp)
        stack, kv = memory_stack(model, serving, custom_gpu(int(total * GIB)), w, None, None, util)
    except KVBudgetError:
        return []
    plan: dict[str, float] = {t.key: t.bytes / GIB for t in stack}
    # from 0.20 the plan's overhead holds the CUDA graphs beside non-torch memory: each beside its own line
    graphs = start_up_graphs(release(options), model, serving.options)
    plan["graphs"] = graphs.bytes / GIB
    plan["overhead"] -= plan["graphs"]
    logged = {"activation": first_number(text, (r"activation peak memory(?: takes)?\s{1,20}([\d.]+) ?GiB",
                                                 r"torch peak memory increase: ([\d.]+) ?GiB",
                                                 r"([\d.]+) GiB for peak activation")),
              # V1's forward increase first: its debug "worker init memory snapshot" also prints a non_torch_memory=
              # (the CUDA context before loading, not what the budget takes off)
              "overhead": first_number(text, (r"non-torch forward increase memory: (-?[\d.]+) ?GiB",
                                               r"([\d.]+) GiB for non-torch memory",
                                               r"non_torch_memory(?: takes)?\s{1,20}(-?[\d.]+) ?GiB",
                                               r"Memory profiling results:.*?non_torch_memory=(-?[\d.]+) ?GiB")),
              # what vLLM >= 0.20 took out of the budget for its graphs (its estimate), else what they took
              "graphs": first_number(text, (r"CUDA graph pool memory: [\d.]+ GiB \(actual\), ([\d.]+) GiB",
                                             r"Estimated CUDA graph memory: ([\d.]+) GiB",
                                             r"([\d.]+) GiB for (?:CUDAGraph|NPU graph) memory"))}
    peak = first_number(text, (r"peak_torch_memory=([\d.]+)GiB",))
    weights = first_number(text, (r"model weights take\s{1,20}([\d.]+) ?GiB", r"(?:Loading model weights took|Model "
                                   r"loading took) ([\d.]+) G", r"Actual usage(?: is|:) ([\d.]+) GiB for weight"))
    if logged["activation"] is None and peak is not None and weights is not None:
        logged["activation"] = peak - weights  # V0 0.6.4 prints the peak with the weights in it
    note = "kvbudget plan's estimate for these settings"
    out = [LogRow("memory: engine share", f"{total * util:.2f} GiB", f"{plan['share']:.2f} GiB", None,
                  f"{total:.2f} GiB x {util:g}, as the log states them")]
    for key, label in (("activation", "profiling peak"), ("overhead", "non-torch memory"), ("graphs", "CUDA graphs")):
        value = logged[key]
        if value is not None:
            out.append(LogRow(f"memory: {label}", f"{value:.2f} GiB", f"{plan[key]:.2f} GiB", None, note))
    out += _graph_count_rows(text, graphs.counts)
    out += _encoder_rows(text, model, serving, s)
    error = kv / GIB / float(budget_text) - 1 if float(budget_text) else 0.0
    out.append(LogRow("memory: KV budget before launch", f"{budget_text} GiB", f"{kv / GIB:.2f} GiB", None,
                      f"{error:+.1%}: {note}"))
    return out


def _graph_count_rows(text: str, counts: GraphCounts | None) -> list[LogRow]:
    """The graphs vLLM >= 0.18 says it profiles ("Profiling CUDA graph memory: PIECEWISE=N (largest=T), FULL=...")
    beside the count the plan works out from the log's batch settings (shown, not a mismatch: an attention backend
    without FULL graphs, or capture sizes given by hand, change them)."""
    found = re.search(r"Profiling CUDA graph memory: (PIECEWISE=\d+ \(largest=\d+\)(?:, FULL=\d+ \(largest=\d+\))?)",
                      text)
    if found is None or counts is None:
        return []
    return [LogRow("memory: CUDA graphs profiled", found.group(1), str(counts), None,
                   "kvbudget plan's count for these settings (config/vllm.py's capture sizes, default "
                   "FULL_AND_PIECEWISE mode)")]


def _encoder_rows(text: str, model: ModelSpec, serving: Serving, s: LogSettings) -> list[LogRow]:
    """The dummy images vLLM profiled its vision encoder with ("profiled with N image items") beside the plan's."""
    m = re.search(r"profiled with (\d+) (\w+) items of the maximum feature size", text)
    if not m:
        return []
    o = serving.options
    planned = encoder_profile(model, o.max_num_batched_tokens or 0, o.max_num_seqs or 0, s.max_len, s.tp)
    return [LogRow(f"memory: dummy {m.group(2)}s the encoder is profiled with", m.group(1),
                   str(planned[0]) if planned else "not modelled",
                   int(m.group(1)) == planned[0] if planned else None,
                   "vLLM's encoder budget rule (the source)")]


# --- startup logs --------------------------------------------------------------------------------------------
# 0.32 prints the settings in its "non-default args" ({'kv_offloading_size': 64.0, ...}) and the native region as
# "Created mmap file /dev/shm/vllm_offload_<id>.mmap (%.2f GB)" in 10^9 bytes (shared_offload_region.py);
# LMCache 0.5.6 prints "LMCache Configuration: {...}" with 'max_local_cpu_size': '5.0 GB' in 2^30 bytes
# (v1/config.py _log_config; per worker).
MMAP_LINE = re.compile(r"Created mmap file \S*vllm_offload_\S* \(([\d.]+) GB\)")
LMCACHE_LINE = re.compile(r"(?:LMCache Configuration: \{|Creating LMCacheEngine with config: "
                          r"LMCacheEngineConfig\()(.*)")


def offload_rows(engine: VLLMEngine, model: ModelSpec, text: str, *, size: str | None, backend: str | None,
                 kv_dtype: str, tp: int, options: EngineOptions) -> list[LogRow]:
    """The offload tiers a vLLM log sets up (`size` and `backend`: its kv_offloading settings as read), beside
    kvbudget's sizing of them (none where it sets none up)."""
    rows: list[LogRow] = []
    direct = re.search(r"""["']cpu_bytes_to_use["']:\s*(\d+)""", text)  # the connector configured by hand
    if size is not None and size != "None":
        backend = backend or "native"
        rows.append(_native_row(engine, model, text, int(float(size) * GIB), f"--kv-offloading-size {size}",
                                kv_dtype=kv_dtype, tp=tp, options=options) if backend == "native" else
                    LogRow("KV offloading (lmcache)", f"--kv-offloading-size {size}", "-", None,
                           "vLLM starts LMCache's multi-process mode, sized on the LMCache server: check its log"))
    elif direct and "OffloadingConnector" in text:
        rows.append(_native_row(engine, model, text, int(direct.group(1)), f"cpu_bytes_to_use {direct.group(1)}",
                                kv_dtype=kv_dtype, tp=tp, options=options))
    if m := LMCACHE_LINE.search(text):
        rows += _lmcache_rows(engine, model, m.group(1), kv_dtype=kv_dtype, tp=tp, options=options)
    return rows


def _native_row(engine: VLLMEngine, model: ModelSpec, text: str, memory: int, setting: str, *, kv_dtype: str,
                tp: int, options: EngineOptions) -> LogRow:
    try:
        tier = engine.host_tiers(model, memory=memory, disk=None, backend="native", kv_dtype=kv_dtype, tp=tp,
                                 options=options)[0]
    except KVBudgetError as exc:
        return LogRow("CPU offload region (native)", setting, "-", None, str(exc))
    ours = f"{tier.host_bytes / 1e9:.2f}"
    how = (f"{tier.units:,} chunks of {tier.unit_bytes:,} bytes ({tier.tokens:,} tokens) from {setting}; this "
           "line's GB are 10^9 bytes")
    if m := MMAP_LINE.search(text):
        return LogRow("CPU offload region (native)", f"{m.group(1)} GB", f"{ours} GB", m.group(1) == ours, how)
    return LogRow("CPU offload region (native)", "-", f"{ours} GB", None,
                  how + "; the log has no 'Created mmap file' line to check it against")


def _lmcache_rows(engine: VLLMEngine, model: ModelSpec, config: str, *, kv_dtype: str, tp: int,
                  options: EngineOptions) -> list[LogRow]:
    def value(name: str) -> str | None:  # 'name': 'value' (0.3 on) or name=value (earlier releases)
        m = re.search(rf"\b{name}(?:': |=)'?([^',)]+)", config)
        return m.group(1) if m else None

    def gib(name: str) -> float:
        return float((value(name) or "0").removesuffix(" GB"))

    cpu = gib("max_local_cpu_size") if value("local_cpu") != "False" else 0.0
    disk = gib("max_local_disk_size") if value("local_disk") not in (None, "None") else 0.0
    chunk = value("chunk_size") or str(LMCACHE_CHUNK)
    if not cpu:
        return [LogRow("LMCache CPU tier per worker", "off", "-", None, "local_cpu off or max_local_cpu_size 0")]
    try:
        tiers = engine.host_tiers(model, memory=int(cpu * GIB) * tp, disk=int(disk * GIB) * tp or None,
                                  backend="lmcache", kv_dtype=kv_dtype, tp=tp, options=options)
    except KVBudgetError as exc:
        return [LogRow("LMCache CPU tier per worker", f"{cpu:g} GB", "-", None, str(exc))]
    rows = []
    for t in tiers:
        per = t.unit_bytes // t.ranks
        note = (f"LMCache's GB are GiB; {per:,}-byte chunks of {LMCACHE_CHUNK} tokens (not printed: from its "
                "layout)" + ("" if chunk == str(LMCACHE_CHUNK) else
                             f"; the log's chunk_size is {chunk}, kvbudget models {LMCACHE_CHUNK}"))
        rows.append(LogRow(f"LMCache {'CPU' if t.medium == 'host memory' else 'disk'} tier per worker",
                           f"{(cpu if t.medium == 'host memory' else disk):g} GB",
                           f"{t.units:,} chunks, {t.units * LMCACHE_CHUNK:,} tokens", None, note))
    return rows
