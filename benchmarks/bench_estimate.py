"""Times a cold `kvbudget estimate` (a new process, as a user runs it) and estimates per second
through the Python API. Prints figures; asserts nothing.

    python benchmarks/bench_estimate.py [--runs 10] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import kvbudget


def cold_cli(runs: int, *extra: str) -> list[float]:
    exe = shutil.which("kvbudget")
    cmd = [exe] if exe else [sys.executable, "-m", "kvbudget"]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd + ["estimate", "mistral-7b", *extra], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def api_rate(seconds: float, fn) -> float:
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        count += 1
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, kvbudget {kvbudget.__version__}")
    for extra in (("--json",), ()):
        times = cold_cli(args.runs, *extra)
        label = " ".join(("kvbudget estimate mistral-7b",) + extra)
        print(f"cold `{label}`: median {statistics.median(times) * 1000:.0f} ms, "
              f"min {min(times) * 1000:.0f} ms over {args.runs} runs")

    mistral = kvbudget.load_model("mistral-7b")
    qwen_next = kvbudget.load_model("qwen3-next-80b-a3b")
    rate = api_rate(args.seconds, lambda: kvbudget.estimate(mistral, batch=[1], context=[4096]))
    print(f"API estimate(), one point, model loaded: {rate:,.0f} per second")
    rate = api_rate(args.seconds, lambda: kvbudget.estimate(qwen_next, batch=[1, 8, 64],
                                                            context=[1024, 4096, 32768, 262144]))
    print(f"API estimate(), hybrid model, 12 points: {rate:,.0f} per second")
    rate = api_rate(args.seconds, lambda: kvbudget.estimate(kvbudget.load_model("deepseek-v3"), context=[4096]))
    print(f"API load_model() + estimate() from the catalog: {rate:,.0f} per second")


if __name__ == "__main__":
    main()
