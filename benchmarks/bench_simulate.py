"""Times `kvbudget.simulate` on the real traces: the Azure conversation trace (19,366 requests, one hour) on
Llama-3.1-8B / H100 without prefix caching (vLLM, fast path and step-by-step reference; llama.cpp's slots), and
the Mooncake conversation trace with prefix caching; and peak Python memory against the trace length (the trace
is streamed). Prints figures; asserts nothing. Trace: Azure LLM inference trace 2023, Microsoft Azure Public Dataset.

    python benchmarks/bench_simulate.py [--runs 3] [--mooncake-requests 12031]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

import kvbudget
from kvbudget.simulation import read_trace, rescale, simulate
from kvbudget.traces import find as bundled_trace

TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package
AZURE = TRACES / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"


def timed(runs: int, make, **kw):
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = simulate(MODEL, make(), gpu="H100", **kw)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mooncake-requests", type=int, default=12031)
    ap.add_argument("--mooncake-rate-scale", type=float, default=1.0)
    a = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")
    best, median, r = timed(a.runs, lambda: read_trace(AZURE), prefix_caching=False)
    print(f"Azure conv, {r.requests:,} requests, {r.steps:,} steps ({r.fast_steps:,} in decode runs), no prefix "
          f"caching: best {best:.2f} s, median {median:.2f} s = {r.requests / best:,.0f} requests/s")
    best, median, r = timed(1, lambda: read_trace(AZURE), prefix_caching=False, fast=False)
    print(f"  the same step by step (reference): {best:.2f} s = {r.requests / best:,.0f} requests/s")
    best, median, r = timed(max(1, a.runs - 2), lambda: rescale(read_trace(MOONCAKE), a.mooncake_rate_scale,
                                                                count=a.mooncake_requests))
    print(f"Mooncake conv, {r.requests:,} requests, prefix caching (hit rate {r.prefix_hit_rate:.1%}, peak "
          f"waiting {r.peak_waiting:,}): best {best:.2f} s = {r.requests / best:,.0f} requests/s")
    for name, gpu, tp, count, max_len in (("gpt-oss-20b", "H100", 1, None, None),
                                          ("qwen3-next-80b-a3b", "H200", 2, None, None),
                                          ("gemma-2-9b", "H100", 1, 5000, 8192)):
        model = kvbudget.load_model(name)
        start = time.perf_counter()
        r = simulate(model, rescale(read_trace(AZURE), count=count), gpu=gpu, tp=tp, max_model_len=max_len,
                     prefix_caching=False)
        took = time.perf_counter() - start
        print(f"Azure conv on {name} (hybrid, fast path), {r.requests:,} requests: {took:.2f} s = "
              f"{r.requests / took:,.0f} requests/s")
    for name, gpu, tp, count in (("gpt-oss-20b", "H100", 1, 3000), ("qwen3-next-80b-a3b", "H200", 2, 3000)):
        model = kvbudget.load_model(name)
        start = time.perf_counter()
        r = simulate(model, rescale(read_trace(AZURE), count=count), gpu=gpu, tp=tp)
        took = time.perf_counter() - start
        print(f"Azure conv on {name} (hybrid, prefix caching, step by step), {r.requests:,} requests: "
              f"{took:.2f} s = {r.requests / took:,.0f} requests/s")
    for slots, unified in ((None, False), (8, False), (16, True)):
        best, median, r = timed(1, lambda: read_trace(AZURE), engine="llamacpp", max_model_len=16384,
                                max_num_seqs=slots, kv_unified=unified)
        print(f"Azure conv on llama.cpp, {r.setup.max_num_seqs} slots{' (unified)' if unified else ''}: "
              f"{best:.2f} s = {r.requests / best:,.0f} requests/s")
    for count in (2000, 19366):
        tracemalloc.start()
        simulate(MODEL, rescale(read_trace(AZURE), count=count), gpu="H100", prefix_caching=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  peak Python memory, Azure first {count:,} requests: {peak / 2**20:.1f} MiB")


MODEL = kvbudget.load_model("llama-3.1-8b")

if __name__ == "__main__":
    main()
