"""`kvbudget web`: the planner, the comparison and the simulator as a page people share."""

from __future__ import annotations

import argparse
from typing import Any

from kvbudget.cli.common import add_options, request_of
from kvbudget.commands.web import WebRequest


def add_parser(sub: Any) -> None:
    w = sub.add_parser("web", help="the planner, comparison and simulator as a web page (needs the web extra)")
    add_options(w, WebRequest)
    w.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.commands.web import answer

    served = answer(request_of(WebRequest, args))  # first: a bad address or a missing extra, in one line
    from kvbudget.web.app import serve

    serve(served.host, served.port, served.allowed_hosts)  # a taken port: one line, before the address is shown
    return 0
