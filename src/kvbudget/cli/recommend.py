"""`kvbudget recommend`: the cheapest deployment meeting latency objectives, searched by simulation."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import add_options, console, request_of, wrote
from kvbudget.commands.recommend import RecommendRequest, prepared, recommendation, write_out
from kvbudget.simulation.search import shown

if TYPE_CHECKING:
    from kvbudget.simulation.recommend import Recommendation, Tried

RUNNERS_UP = 10  # runners-up the table shows (--json: all)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("recommend", help="the cheapest deployment that meets latency objectives on your traffic")
    add_options(p, RecommendRequest)
    p.set_defaults(run=run)


def _progress(done: int, total: int) -> None:
    from kvbudget.cli.simulate import task_progress

    task_progress(done, total, "recommend", "candidates")


def run(args: argparse.Namespace) -> int:
    ask = request_of(RecommendRequest, args)
    ready = prepared(ask)  # every bad value refused here, in one line, before any plan or simulation
    bar = not ask.json and sys.stderr.isatty()
    found = recommendation(ask, ready, _progress if bar else None)
    if bar:
        print(file=sys.stderr)
    written = write_out(ask, found) if ask.out and found.best is not None else []
    if ask.json:
        print(json.dumps(found.to_dict(), indent=1))
    else:
        _print(found)
    for path in written:
        wrote(path, "the chosen deployment, as JSON" if path.endswith(".json") else "a file of the chosen deployment")
    if found.best is None:
        print(f"kvbudget: no candidate meets the objectives: {found.binding}", file=sys.stderr)
        return 1
    return 0


def _value(t: Tried, name: str) -> str:
    value, limit = t.measured.values.get(name), t.slo[name]
    unit = getattr(limit, "unit", "ms" if limit < 1 else "s")
    if value is None:
        return f"{name} -"
    band = t.bands.get(name)
    spread = f" ({shown(band[0], unit)} to {shown(band[1], unit)})" if band else ""
    return f"{name} {shown(value, unit)}{spread}"


def _print(found: Recommendation) -> None:
    from rich.table import Table

    out = console()
    objectives = ", ".join(f"{k} ≤ {shown(v, getattr(v, 'unit', 's'))}" for k, v in found.slo.items())
    pruned = sum(p.candidates for p in found.pruned)
    out.print(f"{found.model} on {found.engine}: {found.listed:,} candidates; {pruned:,} pruned (the engine "
              f"would not start them, or they cannot be simulated), {len(found.tried):,} simulated, "
              f"{found.skipped:,} not simulated (they cost more per hour than one that met the objectives)")
    best = found.best
    if best is not None:
        c, cost = best.candidate, best.cost
        per_m = f", ${cost.per_million_tokens:,.3f} per million tokens" if cost.per_million_tokens else ""
        out.print(f"cheapest meeting {objectives}: [bold]{c.label()}[/bold]: {c.gpus} GPU{'s' * (c.gpus > 1)}, "
                  f"${best.price_per_hour:,.2f}/hour{per_m}")
        out.print("  " + "; ".join(_value(best, name) for name in found.slo) + " (the range: the simulator's "
                  "error band of means, around each figure)")
    if found.front:
        t = Table(title="Pareto front (simulated candidates that served every request)")
        for col in ("candidate", "GPUs", "tokens/s per GPU", "worst objective / limit", "$ per M tokens", "met"):
            t.add_column(col, justify="left" if col == "candidate" else "right")
        for f in found.front:
            front_cost = f.cost.per_million_tokens
            met = "chosen" if f is found.best else "yes" if f.met else "no"
            t.add_row(f.candidate.label(), str(f.candidate.gpus), f"{f.tokens_per_s_per_gpu:,.0f}",
                      f"{f.worst:.0%}", f"{front_cost:,.3f}" if front_cost else "-", met)
        out.print(t)
    losers = found.runners_up
    if losers:
        t = Table(title=f"Runners-up, cheapest first ({min(RUNNERS_UP, len(losers))} of {len(losers)}; --json "
                  "for all)")
        for col in ("candidate", "$/hour", "why it lost"):
            t.add_column(col, justify="right" if col == "$/hour" else "left")
        for loser, why in losers[:RUNNERS_UP]:
            t.add_row(loser.candidate.label(), f"{loser.price_per_hour:,.2f}", why)
        out.print(t)
    for p in found.pruned:
        out.print(f"pruned: {p.setting} ({p.candidates} candidate{'s' * (p.candidates > 1)}): {p.reason}")
    for check in found.quality_checks():
        out.print(f"note: {check}")
    spec = next((t.candidate.speculative for t in found.tried if t.candidate.speculative), None)
    if spec is not None:
        out.print(f"note: speculative decoding's acceptance per position: {', '.join(f'{p:.3g}' for p in spec.rates())}"
                  f" ({spec.acceptance_source})")
