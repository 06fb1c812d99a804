"""The `kvbudget web` server: one page (HTML, script and style bundled, no CDN) and its JSON API.

GET  /                    the page; its state lives in the query string, so a link reproduces the view
GET  /api/choices         models, GPUs, engines, KV dtypes, traces and limits for the page's controls
GET  /api/estimate|plan|compare|simulate   what `kvbudget COMMAND --json` prints for the same arguments
GET  /api/guard.yaml      what `kvbudget plan --guard-config` writes, as a download
GET  /api/quality?report=upload:...        a `kvbudget quality --json` report, checked
POST /api/upload?kind=model|trace|report&name=FILE   the request body is the file (a GGUF: its first bytes,
                          with X-File-Size); answers the id to pass as model=, trace= or report=
"""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from kvbudget import catalog, traces
from kvbudget.dtypes import KV_DTYPE_CHOICES
from kvbudget.engines import ENGINES, serving_engines
from kvbudget.errors import KVBudgetError
from kvbudget.gpus import gpus
from kvbudget.model.load import load_model, readable_roots
from kvbudget.web import api

_STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _static(name: str) -> bytes:
    return (resources.files("kvbudget") / "web" / "static" / name).read_bytes()


def _json(data: Any, status: int = 200) -> Response:
    # allow_nan: the CLI's --json prints what json.dumps gives; the page parses the same text
    return Response(json.dumps(data), status_code=status, media_type="application/json", headers=_HEADERS)


def _error(exc: KVBudgetError, uploads: api.Uploads, names: dict[str, str] | None = None) -> Response:
    status = exc.status if isinstance(exc, api.WebError) else 400
    return _json(api.error_body(exc, uploads, names), status)


def _chart_engines() -> list[str]:
    """The engines the page's charts compare: the registry's servers (a library engine has no KV budget)."""
    return [e.name for e in serving_engines()]


def create_app(upload_dir: Path | None = None, limits: api.Limits | None = None,
               allowed_hosts: list[str] | None = None) -> Starlette:
    """The page and its API; uploads go to `upload_dir` (default: a fresh temporary folder). `allowed_hosts`
    guards a loopback server against DNS rebinding (None: any host)."""
    limits = limits or api.Limits()
    folder = upload_dir or Path(tempfile.mkdtemp(prefix="kvbudget-web-"))
    uploads = api.Uploads(folder, limits)
    simulations = api.Simulations(limits)

    def confined(work: Any, *args: Any) -> Any:
        """Run `work` reading model files only from the upload folder (names are catalog names or Hub ids)."""
        token = readable_roots.set((uploads.folder,))
        try:
            return work(*args)
        finally:
            readable_roots.reset(token)

    def params(request: Request) -> list[tuple[str, str]]:
        if len(request.url.query) > limits.query_chars:
            raise api.WebError(f"the request's parameters are longer than {limits.query_chars:,} characters", None,
                               414)
        return list(request.query_params.multi_items())

    async def page(request: Request) -> Response:
        return HTMLResponse(_static("index.html"), headers=_HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found", status_code=404)
        return Response(_static(name), media_type=_STATIC[name], headers=_HEADERS)

    async def choices(request: Request) -> Response:
        return _json({
            "models": [{"name": e.name, "hf_id": e.hf_id} for e in catalog.entries()],
            "gpus": [{"name": g.name, "memory_bytes": g.memory_bytes} for g in gpus()],
            "engines": list(ENGINES), "chart_engines": _chart_engines(), "kv_dtypes": list(KV_DTYPE_CHOICES),
            "traces": [{"name": t.name, "what": t.what, "credit": t.credit} for t in traces.bundled()],
            "limits": {"simulate_seconds": limits.simulate_seconds, "simulate_requests": limits.simulate_requests,
                       "config_bytes": limits.config_bytes, "gguf_header_bytes": limits.gguf_header_bytes,
                       "trace_bytes": limits.trace_bytes, "report_bytes": limits.report_bytes},
        })

    def endpoint(work: Any) -> Any:
        async def handle(request: Request) -> Response:
            try:
                return _json(await run_in_threadpool(confined, work, params(request)))
            except KVBudgetError as exc:
                return _error(exc, uploads)
        return handle

    async def guard_yaml(request: Request) -> Response:
        try:
            text = await run_in_threadpool(confined, api.guard_yaml, params(request), uploads)
        except KVBudgetError as exc:
            return _error(exc, uploads)
        return Response(text, media_type="application/yaml",
                        headers={**_HEADERS, "Content-Disposition": 'attachment; filename="guard.yaml"'})

    async def quality(request: Request) -> Response:
        try:
            given = dict(params(request))
            unknown = set(given) - {"report", "view"}
            if unknown:
                raise api.WebError(f"unknown parameter {sorted(unknown)[0]!r} for quality; known: report")
            path = uploads.path(given.get("report", ""), "report", "report")
            return _json(await run_in_threadpool(api.quality_report, path))
        except KVBudgetError as exc:
            return _error(exc, uploads)

    async def upload(request: Request) -> Response:
        kind, name = request.query_params.get("kind", ""), request.query_params.get("name", "")
        path = None
        try:
            cap = uploads.cap(kind, name)
            size_header = request.headers.get("x-file-size")
            file_size = int(size_header) if size_header and size_header.isdigit() else None
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > cap:
                    raise api.WebError(f"{name}: larger than the {cap // api.MIB:,} MiB a {kind} upload may be"
                                       + (" (send the first bytes of a GGUF file: its header)" if
                                          name.lower().endswith(".gguf") else ""), kind, 413)
            if not body:
                raise api.WebError(f"{name or 'the file'}: empty", kind)
            path = await run_in_threadpool(uploads.put, kind, name, bytes(body), file_size)
            ref = f"upload:{path.name}"
            answer: dict[str, Any] = {"id": ref, "name": name, "kind": kind}
            if kind == "model":
                spec = await run_in_threadpool(confined, load_model, str(path), Path(name).stem)
                answer["model"] = {"name": spec.name, "model_type": spec.model_type, "layers": spec.num_layers}
            elif kind == "trace":
                from kvbudget.simulation import read_trace

                answer["requests"] = await run_in_threadpool(lambda: sum(1 for _ in read_trace(path)))
            else:
                await run_in_threadpool(api.quality_report, path)
            return _json(answer)
        except KVBudgetError as exc:
            return _error(exc, uploads, {str(path): name} if path else None)

    routes = [
        Route("/", page), Route("/static/{name}", static), Route("/api/choices", choices),
        Route("/api/estimate", endpoint(lambda p: api.estimate(p, uploads))),
        Route("/api/plan", endpoint(lambda p: api.plan(p, uploads))),
        Route("/api/compare", endpoint(lambda p: api.compare(p, uploads))),
        Route("/api/simulate", endpoint(lambda p: api.simulate(p, uploads, simulations))),
        Route("/api/guard.yaml", guard_yaml), Route("/api/quality", quality),
        Route("/api/upload", upload, methods=["POST"]),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    return Starlette(routes=routes, middleware=middleware)
