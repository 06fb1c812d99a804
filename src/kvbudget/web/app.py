"""The `kvbudget web` server: one page (HTML, script and style bundled, no CDN) and its JSON API.

GET  /                    the page; its state lives in the query string, so a link reproduces the view
GET  /api/choices         models, GPUs, engines, KV dtypes, traces and limits for the page's controls
GET  /api/estimate|plan|compare|simulate   what `kvbudget COMMAND --json` prints for the same arguments
GET  /api/guard.yaml      what `kvbudget plan --guard-config` writes, as a download
GET  /api/quality?report=upload:...        a `kvbudget quality --json` report, checked
GET  /api/recommend       what `kvbudget recommend --json` prints, within the page's limits, with the chosen
                          deployment's files; /api/recommend.zip: those files as one zip (the same parameters)
POST /api/upload?kind=model|trace|report&name=FILE   the request body is the file (a GGUF: its first bytes,
                          with X-File-Size); answers the id to pass as model=, trace= or report=

Every answer but the page's files and choices takes one of the server's few work slots (`api.Work`); a bad
parameter is a 400 naming its field, a busy or stopping server a 503 with Retry-After, and anything unexpected a
500 that says nothing of the server (its traceback goes to the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from kvbudget.web import recommend as search

_STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
LOG = logging.getLogger("kvbudget.web")
INTERNAL = "the server could not answer this request (an internal error, logged on the server)"


def _static(name: str) -> bytes:
    return (resources.files("kvbudget") / "web" / "static" / name).read_bytes()


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # allow_nan: the CLI's --json prints what json.dumps gives; the page parses the same text
    return Response(json.dumps(data), status_code=status, media_type="application/json",
                    headers={**_HEADERS, **(headers or {})})


def _chart_engines() -> list[str]:
    """The engines the page's charts compare: the registry's servers (a library engine has no KV budget)."""
    return [e.name for e in serving_engines()]


async def _watch(request: Request, job: api.Job) -> None:
    """Mark `job` left when its client disconnects (its simulation then stops within milliseconds)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.left.set()


@dataclass(frozen=True)
class _Site:
    """What every route answers with: the uploads, the work slots and the limits."""

    uploads: api.Uploads
    work: api.Work
    limits: api.Limits

    def params(self, request: Request) -> list[tuple[str, str]]:
        if len(request.url.query) > self.limits.query_chars:
            raise api.WebError(f"the request's parameters are longer than {self.limits.query_chars:,} characters",
                               None, 414)
        return list(request.query_params.multi_items())

    def confined(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run `work` reading model files only from the upload folder (names are catalog names or Hub ids)."""
        token = readable_roots.set((self.uploads.folder,))
        try:
            return work(*args)
        finally:
            readable_roots.reset(token)

    async def answer(self, request: Request, work: Callable[..., Any], *args: Any, simulation: bool = False,
                     search: bool = False) -> Any:
        """`work(job, *args)` in a worker thread, in one of the server's work slots (a simulation's, a search's),
        its job told when the client leaves."""
        async with self.work.slot(simulation, search) as job:
            watch = asyncio.ensure_future(_watch(request, job))
            try:
                return await run_in_threadpool(self.confined, work, job, *args)
            finally:
                watch.cancel()

    def error(self, exc: KVBudgetError, names: dict[str, str] | None = None) -> Response:
        status = exc.status if isinstance(exc, api.WebError) else 400
        retry = {"Retry-After": str(self.limits.retry_after_s)} if status == 503 else None
        return _json(api.error_body(exc, self.uploads, names), status, retry)

    def route(self, handle: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """`handle` with its errors answered: a KVBudgetError as its line and field, anything else as a 500 that
        names nothing of the server's (logged with its traceback)."""
        async def answered(request: Request) -> Response:
            try:
                return await handle(request)
            except KVBudgetError as exc:
                return self.error(exc)
            except Exception as exc:
                LOG.error("kvbudget web: %s %s: %s", request.method, request.url.path, type(exc).__name__,
                          exc_info=exc)
                return _json({"error": INTERNAL, "field": None}, 500)
        return answered

    def endpoint(self, work: Callable[[list[tuple[str, str]], api.Uploads], Any]) -> Any:
        async def handle(request: Request) -> Response:
            return _json(await self.answer(request, lambda job, p: work(p, self.uploads), self.params(request)))
        return self.route(handle)


def _recommend_routes(site: _Site) -> list[Route]:
    """/api/recommend and /api/recommend.zip: one search per parameters (kept: the download does not search
    again)."""
    kept = search.Searches(site.limits)

    async def found(request: Request) -> search.Found:
        params = site.params(request)
        known = kept.get(params)
        if known is not None:
            return known
        answer = await site.answer(request, lambda job, p: search.recommend(p, site.uploads, job), params,
                                   search=True)
        return kept.put(params, answer)

    async def answer(request: Request) -> Response:
        return _json((await found(request)).answer)

    async def zipped(request: Request) -> Response:
        done = await found(request)
        if done.answer.get("files_error"):
            raise api.WebError(f"recommend: no files: {done.answer['files_error']}", "engine")
        if not done.files:
            raise api.WebError(f"slo: no candidate meets it, so there is no deployment to write: "
                               f"{done.answer['binding']}", "slo")
        return Response(search.zipped(done.files), media_type="application/zip",
                        headers={**_HEADERS, "Content-Disposition": 'attachment; filename="deployment.zip"'})

    return [Route("/api/recommend", site.route(answer)), Route("/api/recommend.zip", site.route(zipped))]


def _read_upload(job: api.Job, kind: str, path: Path, name: str) -> dict[str, Any]:
    """What an upload holds, as the page shows it; a file that cannot be read is a 400 next to its kind."""
    try:
        if kind == "model":
            spec = load_model(str(path), Path(name).stem)
            return {"model": {"name": spec.name, "model_type": spec.model_type, "layers": spec.num_layers}}
        if kind == "trace":
            from kvbudget.simulation import read_trace

            return {"requests": sum(1 for _ in read_trace(path))}
        api.quality_report(path)
        return {}
    except KVBudgetError:
        raise
    except Exception as exc:  # a parser's own failure on a hostile file: still the file's fault
        raise api.WebError(f"{name}: cannot be read as a {kind} file ({type(exc).__name__})", kind) from None


def create_app(upload_dir: Path | None = None, limits: api.Limits | None = None,
               allowed_hosts: list[str] | None = None) -> Starlette:
    """The page and its API; uploads go to `upload_dir` (default: a fresh temporary folder). `allowed_hosts`
    guards a loopback server against DNS rebinding (None: any host). `app.state.work.stop()` ends the work in
    progress (the server stopping)."""
    limits = limits or api.Limits()
    folder = upload_dir or Path(tempfile.mkdtemp(prefix="kvbudget-web-"))
    site = _Site(api.Uploads(folder, limits), api.Work(limits), limits)
    uploads = site.uploads

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
            "limits": {name: getattr(limits, name) for name in api.PAGE_LIMITS}, "recommend": search.form(),
        })

    async def simulate(request: Request) -> Response:
        return _json(await site.answer(request, lambda job, p: api.simulate(p, uploads, job), site.params(request),
                                       simulation=True))

    async def guard_yaml(request: Request) -> Response:
        text = await site.answer(request, lambda job, p: api.guard_yaml(p, uploads), site.params(request))
        return Response(text, media_type="application/yaml",
                        headers={**_HEADERS, "Content-Disposition": 'attachment; filename="guard.yaml"'})

    async def quality(request: Request) -> Response:
        given = dict(site.params(request))
        unknown = sorted(set(given) - {"report", "view"})
        if unknown:
            raise api.WebError(f"unknown parameter {unknown[0]!r} for quality; known: report", unknown[0])
        path = uploads.path(given.get("report", ""), "report", "report")
        return _json(await site.answer(request, lambda job: api.quality_report(path)))

    async def upload(request: Request) -> Response:
        kind, name = request.query_params.get("kind", ""), request.query_params.get("name", "")
        path = None
        try:
            cap = uploads.cap(kind, name)
            size_header = request.headers.get("x-file-size")
            file_size = int(size_header) if size_header and size_header.isdigit() and len(size_header) < 20 else None
            with site.work.receiving():
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
            del body
            read = await site.answer(request, _read_upload, kind, path, name)
            return _json({"id": f"upload:{path.name}", "name": name, "kind": kind, **read})
        except KVBudgetError as exc:
            return site.error(exc, {str(path): name} if path else None)

    routes = [
        Route("/", page), Route("/static/{name}", static), Route("/api/choices", choices),
        Route("/api/estimate", site.endpoint(api.estimate)), Route("/api/plan", site.endpoint(api.plan)),
        Route("/api/compare", site.endpoint(api.compare)), Route("/api/simulate", site.route(simulate)),
        Route("/api/guard.yaml", site.route(guard_yaml)), Route("/api/quality", site.route(quality)),
        Route("/api/upload", site.route(upload), methods=["POST"]), *_recommend_routes(site)]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    app = Starlette(routes=routes, middleware=middleware)
    app.state.work = site.work
    app.state.limits = limits
    return app


def server(host: str, port: int, allowed_hosts: list[str] | None = None, limits: api.Limits | None = None
           ) -> tuple[Any, socket.socket]:
    """The page's uvicorn server and its bound socket (`serve` runs them). The port is bound first: a taken one is
    a one-line KVBudgetError. The guard's connection limits hold (header and body timeouts, header size, open
    connections); SIGTERM or SIGINT ends the simulations in progress at once and waits `shutdown_grace_s` for the
    rest."""
    import uvicorn

    from kvbudget.guard.config import ConnectionLimits
    from kvbudget.guard.limits import protocol_for
    from kvbudget.guard.metrics import GuardMetrics
    from kvbudget.guard.server import bind

    limits = limits or api.Limits()
    sock = bind(host, port)
    app = create_app(allowed_hosts=allowed_hosts, limits=limits)
    connections = ConnectionLimits(header_timeout=limits.header_timeout, body_timeout=limits.body_timeout,
                                   max_header_bytes=limits.max_header_bytes, max_connections=limits.max_connections)
    config = uvicorn.Config(app, log_level="warning", access_log=False, proxy_headers=False,
                            http=protocol_for(connections, GuardMetrics(), LOG),
                            timeout_graceful_shutdown=max(1, round(limits.shutdown_grace_s)))

    class WebServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.work.stop()
            super().handle_exit(sig, frame)

    return WebServer(config), sock


def serve(host: str, port: int, allowed_hosts: list[str] | None = None, announce: Callable[[str], None] = print
          ) -> None:
    """Serve the page until SIGTERM or SIGINT (see `server`); its address is announced once the port is held."""
    running, sock = server(host, port, allowed_hosts)
    shown = f"[{host}]" if ":" in host else host
    announce(f"kvbudget web: http://{shown}:{sock.getsockname()[1]}/ (Ctrl-C stops it)")
    running.run(sockets=[sock])
