"""Two builds of the guard side by side: alternating saturation bursts through each, in front of one upstream stub.

    python benchmarks/ab_guard.py --base /tmp/old/src [--rounds 10] [--seconds 3] [--concurrency 32]

`--base` is the `src` folder of another checkout (for example `git worktree add /tmp/old <commit>`); the other
build is this checkout's. Both guards run at once with the same settings; each round sends a closed-loop burst
through one, then the other (the order swapping every round), so drift in the machine's speed falls on both.
Prints, per build, the median and range of requests/s and of the guard's CPU time per request, and the ratio of
the medians; asserts nothing. A single pair of bursts varies by 15-30% on a 2-core machine: use 10 rounds or more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_guard import HERE, Client, cpu_seconds, free_port, wait

SRC = HERE.parent / "src"


async def burst(url: str, concurrency: int, seconds: float) -> int:
    """Requests completed with `concurrency` always outstanding for `seconds`."""
    client, done = Client(url), 0
    stop = asyncio.get_running_loop().time() + seconds

    async def worker() -> None:
        nonlocal done
        while asyncio.get_running_loop().time() < stop:
            await client.post()
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    client.close()
    return done


def start_guard(src: Path, upstream: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.Popen([sys.executable, "-m", "kvbudget", "guard", "--upstream", upstream, "--listen",
                             f"127.0.0.1:{port}", "--model", "llama-3.1-8b", "--kv-memory", "40GiB"],
                            env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True, help="the src folder of the build to compare with")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if not (args.base / "kvbudget").is_dir():
        sys.exit(f"--base {args.base}: no kvbudget package there; give a checkout's src folder")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream_stub.py"), str(up_port)])
    builds = {"base": args.base.resolve(), "this": SRC}
    ports = {name: free_port() for name in builds}
    guards = {name: start_guard(src, f"http://127.0.0.1:{up_port}", ports[name]) for name, src in builds.items()}
    rps: dict[str, list[float]] = {name: [] for name in builds}
    cpu: dict[str, list[float]] = {name: [] for name in builds}
    try:
        wait(f"http://127.0.0.1:{up_port}/v1/models")
        for name in builds:
            wait(f"http://127.0.0.1:{ports[name]}/healthz")
            asyncio.run(burst(f"http://127.0.0.1:{ports[name]}", args.concurrency, 1))  # warm up
        for i in range(args.rounds):
            for name in (("base", "this") if i % 2 == 0 else ("this", "base")):
                before = cpu_seconds(guards[name].pid)
                done = asyncio.run(burst(f"http://127.0.0.1:{ports[name]}", args.concurrency, args.seconds))
                rps[name].append(done / args.seconds)
                cpu[name].append((cpu_seconds(guards[name].pid) - before) / done * 1e6)
        print(f"{args.rounds} alternating rounds of {args.seconds:g} s at concurrency {args.concurrency}, "
              f"{os.cpu_count()} CPUs; base: {builds['base']}, this: {builds['this']}")
        for name in builds:
            print(f"{name:4s}: {statistics.median(rps[name]):,.0f} requests/s (range {min(rps[name]):,.0f}-"
                  f"{max(rps[name]):,.0f}); guard CPU {statistics.median(cpu[name]):.0f} us a request (range "
                  f"{min(cpu[name]):.0f}-{max(cpu[name]):.0f})")
        wins = sum(t > b for t, b in zip(rps["this"], rps["base"]))
        print(f"this / base: throughput {statistics.median(rps['this']) / statistics.median(rps['base']):.2f}, "
              f"CPU a request {statistics.median(cpu['this']) / statistics.median(cpu['base']):.2f}; "
              f"this faster in {wins} of {args.rounds} rounds")
    finally:
        for proc in (*guards.values(), upstream):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
