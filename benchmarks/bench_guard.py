"""Bounded load on loopback: latency and throughput of a minimal upstream, directly and through
`kvbudget guard`. A fixed number of requests at a fixed rate, then a closed-loop burst; it stops by itself.
Prints figures; asserts nothing.   python benchmarks/bench_guard.py [--rate 300] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REQUEST = {"model": "stub", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16}


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


class Client:
    """A minimal keep-alive HTTP/1.1 load generator (asyncio streams, one request per connection at a time):
    it costs a fraction of what an httpx client does, so the generator disturbs the measurement less."""

    def __init__(self, url: str, stream: bool = False):
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.idle: list = []
        body = json.dumps({**REQUEST, "stream": stream}).encode()
        self.request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (f"{host}:{port}".encode(), len(body), body))

    async def post(self) -> float:
        """Send one request, read the whole answer; the perf_counter() when its first body bytes arrived."""
        for attempt in range(2):
            reused = bool(self.idle)
            reader, writer = self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(self.request)
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                if reused and attempt == 0:  # the server closed an idle keep-alive connection
                    continue
                raise
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.split(b"\r\n")[0].decode())
            lines = head.lower().split(b"\r\n")
            if b"transfer-encoding: chunked" in lines:  # a stream: chunks until the empty one
                first = None
                while size := int(await reader.readuntil(b"\r\n"), 16):
                    await reader.readexactly(size + 2)
                    first = first or time.perf_counter()
                await reader.readexactly(2)
            else:
                await reader.readexactly(next(int(line.split(b":")[1]) for line in lines
                                              if line.startswith(b"content-length:")))
                first = time.perf_counter()
            self.idle.append((reader, writer))
            return first

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def on_schedule(rate: float, count: int, start: Callable[[], Awaitable[Any]]) -> list[Any]:
    """`count` calls of `start`, one every 1/rate seconds whatever the earlier ones are doing; their results."""
    tasks = []
    begin = time.perf_counter()
    for i in range(count):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(start()))
    return await asyncio.gather(*tasks)


async def fixed_rate(url: str, rate: int, seconds: float, stream: bool) -> tuple[list[float], float]:
    """Latencies (to the first event, for streams) of rate x seconds requests sent on a fixed schedule, and the
    achieved requests/s."""
    client, latencies = Client(url, stream), []

    async def one():
        start = time.perf_counter()
        latencies.append(await client.post() - start)

    begin = time.perf_counter()
    await on_schedule(rate, int(rate * seconds), one)
    achieved = len(latencies) / (time.perf_counter() - begin)
    client.close()
    return latencies, achieved


async def closed_loop(url: str, concurrency: int, seconds: float, stream: bool = False,
                      errors: collections.Counter | None = None) -> float:
    """Requests/s answered 200 with `concurrency` requests always outstanding: the saturation throughput. Other
    answers raise, or are counted in `errors` by their status line (their connection dropped) when it is given."""
    client, done = Client(url, stream), 0
    stop = time.perf_counter() + seconds

    async def worker():
        nonlocal done
        while time.perf_counter() < stop:
            try:
                await client.post()
                done += 1
            except RuntimeError as exc:  # an answer other than 200
                if errors is None:
                    raise
                errors[str(exc)] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    client.close()
    return done / seconds


def start_guard(upstream: str, port: int, src: Path | None = None) -> subprocess.Popen:
    """`kvbudget guard` for Llama-3.1-8B with a 40 GiB budget in front of `upstream` (from the checkout whose src
    folder is `src`, else the installed one), its output discarded."""
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    return subprocess.Popen([sys.executable, "-m", "kvbudget", "guard", "--upstream", upstream, "--listen",
                             f"127.0.0.1:{port}", "--model", "llama-3.1-8b", "--kv-memory", "40GiB"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(p * len(ordered)) - 1)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="alternating direct/guard rounds; medians reported")
    parser.add_argument("--stream", action="store_true", help="streamed (SSE) answers; latency to the first event")
    parser.add_argument("--pin", action="store_true", help="load generator on CPU 0, upstream and guard on CPU 1 "
                                                           "(Linux), so the generator does not compete with them")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    up_port, guard_port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream_stub.py"), str(up_port)])
    guard = start_guard(f"http://127.0.0.1:{up_port}", guard_port)
    if args.pin:
        os.sched_setaffinity(0, {0})
        for proc in (upstream, guard):
            os.sched_setaffinity(proc.pid, {1})
    n = int(args.rate * args.seconds)
    try:
        direct, proxied = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{guard_port}"
        wait(f"{direct}/v1/models")
        wait(f"{proxied}/healthz")
        asyncio.run(fixed_rate(proxied, 50, 1, args.stream))  # warm up
        rounds = {"direct": [], "guard": []}
        cpu = {"upstream": 0.0, "guard": 0.0}
        for _ in range(args.repeat):
            for name, url in (("direct", direct), ("guard", proxied)):
                before = cpu_seconds(upstream.pid), cpu_seconds(guard.pid)
                lat, achieved = asyncio.run(fixed_rate(url, args.rate, args.seconds, args.stream))
                if name == "guard":
                    cpu["upstream"] += cpu_seconds(upstream.pid) - before[0]
                    cpu["guard"] += cpu_seconds(guard.pid) - before[1]
                rps = asyncio.run(closed_loop(url, args.concurrency, 5, args.stream))
                rounds[name].append((statistics.median(lat), pct(lat, 0.99), achieved, rps))
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"{args.rate} requests/s for {args.seconds:g} s ({n} requests) per round, {args.repeat} alternating "
              "rounds, medians over rounds; "
              + ("streamed chat completions (latency to the first event)" if args.stream else
                 "non-streaming chat completions") + " on loopback, "
              + ("load generator on CPU 0, upstream and guard on CPU 1" if args.pin else
                 "load generator, guard and upstream sharing the machine"))
        med = {name: [statistics.median(r[i] for r in rs) for i in range(4)] for name, rs in rounds.items()}
        for name, (p50, p99, achieved, rps) in med.items():
            print(f"{name:6s}: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, {achieved:.1f} requests/s achieved; "
                  f"saturation {rps:,.0f} requests/s at concurrency {args.concurrency}")
        added99 = [(g[1] - d[1]) * 1000 for d, g in zip(rounds["direct"], rounds["guard"])]
        print(f"added by the guard: p50 {(med['guard'][0] - med['direct'][0]) * 1000:.2f} ms, p99 "
              f"{(med['guard'][1] - med['direct'][1]) * 1000:.2f} ms (per round: "
              f"{', '.join(f'{a:.2f}' for a in added99)} ms); throughput at {args.rate} requests/s "
              f"{med['guard'][2] / med['direct'][2]:.0%} of direct; saturation throughput "
              f"{med['guard'][3] / med['direct'][3]:.0%} of direct")
        if cpu["guard"]:
            total = n * args.repeat
            print(f"CPU per proxied request at {args.rate} requests/s: guard {cpu['guard'] / total * 1e6:.0f} us, "
                  f"upstream stub {cpu['upstream'] / total * 1e6:.0f} us")
        metrics = urllib.request.urlopen(f"{proxied}/metrics").read().decode()
        count = sum(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("kvbudget_guard_added_latency_seconds_count"))
        total = sum(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("kvbudget_guard_added_latency_seconds_sum"))
        print(f"guard's own measure of the time it adds before forwarding: mean {total / count * 1000:.3f} ms "
              f"over {count:,.0f} requests")
    finally:
        for proc in (guard, upstream):
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
