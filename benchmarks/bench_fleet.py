"""Times `simulate_fleet`: 16 replicas of Llama-3.1-8B on H100-80GBs (default settings: vLLM, prefix caching on)
behind each built-in router over the Azure conversation trace (19,366 requests, one hour), against the target of
20,000 simulated requests per second of wall time on one core; beside it, in the same run, one replica taking the
whole trace (`simulate`), the work a fleet adds being its replicas' steps; with `--pd P,D`, also P prefill and D
decode replicas of the same deployment behind each router, the KV moved over InfiniBand. Times are the process's
CPU seconds (one core; on a shared machine the wall clock also counts other processes' turns). Prints figures;
asserts nothing. Trace: Azure LLM inference trace 2023, Microsoft Azure Public Dataset.

    python benchmarks/bench_fleet.py [--runs 3] [--replicas 16] [--routers round-robin,least-requests,least-kv]
                                     [--pd 1,1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import kvbudget
from kvbudget.engines.scheduling.setup import Role
from kvbudget.simulation import read_trace, simulate
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import setup_for

TARGET = 20_000  # simulated requests per second of wall time (issue 52, item 6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--routers", default="round-robin,least-requests,least-kv")
    ap.add_argument("--pd", default="", help="P,D: prefill and decode replicas of a disaggregated fleet too")
    a = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")
    model = kvbudget.load_model("llama-3.1-8b")
    setup = setup_for(model, gpu="H100-80GB")
    requests = list(read_trace("azure-conv-2023"))  # read once: the figures time the simulation alone
    pools = [Pool(name="main", setup=setup, replicas=a.replicas)]
    routers = a.routers.split(",")
    fleets = {name: (pools, name, None) for name in routers}
    if a.pd:
        p, d = (int(x) for x in a.pd.split(","))
        disagg = [Pool(name="prefill", setup=setup, replicas=p, role=Role.PREFILL),
                  Pool(name="decode", setup=setup, replicas=d, role=Role.DECODE)]
        fleets |= {f"{p} prefill + {d} decode, {name}": (disagg, name, "infiniband") for name in routers}
    times: dict[str, list[float]] = {name: [] for name in ["one replica", *fleets]}
    steps: dict[str, int] = {}
    for _ in range(a.runs):  # alternating rounds: a shared machine's speed moves between them, not within one
        start = time.process_time()
        alone = simulate(model, requests, setup=setup)
        times["one replica"].append(time.process_time() - start)
        steps["one replica"] = alone.steps
        for name, (fleet_pools, router, link) in fleets.items():
            start = time.process_time()
            fleet = simulate_fleet(model, requests, fleet_pools, router, kv_link=link)
            times[name].append(time.process_time() - start)
            steps[name] = sum(r.simulation.steps for r in fleet.replicas)
    single = len(requests) / min(times["one replica"])
    print(f"Azure conv, {len(requests):,} requests, Llama-3.1-8B on H100-80GB, best of {a.runs} (CPU seconds):")
    print(f"  one replica (simulate): {min(times['one replica']):.2f} s = {single:,.0f} requests/s, "
          f"{steps['one replica']:,} steps")
    for name in fleets:
        best = min(times[name])
        rate = len(requests) / best
        label = f"{a.replicas} replicas, {name}" if name in routers else name
        print(f"  {label}: {best:.2f} s = {rate:,.0f} requests/s (target {TARGET:,}: "
              f"{'met' if rate >= TARGET else 'not met'}, {rate / TARGET:.2f}x); {steps[name]:,} steps = "
              f"{steps[name] / best / 1e6:.2f} M steps/s; {rate / single:.2f}x one replica's rate")


if __name__ == "__main__":
    main()
