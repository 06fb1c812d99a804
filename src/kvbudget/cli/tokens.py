"""`kvbudget tokens`: exact prompt lengths with the model's tokenizer and chat template."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import console
from kvbudget.engines import ENGINES
from kvbudget.errors import KVBudgetError

if TYPE_CHECKING:
    from kvbudget.tokens import LogStats


def add_parser(sub: Any) -> None:
    tk = sub.add_parser("tokens", help="exact prompt lengths with the model's tokenizer and chat template")
    tk.add_argument("model", help="a .gguf file, a model folder, a Hub id, or a catalog name (its Hub id) for the "
                                  "tokenizer")
    tk.add_argument("files", nargs="*", help="text files (documents), a chat request .json, a .jsonl log, "
                                            "or - for stdin")
    tk.add_argument("--question", help="the question after the documents")
    tk.add_argument("--system", help="system message (text, or @FILE)")
    tk.add_argument("--no-template", action="store_true", help="count the raw text without the chat template")
    tk.add_argument("--engine", default="vllm", help=f"whose prompt handling to follow: one of {', '.join(ENGINES)} "
                                                     "(llamacpp adds the vocabulary's BOS) (default vllm)")
    tk.add_argument("--approximate", action="store_true", help="no tokenizer: estimate from characters "
                                                               "(4 per token), labelled as an estimate")
    tk.add_argument("--json", action="store_true", help="print JSON")
    tk.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.engines import get_engine
    from kvbudget.tokens import PromptCounter, check_readable, iter_lines, read_request

    get_engine(args.engine)  # a bad engine or file is refused before the tokenizer loads (seconds)
    check_readable(*(args.files or ["-"]), *([args.system[1:]] if args.system and args.system.startswith("@") else []))
    if not args.approximate and sys.stderr.isatty():  # loading takes seconds: say what is happening
        print(f"kvbudget: loading the tokenizer of {args.model} ...", file=sys.stderr, flush=True)
    counter = PromptCounter(args.model, approximate=args.approximate, engine=args.engine)
    template = not args.no_template
    files = args.files or ["-"]
    logs = [f for f in files if f.endswith(".jsonl")]
    if logs:
        if len(files) != 1:
            raise KVBudgetError("a .jsonl request log is counted on its own; pass it alone")
        stats = counter.count_jsonl(progress_lines(logs[0], iter_lines), template)
        if args.json:
            print(json.dumps(stats.to_dict(), indent=2))
            return 0
        render_stats(stats, logs[0])
        return 0
    system = args.system
    if system and system.startswith("@"):
        system = "".join(iter_lines(system[1:]))
    if len(files) == 1 and (files[0].endswith(".json") or files[0] == "-"):
        text = sys.stdin.read() if files[0] == "-" else "".join(iter_lines(files[0]))
        stripped = text.lstrip()
        if files[0].endswith(".json") or stripped.startswith("{"):
            messages, max_tokens = read_request(files[0], text)
            result = counter.count_request(messages, max_tokens, template)
        else:
            result = counter.count_documents([("stdin", text)], args.question, system, template)
    else:
        if any(f.endswith(".json") for f in files):
            raise KVBudgetError("a chat request .json is counted on its own; pass it alone")
        docs = [(("stdin" if f == "-" else f), sys.stdin.read() if f == "-" else "".join(iter_lines(f)))
                for f in files]
        result = counter.count_documents(docs, args.question, system, template)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
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
    return 0


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
