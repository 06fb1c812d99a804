"""`kvbudget simulate`: a trace or synthetic traffic through vLLM's scheduler and KV allocator."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvbudget.choices import Allocator
from kvbudget.cli.common import add_options, console, request_of, wrote
from kvbudget.cli.simulated import (
    RunFiles,
    _calibration_exists,
    _cost_line,
    _credit,
    _dollars,
    _ms,
    _progress,
    _saved,
    _short,
    latency_table,
)
from kvbudget.commands.fleet import is_fleet
from kvbudget.commands.options import positive
from kvbudget.commands.simulate import (
    SimulateRequest,
    costed,
    front_settings,
    prepared,
    prices,
    run_prepared,
    workload,
)
from kvbudget.commands.simulate import simulation as run_simulation
from kvbudget.errors import KVBudgetError
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.setup import SimulationAsk
    from kvbudget.simulation.cost import Cost
    from kvbudget.simulation.run import Simulation
    from kvbudget.simulation.search import RateSearch


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay traffic through the engine's scheduler and KV allocator")
    add_options(p, SimulateRequest)
    p.set_defaults(run=run)


def simulation(args: argparse.Namespace, on_step: Callable[..., None] | None = None,
               progress: Callable[[int], None] | None = None, on_finish: Callable[..., None] | None = None) -> Any:
    """One simulated run of the arguments (its `to_dict()` is what --json prints)."""
    return run_simulation(request_of(SimulateRequest, args), on_step, progress, on_finish)


def run(args: argparse.Namespace) -> int:
    from kvbudget.simulation import find_max_rate, parse_slo, parse_sweep
    from kvbudget.simulation.run import setup_of

    ask = request_of(SimulateRequest, args)
    if is_fleet(ask) and not args.sweep:
        from kvbudget.cli import fleet

        return fleet.run(ask, args)
    calibration_existed = _calibration_exists(args)
    if args.sweep or args.find_max_rate:
        if args.sweep:
            from kvbudget.commands.fleet import check_sweep, sweeps_fleets
            from kvbudget.simulation.parallel import check_backend

            check_backend(args.backend)
            if sweeps_fleets(ask, parse_sweep(args.sweep)):
                check_sweep(ask, parse_sweep(args.sweep))
        workload, found, scale = prepared(ask)
        _saved(args, calibration_existed)
        if args.sweep:
            return _sweep(ask, found, parse_sweep(args.sweep))
        if not args.slo:
            raise KVBudgetError("--find-max-rate needs --slo, e.g. ttft_p99=2s,tpot_p99=100ms")
        slo = parse_slo(args.slo)
        search = find_max_rate(found.model, workload, slo, start=scale, setup=setup_of(found),
                               fast=not args.reference, **front_settings(ask))
        cost = costed(ask, search.best, found) if search.best else None
        if args.json:
            print(json.dumps({"rate_scale": search.rate_scale, "slo": slo, "tried": search.tried,
                              "best": search.best.to_dict() if search.best else None,
                              **({"cost": cost.to_dict()} if cost else {})}, indent=2))
        else:
            _print_search(search, slo, cost)
        if search.best is None:  # nothing meets the objectives: a failure, for scripts and CI
            print(f"kvbudget: no rate meets --slo; even at {min(s for s, _ in search.tried):.4g}x the binding "
                  f"target: {'; '.join(search.binding)}", file=sys.stderr)
            return 1
        return 0
    files = RunFiles(args.timeline, args.per_request)
    progress = _progress() if not args.json and sys.stderr.isatty() else None
    ready = prepared(ask)
    sim = run_prepared(ask, ready, progress=progress, **files.hooks())
    if progress is not None:
        print(file=sys.stderr)
    files.write(args.force)
    if args.prometheus_series:
        _write_series(ask, sim)
    if args.plot:
        from kvbudget.plot import plot_simulation

        wrote(args.plot, "--plot", plot_simulation(sim, args.plot, _credit(args), args.force))
    cost = costed(ask, sim, ready[1])
    _saved(args, calibration_existed)
    if args.json:
        print(json.dumps({**sim.to_dict(), **({"cost": cost.to_dict()} if cost else {})}, indent=2))
    else:
        _print(sim, args)
        if cost is not None:
            console().print(_cost_line(cost, sim.setup.time_model.basis))
    return 0


def _write_series(ask: SimulateRequest, sim: Simulation) -> None:
    from kvbudget.guard.alerts import promtool_test, thresholds_of

    assert ask.prometheus_series is not None
    thresholds = thresholds_of(front_settings(ask)["guard_config"]) if ask.guard_config else {}
    text, fired = promtool_test(sim.setup.engine, [(s.time, s.usage, s.running, s.waiting) for s in sim.timeline],
                                sim.duration_s, positive(ask.prometheus_interval, "prometheus_interval"), thresholds)
    from kvbudget.files import write_file

    wrote(ask.prometheus_series, "--prometheus-series",
          write_file(ask.prometheus_series, text, "prometheus_series", ask.force))
    when = "; ".join(f"{f.alert} {_clock(f.start_s)}-{_clock(f.end_s) if f.end_s is not None else 'end'}"
                     for f in fired) or "no alert fires"
    print(f"kvbudget: alerts of `kvbudget alerts` in this run: {when}", file=sys.stderr)


def _clock(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m{s:02d}s"


def _sig(value: float) -> str:
    """Three significant figures, in ms under a second."""
    return f"{value * 1000:.3g}ms" if value < 1 else f"{value:.3g}s"


def band_line(sim: Simulation) -> str:
    """The simulated means with where their true values likely lie (the band of the held-out runs on the same
    basis), or why that is unknown."""
    from kvbudget.simulation.bands import band_for, judged

    figures = [(label, pct.mean, band_for(sim.setup, kind)) for kind, label, pct in
               (("ttft", "TTFT", sim.ttft), ("tpot", "TPOT", sim.tpot), ("e2e", "E2E", sim.e2e)) if pct is not None]
    known = [(label, mean, band) for label, mean, band in figures if band is not None]
    if not known:
        why = (f"these times: {sim.setup.time_model.basis}" if judged(sim.setup)
               else f"{sim.setup.engine} ({sim.setup.allocator}): they are all of vLLM's paged allocator")
        return f"true means: error band unknown (no held-out runs judge {why})"
    b = known[0][2]
    ranges = ", ".join(f"{label} {_sig(low)}-{_sig(high)}" for label, mean, band in known
                       for low, high in [band.around(mean)])
    held = f"where all {b.runs} held-out runs of {len(b.gpus)} GPUs lay" + (
        ", too few of its own: the wider bases' joined" if b.widened else "")
    short = [(band.held, label) for label, _, band in known
             if band.held is not None and band.held[0] < 0.8 * band.held[1]]
    if short:  # the worst: how far the band carries to a GPU whose runs did not size it
        (inside, runs), label = min(short, key=lambda s: s[0][0] / s[0][1])
        held += f"; sized without their {b.held_by}, {label}'s held only {inside} of {runs}"
    return f"true means likely: {ranges} ({b.basis.value} basis; {held})"


def _print(sim: Simulation, args: argparse.Namespace) -> None:

    s = sim.setup
    out = console()
    budget = f"{format_bytes(s.kv_memory_bytes)} KV, " if s.kv_memory_bytes else ""
    out.print(f"[bold]{s.model}[/bold] on {s.engine} ({s.allocator}), {s.gpu or 'no GPU named'}: {budget}"
              f"{s.describe()}")
    sent = f" from {sim.clients:,} clients in a closed loop" if sim.clients is not None else ""
    out.print(f"{sim.requests:,} requests{sent} ({sim.completed:,} completed) in {sim.duration_s:,.1f} s simulated, "
              f"{sim.steps:,} steps: {sim.requests_per_s:,.2f} requests/s, {sim.output_tokens_per_s:,.0f} output "
              "tokens/s")
    out.print(latency_table(f"latency (times: {s.time_model.basis})", sim))
    out.print(band_line(sim))
    mem = sim.memory
    hit = f"{sim.prefix_hit_rate:.1%}" if sim.prefix_hit_rate is not None else "-"
    rest = s.free_label
    out.print(f"KV cache: peak usage {sim.peak_usage:.1%}, time-averaged {sim.mean_usage:.1%}; slots: token states "
              f"{mem.token_states:.1%}, reserved ahead {mem.reservation:.1%}, internal fragmentation "
              f"{mem.internal:.1%}, {rest} {mem.other:.1%}")
    out.print(f"queues: peak running {sim.peak_running:,}, peak waiting {sim.peak_waiting:,}; preemptions "
              f"{sim.preemptions:,} ({sim.preempted_requests:,} requests, {sim.recomputed_tokens:,} tokens "
              f"recomputed); prefix-cache hits {hit} of prompt tokens")
    if sim.offload is not None and s.host_tier is not None:
        o, tier = sim.offload.to_dict(), s.host_tier
        share = o["hit_tokens"] / sim.prompt_tokens if sim.prompt_tokens else 0.0
        disk = (f" ({o['disk_hit_tokens'] / sim.prompt_tokens:.1%} from disk, {s.disk_tier.tokens:,} tokens)"
                if s.disk_tier is not None and sim.prompt_tokens else "")
        out.print(f"offload tier ({tier.backend}, {tier.setting}, {tier.tokens:,} tokens): hits {share:.1%} of prompt "
                  f"tokens beyond the GPU's{disk}; loaded {format_bytes(o['loaded_bytes'])}, stored "
                  f"{format_bytes(o['stored_bytes'])}; load times over the GPU's host link: an estimate")
    for line in speculation_lines(sim):
        out.print(line)
    if sim.failed:
        out.print(f"[red]failed: {sim.failed:,} requests got an error from the engine[/red] (its KV memory ran "
                  "out: llama.cpp's unified pool fails every busy request when one token no longer fits)")
    if sim.guard is not None and sim.guard.policy != "kvbudget":
        g = sim.guard
        out.print(f"admission ({g.policy}): forwarded {sum(g.forwarded.values()):,}, rejected {g.rejected:,}"
                  f"{f' ({g.status})' if g.rejected else ''}")
    elif sim.guard is not None:
        g = sim.guard
        out.print(f"guard: forwarded {sum(g.forwarded.values()):,} (untouched {g.forwarded[0]:,}, at the cap level "
                  f"{g.forwarded[1]:,}, forced to one sample {g.forwarded[2]:,}), rejected {g.rejected:,} with 503; "
                  f"caps shortened {g.capped:,} requests by {g.tokens_cut:,} output tokens; its predicted usage "
                  f"peaked at {g.peak_predicted:.0%}")
    for note in sim.notes:
        out.print(f"note: {note}")
    if args.request_log and args.approximate:
        out.print("note: prompt lengths are approximate (characters / 4), not counted with the tokenizer")
    if _credit(args):
        out.print(f"trace: {_credit(args)}")


def speculation_lines(sim: Simulation) -> list[str]:
    """What speculative decoding asked and did, in words (none without it)."""
    d, totals = sim.setup.drafting, sim.speculation
    if d is None or totals is None:
        return []
    spec = d.spec
    length = totals.mean_acceptance_length
    rate = totals.acceptance_rate
    tpot, plain = sim.tpot, sim.tpot_without
    lines = [f"speculative decoding ({spec.method}, {spec.num_tokens} draft tokens a step): mean acceptance length "
             f"{'-' if length is None else f'{length:.2f}'}; {totals.drafted:,} drafts verified, {totals.accepted:,} "
             f"accepted ({'-' if rate is None else f'{rate:.1%}'}); TPOT mean {_ms(tpot.mean if tpot else None)}, "
             f"p99 {_ms(tpot.p99 if tpot else None)}" +
             (f"; without it: mean {_ms(plain.mean)}, p99 {_ms(plain.p99)}" if plain is not None else ""),
             f"acceptance per position: {', '.join(f'{p:.3g}' for p in spec.rates())} ({spec.acceptance_source}); "
             f"{spec.draw_source}",
             f"drafter's time: {d.basis}"]
    return lines


def _print_search(found: RateSearch, slo: dict[str, float], cost: Cost | None = None) -> None:
    out = console()
    objectives = ", ".join(f"{k} ≤ {_ms(v)}" for k, v in slo.items())
    if found.best is None:
        out.print(f"no rate scale down to {min(s for s, _ in found.tried):.4g}x meets {objectives}")
        return
    b = found.best
    out.print(f"highest rate scale meeting {objectives}: [bold]{found.rate_scale:.3g}x[/bold] "
              f"({b.requests_per_s:,.2f} requests/s served; TTFT p99 {_ms(b.ttft.p99 if b.ttft else None)}, "
              f"TPOT p99 {_ms(b.tpot.p99 if b.tpot else None)}) after {len(found.tried)} simulations")
    if cost is not None:
        out.print(_cost_line(cost, b.setup.time_model.basis))
    for note in b.notes:
        out.print(f"note: {note}")


def sweep_point(ask: SimulateRequest, found: SimulationAsk, combo: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One configuration of a sweep, (its settings, its simulation without the timeline); a module-level function
    of plain data, so that a process pool or a Ray worker can run it (the workload is rebuilt there)."""
    from kvbudget.simulation.run import setup_of, simulate
    from kvbudget.simulation.search import ask_with

    combo = dict(combo)
    run_scale = combo.pop("rate_scale", positive(ask.rate_scale, "rate_scale"))
    setup = setup_of(ask_with(found, combo))
    sim = simulate(found.model, workload(ask)(run_scale), setup=setup, fast=not ask.reference, **front_settings(ask))
    return {**combo, "rate_scale": run_scale}, replace(sim, timeline=())


def _task_progress(done: int, total: int) -> None:
    task_progress(done, total)


def task_progress(done: int, total: int, what: str = "sweep", of: str = "configurations") -> None:
    """A bar on stderr: `done` of `total` tasks (a sweep's configurations, a search's candidates)."""
    width = 30
    bar = "#" * (width * done // total)
    print(f"\r{what} [{bar:<{width}}] {done}/{total} {of}", end="", file=sys.stderr, flush=True)


def _acceptance(sim: Any) -> str:
    """A sweep row's mean acceptance length ("-" without speculative decoding)."""
    totals = getattr(sim, "speculation", None)
    length = totals.mean_acceptance_length if totals is not None else None
    return "-" if length is None else f"{length:.2f}"


def _cell(key: str, value: Any) -> str:
    """A swept setting as the sweep's table shows it (a host tier's size in GiB, none as 0)."""
    if key == "offload_memory":
        return format_bytes(value) if value else "0"
    return value.short if isinstance(value, Allocator) else str(value)


def _sweep(args: SimulateRequest, found: SimulationAsk, combos: list[dict[str, Any]]) -> int:
    from rich import box
    from rich.table import Table

    from kvbudget.commands.fleet import NOT_SETUP, fleet_point, sweep_figures, sweep_notes, sweeps_fleets
    from kvbudget.simulation.parallel import run_all
    from kvbudget.simulation.search import ask_with

    swept_scale = any("rate_scale" in c for c in combos)
    for combo in combos:  # settings the ask cannot take fail before any run (a sweep of drafts without a method)
        ask_with(found, {k: v for k, v in combo.items() if k not in NOT_SETUP})
    priced = prices(args)
    if priced is not None:  # every configuration's GPU has a price before any runs
        from kvbudget.simulation.cost import price_for

        for combo in combos:
            price_for(priced, combo.get("gpu", found.gpu))
    calls = [(args, found, combo) for combo in combos]
    shown = not args.json and sys.stderr.isatty()
    fleets = sweeps_fleets(args, combos)
    results = run_all(fleet_point if fleets else sweep_point, calls, args.backend, _task_progress if shown else None)
    if shown:
        print(file=sys.stderr)
    costs = [costed(args, sim, ask_with(found, {k: v for k, v in combo.items() if k not in NOT_SETUP}),
                    combo.get("replicas", 1)) for combo, sim in results]
    if args.json:
        print(json.dumps([{"settings": c, "result": s.to_dict(), **({"cost": cost.to_dict()} if cost else {})}
                          for (c, s), cost in zip(results, costs, strict=True)], indent=2))
        return 0
    keys = [k for k in results[0][0] if k != "rate_scale" or swept_scale]
    notes = sweep_notes(results[0][1]) if fleets else results[0][1].notes
    t = Table(title=f"{found.model.name}: sweep (KV tokens{' per replica' if fleets else ''}, p99 latencies"
              + (", $ per million tokens" if priced else "") + (", times estimated)" if notes else ")"),
              box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), pad_edge=False, collapse_padding=True)
    for k in keys:
        t.add_column({"rate_scale": "rate"}.get(k, k.replace("_", "-")), no_wrap=True)
    drafts = any(getattr(sim, "speculation", None) is not None for _, sim in results)
    for col in ("tokens", "TTFT", "TPOT", "E2E", "req/s", "peak", "preempt") + (("accept",) if drafts else ()) \
            + (("$/1M",) if priced else ()):
        t.add_column(col, justify="right", no_wrap=True)
    for (combo, sim), cost in zip(results, costs, strict=True):
        slots, peak = sweep_figures(sim) if fleets else (sim.setup.token_slots, sim.peak_usage)
        t.add_row(*(_cell(k, combo[k]) for k in keys), f"{slots:,}",
                  _short(sim.ttft.p99 if sim.ttft else None), _short(sim.tpot.p99 if sim.tpot else None),
                  _short(sim.e2e.p99 if sim.e2e else None), f"{sim.requests_per_s:,.2f}", f"{peak:.0%}",
                  f"{sim.preemptions:,}", *((_acceptance(sim),) if drafts else ()),
                  *((_dollars(cost.per_million_tokens),) if cost else ()))
    console().print(t)
    return 0
