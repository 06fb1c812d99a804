"""`kvbudget plan` and `kvbudget compare`: will it fit, how many requests, what to change; models side by side."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import UNITS_NOTE, add_options, console, request_of, wrote
from kvbudget.cli.tiers import render_advice, render_host
from kvbudget.commands import spelling
from kvbudget.commands.plan import (
    CompareRequest,
    PlanRequest,
    answer,
    as_json,
    check_failure,
    compare_rows,
    low_end_shortfall,
    pd_sizing,
)
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.planner import NoBudget, Plan, Recommendation
    from kvbudget.simulation.pdsizing import PDSizing


def add_parser(sub: Any) -> None:
    pl = sub.add_parser("plan", help="will it fit: weights, KV budget, capacity, what to change")
    add_options(pl, PlanRequest)
    pl.set_defaults(run=run)

    cmp_ = sub.add_parser("compare", help="models side by side: bytes per token, capacity, longest context")
    add_options(cmp_, CompareRequest)
    cmp_.set_defaults(run=run_compare)


def compute(args: argparse.Namespace) -> Plan | NoBudget:
    """The plan the arguments ask for (`as_json` of it is what --json prints)."""
    return answer(request_of(PlanRequest, args))


def run(args: argparse.Namespace) -> int:
    from kvbudget.planner import NoBudget

    result = compute(args)
    if isinstance(result, NoBudget):
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            render_no_budget(result)
        return checked(result) if args.check else 0
    if args.guard_config:
        from kvbudget.files import write_file
        from kvbudget.guard.config import guard_config_yaml

        replaced = write_file(args.guard_config, guard_config_yaml(result), "guard_config", args.force)
        wrote(args.guard_config, "--guard-config", replaced)
        said_queue_flags(result)
    if args.plot:
        from kvbudget.plot import plot_plan

        wrote(args.plot, "--plot", plot_plan(result, args.plot, args.force))
    sizing = pd_sizing(request_of(PlanRequest, args))
    if args.json:
        print(json.dumps({**as_json(result), **({"disaggregated": sizing.to_dict()} if sizing else {})}, indent=2))
    else:
        render(result)
        if sizing is not None:
            render_pd(sizing)
    return checked(result) if args.check else 0


def checked(result: Plan | NoBudget) -> int:
    """--check's exit status: 1, with the reason on stderr, where the deployment does not fit."""
    failure = check_failure(result)
    if failure:
        print(f"kvbudget: --check: {failure}", file=sys.stderr)
    return 1 if failure else 0


def said_queue_flags(p: Plan) -> None:
    """The engine's own queue limits from the guard's reject level, on stderr beside the file written."""
    from kvbudget.guard.config import engine_queue_flags

    flags = engine_queue_flags(p)
    if flags is not None and flags.argv:
        print(f"kvbudget: {p.engine.name}'s own limits at the same reject level (503 past them; in the file too):\n"
              f"  {flags.shell}", file=sys.stderr)
    for note in flags.notes if flags is not None else ():
        print(f"kvbudget: {note}", file=sys.stderr)


def render_pd(z: PDSizing) -> None:
    """The static P:D answer, in words."""
    out = console()
    out.print(f"[bold]Disaggregated prefill and decode[/] for {z.rate:,.4g} requests/s of {z.prompt_tokens:,} "
              f"prompt and {z.output_tokens:,} output tokens (an estimate from the time model's steps at full "
              "load; simulate --prefill-replicas P --decode-replicas D runs it):")
    out.print(hanging([
        ("  prefill:", f"{_ms(z.prefill_seconds)} of a replica per request ({z.prefill_batch} prompt"
                       f"{'s' if z.prefill_batch > 1 else ''} a step)"),
        ("  decode:", f"{_ms(z.decode_seconds)} of a replica per request, {z.decode_batch:,} at once (what its KV "
                      f"holds at their final length), {_ms(z.decode_step_seconds)} a token"),
        ("  balance:", f"{z.ratio:.3g} prefill replicas per decode replica; at this rate {z.prefill_replicas:,} "
                       f"prefill and {z.decode_replicas:,} decode replicas"),
        ("  KV moved:", f"{format_bytes(z.transfer_bytes)} a GPU per request over {z.link.name} in "
                        f"{_ms(z.transfer_seconds)}; {format_bytes(int(z.staging_bytes))} a GPU on the link at "
                        f"once; each decode replica holds {format_bytes(int(z.decode_held_bytes))} of its "
                        f"{format_bytes(z.decode_budget_bytes)} a GPU"),
    ]))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def render_no_budget(answer: NoBudget) -> None:
    """A deployment that leaves no KV budget: the memory stack and the changes that make room."""
    out = console()
    out.print(f"[bold]{answer.model}[/] on [bold]{answer.gpu}[/] x{answer.tp * answer.pp} (tp "
              f"{answer.tp}, pp {answer.pp}) with [bold]{answer.engine}[/]: [red]does not fit[/]")
    for t in answer.stack:
        out.print(f"  {t.name}: {format_bytes(t.bytes)}" + (" (estimate)" if t.estimate else ""))
    out.print("  the weights and the engine's other memory leave no KV budget")
    if answer.recommendations:
        out.print("[bold]What to change[/] (cheapest first):")
        out.print(hanging([(f"  {i}.", f"{change_text(rec)} ({rec.cost}): {rec.effect}")
                           for i, rec in enumerate(answer.recommendations, 1)]))
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
        stack.add_row(t.name, format_bytes(t.bytes), estimated + t.text(command_line=True))
    out.print(stack)
    cap = p.capacity
    reported = (f"KV cache size {cap.kv_cache_tokens:,} tokens (as {p.engine.name} reports it), physical slots "
                if p.engine.reports_kv_size else "physical token slots ")
    each = f" per replica ({p.tp * p.pp} GPU{'s' if p.tp * p.pp > 1 else ''})" if p.replicas > 1 else ""
    out.print(f"[bold]Capacity[/]{each} for requests of {cap.max_model_len:,} tokens: "
              + (f"{cap.num_blocks:,} blocks of {cap.block_size}; " if cap.num_blocks is not None else "")
              + f"{reported}{cap.physical_token_slots:,}; maximum concurrency {cap.max_concurrency:.2f}x")
    if p.replicas > 1:
        whole = p.deployment()
        out.print(f"[bold]Deployment[/] of {whole['gpus']} GPUs ({p.replicas} replicas, each with its own KV cache): "
                  f"maximum concurrency {p.total_concurrency:.2f}x, physical slots "
                  f"{whole['physical_token_slots']:,}, KV budget {format_bytes(whole['kv_memory_bytes'])}")
    out.print("  one request of max-model-len fits" if cap.fits else
                  f"  [red]one request of {cap.max_model_len:,} tokens does not fit[/]; the longest that does: "
                  f"{cap.estimated_max_model_len:,}")
    shortfall = low_end_shortfall(p) if cap.fits else None
    if shortfall:
        out.print(f"  [yellow]{shortfall}[/]")
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
    levels = Table(title="Degradation plan (fractions of the KV budget" + (", per replica)" if p.replicas > 1 else ")"))
    for name in ("level", "at", "KV bytes", "tokens in cache", "requests", "action"):
        levels.add_column(name, justify="left" if name in ("level", "action") else "right")
    for lv in p.levels:
        levels.add_row(lv.name, f"{lv.fraction:.0%}", format_bytes(lv.kv_bytes), f"{lv.tokens:,}",
                       f"{lv.requests:,}", lv.meaning)
    out.print(levels)
    if p.host is not None:
        render_host(out, p.host)
    if p.reuse is not None:
        render_advice(out, p.reuse)
    if p.drafter is not None:
        render_drafter(out, p)
    if p.recommendations:
        out.print("[bold]What to change[/] (cheapest first):")
        out.print(hanging([(f"  {i}.", f"{change_text(rec)} ({rec.cost}): {rec.effect}")
                           for i, rec in enumerate(p.recommendations, 1)]))
    if p.notes:
        out.print(hanging([("[yellow]note:[/]", note) for note in p.notes]))


def render_drafter(out: Any, p: Plan) -> None:
    """Whether the drafter fits and what it costs in requests of the plan's length."""
    d = p.drafter
    assert d is not None
    who = f" ({d.draft})" if d.draft else ""
    costs = [f"weights {format_bytes(d.weights_bytes)}" if d.weights_bytes else "no weights",
             f"KV {format_bytes(d.bytes_per_token)} per token in the pool" if d.bytes_per_token
             else "no KV in the pool"]
    if d.lookahead_slots:
        costs.append(f"{d.lookahead_slots} lookahead slots per running request")
    fits = "fits" if d.fits else "[red]does not fit[/]: one request of max-model-len no longer fits"
    without = (f"{d.requests_without:.2f} without it ({d.cost:.0%} fewer)" if d.requests_without and d.cost is not None
               else "the plan without it was refused")
    out.print(hanging([("[bold]Drafter[/]", f"--speculative {d.method}, {d.num_tokens} draft tokens{who}: {fits}; "
                        f"{', '.join(costs)}; requests of {p.capacity.max_model_len:,} tokens at once: "
                        f"{d.requests_with:.2f} with it, {without}")]))


def hanging(items: list[tuple[str, str]]) -> Any:
    """Numbered or labelled lines whose wrapped text stays indented under itself."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, text in items:
        grid.add_row(label, text)
    return grid


def run_compare(args: argparse.Namespace) -> int:
    rows = compare_rows(request_of(CompareRequest, args))
    engine = args.engine.partition("@")[0]
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"{engine}, requests of {rows[0].context:,} tokens ({UNITS_NOTE})")
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
                       f"{r.longest_context:,}" if r.longest_context else "-"]
                      if r.kv_memory_bytes is not None and r.max_concurrency is not None else
                      [str(r.budget), "-", "-"])  # does not fit, weights unknown, refused (the note says why)
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
