"""The memory terms a vLLM start-up log prints before its cache (the engine's share, the profiling peak,
non-torch memory, the KV budget), beside `kvbudget plan`'s for the same settings: check-log shows them, and they
check the plan's estimates, not the cache."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvbudget.engines.base import LogRow
from kvbudget.engines.vllm.memory import cuda_graph_bytes, encoder_profile
from kvbudget.engines.vllm.releases import release
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.engines.base import Serving
    from kvbudget.engines.vllm.engine import VLLMEngine
    from kvbudget.engines.vllm.logs import _LogSettings


def memory_rows(engine: VLLMEngine, text: str, model: ModelSpec, s: _LogSettings, budget_text: str
                ) -> list[LogRow]:
    """Where the log states the GPU's total and gpu_memory_utilization: each memory term it printed beside the
    plan's for the same settings (shown, never a mismatch of the cache: they check the plan's estimates)."""
    total = log_total_memory(text)
    util = _first_number(text, (r"gpu_memory_utilization[ =(]+([\d.]+)",
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
    plan["graphs"] = cuda_graph_bytes(release(options), options.enforce_eager) / GIB
    plan["overhead"] -= plan["graphs"]
    logged = {"activation": _first_number(text, (r"activation peak memory takes ([\d.]+) ?GiB",
                                                 r"torch peak memory increase: ([\d.]+) ?GiB",
                                                 r"([\d.]+) GiB for peak activation")),
              # V1's forward increase first: its debug "worker init memory snapshot" also prints a non_torch_memory=
              # (the CUDA context before loading, not what the budget takes off)
              "overhead": _first_number(text, (r"non-torch forward increase memory: (-?[\d.]+) ?GiB",
                                               r"([\d.]+) GiB for non-torch memory",
                                               r"non_torch_memory takes (-?[\d.]+) ?GiB",
                                               r"Memory profiling results:.*?non_torch_memory=(-?[\d.]+) ?GiB")),
              # what vLLM >= 0.20 took out of the budget for its graphs (its estimate), else what they took
              "graphs": _first_number(text, (r"CUDA graph pool memory: [\d.]+ GiB \(actual\), ([\d.]+) GiB",
                                             r"Estimated CUDA graph memory: ([\d.]+) GiB",
                                             r"([\d.]+) GiB for CUDAGraph memory"))}
    peak = _first_number(text, (r"peak_torch_memory=([\d.]+)GiB",))
    weights = _first_number(text, (r"model weights take ([\d.]+)GiB", r"(?:Loading model weights took|Model "
                                   r"loading took) ([\d.]+) G", r"Actual usage is ([\d.]+) GiB for weight"))
    if logged["activation"] is None and peak is not None and weights is not None:
        logged["activation"] = peak - weights  # V0 0.6.4 prints the peak with the weights in it
    note = "kvbudget plan's estimate for these settings"
    out = [LogRow("memory: engine share", f"{total * util:.2f} GiB", f"{plan['share']:.2f} GiB", None,
                  f"{total:.2f} GiB x {util:g}, as the log states them")]
    for key, label in (("activation", "profiling peak"), ("overhead", "non-torch memory"), ("graphs", "CUDA graphs")):
        value = logged[key]
        if value is not None:
            out.append(LogRow(f"memory: {label}", f"{value:.2f} GiB", f"{plan[key]:.2f} GiB", None, note))
    out += _encoder_rows(text, model, serving, s)
    error = kv / GIB / float(budget_text) - 1 if float(budget_text) else 0.0
    out.append(LogRow("memory: KV budget before launch", f"{budget_text} GiB", f"{kv / GIB:.2f} GiB", None,
                      f"{error:+.1%}: {note}"))
    return out


def _encoder_rows(text: str, model: ModelSpec, serving: Serving, s: _LogSettings) -> list[LogRow]:
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


def log_total_memory(text: str) -> float | None:
    """The GPU's total memory (GiB) as the log states it, else None."""
    return _first_number(text, (r"total_gpu_memory[ =(]+([\d.]+) ?GiB", r"total_memory=([\d.]+) ?GiB",
                                r"Free memory on device \([\d.]+/([\d.]+) GiB\)"))


def _first_number(text: str, patterns: tuple[str, ...]) -> float | None:
    """The first pattern's number that the text has, else None."""
    for pattern in patterns:
        if m := re.search(pattern, text):
            return float(m.group(1))
    return None
