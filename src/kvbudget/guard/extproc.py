"""The guard's policy as an Envoy external processor (`envoy.service.ext_proc.v3.ExternalProcessor`, gRPC).

Envoy opens one processing stream per HTTP request and sends its phases in order: the request headers, then, with
`request_body_mode: BUFFERED`, the whole body in one message, then (as configured) the response's headers, body
and trailers. For a completion request this processor runs the proxy's own admission pipeline (`gate`): levels 1-2
answer the body phase with the rewritten body (and its new content-length), level 3 with an `ImmediateResponse`
503 and Retry-After. The chosen replica is named in `x-gateway-destination-endpoint` (the inference extension's
header, for an ORIGINAL_DST cluster) and the level in `x-kvbudget-level`. The request's predicted bytes are held
until Envoy closes the stream: the end of the HTTP exchange, or the client going away.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import grpc
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3.http_status_pb2 import HttpStatus

from kvbudget.guard.gate import ROUTES, Gate, Refusal
from kvbudget.guard.relay import error_body

ENDPOINT_HEADER = "x-gateway-destination-endpoint"


def _headers(message: Any) -> dict[str, str]:
    """An HttpHeaders message as a lowercase dict; Envoy sends `raw_value` (bytes) since 1.27, `value` before."""
    return {h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
            for h in message.headers.headers}


def _set(*pairs: tuple[str, str]) -> list[HeaderValueOption]:
    return [HeaderValueOption(header=HeaderValue(key=k, raw_value=v.encode())) for k, v in pairs]


def _immediate(status: int, body: dict[str, object], headers: tuple[tuple[str, str], ...] = (),
               details: str = "") -> pb.ProcessingResponse:
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=HttpStatus(code=status),  # the StatusCode enum's values are the status codes
        headers=pb.HeaderMutation(set_headers=_set(("content-type", "application/json"), *headers)),
        body=json.dumps(body).encode(), details=details))


def _continue(phase: str, *headers: tuple[str, str], body: bytes | None = None) -> pb.ProcessingResponse:
    common = pb.CommonResponse()
    if headers:
        common.header_mutation.CopyFrom(pb.HeaderMutation(set_headers=_set(*headers)))
    if body is not None:
        common.body_mutation.CopyFrom(pb.BodyMutation(body=body))
    if phase in ("request_headers", "response_headers"):
        return pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=common)})
    if phase in ("request_body", "response_body"):
        return pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})
    return pb.ProcessingResponse(**{phase: pb.TrailersResponse()})


class Processor(pb_grpc.ExternalProcessorServicer):
    """One guard's decisions for Envoy's processing streams."""

    def __init__(self, gate: Gate):
        self.gate = gate

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        headers: dict[str, str] = {}
        release = None
        level: int | None = None
        try:
            async for message in request_iterator:
                phase = message.WhichOneof("request")
                if phase == "request_headers":
                    headers = _headers(message.request_headers)
                    yield _continue(phase)
                elif phase == "request_body" and headers.get(":path", "").split("?")[0] in ROUTES and \
                        headers.get(":method", "POST") == "POST":
                    answer, release, level = self._decide(headers, message.request_body)
                    yield answer
                    if answer.WhichOneof("response") == "immediate_response":
                        return
                elif phase == "response_headers" and level is not None:
                    yield _continue(phase, ("x-kvbudget-level", str(level)))
                elif phase is not None:  # other phases and paths pass untouched
                    yield _continue(phase)
        finally:  # the exchange is over, or Envoy (or the client) went away
            if release is not None:
                release()

    def _decide(self, headers: dict[str, str], part: Any) -> tuple[pb.ProcessingResponse, Any, int | None]:
        gate = self.gate
        start = time.perf_counter()
        refusal = gate.authorize(headers)
        if refusal is not None:
            return _refused(refusal), None, None
        if not part.end_of_stream or len(part.body) > gate.config.max_body_bytes:
            limit = gate.config.max_body_bytes
            return _immediate(413, error_body(413, f"request body over {limit} bytes, or not buffered whole "
                                                   "(set request_body_mode: BUFFERED)", "invalid_request_error"),
                              details="kvbudget: body not whole"), None, None
        # the client's address as Envoy forwards it (x-forwarded-for's first hop; Envoy sets it with
        # use_remote_address): per-client caps count it, not Envoy's own connection
        peer = headers.get("x-forwarded-for", "").split(",")[0].strip()
        pending = gate.read(headers[":path"].split("?")[0], part.body, headers, peer)
        if isinstance(pending, Refusal):
            return _refused(pending), None, None
        admitted = gate.admit(pending, set())
        if isinstance(admitted, Refusal):
            return _refused(admitted), None, admitted.level
        decision = admitted.decision
        assert decision.replica is not None and decision.body is not None
        target = urlsplit(decision.replica)
        endpoint = f"{target.hostname}:{target.port or (443 if target.scheme == 'https' else 80)}"
        set_headers = [(ENDPOINT_HEADER, endpoint), ("x-kvbudget-level", str(decision.level))]
        new_body = None
        if decision.changes:
            new_body = json.dumps(decision.body).encode()
            set_headers.append(("content-length", str(len(new_body))))
        gate.metrics.added_latency.observe(time.perf_counter() - start)
        return _continue("request_body", *set_headers, body=new_body), admitted.release, decision.level


def _refused(refusal: Refusal) -> pb.ProcessingResponse:
    """A refusal as Envoy's immediate response (a 503 says its level and when to retry)."""
    body = error_body(refusal.status, refusal.message, refusal.kind, refusal.param)
    if refusal.retry_after is None:
        return _immediate(refusal.status, body)
    return _immediate(refusal.status, body, (("retry-after", str(refusal.retry_after)),),
                      details=f"kvbudget: level {refusal.level}")


async def start(gate: Gate, host: str, port: int) -> grpc.aio.Server:
    """The processor serving on host:port (started; stop it with `await server.stop(grace)`)."""
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(Processor(gate), server)
    shown = f"[{host}]" if ":" in host else host
    server.add_insecure_port(f"{shown}:{port}")
    await server.start()
    return server
