"""Bounded load on loopback: latency and throughput of a minimal upstream, directly and through
`kvbudget guard`. A fixed number of requests at a fixed rate, then a closed-loop burst; it stops by itself.
Prints figures; asserts nothing.   python benchmarks/bench_guard.py [--rate 300] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
BODY = json.dumps({"model": "stub", "messages": [{"role": "user", "content": "hello there"}],
                   "max_tokens": 16}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def fixed_rate(url: str, rate: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as client:
        async def one():
            start = time.perf_counter()
            r = await client.post(f"{url}/v1/chat/completions", content=BODY,
                                  headers={"content-type": "application/json"})
            r.raise_for_status()
            latencies.append(time.perf_counter() - start)

        tasks = []
        begin = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return latencies


async def closed_loop(url: str, concurrency: int, seconds: float) -> float:
    done = 0
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:
        stop = time.perf_counter() + seconds

        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.post(f"{url}/v1/chat/completions", content=BODY,
                                      headers={"content-type": "application/json"})
                r.raise_for_status()
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / seconds


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(round(p * len(ordered))) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    up_port, guard_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream_stub.py"), str(up_port)])
    guard = subprocess.Popen([sys.executable, "-m", "kvbudget", "guard", "--upstream", f"http://127.0.0.1:{up_port}",
                              "--listen", f"127.0.0.1:{guard_port}", "--model", "llama-3.1-8b", "--kv-memory",
                              "40GiB"], stderr=subprocess.DEVNULL)
    try:
        direct, proxied = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{guard_port}"
        wait(f"{direct}/v1/models")
        wait(f"{proxied}/healthz")
        asyncio.run(fixed_rate(proxied, 50, 1))  # warm up
        results = {}
        for name, url in (("direct", direct), ("guard", proxied)):
            lat = asyncio.run(fixed_rate(url, args.rate, args.seconds))
            rps = asyncio.run(closed_loop(url, args.concurrency, 5))
            results[name] = (lat, rps)
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"{args.rate} requests/s for {args.seconds:g} s ({int(args.rate * args.seconds)} requests), "
              "non-streaming chat completions on loopback")
        for name, (lat, rps) in results.items():
            print(f"{name:6s}: p50 {statistics.median(lat) * 1000:.2f} ms, p99 {pct(lat, 0.99) * 1000:.2f} ms; "
                  f"closed-loop throughput {rps:,.0f} requests/s at concurrency {args.concurrency}")
        d, g = results["direct"], results["guard"]
        print(f"added by the guard: p50 {(statistics.median(g[0]) - statistics.median(d[0])) * 1000:.2f} ms, "
              f"p99 {(pct(g[0], 0.99) - pct(d[0], 0.99)) * 1000:.2f} ms; throughput {g[1] / d[1]:.0%} of direct")
        metrics = urllib.request.urlopen(f"{proxied}/metrics").read().decode()
        count = sum(float(l.split()[-1]) for l in metrics.splitlines()
                    if l.startswith("kvbudget_guard_added_latency_seconds_count"))
        total = sum(float(l.split()[-1]) for l in metrics.splitlines()
                    if l.startswith("kvbudget_guard_added_latency_seconds_sum"))
        print(f"guard's own measure of the time it adds before forwarding: mean {total / count * 1000:.3f} ms "
              f"over {count:,.0f} requests")
    finally:
        for proc in (guard, upstream):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
