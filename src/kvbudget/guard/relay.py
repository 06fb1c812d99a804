"""Forwarding one admitted request to its replica and relaying the answer, streamed chunk by chunk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from starlette.responses import JSONResponse, Response, StreamingResponse

from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import Decision
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError, UpstreamTimeout

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
              b"transfer-encoding", b"upgrade", b"content-length", b"host", b"expect"}
NOT_RELAYED = HOP_BY_HOP | {b"date", b"server"}  # the guard's own server sets these on its responses


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, object]:
    """An OpenAI-style error object (`param`: the request field at fault)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
          param: str | None = None) -> JSONResponse:
    """An OpenAI-style error answer."""
    return JSONResponse(error_body(status, message, kind, param), status_code=status, headers=headers)


async def relay(pool: Pool, decision: Decision, target: str, headers: list[tuple[bytes, bytes]], payload: bytes,
                release: Callable[[], None], metrics: GuardMetrics, first_byte_timeout: float,
                idle_timeout: float, max_response_bytes: int = 64 * 2**20,
                closing: asyncio.Event | None = None) -> Response | None:
    """The upstream's answer, or None when its replica could not be connected to (the caller may retry)."""
    url = decision.replica
    assert url is not None
    try:
        upstream = await pool.send("POST", url, target, headers, payload, first_byte_timeout)
    except ConnectFailed:
        release()
        metrics.upstream_errors.labels(url, "connect").inc()
        return None
    except UpstreamTimeout:
        release()
        metrics.upstream_errors.labels(url, "timeout").inc()
        return error(504, "the upstream did not answer in time", "upstream_timeout")
    except UpstreamError as exc:
        release()
        metrics.upstream_errors.labels(url, "transport").inc()
        return error(502, f"the upstream failed: {exc}", "upstream_error")
    except BaseException:  # the client went away while the upstream was thinking
        release()
        raise
    if upstream.status >= 500:  # relayed as it is, and counted
        metrics.upstream_errors.labels(url, f"status_{upstream.status}").inc()
    out_headers = [(k, v) for k, v in upstream.headers if k.lower() not in NOT_RELAYED]
    if decision.changes:
        out_headers.append((b"x-kvbudget-changes", "; ".join(decision.changes).encode()))
    out_headers.append((b"x-kvbudget-level", str(decision.level).encode()))
    if b"text/event-stream" not in (upstream.header(b"content-type") or b""):
        try:
            content = await upstream.read(idle_timeout, max_response_bytes)
        except UpstreamError as exc:
            metrics.upstream_errors.labels(url, "read").inc()
            return error(502, f"the upstream's answer could not be relayed: {exc}", "upstream_error")
        finally:
            upstream.close()
            release()
        response = Response(content, status_code=upstream.status)
        response.raw_headers.extend(out_headers)
        return response

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.chunks(idle_timeout):
                yield chunk
                if closing is not None and closing.is_set():  # the guard is stopping: end the stream properly
                    metrics.upstream_errors.labels(url, "shutdown").inc()
                    cut = {"error": {"message": "the guard is shutting down; this answer was cut short",
                                     "type": "server_shutting_down", "code": 503}}
                    yield f"data: {json.dumps(cut)}\n\ndata: [DONE]\n\n".encode()
                    return
        except UpstreamError as exc:
            metrics.upstream_errors.labels(url, "stream").inc()
            failure = {"error": {"message": f"the upstream stream ended abnormally ({exc})",
                                 "type": "upstream_error", "code": 502}}
            yield f"data: {json.dumps(failure)}\n\n".encode()
        finally:
            upstream.close()
            release()

    streaming = StreamingResponse(events(), status_code=upstream.status)
    streaming.raw_headers.extend(out_headers)
    return streaming
