"""The guard's HTTP routes as a bare ASGI app: a lookup by path and method, and the lifespan; no middleware.

Each await of a request resumes every coroutine between the server and the handler, so a framework's stack of
middleware, router and endpoint wrappers is paid several times a request; the guard needs none of what they add
(its errors are its own, an unexpected exception is answered 500 by the server and logged)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kvbudget.guard.relay import error

Handler = Callable[[Request], Awaitable[Response]]


class Routes:
    """`routes`: path -> (methods, handler) (GET routes also answer HEAD); `lifespan`: what runs around serving."""

    def __init__(self, routes: dict[str, tuple[tuple[str, ...], Handler]],
                 lifespan: Callable[[], AbstractAsyncContextManager[None]]):
        self.routes = {path: ((*methods, "HEAD") if "GET" in methods else methods, handler)
                       for path, (methods, handler) in routes.items()}
        self.lifespan = lifespan

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            route = self.routes.get(scope["path"])
            if route is None:
                response: Response = error(404, f"no route {scope['path']} on the guard", "not_found_error")
            elif scope["method"] not in route[0]:
                response = error(405, f"{scope['path']} takes {' or '.join(route[0])}", "invalid_request_error",
                                 headers={"allow": ", ".join(route[0])})
            else:
                response = await route[1](Request(scope, receive, send))
            await response(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await receive()  # lifespan.startup
        context = self.lifespan()
        try:
            await context.__aenter__()
        except BaseException as exc:  # the server stops rather than serving without its start-up
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            raise
        try:
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        finally:
            await context.__aexit__(None, None, None)
        await send({"type": "lifespan.shutdown.complete"})


__all__ = ["Routes"]
