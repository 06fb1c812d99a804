"""`kvbudget check-log`: an engine's startup log beside kvbudget's prediction."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvbudget.cli.common import add_options, console, request_of
from kvbudget.commands import spelling
from kvbudget.commands.checklog import CheckLogRequest, LogAnswer, answer
from kvbudget.errors import KVBudgetError


def add_parser(sub: Any) -> None:
    chk = sub.add_parser("check-log", help="an engine's startup log beside kvbudget's prediction")
    add_options(chk, CheckLogRequest)
    chk.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ask = request_of(CheckLogRequest, args)
    result = answer(ask)
    # rows that differ fail a CI step; bad input is 2, and so is a partial check (what the full one needs is
    # missing: the model, or a line) whose rows agree
    status = 0 if result.check.all_match and not result.missing else 1 if not result.check.all_match else 2
    missing = spelling.message(KVBudgetError(result.missing)) if result.missing else ""
    if ask.json:
        print(json.dumps(result.to_dict() | {"missing": missing}, indent=2))
    else:
        render(result)
    if missing:
        print(f"kvbudget: {missing}", file=sys.stderr)
    return status


def render(result: LogAnswer) -> None:
    from rich.table import Table

    check = result.check
    title = (f"{check.engine} log vs kvbudget for {result.model.name}" if result.model and not result.missing
             else f"{check.engine} log: the rows its own figures check")
    table = Table(title=title)
    for name in ("quantity", "log", "kvbudget", "", "note"):
        table.add_column(name)
    for r in check.rows:
        verdict = "shown" if r.matches is None else "[green]ok[/]" if r.matches else "[red]differs[/]"
        table.add_row(r.quantity, r.logged, r.predicted, verdict, r.note)
    out = console()
    if check.settings:
        out.print("settings read from the log (or given): "
                  + ", ".join(f"{k}={v}" for k, v in check.settings.items()))
    if check.assumed:
        out.print("assumed, not in the log (pass the flag to set it): "
                  + ", ".join(f"{k}={v}" for k, v in check.assumed.items()))
    out.print(table)
    for cause in check.causes:
        out.print(f"likely cause: {cause}")
