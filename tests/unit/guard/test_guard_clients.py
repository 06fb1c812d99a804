"""Fairness between clients: one client's idle sockets or flood of requests cannot keep another from being
served. Clients are real sockets from different loopback addresses (127.0.0.2, 127.0.0.3) against the guard as
`kvbudget guard` serves it."""

from __future__ import annotations

import io
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")

from kvbudget.guard.server import build_guard, server_config  # noqa: E402

A, B = "127.0.0.2", "127.0.0.3"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def serve_guard(serve, fake_engine, log, **config):
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=log, config=config)
    return serve(None, config=lambda port: server_config(guard, "127.0.0.1", port))


def connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def get(sock: socket.socket, path: str = "/healthz") -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock.recv(4096)


def post(port: int, source: str, headers: dict | None = None) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=20) as client:
        return client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, headers=headers or {})


def test_one_address_cannot_hold_every_connection(fake_engine, serve):
    log = io.StringIO()
    with serve_guard(serve, fake_engine, log, max_connections=20, max_connections_per_client=5) as g:
        mine = [connect(g.port, A) for _ in range(5)]
        extra = connect(g.port, A)
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"this address holds its limit of 5" in answer
        other = connect(g.port, B)  # another client is served while A sits on its five
        assert get(other).startswith(b"HTTP/1.1 200")
        mine[0].close()  # A closes one: it may open one again
        time.sleep(0.1)
        again = connect(g.port, A)
        assert get(again).startswith(b"HTTP/1.1 200")
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_connections_refused_total{reason="too_many_connections_per_client"} 1.0' in text
        for sock in [*mine, extra, other, again]:
            sock.close()
    refused = [json.loads(line) for line in log.getvalue().splitlines() if "connection_refused" in line]
    assert [(r["reason"], r["client"]) for r in refused] == [("too_many_connections_per_client", A)]


def test_a_trusted_proxy_is_not_capped_per_client(fake_engine, serve):
    with serve_guard(serve, fake_engine, io.StringIO(), max_connections_per_client=2,
                     trusted_proxies=[A]) as g:
        many = [connect(g.port, A) for _ in range(4)]
        assert all(get(sock).startswith(b"HTTP/1.1 200") for sock in many)
        for sock in many:
            sock.close()


def test_one_client_flooding_requests_gets_429_and_the_other_is_served(fake_engine, serve):
    fake_engine.slow_answer = 1.5  # each answer takes 1.5 s: requests stay in flight
    log = io.StringIO()
    with serve_guard(serve, fake_engine, log, max_in_flight_per_client=2) as g, ThreadPoolExecutor(8) as pool:
        flood = [pool.submit(post, g.port, A) for _ in range(2)]
        time.sleep(0.5)  # A's two are in flight
        third = post(g.port, A)
        assert third.status_code == 429 and third.headers["retry-after"] == "5"
        assert third.json()["error"]["type"] == "rate_limit_exceeded"
        other = post(g.port, B)
        assert other.status_code == 200  # B is not held back by A's flood
        assert [f.result().status_code for f in flood] == [200, 200]
        assert post(g.port, A).status_code == 200  # A's finished: it may send again
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_client_refused_total{reason="in_flight"} 1.0' in text
    events = [json.loads(line) for line in log.getvalue().splitlines() if "client_refused" in line]
    assert [(e["client"], e["limit"]) for e in events] == [(f"addr:{A}", 2)]


def test_a_client_is_its_key_or_the_name_a_trusted_proxy_gives(fake_engine, serve):
    fake_engine.slow_answer = 1.0
    with serve_guard(serve, fake_engine, io.StringIO(), max_in_flight_per_client=1, api_keys=["k1", "k2"]) as g, \
            ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, g.port, A, {"authorization": "Bearer k1"})
        time.sleep(0.4)
        assert post(g.port, A, {"authorization": "Bearer k1"}).status_code == 429  # the same key
        assert post(g.port, A, {"authorization": "Bearer k2"}).status_code == 200  # same address, other key
        assert first.result().status_code == 200
    with serve_guard(serve, fake_engine, io.StringIO(), max_in_flight_per_client=1, client_header="x-client-id",
                     trusted_proxies=[A]) as g, ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, g.port, A, {"x-client-id": "alice"})
        time.sleep(0.4)
        assert post(g.port, A, {"x-client-id": "alice"}).status_code == 429
        assert post(g.port, A, {"x-client-id": "bob"}).status_code == 200  # the proxy names another client
        assert first.result().status_code == 200
        first = pool.submit(post, g.port, B, {"x-client-id": "carol"})
        time.sleep(0.4)
        # B is no trusted proxy: its header is ignored, so it is one client whatever it claims
        assert post(g.port, B, {"x-client-id": "dave"}).status_code == 429
        assert first.result().status_code == 200
    with serve_guard(serve, fake_engine, io.StringIO(), max_in_flight_per_client=1) as g, \
            ThreadPoolExecutor(4) as pool:  # X-Forwarded-For names no client, even from loopback
        first = pool.submit(post, g.port, "127.0.0.1", {"x-forwarded-for": "10.0.0.1"})
        time.sleep(0.4)
        assert post(g.port, "127.0.0.1", {"x-forwarded-for": "10.0.0.2"}).status_code == 429
        assert first.result().status_code == 200
