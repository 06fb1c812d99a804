"""`kvbudget web`: the planner, the comparison and the simulator as a page people share."""

from __future__ import annotations

import argparse
from typing import Any

from kvbudget.errors import KVBudgetError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub: Any) -> None:
    w = sub.add_parser("web", help="the planner, comparison and simulator as a web page (needs the web extra)")
    w.add_argument("--listen", default="127.0.0.1:8765",
                   help="HOST:PORT to serve on (default 127.0.0.1:8765, this machine only; 0.0.0.0:8765 for all)")
    w.set_defaults(run=run)


def listen_address(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise KVBudgetError(f"--listen {text!r}: write HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    host, port = listen_address(args.listen)
    try:
        import uvicorn

        from kvbudget.web.app import create_app
    except ImportError:
        raise KVBudgetError("kvbudget web needs Starlette and uvicorn: pip install 'kvbudget[web]'") from None
    hosts = [*LOOPBACK, "[::1]"] if host in LOOPBACK else None  # a loopback server answers only loopback names
    print(f"kvbudget web: http://{'[' + host + ']' if ':' in host else host}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(create_app(allowed_hosts=hosts), host=host, port=port, log_level="warning")
    return 0
