"""`kvbudget` command line: argument parsing and rendering only; every number comes from the API."""

from __future__ import annotations

import argparse
import json
import sys

from kvbudget import __version__, catalog
from kvbudget.dtypes import KV_DTYPE_CHOICES
from kvbudget.engines import ENGINES
from kvbudget.errors import KVBudgetError
from kvbudget.estimate import Estimate, estimate
from kvbudget.model.load import load_model
from kvbudget.units import format_bytes, parse_positive_ints

UNITS_NOTE = "KiB/MiB/GiB are powers of 1024"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        self.exit(2, f"kvbudget: error: {message} (see `{self.prog} --help`)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvbudget", description="Exact KV-cache memory for LLM serving.")
    parser.add_argument("--version", action="version", version=f"kvbudget {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="KV memory map of one model on one engine")
    est.add_argument("model", help="catalog name (kvbudget models), config.json, model folder or Hub id")
    est.add_argument("--engine", default="hf", help=f"one of {', '.join(ENGINES)} (default hf)")
    est.add_argument("--kv-dtype", default="auto", help=f"one of {', '.join(KV_DTYPE_CHOICES)} (default auto)")
    est.add_argument("--batch", default="1", help="batch sizes, comma-separated (default 1)")
    est.add_argument("--beams", default="1", help="beams or samples per request (default 1)")
    est.add_argument("--context", help="context lengths in tokens, e.g. 1024,4096,32k "
                                       "(default 1024,4096,8192,16384 and the model's maximum)")
    est.add_argument("--tp", default="1", help="tensor parallel size: numbers are per GPU (default 1)")
    est.add_argument("--layers", action="store_true", help="show the per-layer-kind breakdown")
    est.add_argument("--json", action="store_true", help="print JSON (bytes) instead of tables")

    models = sub.add_parser("models", help="list the bundled model catalog")
    models.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _one(text: str, what: str) -> int:
    values = parse_positive_ints(text, what)
    if len(values) != 1:
        raise KVBudgetError(f"{what}: give one value, not {text!r}")
    return values[0]


def _run_estimate(args: argparse.Namespace) -> int:
    result = estimate(
        load_model(args.model),
        engine=args.engine,
        kv_dtype=args.kv_dtype,
        batch=parse_positive_ints(args.batch, "--batch"),
        context=parse_positive_ints(args.context, "--context") if args.context else None,
        beams=_one(args.beams, "--beams"),
        tp=_one(args.tp, "--tp"),
    )
    if args.json:
        for warning in result.model.warnings:  # also in "notes"; stderr so that people see them
            print(f"kvbudget: warning: {warning}", file=sys.stderr)
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _render_estimate(result, args.layers)
    return 0


def _render_estimate(result: Estimate, show_layers: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    alloc, model = result.allocation, result.model
    kinds = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in model.kinds().items())
    console.print(
        f"[bold]{model.name}[/] ({model.model_type}, {model.num_layers} layers: {kinds})\n"
        f"engine [bold]{alloc.engine}[/], KV dtype [bold]{alloc.kv_dtype.name}[/], "
        f"tensor parallel {alloc.tp} (per GPU), beams {result.beams}"
        + ("" if alloc.exact else "  [yellow]ESTIMATE (see notes)[/]")
    )
    console.print(f"sizes in {UNITS_NOTE}")
    console.print(f"token tax: [bold]{result.bytes_per_token:,} bytes[/] ({format_bytes(result.bytes_per_token)}) "
                  f"per token per sequence before window caps; fixed state "
                  f"{format_bytes(result.fixed_bytes_per_sequence)} per sequence")

    tax = Table(title="Token tax per generated token")
    tax.add_column("batch", justify="right")
    tax.add_column("sequences", justify="right")
    tax.add_column("per generated token", justify="right")
    for b in result.batches:
        tax.add_row(str(b), str(b * result.beams), format_bytes(result.token_tax(b)))
    console.print(tax)

    capped = any(p.kv_bytes != p.uncapped_kv_bytes for p in result.points)
    table = Table(title="KV cache held")
    for name in ("context", "batch", "sequences", f"{alloc.engine} holds"):
        table.add_column(name, justify="right")
    if capped:
        table.add_column("no window cap", justify="right")
    table.add_column("per sequence", justify="right")
    for p in result.points:
        row = [f"{p.context:,}", str(p.batch), str(p.sequences), format_bytes(p.kv_bytes)]
        if capped:
            row.append(format_bytes(p.uncapped_kv_bytes))
        row.append(format_bytes(p.kv_bytes // p.sequences))
        table.add_row(*row)
    console.print(table)

    if show_layers:
        longest = max(result.contexts)
        layers = Table(title="Per layer kind, one sequence")
        for name in ("#", "kind", "layers", "bytes/token/layer", "keeps tokens", "fixed/layer",
                     f"at {longest:,} tokens"):
            layers.add_column(name, justify="left" if name == "kind" else "right")
        for i, g in enumerate(alloc.groups, 1):
            layers.add_row(str(i), g.kind.replace("_", " "), str(g.layers), f"{g.bytes_per_token:,}",
                           "all" if g.token_cap is None else f"{g.token_cap:,}",
                           format_bytes(g.fixed_bytes), format_bytes(g.sequence_bytes(longest)))
        console.print(layers)
        for i, g in enumerate(alloc.groups, 1):
            console.print(f"  {i}. {g.detail}")
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")


def _run_models(args: argparse.Namespace) -> int:
    rows = []
    for entry in catalog.entries():
        spec = load_model(entry.name)
        rows.append({"name": entry.name, "hf_id": entry.hf_id, "model_type": spec.model_type,
                     "layers": spec.num_layers, "dtype": spec.dtype,
                     "max_position_embeddings": spec.max_position_embeddings,
                     "cache": spec.kinds(), "source": entry.source, "note": entry.note})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Bundled models ({len(rows)}); Hub ids and provenance: kvbudget models --json")
    for name in ("name", "type", "layers", "dtype", "max len", "cache layers"):
        table.add_column(name, no_wrap=name != "cache layers")
    for r in rows:
        table.add_row(r["name"], r["model_type"], str(r["layers"]), r["dtype"],
                      f"{r['max_position_embeddings']:,}" if r["max_position_embeddings"] else "-",
                      ", ".join(f"{n} {k.split('_')[0]}" for k, n in r["cache"].items()))
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "estimate":
            code = _run_estimate(args)
        else:
            code = _run_models(args)
    except KVBudgetError as exc:
        print(f"kvbudget: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kvbudget ... | head`
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
