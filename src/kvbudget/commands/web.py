"""`web`: the planner, the comparison and the simulator as a page people share."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.commands.options import option
from kvbudget.errors import KVBudgetError
from kvbudget.validate import listen_address

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, kw_only=True)
class WebRequest:
    """What `web` is asked, as given."""

    listen: str = option("HOST:PORT to serve on (default 127.0.0.1:8765, this machine only; 0.0.0.0:8765 for all)",
                         "127.0.0.1:8765", web=False)


@dataclass(frozen=True)
class Served:
    """Where the page listens, and the host names it answers (None: any; a loopback server answers only
    loopback names, against DNS rebinding)."""

    host: str
    port: int
    allowed_hosts: list[str] | None


def answer(ask: WebRequest) -> Served:
    """Where and how the page is served, checked before anything starts."""
    host, port = listen_address(ask.listen)
    try:
        import httptools  # noqa: F401
        import prometheus_client  # noqa: F401  (the guard's connection limits, which the page's server shares)
        import uvicorn  # noqa: F401

        import kvbudget.web.app  # noqa: F401
    except ImportError:
        raise KVBudgetError("kvbudget web needs Starlette, uvicorn, httptools and prometheus_client: pip install "
                            "'kvbudget[web]'") from None
    return Served(host, port, [*LOOPBACK, "[::1]"] if host in LOOPBACK else None)
