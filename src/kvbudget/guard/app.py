"""The guard's ASGI app: OpenAI-compatible routes in front of one or more engine replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvbudget.engines import get_engine
from kvbudget.errors import UpstreamConfigError
from kvbudget.guard.config import GuardConfig
from kvbudget.guard.gate import Gate, Refusal
from kvbudget.guard.limits import ON_DISCONNECT
from kvbudget.guard.log import guard_log
from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import Replica
from kvbudget.guard.poller import Poller
from kvbudget.guard.relay import HOP_BY_HOP, error, relay
from kvbudget.guard.routes import Routes
from kvbudget.guard.signals import Prediction
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError

FAILING = 3  # a replica whose last this many answers failed (5xx, timeouts) is not ready ...
FAILURE_MEMORY = 30.0  # ... for this many seconds after the last of them (then traffic tries it again)


class Guard:
    """The OpenAI routes over HTTP: body limits here; the admission pipeline in `gate`, polling, metrics and relay
    in their modules. `prediction`: what it predicts with (none: observed usage alone); `log`: where its decisions
    and events go (None: the `kvbudget.guard` logger, on stderr)."""

    def __init__(self, config: GuardConfig, prediction: Prediction | None = None, log: logging.Logger | None = None):
        self.config = config
        self.prediction = prediction = prediction or Prediction()
        self.log = log = log or guard_log()
        if config.sidecar and len(config.upstreams) != 1:
            raise UpstreamConfigError("sidecar: a sidecar fronts exactly one engine replica; give one upstream",
                                      param="upstream")
        self.replicas = [Replica(url=url.rstrip("/"), budget=prediction.budget, pool=prediction.budget_source)
                         for url in config.upstreams]
        self.pool: Pool | None = None  # made in the app's lifespan, on its event loop
        self.closing = asyncio.Event()  # set shortly before the shutdown grace runs out: streams end cleanly
        self.loop: asyncio.AbstractEventLoop | None = None  # the app's, once it has started
        self.metrics = GuardMetrics()
        self.engine = get_engine(config.engine)
        self.gate = Gate(config, self.replicas, self.metrics, self.engine, prediction, log)
        # request headers kept from the upstream: hop-by-hop ones, and the guard's own API key
        self.not_forwarded = HOP_BY_HOP | ({b"authorization"} if self.gate.keys else set())
        for r in self.replicas:
            if r.budget is not None:
                self.metrics.kv_budget.labels(r.url).set(r.budget)
        self.poller = Poller(self.engine, self.replicas, self.metrics, config.connect_timeout,
                             config.poll_interval, prediction.pool_budget, log,
                             queue=config.policy.max_waiting is not None)

    @staticmethod
    def refused(refusal: Refusal) -> Response:
        """A refusal as an OpenAI-style error answer."""
        headers = None if refusal.retry_after is None else {"Retry-After": str(refusal.retry_after)}
        return error(refusal.status, refusal.message, refusal.kind, headers=headers, param=refusal.param)

    def _denied(self, request: Request) -> Response | None:
        """401 when the guard has keys and the request carries none of them."""
        refusal = self.gate.authorize(request.headers)
        return None if refusal is None else self.refused(refusal)

    async def _read(self, request: Request) -> bytes | Response:
        """The request's body, or the error answer (401, 413; 499 for a client gone or cut by the HTTP
        protocol's body_timeout, which has answered it)."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return error(413, f"request body over {limit} bytes", "invalid_request_error")
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return Response(status_code=499)
            chunk, more = message.get("body", b""), message.get("more_body", False)
            size += len(chunk)
            if size > limit:
                return error(413, f"request body over {limit} bytes", "invalid_request_error")
            chunks.append(chunk)
        return b"".join(chunks)

    async def completions(self, request: Request) -> Response:
        raw = await self._read(request)
        if isinstance(raw, Response):
            return raw
        start = time.perf_counter()  # the guard's own time starts here, not during the client's upload
        scope = request.scope
        pending = self.gate.read(scope["path"], raw, request.headers, (request.client or ("", 0))[0])
        if isinstance(pending, Refusal):
            return self.refused(pending)
        tried: set[str] = set()
        while True:
            admitted = self.gate.admit(pending, tried)
            if isinstance(admitted, Refusal):
                return self.refused(admitted)
            decision, release = admitted.decision, admitted.release
            assert decision.replica is not None and decision.body is not None
            # raw header pairs, filtered once: cheaper than rebuilding and re-normalising a mapping per request
            dropped = self.not_forwarded
            for k, v in scope["headers"]:  # the headers a client names in Connection are hop-by-hop too
                if k == b"connection":
                    dropped = dropped | {t.strip().lower().encode("latin-1") for t in v.decode("latin-1").split(",")}
            headers = [(k, v) for k, v in scope["headers"] if k not in dropped]  # lowercase
            payload = raw if not decision.changes else json.dumps(decision.body).encode()  # untouched: as received
            target = scope["path"] + ("?" + scope["query_string"].decode() if scope.get("query_string") else "")
            self.metrics.added_latency.observe(time.perf_counter() - start)
            assert self.pool is not None
            forwarding = relay(self.pool, decision, target, headers, payload, release, self.metrics,
                               self.config.first_byte_timeout, self.config.idle_timeout,
                               self.config.max_response_bytes, self.closing)
            if pending.body.get("stream"):  # a streamed answer notices the client leaving while it streams
                response = await forwarding
            else:  # the whole answer is awaited: a client that leaves meanwhile cancels the upstream request
                response = await self._unless_client_leaves(forwarding, scope)
            if response is not None:
                if response.status_code != 499:  # a client that left says nothing about the engine
                    self.answered(decision.replica, response.status_code)
                return response
            next(r for r in self.replicas if r.url == decision.replica).healthy = False
            tried.add(decision.replica)  # could not connect: try another replica once
            if len(tried) == len(self.replicas):
                self.metrics.upstream_errors.labels("all", "unreachable").inc()
                return error(502, "no upstream could be reached", "upstream_unreachable")

    def settle(self) -> None:
        """Every replica's level and usage gauge brought up to now (staleness and hysteresis move with time)."""
        policy, now = self.config.policy, time.monotonic()
        for r in self.replicas:
            self.metrics.usage.labels(r.url).set(r.settle(policy, now))
            self.metrics.level.labels(r.url).set(r.level)

    def ready(self) -> bool:
        """Some replica can serve (`unready`): a guard rejecting everything, reading garbage or in front of an
        engine that fails should be taken out of rotation."""
        self.settle()
        now = time.monotonic()
        return self.poller.polled and any(self.unready(r, now) is None for r in self.replicas)

    def unready(self, r: Replica, now: float) -> str | None:
        """Why a replica cannot serve now (None: it can): unreachable, its last answers failed, its KV usage
        unread or stale (its metrics fail), or at level 3."""
        if not r.healthy:
            return "unreachable"
        if r.failures >= FAILING and now - r.failed_at <= FAILURE_MEMORY:
            return f"its last {r.failures} answers failed (the last: {r.failure})"
        if self.engine.usage is not None and r.observed is None:
            return "no usable reading of its KV usage"
        if self.engine.usage is not None and not r.fresh(self.config.policy, now):
            return f"its KV usage is stale: its metrics last read {now - r.observed_at:.0f} s ago"
        return "level 3: its KV cache is nearly full" if r.level >= 3 else None

    def answered(self, url: str, status: int) -> None:
        """Count a replica's answer: a 5xx (or the guard's 502/504 for it) adds to its run of failures, anything
        else ends it."""
        replica = next(r for r in self.replicas if r.url == url)
        if status >= 500:
            replica.failures += 1
            replica.failed_at, replica.failure = time.monotonic(), f"status {status}"
        else:
            replica.failures = 0

    def begin_shutdown(self) -> None:
        """SIGTERM: streams still running when the grace is nearly over end with an error event and [DONE]
        rather than being cut (called from the signal handler; thread-safe)."""
        loop = self.loop
        if loop is None:
            return
        grace = self.config.shutdown_grace
        margin = min(5.0, grace / 3)
        loop.call_soon_threadsafe(loop.call_later, max(0.0, grace - margin), self.closing.set)

    async def _unless_client_leaves(self, forwarding: Any, scope: MutableMapping[str, Any]) -> Response | None:
        """The relay's answer, or 499 when the client disconnects first: the guard's HTTP protocol calls back
        (`ON_DISCONNECT`), the relay is cancelled, which closes the upstream connection, and the engine aborts the
        request. No task is started for it: the request's own task is the one cancelled."""
        task = asyncio.current_task()
        assert task is not None
        left = False

        def leave() -> None:
            nonlocal left
            left = True
            task.cancel()

        scope[ON_DISCONNECT] = leave
        try:
            return await forwarding
        except asyncio.CancelledError:
            if not left:
                raise
            task.uncancel()
            self.metrics.upstream_errors.labels("all", "client_left").inc()
            return Response(status_code=499)
        finally:
            scope.pop(ON_DISCONNECT, None)

    async def models(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        assert self.pool is not None
        for replica in sorted(self.replicas, key=lambda r: not r.healthy):
            try:
                status, body, kind = await self.pool.get(f"{replica.url}/v1/models", self.config.connect_timeout)
                return Response(body, status_code=status, headers={"content-type": (
                    kind or b"application/json").decode("latin-1")})
            except ConnectFailed:
                replica.healthy = False
            except UpstreamError:
                pass
        self.metrics.upstream_errors.labels("all", "unreachable").inc()
        return error(502, "no upstream could be reached", "upstream_unreachable")

    async def metrics_route(self, request: Request) -> Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        engine = b""
        if self.config.sidecar:  # the engine's own, from the last poll: a scrape here would let anyone who asks
            engine = self.replicas[0].exposition.removesuffix(b"# EOF\n")  # drive the engine's /metrics
            if engine and not engine.endswith(b"\n"):
                engine += b"\n"
        self.settle()
        return Response(engine + self.metrics.exposition(), media_type="text/plain; version=0.0.4")

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        ready = self.ready()
        if self._denied(request) is not None:  # probes without the key learn readiness, not the upstreams
            return JSONResponse({"ready": ready}, status_code=200 if ready else 503)
        now = time.monotonic()
        replicas = [{"url": r.url, "ready": (why := self.unready(r, now)) is None, "reason": why or "",
                     "healthy": r.healthy, "level": r.level, "observed": r.observed, "predicted": r.predicted,
                     "in_flight": r.in_flight, "waiting": r.waiting, "failures": r.failures, "budget_bytes": r.budget,
                     "budget_source": r.pool, "pool": r.pool} for r in self.replicas]
        reason = "" if ready else "not polled yet" if not self.poller.polled else "; ".join(
            f"{r['url']}: {r['reason']}" for r in replicas)
        return JSONResponse({"ready": ready, "reason": reason, "replicas": replicas},
                            status_code=200 if ready else 503)

    def app(self) -> Routes:
        """The ASGI app; serve it with `server.server_config` (the guard's HTTP protocol: connection limits, and
        a client that leaves a non-streamed request cancels it upstream)."""
        @contextlib.asynccontextmanager
        async def lifespan() -> AsyncIterator[None]:
            self.pool = pool = Pool(connect_timeout=self.config.connect_timeout)
            self.loop = asyncio.get_running_loop()
            await self.poller.poll_once(pool)
            task = asyncio.create_task(self.poller.poll_forever(pool))
            processor = None
            if self.config.ext_proc is not None:
                from kvbudget.guard.extproc import start

                processor = await start(self.gate, *self.config.ext_proc)
            try:
                yield
            finally:
                if processor is not None:
                    await processor.stop(min(5.0, self.config.shutdown_grace))
                task.cancel()
                pool.close()

        post, get = ("POST",), ("GET",)
        return Routes({"/v1/chat/completions": (post, self.completions), "/v1/completions": (post, self.completions),
                       "/v1/models": (get, self.models), "/metrics": (get, self.metrics_route),
                       "/healthz": (get, self.healthz), "/readyz": (get, self.readyz)}, lifespan)
