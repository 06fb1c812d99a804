"""The guard's upstream client against scripted raw-socket servers (framing, keep-alive, faults) and a
real uvicorn server over plain HTTP and TLS."""

from __future__ import annotations

import asyncio
import ssl
import time

import pytest

pytest.importorskip("httptools")
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError, UpstreamTimeout

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Script:
    """A loopback server that hands each connection to `handler(reader, writer, log)`; log counts connections
    and requests."""

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self):
        async def serve(reader, writer):
            self.connections += 1
            try:
                await self.handler(reader, writer, self)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def request(self, reader) -> bytes:
        """One request's head and body (content-length framed)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:"))
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


async def post(pool: Pool, url: str, body: bytes = b'{"a": 1}', timeout: float = 5.0, idle: float = 5.0):
    response = await pool.send("POST", url, "/v1/chat/completions", [(b"content-type", b"application/json")],
                               body, timeout)
    try:
        return response.status, await response.read(idle), response
    finally:
        response.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def answering(*parts: bytes, pause: float = 0.0, linger: float = 0.0):
    """A handler that reads one request, writes `parts` with `pause` s between them, and stays `linger` s."""
    async def handler(reader, writer, log):
        await log.request(reader)
        for i, part in enumerate(parts):
            await asyncio.sleep(pause if i else 0)
            writer.write(part)
            await writer.drain()
        await asyncio.sleep(linger)

    return handler


async def keep_answering(reader, writer, log):
    while True:
        await log.request(reader)
        writer.write(OK)


def test_keep_alive_connection_is_reused_and_request_is_framed():
    async def main():
        async with Script(keep_answering) as server:
            pool = Pool()
            for _ in range(3):
                status, body, _ = await post(pool, server.url, b'{"model": "m"}')
                assert (status, body) == (200, b"{}")
            assert server.connections == 1 and len(server.requests) == 3
            first = server.requests[0]
            assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert f"host: {server.url.removeprefix('http://')}".encode() in first
            assert b"content-length: 14\r\n" in first and first.endswith(b'{"model": "m"}')
            pool.close()

    run(main())


def test_chunked_response_streams_before_it_ends():
    release = asyncio.Event()

    async def handler(reader, writer, log):
        await log.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"6\r\ndata: \r\n")
        await release.wait()  # the second chunk only after the client has seen the first
        writer.write(b"4\r\nx\n\n\n\r\n0\r\n\r\n")

    async def main():
        async with Script(handler) as server:
            pool = Pool()
            response = await pool.send("POST", server.url, "/v1/chat/completions", [], b"{}", 5)
            chunks = []
            async for chunk in response.chunks(5):
                chunks.append(chunk)
                release.set()
            response.close()
            assert chunks == [b"data: ", b"x\n\n\n"]
            assert response.header(b"content-type") == b"text/event-stream"
            pool.close()

    run(main())


def test_interim_100_continue_is_skipped():
    handler = answering(b"HTTP/1.1 100 Continue\r\n\r\n",  # the final answer in a later packet
                        b"HTTP/1.1 201 Created\r\nx-final: yes\r\ncontent-length: 2\r\n\r\n{}", pause=0.2, linger=1)

    async def main():
        async with Script(handler) as server:
            status, body, response = await post(Pool(), server.url)
            assert (status, body, response.header(b"x-final")) == (201, b"{}", b"yes")

    run(main())


def test_response_framed_by_close_is_complete_and_not_reused():
    handler = answering(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")

    async def main():
        async with Script(handler) as server:
            pool = Pool()
            assert (await post(pool, server.url))[:2] == (200, b"all of it")
            assert (await post(pool, server.url))[:2] == (200, b"all of it")
            assert server.connections == 2

    run(main())


@pytest.mark.parametrize("answer, error", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part", "mid-response"),  # closes early
    (b"SMTP ready\r\n\r\n", "unparsable"),
])
def test_broken_answers_are_errors(answer, error):
    async def main():
        async with Script(answering(answer)) as server:
            with pytest.raises(UpstreamError, match=error):
                await post(Pool(), server.url)

    run(main())


def test_refused_connection_is_connect_failed():
    async def main():
        async with Script(None) as server:
            url = server.url
        with pytest.raises(ConnectFailed):  # nobody listens there any more
            await post(Pool(), url)

    run(main())


def test_first_byte_timeout_is_not_retried():
    handler = answering(linger=5)

    async def main():
        async with Script(handler) as server:
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout):
                await post(Pool(), server.url, timeout=0.3)
            assert 0.3 <= time.monotonic() - start < 2
            assert len(server.requests) == 1

    run(main())


def test_idle_stream_timeout():
    handler = answering(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n", linger=5)

    async def main():
        async with Script(handler) as server:
            response = await Pool().send("POST", server.url, "/x", [], b"", 5)
            got = []
            with pytest.raises(UpstreamTimeout):
                async for chunk in response.chunks(0.3):
                    got.append(chunk)
            response.close()
            assert got == [b"hi"]

    run(main())


def test_kept_alive_connection_the_upstream_dropped_is_retried_once_on_a_new_one():
    async def handler(reader, writer, log):
        await log.request(reader)
        if log.connections == 1:
            writer.write(OK)  # keep-alive answer, then the server drops the connection on the next request
            await log.request(reader)
            return
        writer.write(OK)
        await writer.drain()

    async def main():
        async with Script(handler) as server:
            pool = Pool()
            assert (await post(pool, server.url))[:2] == (200, b"{}")
            assert (await post(pool, server.url))[:2] == (200, b"{}")
            assert server.connections == 2 and len(server.requests) == 3

    run(main())


def test_idle_connections_expire():
    async def main():
        async with Script(keep_answering) as server:
            pool = Pool(keepalive_s=0.1)
            await post(pool, server.url)
            await asyncio.sleep(0.2)
            await post(pool, server.url)
            assert server.connections == 2
            pool.close()

    run(main())


def test_large_body_read_slowly_arrives_whole():
    payload = bytes(range(256)) * (12 * 4096)  # 12 MiB, well over the pause threshold

    async def handler(reader, writer, log):
        await log.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 65536):
            writer.write(payload[i:i + 65536])
            await writer.drain()
        await asyncio.sleep(5)  # the connection stays open: only a pause can stop the client reading

    async def main():
        async with Script(handler) as server:
            response = await Pool().send("POST", server.url, "/x", [], b"", 5)
            await asyncio.sleep(0.5)  # let the upstream fill the buffers: reading must pause, not grow without end
            assert not response._conn.transport.is_reading()
            data = b"".join([chunk async for chunk in response.chunks(5)])
            response.close()
            assert data == payload

    run(main())


def test_against_uvicorn_over_http_and_tls(tmp_path, serve, fake_engine_class):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    engine = fake_engine_class(usage=0.25)
    with serve(engine.app()) as plain, serve(engine.app(), ssl_files=(cert_file, key_file)) as secure:
        async def main(url, ctx):
            pool = Pool(ssl_context=ctx)
            status, body, kind = await pool.get(f"{url}/metrics", 5)
            assert status == 200 and b"vllm:kv_cache_usage_perc" in body and kind.startswith(b"text/plain")
            status, body, _ = await post(pool, url, b'{"messages": [], "n": 2}')
            assert status == 200 and body.count(b'"index"') == 2
            pool.close()

        run(main(plain.url, None))
        run(main(secure.url.replace("http://", "https://"), client_ctx))
