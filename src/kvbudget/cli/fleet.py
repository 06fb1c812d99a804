"""`kvbudget simulate --replicas N / --fleet FILE`: a fleet's run, its summary per pool and per replica, its files."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from kvbudget.cli.common import console, wrote
from kvbudget.cli.simulated import (
    RunFiles,
    _calibration_exists,
    _cost_line,
    _credit,
    _ms,
    _progress,
    _saved,
    _short,
    latency_table,
)
from kvbudget.commands.fleet import (
    SHOWN_REPLICAS,
    fleet_cost,
    fleet_dict,
    fleet_gpus,
    fleet_simulation,
    pool_figures,
)
from kvbudget.commands.simulate import SimulateRequest
from kvbudget.simulation.autoscale import DEFAULT_LOAD_BANDWIDTH, DEFAULT_STARTUP_S
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.commands.fleet import FleetAsk
    from kvbudget.simulation.fleet import FleetSimulation


def run(ask: SimulateRequest, args: argparse.Namespace) -> int:
    files = RunFiles(ask.timeline, ask.per_request, fleet=True)
    progress = _progress() if not ask.json and sys.stderr.isatty() else None
    calibration_existed = _calibration_exists(args)
    sim, fleet = fleet_simulation(ask, progress=progress, **files.hooks())
    _saved(args, calibration_existed)
    if progress is not None:
        print(file=sys.stderr)
    files.write(ask.force)
    if ask.plot:
        from kvbudget.plot import plot_fleet

        wrote(ask.plot, "--plot", plot_fleet(sim, ask.plot, _credit(args), ask.force))
    cost = fleet_cost(ask, sim, fleet)
    if ask.json:
        print(json.dumps(fleet_dict(sim, cost), indent=2))
        return 0
    print_fleet(sim, fleet)
    if cost is not None:
        line = _cost_line(cost, _basis(sim))
        if len({price for _, price in fleet_gpus(ask, fleet)}) > 1:  # GPUs of several prices
            line = line.replace("cost: ", "cost: at their mean ", 1)
        if sim.autoscale is not None:  # GPUs that came and went: at their most, and the mean spend
            line = line.replace(" x ", ", up to ", 1).replace(" = ", ": ", 1).replace(
                "/hour;", f"/hour on average ({sim.gpu_hours:,.3f} GPU-hours);", 1)
        console().print(line)
    if _credit(args):
        console().print(f"trace: {_credit(args)}")
    return 0


def _basis(sim: FleetSimulation) -> str:
    """What the fleet's times rest on: one basis, or each pool's (said in the notes)."""
    bases = {p.setup.time_model.basis for p in sim.pools}
    return next(iter(bases)) if len(bases) == 1 else "each pool's, in the notes"


def _pair(a: float | None, b: float | None) -> str:
    return f"{_short(a)}/{_short(b)}"


def _latency(d: dict[str, Any], key: str) -> str:
    pct = d.get(key)
    return _pair(pct["p50"], pct["p99"]) if pct else "-"


def _table(title: str, first: str, rows: list[tuple[str, dict[str, Any]]]) -> Any:
    from rich.table import Table

    t = Table(title=title)
    t.add_column(first, no_wrap=True)
    for col in ("routed", "done", "TTFT p50/p99", "TPOT p50/p99", "E2E p50/p99", "KV peak/mean",
                "preempt", "prefix hits"):
        t.add_column(col, justify="right")
    for name, d in rows:
        hit = d.get("prefix_hit_rate")
        t.add_row(name, f"{d['routed']:,}", f"{d['completed']:,}", _latency(d, "ttft_s"), _latency(d, "tpot_s"),
                  _latency(d, "e2e_s"), f"{d['peak_usage']:.0%}/{d['mean_usage']:.0%}", f"{d['preemptions']:,}",
                  "-" if hit is None else f"{hit:.1%}")
    return t


def print_fleet(sim: FleetSimulation, fleet: FleetAsk) -> None:
    """The fleet's summary: its pools' deployments, the whole run, each pool and (up to SHOWN_REPLICAS) each
    replica."""

    out = console()
    total = sum(p.replicas for p in sim.pools)
    split = ", disaggregated prefill and decode" if sim.kv_transfer is not None else ""
    if sim.pools[0].setup.expert_group is not None:
        out.print(f"[bold]{sim.pools[0].setup.model}[/bold]: an expert-parallel group of {total:,} data-parallel "
                  "ranks stepping together, behind vLLM's own balancer (each rank a replica below)")
    else:
        out.print(f"[bold]{sim.pools[0].setup.model}[/bold]: a fleet of {total:,} replica{'s' if total > 1 else ''} "
                  f"behind the {sim.router} router{split}")
    for p in sim.pools:
        s = p.setup
        budget = f"{format_bytes(s.kv_memory_bytes)} KV, " if s.kv_memory_bytes else ""
        role = "" if p.role.value in ("both", p.name) else f" ({p.role.value})"
        out.print(f"  pool {p.name}{role}: {p.replicas:,} x {s.gpu or 'no GPU named'}{_gpus(fleet, p.name)}, "
                  f"{s.engine} ({s.allocator}): {budget}{s.describe()}")
    out.print(f"{sim.requests:,} requests ({sim.completed:,} completed) in {sim.duration_s:,.1f} s simulated: "
              f"{sim.requests_per_s:,.2f} requests/s, {sim.output_tokens_per_s:,.0f} output tokens/s; preemptions "
              f"{sim.preemptions:,}")
    _scaled(sim)
    _moved(sim)
    out.print(latency_table(f"latency over the fleet (times: {_basis(sim)})", sim))
    figures = pool_figures(sim)
    if len(sim.pools) > 1:
        out.print(_table("per pool", "pool", list(figures.items())))
    replicas = [r.to_dict() for r in sim.replicas[:SHOWN_REPLICAS]]
    title = "per replica" + (f" (the first {SHOWN_REPLICAS} of {len(sim.replicas):,}; --json has every one)"
                             if len(sim.replicas) > SHOWN_REPLICAS else "")
    named = len(sim.pools) > 1
    out.print(_table(title, "replica", [(f"{r['index']} {r['pool']}" if named else str(r["index"]), r)
                                        for r in replicas]))
    for note in dict.fromkeys(n for r in sim.replicas for n in r.simulation.notes):
        out.print(f"note: {note}")


def _moved(sim: FleetSimulation) -> None:
    """What crossed the link between the prefill and decode pools, a line."""
    k = sim.kv_transfer
    if k is None:
        return
    console().print(
        f"KV moved over {k.link.name} ({k.link.bandwidth / 1e9:,.1f} GB/s a GPU, {k.link.latency * 1e6:,.1f} us "
        f"each): {k.count:,} reads, {format_bytes(k.bytes)} ({format_bytes(k.bytes_per_gpu)} a GPU), "
        f"{_ms(k.mean_seconds)} each on average; waited at the decode side before the read "
        f"{_ms(k.wait_s / k.count if k.count else 0.0)} on average, {_ms(k.max_wait_s)} at most (the step in "
        "progress, then room for the prompt); times are estimates from the link's figures (vLLM's NIXL connector, "
        "engines/vllm/disagg.py)")


def _scaled(sim: FleetSimulation) -> None:
    """What the autoscaler and the front door did, a line each."""
    out = console()
    if sim.autoscale is not None:
        a = sim.autoscale
        counts = [s + n for _, s, n in a.timeline]
        p = a.policy
        cold = ", ".join(f"{v:,.1f} s" for v in a.cold_start_s.values()) + (
            f": the weights at {p.load_bandwidth / 1e9:,.2f} GB/s"
            f"{' (assumed: a 25 Gbit/s link; --load-bandwidth)' if p.load_bandwidth == DEFAULT_LOAD_BANDWIDTH else ''}"
            f" + {p.startup:g} s start-up{' (an estimate; startup=)' if p.startup == DEFAULT_STARTUP_S else ''}")
        out.print(f"autoscale {a.policy.signal} (pool {a.policy.pool}, every {a.policy.interval:g} s): "
                  f"{min(counts):,} to {max(counts):,} replicas, {a.started:,} added (cold start {cold}), "
                  f"{a.removed:,} drained; {sim.gpu_hours:,.3f} GPU-hours")
    if sim.front is not None:
        f = sim.front
        refused = ", ".join(f"{n:,} {reason} ({f.status(reason)})" for reason, n in f.refused.items()) or "none"
        held = (f"; {f.held:,} held at the gateway, waiting {_pair(f.wait.p50, f.wait.p99)} p50/p99"
                if f.held and f.wait else "")
        out.print(f"front door{f' ({f.admission})' if f.admission else ''}: refused {refused}{held}")


def _gpus(fleet: FleetAsk, pool: str) -> str:
    """How many GPUs a replica of the pool has, where it has several."""
    found = next(p.found for p in fleet.pools if p.name == pool)
    return f" ({found.tp * found.pp} GPUs each)" if found.tp * found.pp > 1 else ""
