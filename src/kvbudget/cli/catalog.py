"""`kvbudget models`, `kvbudget gpus` and `kvbudget traces`: the bundled catalogs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvbudget.cli.common import add_options, console, request_of
from kvbudget.commands import catalog
from kvbudget.commands.catalog import CatalogRequest
from kvbudget.units import format_bytes


def add_parser(sub: Any) -> None:
    for name, run, text in (("models", run_models, "list the bundled model catalog"),
                            ("gpus", run_gpus, "list the GPU catalog"),
                            ("traces", run_traces, "list the bundled request traces (for simulate --trace NAME)")):
        p = sub.add_parser(name, help=text)
        add_options(p, CatalogRequest)
        p.set_defaults(run=run)


def run_models(args: argparse.Namespace) -> int:
    rows = catalog.models()
    if request_of(CatalogRequest, args).json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"Bundled models ({len(rows)}); dtypes, Hub ids and provenance: kvbudget models --json")
    table.add_column("name", no_wrap=True)
    for name in ("type", "layers", "max len", "cache layers"):
        table.add_column(name, justify="right" if name in ("layers", "max len") else "left")
    for r in rows:
        table.add_row(r["name"], r["model_type"], str(r["layers"]),
                      f"{r['max_position_embeddings']:,}" if r["max_position_embeddings"] else "-",
                      ", ".join(f"{n} {k.split('_')[0]}" for k, n in r["cache"].items()))
    console().print(table)
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    from kvbudget.gpus import gpus

    rows = catalog.gpus()
    if request_of(CatalogRequest, args).json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"GPUs ({len(rows)}); sources in `kvbudget gpus --json`",
                  caption="* nominal memory (the datasheet's); † fp16 (no bf16 on this GPU)")
    table.add_column("name", no_wrap=True)
    for name in ("memory", "bandwidth", "bf16 TFLOPS", "fp8 TFLOPS"):
        table.add_column(name, justify="right")
    table.add_column("step times")
    for g, row in zip(gpus(), rows, strict=True):
        half = f"{g.bf16_tflops:g}" if g.bf16_tflops else f"{g.fp16_tflops:g}†" if g.fp16_tflops else "-"
        table.add_row(g.name, format_bytes(g.memory_bytes) + ("" if g.memory_basis.startswith("as") else "*"),
                      f"{g.bandwidth_bytes_per_s / 1e9:,.0f} GB/s" if g.bandwidth_bytes_per_s else "-",
                      half, f"{g.fp8_tflops:g}" if g.fp8_tflops else "-", row["step_times"])
    console().print(table)
    return 0


def run_traces(args: argparse.Namespace) -> int:
    rows = catalog.traces()
    if request_of(CatalogRequest, args).json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"Bundled traces ({len(rows)}): kvbudget simulate MODEL --trace NAME")
    table.add_column("name", no_wrap=True)
    for name in ("what", "licence and credit"):
        table.add_column(name)
    for r in rows:
        table.add_row(r["name"], r["what"], f"{r['licence']}: {r['credit']}")
    console().print(table)
    return 0
