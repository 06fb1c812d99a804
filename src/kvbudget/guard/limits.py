"""Connection limits: what keeps clients that never finish a request from taking the guard down.

uvicorn's HTTP protocol (on httptools) times out idle keep-alive connections but not a connection that is slow to
send its request line and headers, and it bounds neither the headers' size nor the number of open connections.
The guard's protocol adds the three, each logged and counted when it acts:
- a request's line and headers must arrive within `header_timeout` seconds of the connection opening or of the
  previous response ending (else 408 and the connection closed);
- they may be at most `max_header_bytes` bytes (else 431, closed);
- at most `max_connections` connections are open at once: one more is answered 503 and closed at once (so
  `/healthz` keeps answering while idle sockets pile up, and the file-descriptor limit is never reached);
- at most `max_connections_per_client` of them from one address (trusted proxies apart, which carry many
  clients): one client's idle sockets or flood cannot fill the guard for the others (503, closed).
- a request's body must arrive within `body_timeout` seconds of its headers (else 408, closed)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvbudget.guard.config import ConnectionLimits
from kvbudget.guard.log import event
from kvbudget.guard.metrics import GuardMetrics

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
else:
    _Base = object

HEADERS, BODY = "headers", "body"  # what a connection is waiting for, each with its deadline
ON_DISCONNECT = "kvbudget.on_disconnect"  # scope key: what the app wants called if its client leaves


def _answer(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": status}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


def _refuse(protocol: Any, why: str, status: int, reason: str, message: str, *, metrics: GuardMetrics,
            log: logging.Logger) -> None:
    """Count and log a connection refused by a limit, answer it and close it."""
    metrics.connections_refused.labels(why).inc()
    event(log, {"event": "connection_refused", "reason": why, "client": (protocol.client or ("", 0))[0]})
    if not protocol.transport.is_closing():
        protocol.transport.write(_answer(status, reason, message))
        protocol.transport.close()


class _PerClient:
    """Open connections by address, trusted proxies apart."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.open: dict[str, int] = {}

    def opened(self, peer: str) -> bool:
        """Count a new connection from `peer`; whether it is over the per-client cap."""
        if peer in self.limits.trusted_proxies:
            return False
        self.open[peer] = held = self.open.get(peer, 0) + 1
        cap = self.limits.max_connections_per_client
        return cap is not None and held > cap

    def closed(self, peer: str | None) -> None:
        if peer is None or peer in self.limits.trusted_proxies or peer not in self.open:
            return
        left = self.open[peer] - 1
        if left:
            self.open[peer] = left
        else:
            del self.open[peer]


class _Limited(_Base):
    """The limits over uvicorn's httptools protocol (a mixin: `protocol_for` puts it first in the protocol class,
    with its settings as class attributes). It also tells the app when a client leaves while its request is being
    answered: a callable the app puts in the request's scope under `ON_DISCONNECT` is called when the connection
    is lost."""

    limits: ConnectionLimits
    metrics: GuardMetrics
    per_client: _PerClient
    refuse: Callable[..., None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # one timer per connection for both deadlines: a phase change moves the deadline, and the timer, when
        # it fires early, sets itself again for it (no timer call per request on a busy connection)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # HEADERS, BODY, or None while the app answers (no deadline)
        self._deadline = 0.0
        self._header_bytes = 0
        self._tail = b""  # the last bytes of the headers so far (a blank line may span two reads)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.metrics.connections.set(len(self.connections))
        self._peer = (self.client or ("", 0))[0]
        over = self.per_client.opened(self._peer)
        if len(self.connections) > self.limits.max_connections or over:
            mine = len(self.connections) <= self.limits.max_connections
            self.refuse(self, "too_many_connections" + ("_per_client" if mine else ""), 503, "Service Unavailable",
                        f"this address holds its limit of {self.limits.max_connections_per_client} open "
                        "connections; close some" if mine else
                        f"the guard holds its limit of {self.limits.max_connections} open connections; retry later")
            return
        self._enter(HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = None
        if self._timer is not None:
            self._timer.cancel()
        cycle = self.cycle
        scope: dict[str, Any] = cycle.scope if cycle and not cycle.response_complete else {}  # type: ignore[assignment]
        left = scope.pop(ON_DISCONNECT, None)
        super().connection_lost(exc)
        self.metrics.connections.set(len(self.connections))
        self.per_client.closed(getattr(self, "_peer", None))
        if left is not None:
            left()

    def data_received(self, data: bytes) -> None:
        if self._phase is HEADERS:  # count the bytes up to the blank line that ends the headers
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._tail = seen[-3:]
            if self._header_bytes > self.limits.max_header_bytes:
                self.refuse(self, "headers_too_large", 431, "Request Header Fields Too Large",
                            f"request line and headers over {self.limits.max_header_bytes} bytes")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is None:  # a pipelined request: its headers are timed from their first byte
            self._enter(HEADERS)

    def on_headers_complete(self) -> None:
        self._enter(BODY)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        idle = not self.pipeline
        super().on_response_complete()
        if idle and self._phase is None:  # waiting for the next request: its headers are timed from now
            self._header_bytes = 0
            self._tail = b""
            self._enter(HEADERS)

    def _enter(self, phase: str) -> None:
        self._phase = phase
        limits = self.limits
        self._deadline = self.loop.time() + (limits.header_timeout if phase is HEADERS else limits.body_timeout)
        if self._timer is not None and self._timer.when() > self._deadline:  # an earlier deadline: the timer
            self._timer.cancel()  # set for a later one would act late (a 5 s body_timeout cut at the headers' 10 s)
            self._timer = None
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._late)

    def _late(self) -> None:
        self._timer = None
        if self._phase is None or self.transport.is_closing():
            return
        if self.loop.time() < self._deadline:  # the phase moved since the timer was set
            self._timer = self.loop.call_at(self._deadline, self._late)
        elif self._phase is HEADERS:
            self.refuse(self, "header_timeout", 408, "Request Timeout",
                        f"no complete request line and headers within {self.limits.header_timeout:g} s")
        else:
            self.refuse(self, "body_timeout", 408, "Request Timeout",
                        f"the request body did not arrive within {self.limits.body_timeout:g} s")


def protocol_for(limits: ConnectionLimits, metrics: GuardMetrics, log: logging.Logger | None = None) -> type:
    """uvicorn's httptools protocol with the guard's connection limits (pass it as uvicorn's `http`); refusals
    are logged to `log` (None: the `kvbudget.guard` logger)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from kvbudget.guard.log import guard_log

    log = log or guard_log()
    refuse = functools.partial(_refuse, metrics=metrics, log=log)
    return type("GuardProtocol", (_Limited, HttpToolsProtocol), {
        "limits": limits, "metrics": metrics, "per_client": _PerClient(limits), "refuse": staticmethod(refuse)})


__all__ = ["ON_DISCONNECT", "ConnectionLimits", "protocol_for"]
