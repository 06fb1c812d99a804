"""`kvbudget check-log`: an engine's startup log beside kvbudget's prediction."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvbudget.cli.common import console
from kvbudget.commands.options import load as common_load
from kvbudget.errors import KVBudgetError
from kvbudget.units import parse_positive_ints


def add_parser(sub: Any) -> None:
    chk = sub.add_parser("check-log", help="an engine's startup log beside kvbudget's prediction")
    chk.add_argument("log", help="startup log of vLLM, SGLang, TGI or llama-server (- for stdin)")
    chk.add_argument("--model", help="the model (catalog name, config.json, folder, Hub id) when the log's "
                                     "model path is not readable here")
    chk.add_argument("--json", action="store_true", help="print JSON")
    given = chk.add_argument_group("settings the log does not state (otherwise the engine's default is assumed "
                                   "and shown as assumed)")
    given.add_argument("--engine-version", help="the engine's version, e.g. 0.8.5 (vLLM changed what it prints)")
    given.add_argument("--max-model-len", type=int)
    given.add_argument("--tp", type=int, help="tensor parallel size")
    given.add_argument("--pp", type=int, help="pipeline parallel size")
    given.add_argument("--kv-cache-dtype", help="auto, fp8, ...")
    given.add_argument("--max-num-batched-tokens", type=int)
    given.add_argument("--pp-layer-partition", help="vLLM's VLLM_PP_LAYER_PARTITION, e.g. 16,32")
    given.add_argument("--attention-backend", help="vLLM's MLA backend: FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, "
                                                  "FLASH_ATTN_MLA, TRITON_MLA")
    given.add_argument("--num-speculative-tokens", type=int,
                       help="vLLM: draft tokens per step with the model's MTP layers (speculative_config)")
    chk.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvbudget.checklog import check_log, detect_engine, model_in_log

    if args.log == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(args.log, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise KVBudgetError(f"{args.log}: cannot read it ({exc.strerror or exc})") from None
    detect_engine(text)
    source = args.model or model_in_log(text)
    if source is None:
        raise KVBudgetError("check-log: the log does not name its model; pass --model")
    try:
        model = common_load(source)
    except KVBudgetError as exc:
        if args.model:
            raise
        raise KVBudgetError(f"check-log: the log's model {source!r} cannot be read here ({exc}); "
                            "pass --model") from None
    given = {"engine_version": args.engine_version, "max_model_len": args.max_model_len, "tp": args.tp,
             "pp": args.pp, "kv_cache_dtype": args.kv_cache_dtype,
             "max_num_batched_tokens": args.max_num_batched_tokens, "pp_layer_partition": args.pp_layer_partition,
             "attention_backend": args.attention_backend, "num_speculative_tokens": args.num_speculative_tokens}
    if args.pp_layer_partition:
        parse_positive_ints(args.pp_layer_partition, "--pp-layer-partition")
    if args.num_speculative_tokens is not None and args.num_speculative_tokens < 0:
        raise KVBudgetError(f"--num-speculative-tokens: {args.num_speculative_tokens} is negative")
    for name in ("max_model_len", "tp", "pp", "max_num_batched_tokens"):
        if given[name] is not None and given[name] <= 0:
            raise KVBudgetError(f"--{name.replace('_', '-')}: {given[name]} is not positive")
    result = check_log(text, model, {k: v for k, v in given.items() if v is not None})
    status = 0 if result.all_match else 1  # rows that differ fail a CI step; bad input is 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return status
    from rich.table import Table

    table = Table(title=f"{result.engine} log vs kvbudget for {model.name}")
    for name in ("quantity", "log", "kvbudget", "", "note"):
        table.add_column(name)
    for r in result.rows:
        verdict = "shown" if r.matches is None else "[green]ok[/]" if r.matches else "[red]differs[/]"
        table.add_row(r.quantity, r.logged, r.predicted, verdict, r.note)
    out = console()
    out.print("settings read from the log (or given): " + ", ".join(f"{k}={v}" for k, v in result.settings.items()))
    if result.assumed:
        out.print("assumed, not in the log (pass the flag to set it): "
                  + ", ".join(f"{k}={v}" for k, v in result.assumed.items()))
    out.print(table)
    for cause in result.causes:
        out.print(f"likely cause: {cause}")
    return status
