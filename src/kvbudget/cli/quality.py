"""`kvbudget quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbudget.cli.common import add_options, console, request_of, wrote
from kvbudget.commands.quality import QualityRequest, answer


def add_parser(sub: Any) -> None:
    q = sub.add_parser("quality", help="what a quantized KV cache costs in answers, on a real model and your text")
    add_options(q, QualityRequest)
    q.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ask = request_of(QualityRequest, args)
    out = console()
    live = not ask.json and out.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, transient=True, disable=not live) as bar:
        task = bar.add_task("loading the model", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        report = answer(ask, progress)
    if ask.plot:
        from kvbudget.plot import plot_quality

        wrote(ask.plot, "--plot", plot_quality(report, ask.plot, ask.force))
    if ask.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    render(report)
    if ask.plot:
        console().print(f"wrote {ask.plot}")
    return 0


def render(report: Any) -> None:
    from rich import box
    from rich.table import Table

    first = report.results[0]
    scored = f", positions {report.first:,} on" if report.first else ""
    headline = (f"{report.model}: KV cache formats against the untouched cache, {first.windows} windows of "
                f"{report.context:,} tokens{scored} ({first.tokens:,} scored)")  # not a title: those move with widths
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    memory = report.memory is not None
    columns = ["format", "KL mean", "top-1 %", "ppl"] if memory else \
        ["format", "KL mean", "KL p99", "KL max", "top-1 %", "ppl"]
    requests = memory and any(m.requests is not None for m in report.memory)
    if memory:
        columns += ["B/tok", "x tok"] + (["reqs"] if requests else [])  # (p99, max: in --json)
    for column in columns:
        table.add_column(column, justify="left" if column == "format" else "right", no_wrap=True)
    for i, r in enumerate(report.results):
        kl_half = (r.kl_mean.high - r.kl_mean.low) / 2
        top_half = (r.top1.high - r.top1.low) / 2 * 100
        row = [r.variant, f"{r.kl_mean.value:.2g}±{kl_half:.1g}"]
        if not memory:
            row += [f"{r.kl_p99:.2g}", f"{r.kl_max:.2g}"]
        row += [f"{r.top1.value * 100:.1f}±{top_half:.1f}", f"{r.perplexity_change:+.1%}"]
        if memory:
            m = report.memory[i]
            row += [f"{m.bytes_per_token:,}" if m.bytes_per_token else "—", f"{m.gain:.2f}x" if m.gain else "—"]
            if requests:
                row.append(f"{m.requests:,.0f}" if m.requests is not None else "—")
        table.add_row(*row)
    out = console()
    out.print(headline)
    out.print(table)
    if report.real is not None:
        real = Table(title=f"the same windows in {report.engine} (llama-perplexity, f32 baseline cache)",
                     box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for column in ("format", "KL mean", "KL p99", "top-1 %", "ppl", "KL/ours"):
            real.add_column(column, justify="left" if column == "format" else "right", no_wrap=True)
        for e, r in zip(report.real, report.results, strict=True):
            ratio = f"{e.kl_mean / r.kl_mean.value:.2f}" if r.kl_mean.value > 1e-9 else "—"
            real.add_row(e.variant, f"{max(e.kl_mean, 0.0):.2g}", f"{e.kl_p99:.2g}", f"{e.top1 * 100:.1f}",
                         f"{e.perplexity / e.base_perplexity - 1:+.1%}", ratio)
        out.print(real)
    if report.divergence is not None:
        d0 = report.divergence[0]
        out.print(f"Greedy generation, {d0.tokens} tokens from each of {d0.prompts} prompts (-: no difference):")
        for d in report.divergence:
            firsts = " ".join("-" if f is None else str(f) for f in d.first)
            median = "none differ" if d.median is None else f"median {d.median:g}"
            out.print(f"{d.variant}: greedy generation first differs at token {firsts} ({median})")
    if report.needle is not None:
        needle = Table(title=f"needle test: passkey found, of {report.needle[0].trials} per depth",
                       box=box.SIMPLE_HEAD)
        needle.add_column("cache")
        for depth in report.needle[0].depths:
            needle.add_column(f"{depth:.0%}", justify="right")
        needle.add_column("all", justify="right")
        for n in report.needle:
            needle.add_row(n.variant, *(str(c) for c in n.correct), f"{n.accuracy:.0%}")
        out.print(needle)
    if report.layers is not None:
        ranked = sorted(range(len(report.layers)), key=lambda i: -report.layers[i])[:5]
        out.print(f"{report.layers_variant} in one layer at a time: most KL in layers "
                  + ", ".join(f"{i} ({report.layers[i]:.2g})" for i in ranked)
                  + f"; least {min(report.layers):.2g}")
    if memory:
        for m, r in zip(report.memory, report.results, strict=True):
            if m.note:
                out.print(f"{r.variant}: no memory figure ({m.note})")
    for note in report.notes:
        out.print(note)
    legend = (f"KL: nats, of the next-token distributions; ±: half the 95% interval over windows; ppl: "
              f"perplexity against {first.base_perplexity:.2f}")
    if memory:
        legend += f"; B/tok: bytes per token in {report.engine}; x tok: tokens in the same memory against its " \
                  "default cache"
        if requests:
            legend += f"; reqs: requests of {report.max_model_len:,} tokens at once"
    out.print(legend + f". Linear layers {report.matmul}.")
    out.print(report.verdict + " A small model on one text: check your own model on your own traffic.")
