"""Start-up and the estimator's hot path, each beside its limit. Prints figures; asserts nothing.

    python benchmarks/bench_estimate.py [--rounds 10] [--number 20000]

Start-up: a cold `kvbudget estimate` (a new process, as a user runs it, with the package's bytecode compiled, as
pip leaves it) against a bare `python -c pass`, in alternating rounds so that a slow spell of the machine hits
both alike; the ratio of medians is the figure (targets: 3x for --json, 4x for tables). Beside them, the floor
the design sets before any kvbudget code runs: the standard library the --json path needs (`dataclasses` for the
core types, `typing`, `json`, `argparse`) and, for tables, rich as well. The hot path: estimates per second in this
process, the best of 7 repeats (targets: 100,000 dense single-point, 30,000 hybrid 12-point).
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import timeit

import kvbudget


def cold(commands: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    return times


def per_second(fn, number: int) -> float:
    return number / min(timeit.repeat(fn, number=number, repeat=7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, kvbudget {kvbudget.__version__}")
    compileall.compile_dir(os.path.dirname(kvbudget.__file__), quiet=1)  # as an installed wheel has it
    exe = shutil.which("kvbudget")
    cli = [exe] if exe else [sys.executable, "-m", "kvbudget"]
    stdlib = "import dataclasses, typing, json, argparse"
    times = cold({"bare": [sys.executable, "-c", "pass"],
                  "floor": [sys.executable, "-c", stdlib],
                  "floor_rich": [sys.executable, "-c", stdlib + ", rich.console, rich.table"],
                  "import": [sys.executable, "-c", "import kvbudget"],
                  "json": cli + ["estimate", "mistral-7b", "--json"],
                  "table": cli + ["estimate", "mistral-7b"]}, args.rounds)
    bare = statistics.median(times["bare"])
    print(f"limit: bare `python -c pass` median {bare * 1000:.0f} ms (min {min(times['bare']) * 1000:.0f} ms), "
          f"{args.rounds} alternating rounds")
    for name, label, target, floor in (
            ("floor", f"python -c '{stdlib}'", None, None),
            ("floor_rich", "the same and rich.console, rich.table", None, None),
            ("import", "import kvbudget", None, None),
            ("json", "kvbudget estimate mistral-7b --json", 3.0, "floor"),
            ("table", "kvbudget estimate mistral-7b", 4.0, "floor_rich")):
        median = statistics.median(times[name])
        goal = f" (target <= {target:g}x)" if target else ""
        above = (f"; {(median - statistics.median(times[floor])) * 1000:.0f} ms above its floor" if floor else "")
        print(f"cold `{label}`: median {median * 1000:.0f} ms, min {min(times[name]) * 1000:.0f} ms = "
              f"{median / bare:.2f}x bare{goal}{above}")

    mistral = kvbudget.load_model("mistral-7b")
    qwen_next = kvbudget.load_model("qwen3-next-80b-a3b")
    rate = per_second(lambda: kvbudget.estimate(mistral, batch=[1], context=[4096]), args.number)
    print(f"API estimate(), dense, one point, model loaded: {rate:,.0f} per second (target >= 100,000)")
    rate = per_second(lambda: kvbudget.estimate(qwen_next, batch=[1, 8, 64], context=[1024, 4096, 32768, 262144]),
                      args.number // 2)
    print(f"API estimate(), hybrid, 12 points: {rate:,.0f} per second (target >= 30,000)")
    rate = per_second(lambda: kvbudget.estimate(kvbudget.load_model("deepseek-v3"), context=[4096]), 500)
    print(f"API load_model() + estimate() from the catalog: {rate:,.0f} per second")


if __name__ == "__main__":
    main()
