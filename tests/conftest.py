"""Shared fixtures: a scriptable OpenAI-style upstream (`fake_engine`), serving any ASGI app on loopback
(`serve`), and free ports (`free_port`). The guard's dependencies are imported when a fixture is used."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # shared helpers (tiny_configs, simkit), every folder


class FakeEngine:
    def __init__(self, usage: float = 0.1):
        self.usage = usage
        self.metrics_fail = False
        self.die_midstream = False
        self.slow_stream = 0.0  # seconds between chunks
        self.slow_metrics = 0.0  # seconds before /metrics answers
        self.trickle_metrics = 0.0  # seconds between the bytes of /metrics (its body padded to 100 bytes)
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []  # each chat request's headers, as received
        self.status = 200  # what chat answers (a 5xx to play a failing engine)
        self.answer_padding = 0  # bytes of padding in a non-streamed chat answer
        self.metrics_padding = 0  # bytes of comment lines appended to /metrics
        self.waiting: int | None = None  # vllm:num_requests_waiting, when set
        self.slow_answer = 0.0  # seconds before a non-streamed chat answer
        self.abandoned = 0  # non-streamed chat requests whose client (the guard) left before the answer

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        async def metrics(request):
            if self.slow_metrics:
                await asyncio.sleep(self.slow_metrics)
            if self.metrics_fail:
                return PlainTextResponse("boom", status_code=500)
            text = f'vllm:kv_cache_usage_perc{{engine="0"}} {self.usage}\n'
            if self.waiting is not None:
                text += f'vllm:num_requests_waiting{{engine="0"}} {self.waiting}\n'
            if self.metrics_padding:
                text += "#" * self.metrics_padding + "\n"
            if self.trickle_metrics:
                async def trickle():
                    for ch in text.ljust(100, "#"):
                        await asyncio.sleep(self.trickle_metrics)
                        yield ch.encode()
                return StreamingResponse(trickle(), media_type="text/plain")
            return PlainTextResponse(text)

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        async def chat(request):
            body = await request.json()
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if self.status != 200:
                return JSONResponse({"error": {"message": "engine failure"}}, status_code=self.status)
            if body.get("stream"):
                async def events():
                    for i in range(5):
                        if self.slow_stream:
                            await asyncio.sleep(self.slow_stream)
                        if self.die_midstream and i == 2:
                            raise RuntimeError("engine died")
                        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
                                 "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                return StreamingResponse(events(), media_type="text/event-stream")
            n = body.get("n", 1)
            waited = 0.0
            while waited < self.slow_answer:
                await asyncio.sleep(0.02)
                waited += 0.02
                if await request.is_disconnected():
                    self.abandoned += 1
                    return PlainTextResponse("", status_code=499)
            return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": "tiny",
                                 "padding": "x" * self.answer_padding,
                                 "choices": [{"index": i, "message": {"role": "assistant", "content": "ok"},
                                              "finish_reason": "stop"} for i in range(n)],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

        return Starlette(routes=[Route("/metrics", metrics), Route("/v1/models", models),
                                 Route("/v1/chat/completions", chat, methods=["POST"])])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """An ASGI app served by uvicorn in a thread on 127.0.0.1."""

    def __init__(self, app, port: int | None = None, ssl_files: tuple | None = None, config=None):
        """`config`: a function of the port giving the uvicorn Config to serve with (else the app's default)."""
        self.port = port or _free_port()
        import uvicorn

        tls = {"ssl_certfile": str(ssl_files[0]), "ssl_keyfile": str(ssl_files[1])} if ssl_files else {}
        self.server = uvicorn.Server(config(self.port) if config else uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on", **tls))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A function giving a port nobody listens on (yet) on 127.0.0.1."""
    return _free_port


@pytest.fixture
def guard_process() -> Callable[..., Any]:
    """`with guard_process(*args) as (proc, url):` runs `kvbudget guard --listen 127.0.0.1:PORT *args` as a
    process (stderr piped) until /healthz answers, and kills it if the block leaves it running."""
    import contextlib
    import subprocess
    import sys

    import httpx

    @contextlib.contextmanager
    def run(*args: str) -> Iterator[tuple[subprocess.Popen, str]]:
        url = f"http://127.0.0.1:{_free_port()}"
        proc = subprocess.Popen([sys.executable, "-m", "kvbudget", "guard", "--listen", url.removeprefix("http://"),
                                 *args], stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.1)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()

    return run


@pytest.fixture
def serve() -> Callable[..., Served]:
    """`with serve(app) as s:` runs an ASGI app on loopback (s.url) until the block ends."""
    return Served


@pytest.fixture
def fake_engine() -> Iterator[FakeEngine]:
    """A served upstream with a settable KV gauge (`.usage`) and scriptable faults."""
    fake = FakeEngine()
    with Served(fake.app()) as served:
        fake.url = served.url
        yield fake


@pytest.fixture
def fake_engine_class() -> type[FakeEngine]:
    """The upstream class itself, for tests that serve it their own way (TLS, several copies)."""
    return FakeEngine


@pytest.fixture
def offline(monkeypatch):
    """The Hub taken as unreachable (HF_HUB_OFFLINE), with kvbudget's once-per-process answer renewed around it."""
    from kvbudget import hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.offline_reason.cache_clear()
    yield
    hub.offline_reason.cache_clear()


@pytest.fixture
def unwritable_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder nobody may write in (mode 0500; as root, who writes anywhere, os.access says no for it as it would
    to anyone else), made writable again afterwards so that it can be cleaned up."""
    import os

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == os.path.realpath(folder) else real(p, m))
    try:
        yield folder
    finally:
        folder.chmod(0o700)
