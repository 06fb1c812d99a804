"""`kvbudget guard` (the KV-aware proxy) and `kvbudget alerts` (rules and a dashboard for the same levels)."""

from __future__ import annotations

import argparse
from typing import Any

from kvbudget.cli.common import add_options, request_of, wrote
from kvbudget.commands.alerts import AlertsRequest
from kvbudget.commands.guard import GuardRequest


def add_parser(sub: Any) -> None:
    gd = sub.add_parser("guard", help="KV-aware OpenAI-compatible proxy with three degradation levels")
    add_options(gd, GuardRequest)
    gd.set_defaults(run=run_guard)
    al = sub.add_parser("alerts", help="Prometheus alert rules and a Grafana dashboard for the three levels")
    add_options(al, AlertsRequest)
    al.set_defaults(run=run_alerts)


def run_alerts(args: argparse.Namespace) -> int:
    from kvbudget.commands.alerts import answer, targets
    from kvbudget.files import write_files

    ask: AlertsRequest = request_of(AlertsRequest, args)
    found = answer(ask)  # (milliseconds: the guard configuration read first, so that a bad one makes no folder)
    paths = targets(ask)
    replaced = write_files(tuple(zip(paths, (found.rules, found.dashboard), strict=True)), "out", ask.force)
    for path, again in zip(paths, replaced, strict=True):
        wrote(path, "--out", again)
    return 0


def run_guard(args: argparse.Namespace) -> int:
    from kvbudget.commands.guard import answer

    serving = answer(request_of(GuardRequest, args))
    from kvbudget.guard.log import guard_log
    from kvbudget.guard.server import serve

    notes = guard_log()  # `kvbudget guard: ...` lines on stderr
    for note in serving.notes:
        notes.info(note)
    serve(serving.guard, serving.host, serving.port, announce=notes.info)
    return 0
