"""`kvbudget estimate`: the memory map of one model on one engine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvbudget.cli.common import UNITS_NOTE, add_options, console, request_of
from kvbudget.cli.tiers import render_host
from kvbudget.commands.estimate import EstimateRequest, answer
from kvbudget.commands.options import warn
from kvbudget.estimator import Estimate
from kvbudget.units import format_bytes


def add_parser(sub: Any) -> None:
    est = sub.add_parser("estimate", help="KV memory map of one model on one engine")
    add_options(est, EstimateRequest)
    est.set_defaults(run=run)


def compute(args: argparse.Namespace) -> Estimate:
    """The estimate the arguments ask for (its `to_dict()` is what --json prints)."""
    return answer(request_of(EstimateRequest, args))


def run(args: argparse.Namespace) -> int:
    result = compute(args)
    if args.json:
        for warning in result.model.warnings:  # also in "notes"; stderr so that people see them
            warn(warning)
        print(json.dumps(result.to_dict(), indent=2))
    else:
        render(result, args.layers)
    return 0


def render(result: Estimate, show_layers: bool) -> None:
    from rich.table import Table

    out = console()
    alloc, model = result.allocation, result.model
    kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in model.kinds().items())
    out.print(
        f"[bold]{model.name}[/] ({model.model_type}, {model.num_layers} layers: {kinds})\n"
        f"engine [bold]{alloc.engine}[/], KV dtype [bold]{alloc.kv_dtype.name}[/], "
        f"tensor parallel {alloc.tp} (per GPU), beams {result.beams}"
        + ("" if alloc.exact else "  [yellow]ESTIMATE (see notes)[/]")
    )
    out.print(f"sizes in {UNITS_NOTE}")
    out.print(f"token tax: [bold]{result.bytes_per_token:,} bytes[/] ({format_bytes(result.bytes_per_token)}) "
                  f"per token per sequence before window caps; fixed state "
                  f"{format_bytes(result.fixed_bytes_per_sequence)} per sequence")

    tax = Table(title="Token tax per generated token")
    tax.add_column("batch", justify="right")
    tax.add_column("sequences", justify="right")
    tax.add_column("per generated token", justify="right")
    for b in result.batches:
        tax.add_row(f"{b:,}", f"{b * result.beams:,}", format_bytes(result.token_tax(b)))
    out.print(tax)

    capped = any(p.kv_bytes != p.uncapped_kv_bytes for p in result.points)
    table = Table(title="KV cache held")
    for name in ("context", "batch", "sequences", f"{alloc.engine} holds"):
        table.add_column(name, justify="right")
    if capped:
        table.add_column("no window cap", justify="right")
    table.add_column("per sequence", justify="right")
    for p in result.points:
        row = [f"{p.context:,}", f"{p.batch:,}", f"{p.sequences:,}", format_bytes(p.kv_bytes)]
        if capped:
            row.append(format_bytes(p.uncapped_kv_bytes))
        row.append(format_bytes(p.kv_bytes // p.sequences))
        table.add_row(*row)
    out.print(table)

    if show_layers:
        longest = max(result.contexts)
        layers = Table(title="Per layer kind, one sequence")
        for name in ("#", "kind", "layers", "bytes/token/layer", "keeps tokens", "fixed/layer",
                     f"at {longest:,} tokens"):
            layers.add_column(name, justify="left" if name == "kind" else "right")
        for i, g in enumerate(alloc.groups, 1):
            layers.add_row(str(i), g.kind.replace("_", " "), str(g.layers), f"{g.token_tax:,}",
                           "all" if g.token_cap is None else f"{g.token_cap:,}",
                           format_bytes(g.fixed_bytes), format_bytes(g.sequence_bytes(longest)))
        out.print(layers)
        for i, g in enumerate(alloc.groups, 1):
            out.print(f"  {i}. {g.detail}")
    cap = result.capacity
    if cap is not None:
        out.print(f"[bold]Capacity[/] with {format_bytes(cap.kv_memory_bytes)} of KV memory, requests of "
                      f"{cap.max_model_len:,} tokens:")
        if cap.num_blocks is not None:
            out.print(f"  blocks: {cap.num_blocks:,} of {cap.block_size} tokens")
        out.print(f"  KV cache size: {cap.kv_cache_tokens:,} tokens (as {alloc.engine} reports it); "
                      f"physical token slots {cap.physical_token_slots:,}")
        out.print(f"  maximum concurrency: {cap.max_concurrency:.2f}x")
        out.print("  one request of max_model_len fits" if cap.fits else
                      f"  [red]one request of {cap.max_model_len:,} tokens does not fit[/]; the longest that "
                      f"does: {cap.estimated_max_model_len:,}")
    if result.host is not None:
        render_host(out, result.host)
    for note in result.notes:
        out.print(f"[yellow]note:[/] {note}")
