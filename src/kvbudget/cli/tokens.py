"""`kvbudget tokens`: exact prompt lengths with the model's tokenizer and chat template."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import add_options, console, request_of
from kvbudget.commands.tokens import TokensRequest, answer

if TYPE_CHECKING:
    from kvbudget.tokens import LogStats, PromptCount


def add_parser(sub: Any) -> None:
    tk = sub.add_parser("tokens", help="exact prompt lengths with the model's tokenizer and chat template")
    add_options(tk, TokensRequest)
    tk.set_defaults(run=run)


def loading(model: str) -> None:
    if sys.stderr.isatty():  # loading takes seconds: say what is happening
        print(f"kvbudget: loading the tokenizer of {model} ...", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from kvbudget.tokens import LogStats, read_log

    ask = request_of(TokensRequest, args)
    result = answer(ask, loading, lambda path: progress_lines(path, read_log))
    if ask.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    if isinstance(result, LogStats):
        render_stats(result, ask.files[0])
    else:
        render(result)
    return 0


def render(result: PromptCount) -> None:
    from rich.table import Table

    label = " (approximate: characters / 4, no tokenizer)" if result.approximate else ""
    table = Table(title=f"Prompt tokens{label}")
    table.add_column("part")
    table.add_column("tokens", justify="right")
    for part in result.parts:
        table.add_row(part.name, f"{part.tokens:,}")
    table.add_row("[bold]prompt[/]", f"[bold]{result.prompt_tokens:,}[/]")
    if result.max_tokens is not None:
        table.add_row("max_tokens", f"{result.max_tokens:,}")
        table.add_row("[bold]prompt + max_tokens[/]", f"[bold]{result.prompt_tokens + result.max_tokens:,}[/]")
    console().print(table)


def progress_lines(path: str, iter_lines: Callable[[str], Iterator[str]]) -> Iterator[str]:
    """Lines of the file, with a progress bar on a terminal (stderr)."""
    import os

    if not sys.stderr.isatty():
        return iter_lines(path)
    from rich.progress import Progress

    size = os.path.getsize(path)

    def gen() -> Iterator[str]:
        with Progress(transient=True) as progress:
            task = progress.add_task("counting", total=size)
            for line in iter_lines(path):
                progress.advance(task, len(line.encode("utf-8")))
                yield line

    return gen()


def render_stats(stats: LogStats, path: str) -> None:
    from rich.table import Table

    from kvbudget.tokens import SKIPPED_SHOWN

    label = " (approximate)" if stats.approximate else ""
    table = Table(title=f"{stats.count:,} requests in {path}{label}")
    for name in ("", "mean", "p50", "p90", "p99", "max"):
        table.add_column(name, justify="right" if name else "left")
    for name, d in (("prompt tokens", stats.prompt_tokens), ("prompt + max_tokens", stats.total_tokens)):
        table.add_row(name, f"{d.mean:,.1f}", f"{d.p50:,}", f"{d.p90:,}", f"{d.p99:,}", f"{d.max:,}")
    out = console()
    out.print(table)
    if stats.skipped:
        out.print(f"[yellow]skipped {len(stats.skipped):,} line(s)[/] that are not a chat request, not counted:")
        for number, why in stats.skipped[:SKIPPED_SHOWN]:
            out.print(f"  line {number}: {why}")
        if len(stats.skipped) > SKIPPED_SHOWN:
            out.print(f"  ... and {len(stats.skipped) - SKIPPED_SHOWN:,} more")
