"""The guard's ASGI app: OpenAI-compatible routes in front of one or more engine replicas."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import sys
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvbudget.guard.policy import Policy, Replica, decide
from kvbudget.guard.signals import Predictor, approximate_prompt_tokens, observed_usage
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError, UpstreamTimeout

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailers",
              b"transfer-encoding", b"upgrade", b"content-length", b"host", b"expect"}
NOT_RELAYED = HOP_BY_HOP | {b"date", b"server"}  # the guard's own server sets these on its responses
PRIORITY_HEADER = "x-kvbudget-priority"
log = logging.getLogger("kvbudget.guard")


@dataclass
class GuardConfig:
    upstreams: list[str]
    engine: str = "vllm"
    policy: Policy = field(default_factory=Policy)
    predictor: Predictor | None = None
    count_prompt: object = None  # callable(body) -> prompt tokens; None: characters / 4
    api_keys: frozenset[str] = frozenset()
    max_body_bytes: int = 4 * 2**20
    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0
    idle_timeout: float = 120.0
    poll_interval: float = 1.0
    decision_log: object = None  # a file-like for JSON lines; None: stderr


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                        headers=headers)


class Guard:
    def __init__(self, config: GuardConfig):
        self.config = config
        self.replicas = [Replica(url.rstrip("/")) for url in config.upstreams]
        self.held: dict[str, dict[int, int]] = {r.url: {} for r in self.replicas}  # request id -> predicted bytes
        self.ids = itertools.count()
        self.pool: Pool | None = None  # made in the app's lifespan, on its event loop
        # request headers kept from the upstream: hop-by-hop ones, and the guard's own API key
        self.not_forwarded = HOP_BY_HOP | ({b"authorization"} if config.api_keys else set())
        self.polled = False
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter("kvbudget_guard_decisions_total", "Requests by level and action",
                                 ["level", "action"], registry=r)
        self.observed_g = Gauge("kvbudget_guard_observed_usage", "Engine-reported KV usage (0-1)", ["replica"],
                                registry=r)
        self.predicted_g = Gauge("kvbudget_guard_predicted_usage", "Predicted KV usage of requests in flight (0-1)",
                                 ["replica"], registry=r)
        self.level_g = Gauge("kvbudget_guard_level", "Current level per replica (0-3)", ["replica"], registry=r)
        self.staleness_g = Gauge("kvbudget_guard_metrics_age_seconds", "Age of the last successful scrape",
                                 ["replica"], registry=r)
        self.scrape_failures = Counter("kvbudget_guard_scrape_failures_total", "Failed metric scrapes", ["replica"],
                                       registry=r)
        self.upstream_errors = Counter("kvbudget_guard_upstream_errors_total", "Upstream failures", ["replica", "kind"],
                                       registry=r)
        self.added_latency = Histogram("kvbudget_guard_added_latency_seconds", "Time the guard adds before forwarding",
                                       buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05), registry=r)
        self.in_flight_g = Gauge("kvbudget_guard_in_flight", "Requests in flight", ["replica"], registry=r)

    # --- signals ----------------------------------------------------------------------------------
    async def poll_once(self) -> None:
        for replica in self.replicas:
            timeout = self.config.connect_timeout
            try:
                if self.config.engine == "llamacpp":
                    status, body, _ = await self.pool.get(f"{replica.url}/slots", timeout)
                    value = observed_usage("llamacpp", slots=json.loads(body)) if status == 200 else None
                    if status != 200:  # /slots can be disabled; the server is still alive
                        health, _, _ = await self.pool.get(f"{replica.url}/health", timeout)
                        if health != 200:
                            raise UpstreamError(f"/health answered {health}")
                else:
                    status, body, _ = await self.pool.get(f"{replica.url}/metrics", timeout)
                    if status != 200:
                        raise UpstreamError(f"/metrics answered {status}")
                    value = observed_usage(self.config.engine, metrics_text=body.decode("utf-8", "replace"))
                replica.healthy = True
                if value is not None:
                    replica.observed, replica.observed_at = value, time.monotonic()
                    self.observed_g.labels(replica.url).set(value)
                else:
                    self.scrape_failures.labels(replica.url).inc()
            except ConnectFailed:  # nobody listening: not healthy
                replica.healthy = False
                self.scrape_failures.labels(replica.url).inc()
            except (UpstreamError, ValueError):  # slow or broken metrics: the usage goes stale
                self.scrape_failures.labels(replica.url).inc()
            if replica.observed is not None:
                self.staleness_g.labels(replica.url).set(time.monotonic() - replica.observed_at)
            self.level_g.labels(replica.url).set(replica.level)
        self.polled = True

    async def poll_forever(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let the poller die
                log.exception("metrics poll failed")
            await asyncio.sleep(self.config.poll_interval)

    def _set_predicted(self, url: str) -> None:
        replica = next(r for r in self.replicas if r.url == url)
        if self.config.predictor is not None:
            replica.predicted = self.config.predictor.fraction(sum(self.held[url].values()))
            self.predicted_g.labels(url).set(replica.predicted)
        replica.in_flight = len(self.held[url])
        self.in_flight_g.labels(url).set(replica.in_flight)

    # --- decisions ---------------------------------------------------------------------------------
    def _log(self, **fields) -> None:
        line = json.dumps({"ts": round(time.time(), 3), **fields})
        out = self.config.decision_log or sys.stderr
        print(line, file=out, flush=True)

    async def completions(self, request: Request) -> Response:
        start = time.perf_counter()
        if self.config.api_keys:
            token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if token not in self.config.api_keys:
                return _error(401, "invalid or missing API key for the guard", "authentication_error")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.config.max_body_bytes:
            return _error(413, f"request body over {self.config.max_body_bytes} bytes", "invalid_request_error")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return _error(413, f"request body over {self.config.max_body_bytes} bytes", "invalid_request_error")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return _error(400, "the request body is not a JSON object", "invalid_request_error")
        priority = request.headers.get(PRIORITY_HEADER, "").lower() == "high"
        tried: set[str] = set()
        while True:
            candidates = [r for r in self.replicas if r.url not in tried]
            decision = decide(body, candidates, self.config.policy, priority)
            self.decisions.labels(str(decision.level), decision.action).inc()
            self._log(event="decision", path=request.scope["path"], action=decision.action, level=decision.level,
                      replica=decision.replica, pressure=round(decision.pressure, 4), changes=list(decision.changes),
                      reason=decision.reason, priority=priority)
            if decision.action == "reject":
                retry = {"Retry-After": str(self.config.policy.retry_after_s)}
                if decision.replica is None:
                    return _error(503, f"no upstream can take the request: {decision.reason}", "server_unavailable",
                                  headers=retry)
                return _error(503, f"the KV cache is nearly full ({decision.reason}); retry later",
                              "server_overloaded", headers=retry)
            response = await self._forward(request, decision, start, raw)
            if response is not None:
                return response
            tried.add(decision.replica)  # could not connect: try another replica once
            if len(tried) == len(self.replicas):
                return _error(502, "no upstream could be reached", "upstream_unreachable")

    async def _forward(self, request: Request, decision, start: float, raw: bytes) -> Response | None:
        body = decision.body
        rid = next(self.ids)
        prompt = (self.config.count_prompt or approximate_prompt_tokens)(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or \
            self.config.policy.default_max_tokens
        samples = max(int(body.get("n", 1) or 1), int(body.get("best_of", 1) or 1))
        if self.config.predictor is not None:
            self.held[decision.replica][rid] = self.config.predictor.request_bytes(prompt, max_tokens, samples)
        else:
            self.held[decision.replica][rid] = 0
        self._set_predicted(decision.replica)
        # raw header pairs, filtered once: cheaper than rebuilding and re-normalising a mapping per request
        headers = [(k, v) for k, v in request.scope["headers"] if k not in self.not_forwarded]  # ASGI: lowercase
        payload = raw if not decision.changes else json.dumps(body).encode()  # untouched bodies go as they came
        scope = request.scope
        target = scope["path"] + ("?" + scope["query_string"].decode() if scope.get("query_string") else "")

        def release() -> None:
            self.held[decision.replica].pop(rid, None)
            self._set_predicted(decision.replica)

        self.added_latency.observe(time.perf_counter() - start)
        try:
            upstream = await self.pool.send("POST", decision.replica, target, headers, payload,
                                            self.config.first_byte_timeout)
        except ConnectFailed:
            release()
            self.upstream_errors.labels(decision.replica, "connect").inc()
            next(r for r in self.replicas if r.url == decision.replica).healthy = False
            return None
        except UpstreamTimeout:
            release()
            self.upstream_errors.labels(decision.replica, "timeout").inc()
            return _error(504, "the upstream did not answer in time", "upstream_timeout")
        except UpstreamError as exc:
            release()
            self.upstream_errors.labels(decision.replica, "transport").inc()
            return _error(502, f"the upstream failed: {exc}", "upstream_error")
        except BaseException:  # the client went away while the upstream was thinking
            release()
            raise
        out_headers = [(k, v) for k, v in upstream.headers if k.lower() not in NOT_RELAYED]
        if decision.changes:
            out_headers.append((b"x-kvbudget-changes", "; ".join(decision.changes).encode()))
        out_headers.append((b"x-kvbudget-level", str(decision.level).encode()))
        idle = self.config.idle_timeout
        if b"text/event-stream" not in (upstream.header(b"content-type") or b""):
            try:
                content = await upstream.read(idle)
            except UpstreamError:
                self.upstream_errors.labels(decision.replica, "read").inc()
                return _error(502, "the upstream closed the connection mid-response", "upstream_error")
            finally:
                upstream.close()
                release()
            response = Response(content, status_code=upstream.status)
            response.raw_headers.extend(out_headers)
            return response

        async def relay():
            try:
                async for chunk in upstream.chunks(idle):
                    yield chunk
            except UpstreamError as exc:
                self.upstream_errors.labels(decision.replica, "stream").inc()
                error = {"error": {"message": f"the upstream stream ended abnormally ({exc})",
                                   "type": "upstream_error", "code": 502}}
                yield f"data: {json.dumps(error)}\n\n".encode()
            finally:
                upstream.close()
                release()

        response = StreamingResponse(relay(), status_code=upstream.status)
        response.raw_headers.extend(out_headers)
        return response

    async def models(self, request: Request) -> Response:
        for replica in sorted(self.replicas, key=lambda r: not r.healthy):
            try:
                status, body, kind = await self.pool.get(f"{replica.url}/v1/models", self.config.connect_timeout)
                return Response(body, status_code=status, headers={"content-type": (
                    kind or b"application/json").decode("latin-1")})
            except ConnectFailed:
                replica.healthy = False
            except UpstreamError:
                pass
        return _error(502, "no upstream could be reached", "upstream_unreachable")

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        ready = self.polled and any(r.healthy for r in self.replicas)
        return JSONResponse({"ready": ready, "replicas": [
            {"url": r.url, "healthy": r.healthy, "level": r.level, "observed": r.observed, "predicted": r.predicted,
             "in_flight": r.in_flight} for r in self.replicas]}, status_code=200 if ready else 503)

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app):
            self.pool = Pool(connect_timeout=self.config.connect_timeout)
            await self.poll_once()
            task = asyncio.create_task(self.poll_forever())
            try:
                yield
            finally:
                task.cancel()
                self.pool.close()

        return Starlette(routes=[
            Route("/v1/chat/completions", self.completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ], lifespan=lifespan)
