"""What `kvbudget simulate`'s renderings share (one run, a sweep, a fleet): numbers as they are shown, the cost
line, the progress line, the trace's credit and the files written."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import wrote
from kvbudget.commands.spelling import flag

if TYPE_CHECKING:
    from kvbudget.simulation.cost import Cost


def _write(path: str, lines: list[str], param: str, force: bool) -> None:
    from kvbudget.files import write_file

    wrote(path, flag(param), write_file(path, "\n".join(lines) + "\n", param, force))


class RunFiles:
    """A run's --timeline (a row a step) and --per-request (a row a completed request) files, filled by the hooks
    it hands the simulation; a fleet's rows start with the replica's index."""

    def __init__(self, timeline: str | None, per_request: str | None, fleet: bool = False) -> None:
        self.timeline, self.per_request, self.fleet = timeline, per_request, fleet
        first = "replica," if fleet else ""
        self.steps = [f"{first}time_s,tokens,kv_usage,running,waiting"]
        self.done = [f"{first}id,arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s"]

    def hooks(self) -> dict[str, Callable[..., None]]:
        """simulate's (or simulate_fleet's) on_step and on_finish, for the files asked for."""
        def step(t: float, tokens: int, usage: float, running: int, waiting: int) -> str:
            return f"{t:.6f},{tokens},{usage:.6f},{running},{waiting}"

        def request(r: Any, ttft: float, tpot: float | None, e2e: float) -> str:
            return (f"{r.id},{r.arrival:.6f},{r.prompt_tokens},{r.output_tokens},{ttft:.6f},"
                    f"{'' if tpot is None else f'{tpot:.6f}'},{e2e:.6f}")

        out: dict[str, Callable[..., None]] = {}
        for name, path, rows, row in (("on_step", self.timeline, self.steps, step),
                                      ("on_finish", self.per_request, self.done, request)):
            if path:
                out[name] = ((lambda i, *a, rows=rows, row=row: rows.append(f"{i},{row(*a)}")) if self.fleet
                             else (lambda *a, rows=rows, row=row: rows.append(row(*a))))
        return out

    def write(self, force: bool) -> None:
        if self.timeline:
            _write(self.timeline, self.steps, "timeline", force)
        if self.per_request:
            _write(self.per_request, self.done, "per_request", force)


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}" if value >= 0.1 else f"${value:,.4f}"


def _cost_line(cost: Cost, basis: str) -> str:
    return (f"cost: {_dollars(cost.price_per_gpu_hour)} per GPU-hour x {cost.gpus} GPU"
            f"{'s' if cost.gpus > 1 else ''} = {_dollars(cost.per_hour)}/hour; this run {_dollars(cost.run)}: "
            f"{_dollars(cost.per_million_tokens)} per million tokens (prompt and output), "
            f"{_dollars(cost.per_million_output_tokens)} per million output tokens, "
            f"{_dollars(cost.per_thousand_requests)} per thousand requests (times: {basis})")


def _progress() -> Callable[[int], None]:
    def show(n: int) -> None:
        print(f"\rsimulated {n:,} requests", end="", file=sys.stderr, flush=True)
    return show


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def latency_table(title: str, sim: Any) -> Any:
    """A run's (or a fleet's) TTFT, TPOT and end-to-end percentiles as a table."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("", "p50", "p90", "p99", "mean", "max"):
        t.add_column(col, justify="right" if col else "left")
    for name, pct in (("time to first token", sim.ttft), ("time per output token", sim.tpot),
                      ("end to end", sim.e2e)):
        if pct is not None:
            t.add_row(name, *(_ms(getattr(pct, k)) for k in ("p50", "p90", "p99", "mean", "max")))
    return t


def _short(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def _credit(args: argparse.Namespace) -> str:
    """The credit a bundled trace's licence asks for wherever results from it are shown (also for a copy of one)."""
    import os

    from kvbudget.traces import find

    found = [find(os.path.basename(p)) for p in (args.trace, args.lengths_from_trace) if p]
    return "; ".join(dict.fromkeys(f"{t.credit} ({t.licence})" for t in found if t))


def _calibration_exists(args: argparse.Namespace) -> bool:
    """Whether --save-calibration will replace a calibration of its name (which it does, saying so)."""
    from kvbudget.simulation.calibrations import calibration_path

    return bool(args.save_calibration) and calibration_path(args.save_calibration).is_file()


def _saved(args: argparse.Namespace, existed: bool) -> None:
    if args.save_calibration:
        from kvbudget.simulation.calibrations import calibration_path

        wrote(str(calibration_path(args.save_calibration)), "--save-calibration", existed)
