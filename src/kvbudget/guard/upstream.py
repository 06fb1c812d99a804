"""The guard's HTTP/1.1 client for its upstreams: keep-alive connections pooled per origin, responses parsed
by httptools (the C parser uvicorn uses), bodies handed on chunk by chunk as they arrive.

Why not httpx: on the 2-core benchmark machine the guard spent 1,300-1,600 us of CPU per proxied request
with httpx, most of it in httpcore's pool (a scan with a readability syscall per idle connection) and
httpx's request and header models; with this client the whole guard spends 440-500 us
(benchmarks/bench_guard.py). It does only what the guard needs: one request per connection at a time,
bodies already in memory, http:// and https:// upstreams, content-length, chunked and read-until-close
responses.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # buffered response bytes before reading from the upstream pauses (a slow client)


class UpstreamError(Exception):
    """The upstream failed after the connection was made: closed early, sent something unparsable."""


class ConnectFailed(UpstreamError):
    """Nobody could be connected to (refused, unreachable, or the connect timed out)."""


class UpstreamTimeout(UpstreamError):
    """Connected, but the upstream sent nothing within the time allowed (first byte, or between chunks)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; the parser's callbacks fill in the response of the request in flight."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.head_done = self.complete = self.received = self.paused = self.keep_alive = self.interim = False
        self.error: str | None = None
        self.waiter: asyncio.Future | None = None

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = f"unparsable response ({exc})"
            self.transport.close()
        self._wake()

    def eof_received(self) -> bool:
        self.lost = True
        self._wake()
        return False

    def connection_lost(self, exc) -> None:
        self.lost = True
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.parser.get_status_code() < 200:  # an interim answer (100 Continue): the real one follows
            self.headers.clear()
            self.interim = True
            return
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful while the message is being read

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.complete = True

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until the parser or the connection has news, or `timeout` seconds (UpstreamTimeout)."""
        self.waiter = waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take_chunks(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return data

    @property
    def until_close(self) -> bool:
        """A response framed by closing the connection (neither content-length nor chunked)."""
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("no answer in time"))


class Response:
    """An upstream response whose head has arrived; the body is read with `chunks()` or `read()`.
    Always `close()` it: a complete keep-alive response returns its connection to the pool."""

    def __init__(self, pool: Pool, key: tuple, conn: _Connection):
        self._pool, self._key = pool, key
        self._conn: _Connection | None = conn
        self.status = conn.parser.get_status_code()
        self.headers = conn.headers
        self._done = False

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamTimeout after `idle_timeout` s of silence, UpstreamError if the
        connection ends before the response does."""
        conn = self._conn
        if conn is None:
            raise UpstreamError("the response was already closed")
        while True:
            if conn.chunks:
                yield conn.take_chunks()
            elif conn.complete:
                self._done = True
                return
            elif conn.error or conn.lost:
                if conn.lost and not conn.error and conn.until_close:
                    self._done = True
                    return
                raise UpstreamError(conn.error or "the upstream closed the connection mid-response")
            else:
                await conn.wait(idle_timeout)

    async def read(self, idle_timeout: float, max_bytes: int | None = None) -> bytes:
        """The whole body; UpstreamError (the connection closed) once it passes `max_bytes`."""
        parts, size = [], 0
        async for chunk in self.chunks(idle_timeout):
            size += len(chunk)
            if max_bytes is not None and size > max_bytes:
                raise UpstreamError(f"the upstream's answer is over {max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and conn.complete and not conn.lost and conn.keep_alive:
            self._pool._release(self._key, conn)
        else:
            conn.transport.close()


class Pool:
    """Keep-alive connections per origin (most recently used first), each carrying one request at a time.
    Idle connections are dropped after `keepalive_s`, below the 5 s uvicorn-based engines keep them."""

    def __init__(self, connect_timeout: float = 5.0, keepalive_s: float = 4.0, max_idle: int = 64,
                 ssl_context: ssl.SSLContext | None = None):
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self._idle: dict[tuple, list[_Connection]] = {}
        self._origins: dict[str, tuple] = {}
        self._ssl = ssl_context  # https:// upstreams; default: the system's CAs (SSL_CERT_FILE is honoured)

    def _origin(self, base: str) -> tuple:
        """((scheme, host, port), host header, path prefix) of a base URL, parsed once."""
        origin = self._origins.get(base)
        if origin is None:
            parts = urlsplit(base)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {base!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            origin = self._origins[base] = ((parts.scheme, parts.hostname, port), parts.netloc.encode(),
                                            parts.path.rstrip("/").encode())
        return origin

    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        secure = None
        if scheme == "https":
            secure = self._ssl = self._ssl or ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Connection(loop), host, port, ssl=secure), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port} ({type(exc).__name__})") from None
        return conn

    def _take(self, key: tuple) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.transport.close()
        return None

    def _release(self, key: tuple, conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle:
            conn.transport.close()
            return
        conn._reset()
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def send(self, method: str, base: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes,
                   first_byte_timeout: float) -> Response:
        """Send one request to the upstream at `base` (its URL) for `target` (path and query) and wait for the
        head of the answer. `headers` must not carry host or content-length (they are set here)."""
        key, netloc, prefix = self._origin(base)
        head = b"".join([method.encode(), b" ", prefix, target.encode(), b" HTTP/1.1\r\nhost: ", netloc,
                         b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n",
                         *[b"%s: %s\r\n" % pair for pair in headers], b"\r\n"])
        conn = self._take(key)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(*key)
            conn.transport.write(head + body)
            try:
                while not conn.head_done:
                    if conn.error or conn.lost:
                        raise UpstreamError(conn.error or "the upstream closed the connection before answering")
                    await conn.wait(first_byte_timeout)
            except UpstreamTimeout:
                conn.transport.close()
                raise
            except UpstreamError:
                conn.transport.close()
                if reused and not conn.received:  # a kept-alive connection the upstream had just closed
                    conn, reused = None, False
                    continue
                raise
            except BaseException:
                conn.transport.close()
                raise
            return Response(self, key, conn)

    async def get(self, url: str, timeout: float, max_bytes: int = 16 * 2**20) -> tuple[int, bytes, bytes | None]:
        """GET a whole (small) resource, at most `max_bytes`: status, body and content type; errors as in
        `send`."""
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        response = await self.send("GET", f"{parts.scheme}://{parts.netloc}", target, [(b"accept", b"*/*")], b"",
                                   timeout)
        try:
            return response.status, await response.read(timeout, max_bytes), response.header(b"content-type")
        finally:
            response.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
