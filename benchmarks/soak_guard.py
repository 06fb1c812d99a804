"""Soak: mixed traffic through `kvbudget guard` for a while, and what it leaves behind. Normal and streamed
requests, clients that leave mid-stream and mid-answer, malformed requests, upstream failures (500s, streams
dying), idle connections and oversized headers, all at once on loopback against the benchmark's stub upstream.
Prints the outcomes by kind (every one is checked against what the guard should answer), latency percentiles of
the normal requests, and the guard's resident memory, open file descriptors and in-flight accounting before and
after. Asserts nothing.

    python benchmarks/soak_guard.py [--seconds 60] [--rate 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_guard import free_port, on_schedule, pct, wait  # noqa: E402

MSGS = [{"role": "user", "content": "hello there"}]
MIX = [("normal", 60), ("stream", 15), ("leave_stream", 5), ("leave_answer", 4), ("bad_field", 5),
       ("upstream_500", 2), ("stream_dies", 3), ("idle_connection", 4), ("huge_header", 2)]


def proc_figures(pid: int) -> tuple[float, int]:
    """Resident memory (MiB) and open file descriptors of a process (Linux /proc)."""
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def gauge(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def one(kind: str, client: httpx.AsyncClient, url: str, port: int, idle: list) -> tuple[str, bool, float]:
    """Send one request of this kind; (kind, whether the guard answered as it should, seconds)."""
    start = time.perf_counter()
    chat = f"{url}/v1/chat/completions"
    ok = False
    try:
        if kind == "normal":
            r = await client.post(chat, json={"messages": MSGS, "max_tokens": 16})
            ok = r.status_code == 200 and r.json()["object"] == "chat.completion"
        elif kind in ("stream", "stream_dies"):
            body = {"messages": MSGS, "max_tokens": 16, "stream": True}
            if kind == "stream_dies":
                body["fault"] = "die"
            async with client.stream("POST", chat, json=body) as r:
                lines = [line async for line in r.aiter_lines() if line]
            ok = lines[-1] == "data: [DONE]" if kind == "stream" else "upstream_error" in lines[-1]
        elif kind == "leave_stream":
            body = {"messages": MSGS, "max_tokens": 16, "stream": True, "fault": "slow"}
            async with client.stream("POST", chat, json=body) as r:
                async for _ in r.aiter_lines():
                    break  # first event, then away
            ok = r.status_code == 200
        elif kind == "leave_answer":
            try:
                await client.post(chat, json={"messages": MSGS, "fault": "slow"}, timeout=0.2)
            except httpx.TimeoutException:
                ok = True
        elif kind == "bad_field":
            raw = random.choice([b'{"messages": [], "max_tokens": "abc"}', b'{"messages": [{"role": "user", '
                                 b'"content": "x"}], "max_tokens": NaN}', b'{"messages": "x", "n": "x"}'])
            r = await client.post(chat, content=raw, headers={"content-type": "application/json"})
            ok = r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        elif kind == "upstream_500":
            r = await client.post(chat, json={"messages": MSGS, "fault": "500"})
            ok = r.status_code == 500
        elif kind == "idle_connection":
            idle.append(socket.create_connection(("127.0.0.1", port)))  # opened, never used
            ok = True
        elif kind == "huge_header":
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
            try:
                await writer.drain()
            except ConnectionError:
                pass
            head = await reader.read(64)
            ok = head.startswith(b"HTTP/1.1 431") or head == b""
            writer.close()
    except (httpx.HTTPError, ConnectionError, json.JSONDecodeError, IndexError, OSError):
        ok = False
    return kind, ok, time.perf_counter() - start


async def soak(url: str, port: int, rate: float, seconds: float) -> tuple[collections.Counter, dict]:
    kinds = [k for k, weight in MIX for _ in range(weight)]
    rng = random.Random(0)
    random.seed(0)
    outcomes: collections.Counter = collections.Counter()
    latencies: dict = collections.defaultdict(list)
    idle: list = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        results = await on_schedule(rate, int(rate * seconds),
                                    lambda: one(rng.choice(kinds), client, url, port, idle))
        for kind, ok, took in results:
            outcomes[(kind, ok)] += 1
            if ok:
                latencies[kind].append(took)
    idle_open = len(idle)
    await asyncio.sleep(3)  # past the header timeout: the guard closes the idle ones
    closed = sum(1 for s in idle if _closed(s))
    for s in idle:
        s.close()
    return outcomes, {"latencies": latencies, "idle": (idle_open, closed)}


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(0.5)
    try:
        data = sock.recv(4096)
        return data.startswith(b"HTTP/1.1 408") or data == b""
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=100)
    a = ap.parse_args()
    up_port, port = free_port(), free_port()
    config = Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-guard-{os.getpid()}.yaml"
    config.write_text("header_timeout: 2\n")
    upstream = subprocess.Popen([sys.executable, str(HERE / "upstream_stub.py"), str(up_port)],
                                stderr=subprocess.DEVNULL)  # (the streams it kills on purpose log tracebacks)
    guard = subprocess.Popen([sys.executable, "-m", "kvbudget", "guard", "--upstream", f"http://127.0.0.1:{up_port}",
                              "--listen", f"127.0.0.1:{port}", "--model", "llama-3.1-8b", "--kv-memory", "40GiB",
                              "--config", str(config)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(f"http://127.0.0.1:{up_port}/v1/models")
        wait(f"{url}/healthz")
        asyncio.run(soak(url, port, 20, 1))  # warm up
        rss0, fds0 = proc_figures(guard.pid)
        outcomes, extra = asyncio.run(soak(url, port, a.rate, a.seconds))
        time.sleep(1)
        rss1, fds1 = proc_figures(guard.pid)
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        guard.terminate()
        upstream.terminate()
        guard.wait(40)
        upstream.wait(10)
        config.unlink()
    total = sum(outcomes.values())
    print(f"soak: {total:,} requests over {a.seconds:g} s at {a.rate:g}/s through kvbudget guard (loopback, stub "
          f"upstream, {os.cpu_count()} CPUs)")
    for kind, _ in MIX:
        good, bad = outcomes[(kind, True)], outcomes[(kind, False)]
        took = extra["latencies"][kind]
        timing = f", p50 {pct(took, 0.5) * 1000:.1f} ms, p99 {pct(took, 0.99) * 1000:.1f} ms" if took else ""
        print(f"  {kind:<16} {good + bad:>6,}  as expected {good:>6,}  not {bad:>4,}{timing}")
    opened, closed = extra["idle"]
    print(f"  idle connections left open: {opened}, closed by the guard within 3 s of the end: {closed}")
    print(f"guard process: RSS {rss0:.1f} -> {rss1:.1f} MiB, open file descriptors {fds0} -> {fds1}; in flight "
          f"after: {gauge(metrics, 'kvbudget_guard_in_flight'):.0f}, predicted usage after: "
          f"{gauge(metrics, 'kvbudget_guard_predicted_usage'):.3f}")


if __name__ == "__main__":
    main()
