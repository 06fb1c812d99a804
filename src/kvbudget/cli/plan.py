"""`kvbudget plan` and `kvbudget compare`: will it fit, how many requests, what to change; models side by side."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import (
    UNITS_NOTE,
    add_counted_lengths,
    add_engine_knobs,
    add_model_engine,
    console,
    counted_context,
    engine_options,
    engine_release,
    one,
    optional_one,
    size,
    size_or_zero,
    write_atomically,
    wrote,
)
from kvbudget.cli.common import load as common_load
from kvbudget.commands import spelling
from kvbudget.engines import EngineOptions
from kvbudget.errors import KVBudgetError
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.planner import Plan, Recommendation


def add_parser(sub: Any) -> None:
    pl = sub.add_parser("plan", help="will it fit: weights, KV budget, capacity, what to change")
    add_model_engine(pl, "vllm")
    pl.add_argument("--gpu", help="GPU from `kvbudget gpus` (e.g. H100-80GB)")
    pl.add_argument("--gpu-memory", help="memory of one GPU (overrides --gpu's), e.g. 24GiB")
    pl.add_argument("--gpus", help="GPUs in the deployment: replicas of tp x pp (data parallel; default tp x pp)")
    pl.add_argument("--expert-parallel", action="store_true",
                    help="with --gpus: the replicas are data-parallel attention ranks sharing an MoE's experts "
                         "(vLLM --data-parallel-size N --enable-expert-parallel; SGLang --enable-dp-attention)")
    pl.add_argument("--tp", default="1", help="tensor parallel size (default 1)")
    pl.add_argument("--pp", default="1", help="pipeline parallel size (default 1)")
    pl.add_argument("--max-model-len", help="request length (default: the model's maximum)")
    pl.add_argument("--concurrency", default="1", help="requests at once, for the longest-context answer")
    pl.add_argument("--beams", default="1", help="beams or samples per request (default 1)")
    pl.add_argument("--weights", help="weight bytes per GPU (overrides the computed figure)")
    pl.add_argument("--activation", help="activation peak (overrides the estimate)")
    pl.add_argument("--overhead", help="non-torch memory and CUDA graphs (overrides the estimate)")
    pl.add_argument("--utilization", help="the engine's memory fraction (vLLM gpu_memory_utilization, SGLang "
                                          "mem_fraction_static, TGI cuda_memory_fraction)")
    pl.add_argument("--kv-memory", help="use this KV budget per GPU instead of deriving it")
    add_engine_knobs(pl)
    pl.add_argument("--guard-config", help="write the degradation plan as YAML for `kvbudget guard`")
    pl.add_argument("--plot", help="write a picture (.png or .svg): GPU memory and KV bytes against context")
    add_counted_lengths(pl)
    pl.add_argument("--json", action="store_true", help="print JSON (bytes) instead of tables")
    pl.add_argument("--check", action="store_true", help="exit 1 when the deployment does not fit (for CI): no KV "
                                                        "budget, or one request of --max-model-len does not fit")
    pl.set_defaults(run=run)

    cmp_ = sub.add_parser("compare", help="models side by side: bytes per token, capacity, longest context")
    add_model_engine(cmp_, "vllm", many=True)
    cmp_.add_argument("--gpu", help="GPU from `kvbudget gpus`: adds KV budget, concurrency and longest context")
    cmp_.add_argument("--gpu-memory", help="memory of one GPU instead of --gpu")
    cmp_.add_argument("--context", default="8192", help="request length to compare at (default 8192)")
    cmp_.add_argument("--tp", default="1", help="tensor parallel size for every model (default 1)")
    cmp_.add_argument("--json", action="store_true", help="print JSON")
    cmp_.set_defaults(run=run_compare)


def compute(args: argparse.Namespace) -> Plan | dict[str, Any]:
    """The plan the arguments ask for, or (a deployment that leaves no KV budget) the answer saying so with the
    changes that make room. `as_json` of it is what --json prints, and what `kvbudget web` serves."""
    from kvbudget.planner import NoKVBudget

    options = engine_options(args)  # first: it reads the release off --engine NAME@VERSION
    counted, counted_note = counted_context(args, "--max-model-len")
    util = None
    if args.utilization is not None:
        try:
            util = float(args.utilization)
        except ValueError:
            raise KVBudgetError(f"--utilization: {args.utilization!r} is not a number between 0 and 1") from None
    try:
        result = _plan(args, options, counted, util)
    except NoKVBudget as exc:  # "does not fit" is an answer: said in full, exit 0
        return exc.answer
    return replace(result, notes=(*result.notes, counted_note)) if counted_note else result


def as_json(result: Plan | dict[str, Any]) -> dict[str, Any]:
    return result if isinstance(result, dict) else result.to_dict()


def run(args: argparse.Namespace) -> int:
    from kvbudget.planner import guard_config_yaml

    result = compute(args)
    if isinstance(result, dict):
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            render_no_budget(result)
        return 1 if args.check else 0
    if args.guard_config:
        write_atomically(args.guard_config, guard_config_yaml(result), "--guard-config")
    if args.plot:
        from kvbudget.plot import plot_plan

        plot_plan(result, args.plot)
        wrote(args.plot, "--plot")
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        render(result)
    return 1 if args.check and not result.fits else 0


def _plan(args: argparse.Namespace, options: EngineOptions, counted: int | None, util: float | None) -> Plan:
    from kvbudget.planner import plan

    return plan(
        common_load(args.model), engine=args.engine, gpu=args.gpu, gpu_memory=size(args.gpu_memory, "--gpu-memory"),
        gpus=optional_one(args.gpus, "--gpus"), tp=one(args.tp, "--tp"), pp=one(args.pp, "--pp"),
        kv_dtype=args.kv_dtype, max_model_len=counted or optional_one(args.max_model_len, "--max-model-len"),
        concurrency=one(args.concurrency, "--concurrency"), beams=one(args.beams, "--beams"),
        options=options, weights=size(args.weights, "--weights"),
        activation=size_or_zero(args.activation, "--activation"),
        overhead=size_or_zero(args.overhead, "--overhead"), utilization=util,
        kv_memory=size(args.kv_memory, "--kv-memory"), expert_parallel=args.expert_parallel,
    )


def render_no_budget(answer: dict[str, Any]) -> None:
    """A deployment that leaves no KV budget: the memory stack and the changes that make room."""
    from kvbudget.planner import Recommendation

    out = console()
    out.print(f"[bold]{answer['model']}[/] on [bold]{answer['gpu']}[/] x{answer['tp'] * answer['pp']} (tp "
              f"{answer['tp']}, pp {answer['pp']}) with [bold]{answer['engine']}[/]: [red]does not fit[/]")
    for t in answer["stack"]:
        out.print(f"  {t['name']}: {format_bytes(t['bytes'])}" + (" (estimate)" if t["estimate"] else ""))
    out.print("  the weights and the engine's other memory leave no KV budget")
    if answer["recommendations"]:
        out.print("[bold]What to change[/] (cheapest first):")
        recs = [Recommendation(r["parameters"], r["note"], r["effect"], r["gain"], r["makes_it_fit"], r["more_gpus"])
                for r in answer["recommendations"]]
        out.print(hanging([(f"  {i}.", f"{change_text(rec)} ({rec.cost}): {rec.effect}")
                           for i, rec in enumerate(recs, 1)]))
    else:
        out.print("  no larger tensor parallel size or GPU makes room: a quantized checkpoint (give its size with "
                  "--weights)")


def render(p: Plan) -> None:
    from rich.table import Table

    out = console()
    w = p.weights
    dp = f", {p.replicas} replicas" if p.replicas > 1 else ""
    out.print(f"[bold]{p.model.name}[/] on [bold]{p.gpu}[/] x{p.tp * p.pp * p.replicas} (tp {p.tp}, pp {p.pp}{dp}) "
              f"with [bold]{p.engine.name}[/]; sizes in {UNITS_NOTE}")
    if w.total_params:
        out.print(f"parameters: {w.total_params / 1e9:,.2f}B total, {w.active_params / 1e9:,.2f}B active per token"
                  + (f", +{w.mtp_params / 1e9:,.2f}B MTP" if w.mtp_params else ""))
    else:
        out.print(f"parameters: not counted ({w.basis})")
    stack = Table(title="Memory of one GPU")
    for name in ("term", "size", "how"):
        stack.add_column(name, justify="right" if name == "size" else "left")
    for t in p.stack:
        estimated = "[yellow]estimate[/]: " if t.estimate else ""
        stack.add_row(t.name, format_bytes(t.bytes), estimated + spelling.text(t.note))
    out.print(stack)
    cap = p.capacity
    reported = (f"KV cache size {cap.kv_cache_tokens:,} tokens (as {p.engine.name} reports it), physical slots "
                if p.engine.reports_kv_size else "physical token slots ")
    out.print(f"[bold]Capacity[/] for requests of {cap.max_model_len:,} tokens: "
              + (f"{cap.num_blocks:,} blocks of {cap.block_size}; " if cap.num_blocks is not None else "")
              + f"{reported}{cap.physical_token_slots:,}; maximum concurrency {cap.max_concurrency:.2f}x")
    out.print("  one request of max-model-len fits" if cap.fits else
                  f"  [red]one request of {cap.max_model_len:,} tokens does not fit[/]; the longest that does: "
                  f"{cap.estimated_max_model_len:,}")
    if p.longest_context:
        out.print(f"  longest context for {p.concurrency} request(s) at once: {p.longest_context:,} tokens")
    out.print(f"  token tax: {format_bytes(p.estimate.bytes_per_token)} per token per sequence; fixed state "
                  f"{format_bytes(p.estimate.fixed_bytes_per_sequence)} per sequence")
    if p.roofline:
        comm = p.roofline[0].all_reduce_seconds > 0
        title = f"Decode roofline, {p.roofline[0].batch} sequence(s): " + (
            "memory read at HBM bandwidth (a lower bound) + tensor-parallel all-reduces (an estimate)" if comm else
            "memory read at HBM bandwidth (a lower bound on step time)")
        roof = Table(title=title)
        names = ("context", "memory", "all-reduce", "step", "tokens/s per sequence", "tokens/s total") if comm else \
            ("context", "step", "tokens/s per sequence", "tokens/s total")
        for name in names:
            roof.add_column(name, justify="right")
        for r in p.roofline:
            split = [f"{r.memory_seconds * 1000:.2f} ms", f"{r.all_reduce_seconds * 1000:.2f} ms"] if comm else []
            roof.add_row(f"{r.context:,}", *split, f"{r.step_seconds * 1000:.2f} ms", f"{r.tokens_per_second:,.1f}",
                         f"{r.aggregate_tokens_per_second:,.1f}")
        out.print(roof)
    levels = Table(title="Degradation plan (fractions of the KV budget)")
    for name in ("level", "at", "KV bytes", "tokens in cache", "requests", "action"):
        levels.add_column(name, justify="left" if name in ("level", "action") else "right")
    for lv in p.levels:
        levels.add_row(lv.name, f"{lv.fraction:.0%}", format_bytes(lv.kv_bytes), f"{lv.tokens:,}",
                       f"{lv.requests:,}", lv.meaning)
    out.print(levels)
    if p.recommendations:
        out.print("[bold]What to change[/] (cheapest first):")
        out.print(hanging([(f"  {i}.", f"{change_text(rec)} ({rec.cost}): {rec.effect}")
                           for i, rec in enumerate(p.recommendations, 1)]))
    if p.notes:
        out.print(hanging([("[yellow]note:[/]", spelling.text(note)) for note in p.notes]))


def hanging(items: list[tuple[str, str]]) -> Any:
    """Numbered or labelled lines whose wrapped text stays indented under itself."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, text in items:
        grid.add_row(label, text)
    return grid


def compare_rows(args: argparse.Namespace) -> tuple[Any, ...]:
    """The comparison the arguments ask for (each row's `__dict__` is what --json prints and `kvbudget web` serves)."""
    from kvbudget.planner import compare

    if len(args.models) < 2:
        raise KVBudgetError("compare: name at least two models")
    release = engine_release(args)
    return compare([common_load(m) for m in args.models], engine=args.engine, gpu=args.gpu,
                   gpu_memory=size(args.gpu_memory, "--gpu-memory"), context=one(args.context, "--context"),
                   kv_dtype=args.kv_dtype, options=EngineOptions(engine_version=release), tp=one(args.tp, "--tp"))


def run_compare(args: argparse.Namespace) -> int:
    rows = compare_rows(args)
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{args.engine}, requests of {rows[0].context:,} tokens ({UNITS_NOTE})")
    columns = ["model", "cache layers", "per token", "fixed per seq", "one request"]
    if args.gpu or args.gpu_memory:
        columns += ["KV budget", "max requests", "longest single request"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("model", "cache layers") else "right",
                         no_wrap=name == "model")  # names are never cut or wrapped
    for r in rows:
        cells = [r.model, ", ".join(f"{n} {k.split('_')[0]}" for k, n in r.cache.items()),
                 format_bytes(r.bytes_per_token), format_bytes(r.fixed_bytes_per_sequence),
                 format_bytes(r.kv_bytes_at_context)]
        if args.gpu or args.gpu_memory:
            cells += ([format_bytes(r.kv_memory_bytes), f"{r.max_concurrency:.2f}x",
                       f"{r.longest_context:,}" if r.longest_context else "-"] if r.kv_memory_bytes else
                      ["does not fit", "-", "-"])
        table.add_row(*cells)
    console().print(table)
    for r in rows:
        if r.note:
            console().print(f"[yellow]note:[/] {r.note}")
    return 0


def change_text(rec: Recommendation) -> str:
    """A recommendation as the flags that make it: `--tp 4, 4 GPUs`; another model by its name."""
    if "model" in rec.parameters:
        return f"{rec.parameters['model']}, {rec.note}"
    flag = spelling.flag
    flags = " ".join(flag(key) if value is True else f"{flag(key)} {value}" for key, value in rec.parameters.items())
    return f"{flags}, {rec.note}" if rec.note else flags
