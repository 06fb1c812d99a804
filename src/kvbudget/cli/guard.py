"""`kvbudget guard` (the KV-aware proxy) and `kvbudget alerts` (rules and a dashboard for the same levels)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvbudget.cli.common import add_options, request_of, write_atomically
from kvbudget.commands.alerts import AlertsRequest
from kvbudget.commands.guard import GuardRequest
from kvbudget.errors import KVBudgetError


def add_parser(sub: Any) -> None:
    gd = sub.add_parser("guard", help="KV-aware OpenAI-compatible proxy with three degradation levels")
    add_options(gd, GuardRequest)
    gd.set_defaults(run=run_guard)
    al = sub.add_parser("alerts", help="Prometheus alert rules and a Grafana dashboard for the three levels")
    add_options(al, AlertsRequest)
    al.set_defaults(run=run_alerts)


def run_alerts(args: argparse.Namespace) -> int:
    from kvbudget.commands.alerts import answer

    ask: AlertsRequest = request_of(AlertsRequest, args)
    if os.path.exists(ask.out) and not os.path.isdir(ask.out):
        raise KVBudgetError(f"--out {ask.out}: a file, not a folder; name a folder (it is created if missing)")
    found = answer(ask)
    try:
        os.makedirs(ask.out, exist_ok=True)
    except OSError as exc:
        raise KVBudgetError(f"--out {ask.out}: cannot create the folder ({exc.strerror or exc})") from None
    write_atomically(os.path.join(ask.out, "kvbudget-alerts.yaml"), found.rules, "--out")  # each says where it went
    write_atomically(os.path.join(ask.out, "kvbudget-dashboard.json"), found.dashboard, "--out")
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
