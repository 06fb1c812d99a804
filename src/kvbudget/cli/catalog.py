"""`kvbudget models`, `kvbudget gpus` and `kvbudget traces`: the bundled catalogs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvbudget import catalog
from kvbudget.cli.common import console
from kvbudget.model.load import load_model
from kvbudget.units import format_bytes


def add_parser(sub: Any) -> None:
    models = sub.add_parser("models", help="list the bundled model catalog")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(run=run_models)
    g = sub.add_parser("gpus", help="list the GPU catalog")
    g.add_argument("--json", action="store_true", help="print JSON")
    g.set_defaults(run=run_gpus)
    t = sub.add_parser("traces", help="list the bundled request traces (for simulate --trace NAME)")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.set_defaults(run=run_traces)


def run_models(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for entry in catalog.entries():
        spec = load_model(entry.name)
        rows.append({"name": entry.name, "hf_id": entry.hf_id, "model_type": spec.model_type,
                     "layers": spec.num_layers, "dtype": spec.dtype,
                     "max_position_embeddings": spec.max_position_embeddings,
                     "cache": spec.kinds(), "source": entry.source, "note": entry.note})
    if args.json:
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
    from kvbudget.simulation.steptimes import step_times_basis

    rows = [dict(g.__dict__, step_times=step_times_basis(g.name)) for g in gpus()]
    if args.json:
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
    from kvbudget.traces import bundled

    rows = [{**t.__dict__, "path": t.path} for t in bundled()]
    if args.json:
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
