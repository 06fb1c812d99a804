"""MkDocs hook: the reference pages made from the code and the data files at build time, so they cannot drift.

A page holds a marker `<!-- generated: NAME -->`; `on_page_markdown` puts NAME's text in its place."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _cli() -> str:
    os.environ["COLUMNS"] = "100"
    from kvbudget.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [f"```text\n{parser.format_help()}```\n"]
    for name, command in sub.choices.items():
        parts.append(f"## `kvbudget {name}`\n\n```text\n{command.format_help()}```\n")
    return "\n".join(parts)


def _models() -> str:
    from kvbudget import catalog
    from kvbudget.model.load import load_model

    rows = ["| name | Hub id | type | layers | max length | cache layers | source |", "|---|---|---|---|---|---|---|"]
    for e in catalog.entries():
        spec = load_model(e.name)
        cache = ", ".join(f"{n} {k}" for k, n in spec.kinds().items())
        rows.append(f"| `{e.name}` | {e.hf_id} | {spec.model_type} | {spec.num_layers} | "
                    f"{spec.max_position_embeddings or '-':,} | {cache} | {e.source.replace('|', '/')} |"
                    if spec.max_position_embeddings else
                    f"| `{e.name}` | {e.hf_id} | {spec.model_type} | {spec.num_layers} | - | {cache} | "
                    f"{e.source.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _gpus() -> str:
    from kvbudget.gpus import gpus
    from kvbudget.simulation.steptimes import step_times_basis
    from kvbudget.units import format_bytes

    rows = ["| name | memory | HBM bandwidth | bf16 TFLOPS | fp8 TFLOPS | links | step times | source |",
            "|---|---|---|---|---|---|---|---|"]
    for g in gpus():
        rows.append(f"| {g.name} | {format_bytes(g.memory_bytes)} ({g.memory_basis}) | "
                    f"{g.bandwidth_bytes_per_s / 1e9:,.0f} GB/s | {g.bf16_tflops or '-'} | {g.fp8_tflops or '-'} | "
                    f"{', '.join(g.links) or '-'} | {step_times_basis(g.name)} | {g.source.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def _prices() -> str:
    import json

    doc = json.loads((ROOT / "src" / "kvbudget" / "data" / "prices.json").read_text(encoding="utf-8"))
    rows = ["| GPU | $ per GPU-hour | provider | instance | date | source |", "|---|---|---|---|---|---|"]
    rows += [f"| {name} | {r['price_per_gpu_hour']:.2f} | {r['provider']} | {r['instance']} | {r['date']} "
             f"({r['date_kind']}) | [{r['source']}]({r['source']}), read from [a transcription]({r['via']}) |"
             for name, r in doc["gpus"].items()]
    return "\n".join(rows) + "\n"


def _traces() -> str:
    from kvbudget.traces import bundled

    rows = ["| name | what | source | licence | credit |", "|---|---|---|---|---|"]
    rows += [f"| `{t.name}` | {t.what} | {t.source} | {t.licence} | {t.credit} |" for t in bundled()]
    return "\n".join(rows) + "\n"


def _changelog() -> str:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return text.split("\n", 1)[1]  # without its own title


GENERATED = {"cli": _cli, "models": _models, "gpus": _gpus, "prices": _prices, "traces": _traces,
             "changelog": _changelog}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, make in GENERATED.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
