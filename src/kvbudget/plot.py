"""`kvbudget plan --plot FILE`: GPU memory as a stacked bar, and KV bytes against context with the budget
line, so the point where it runs out is visible. matplotlib is an optional extra (kvbudget[plot])."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from kvbudget.budget import TermKey
from kvbudget.errors import KVBudgetError
from kvbudget.files import check_target, write_file
from kvbudget.planner import Plan
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.quality.report import Report
    from kvbudget.simulation import Simulation
    from kvbudget.simulation.fleet import FleetSimulation


def plot_target(path: str, force: bool = False) -> str:
    """Refuse, before the work a picture shows, a path that cannot take one: not .png or .svg, no matplotlib, or a
    file that cannot be written (kvbudget.files.check_target)."""
    import importlib.util

    if os.path.splitext(path)[1].lower() not in (".png", ".svg"):
        raise KVBudgetError(f"plot {path}: write a .png or .svg file", param="plot")
    if importlib.util.find_spec("matplotlib") is None:
        raise KVBudgetError("plot: drawing needs matplotlib: pip install 'kvbudget[plot]'", param="plot")
    return check_target(path, "plot", force)


def _pyplot(path: str, force: bool) -> Any:
    """matplotlib's pyplot, once the path is known to take the picture."""
    plot_target(path, force)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str, force: bool) -> bool:
    """Write the figure whole or not at all (kvbudget.files); True when it replaced a file."""
    try:
        return write_file(path, lambda fh: fig.savefig(fh, format=os.path.splitext(path)[1][1:].lower()), "plot",
                          force)
    finally:
        plt.close(fig)


def plot_plan(p: Plan, path: str, force: bool = False) -> bool:
    """Write the plan's picture to `path` (.png or .svg), whole or not at all: one GPU's memory as a labelled stack,
    and how many requests fit at once against their length, for the plan's KV dtype and the cheaper one the engine
    offers (the engine's own capacity at each length, on this KV budget). An existing file is replaced only with
    `force`; True when one was."""
    plt = _pyplot(path, force)
    fig, (bar, curve) = plt.subplots(1, 2, figsize=(11, 4.8), gridspec_kw={"width_ratios": [1, 2.6]})
    total = p.term_bytes(TermKey.GPU)
    keys = {t.key for t in p.stack}
    slices = [(str(key), p.term_bytes(key)) for key in (TermKey.WEIGHTS, TermKey.ACTIVATION, TermKey.OVERHEAD)
              if key in keys]
    slices.append(("KV budget", max(p.kv_memory_bytes, 0)))
    rest = "not given to the engine" if TermKey.WEIGHTS in keys else "the rest (KV budget given)"
    slices.append((rest, max(total - sum(v for _, v in slices), 0)))
    colours = {"weights": "tab:blue", "activation": "tab:orange", "overhead": "tab:green", "KV budget": "tab:red"}
    bottom = 0.0
    for name, value in slices:
        height = value / GIB
        bar.bar([0], [height], bottom=[bottom], width=0.6, color=colours.get(name, "tab:gray"),
                edgecolor="white")
        if height >= 0.08 * total / GIB:  # label the slice in it; thin slices are named under the bar
            bar.text(0, bottom + height / 2, f"{name}\n{height:.1f} GiB", ha="center", va="center", fontsize=9,
                     color="white")
        bottom += height
    small = [f"{name} {value / GIB:.2f} GiB" for name, value in slices if 0 < value < 0.08 * total]
    bar.set_xticks([0], [f"{p.gpu}\n" + "\n".join(small)], fontsize=8)
    bar.set_ylabel("GiB (one GPU)")
    bar.set_title(f"GPU memory ({total / GIB:.1f} GiB)")

    top = p.capacity.max_model_len
    lengths = sorted({max(256, int(top * 2 ** (-k / 4))) for k in range(0, 41)})
    dtypes = [p.estimate.allocation.kv_dtype.name]
    cheaper = p.engine.cheaper_kv_dtype(p.estimate.allocation.kv_dtype)
    for dtype in dtypes + ([cheaper] if cheaper else []):
        try:
            counts = [p.engine.capacity(p.estimate.model, p.kv_memory_bytes, n, kv_dtype=dtype, tp=p.tp,
                                        options=p.options).max_concurrency for n in lengths]
        except KVBudgetError:
            continue
        curve.plot(lengths, counts, marker=".", label=f"{dtype} KV cache")
    curve.axvline(top, color="gray", linestyle=":", label=f"max-model-len {top:,}")
    curve.axhline(1, color="red", linestyle="--", label="one request (below: it does not fit)")
    curve.set_xscale("log", base=2)
    curve.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    curve.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1024:g}k" if x >= 1024 else f"{x:g}"))
    curve.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    curve.set_xlabel("request length (tokens), log scale")
    curve.set_ylabel("requests at once (log scale)")
    curve.set_title(f"{p.model.name} on {p.engine.name}: requests that fit a {p.kv_memory_bytes / GIB:.1f} GiB "
                    "KV budget", fontsize=10)
    curve.grid(True, which="major", alpha=0.3)
    curve.legend(fontsize=9)
    fig.tight_layout()
    return _save(plt, fig, path, force)


def times_are(basis: str) -> str:
    """What a simulation's times are, for a picture: calibrated on measurements, or estimates (the roofline, or
    kernels measured on other runs)."""
    return "calibrated" if "calibrated" in basis else "estimates"


def plot_simulation(sim: Simulation, path: str, caption: str = "", force: bool = False) -> bool:
    """A simulation's picture: KV usage over time, running and waiting requests, latency distributions;
    `caption` (a trace's credit) goes under it. Written as plot_plan writes its picture."""
    from kvbudget.simulation.bands import band_for

    plt = _pyplot(path, force)
    s = sim.setup
    fig, (usage, queues, cdf) = plt.subplots(1, 3, figsize=(15, 4.5))
    times = [x.time for x in sim.timeline]
    usage.plot(times, [100 * x.usage for x in sim.timeline], color="tab:red", linewidth=0.8)
    usage.set_ylim(0, 105)
    usage.set_xlabel("simulated time (s)")
    usage.set_ylabel("KV cache usage (%)")
    usage.set_title(f"KV usage: peak {sim.peak_usage:.0%}, mean {sim.mean_usage:.0%}")
    queues.plot(times, [x.running for x in sim.timeline], label="running", linewidth=0.8)
    queues.plot(times, [x.waiting for x in sim.timeline], label="waiting", linewidth=0.8)
    queues.set_xlabel("simulated time (s)")
    queues.set_ylabel("requests")
    title = f"queues: {sim.preemptions:,} preemption{'' if sim.preemptions == 1 else 's'}"
    if sim.guard is not None:
        title += f"; the guard rejected {sim.guard.rejected:,}, capped {sim.guard.capped:,}"
    queues.set_title(title)
    queues.legend(fontsize=8)
    banded = False  # a band drawn
    for kind, name, values, pct in (("ttft", "time to first token", sim.ttft_sorted, sim.ttft),
                                    ("e2e", "end to end", sim.e2e_sorted, sim.e2e)):
        if values:
            n = len(values)
            (line,) = cdf.plot(values, [(i + 1) / n for i in range(n)], label=name)
            band = band_for(s, kind)
            if band is not None and pct is not None:  # the simulated mean, and where the true mean likely lies
                low, high = band.around(pct.mean)
                cdf.axvspan(low, high, color=line.get_color(), alpha=0.15,
                            label=f"its true mean likely {low:.3g}-{high:.3g} s ({band.basis.value})")
                cdf.axvline(pct.mean, color=line.get_color(), linestyle="--", linewidth=0.8)
                banded = True
    cdf.set_xscale("log")
    note = "" if banded else "; error band unknown"
    cdf.set_xlabel(f"seconds (log scale; times are {times_are(s.time_model.basis)}{note})")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("latency distribution" + ("; dashed: simulated means" if banded else ""))
    cdf.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{s.model} on {s.engine} ({s.allocator}), {s.gpu or 'no GPU named'}: {s.describe(short=True)}; "
                 f"{sim.requests:,} requests", fontsize=10)
    if "estimate" in s.scheduling:  # a scheduler followed from source only says so on the picture too
        caption = "; ".join(x for x in (s.scheduling, caption) if x)
    if caption:
        fig.text(0.5, 0.01, caption, ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 1))
    return _save(plt, fig, path, force)


EACH_REPLICA = 16  # a fleet's picture draws a line per replica up to this many; more: each pool's mean and range


def _pool_lines(ax: Any, sim: FleetSimulation, value: Any, scale: float = 1.0) -> None:
    """One line per replica (a pool's replicas in its colour), or past EACH_REPLICA each pool's mean over its
    replicas per second of simulated time with the lowest to highest shaded."""
    styles = ("-", "--", ":", "-.")
    for i, pool in enumerate(sim.pools):
        colour = f"C{i % 10}"
        mine = [r for r in sim.replicas if r.pool == pool.name]
        if len(sim.replicas) <= EACH_REPLICA:  # a colour per replica, a line style per pool
            for r in mine:
                line = r.simulation.timeline
                ax.plot([x.time for x in line], [scale * value(x) for x in line], color=f"C{r.index % 10}",
                        linestyle=styles[i % len(styles)], linewidth=0.8, alpha=0.85,
                        label=f"{r.index} ({pool.name})" if len(sim.pools) > 1 else f"replica {r.index}")
            continue
        bins: dict[int, list[float]] = {}
        for r in mine:
            for x in r.simulation.timeline:
                bins.setdefault(int(x.time), []).append(scale * value(x))
        t = sorted(bins)
        ax.plot(t, [sum(bins[k]) / len(bins[k]) for k in t], color=colour, linewidth=0.9,
                label=f"{pool.name}: mean of {len(mine):,}")
        ax.fill_between(t, [min(bins[k]) for k in t], [max(bins[k]) for k in t], color=colour, alpha=0.2,
                        label=f"{pool.name}: lowest to highest")


def plot_fleet(sim: FleetSimulation, path: str, caption: str = "", force: bool = False) -> bool:
    """A fleet's picture: each replica's KV usage and waiting requests over time (each pool's mean and range where
    there are many), and the replicas each pool has over time."""
    plt = _pyplot(path, force)
    fig, (usage, queues, count) = plt.subplots(1, 3, figsize=(15, 4.5))
    _pool_lines(usage, sim, lambda x: x.usage, 100.0)
    usage.set_ylim(0, 105)
    usage.set_ylabel("KV cache usage (%)")
    peak = max((r.simulation.peak_usage for r in sim.replicas), default=0.0)
    usage.set_title(f"KV usage per replica: highest peak {peak:.0%}")
    _pool_lines(queues, sim, lambda x: x.waiting)
    queues.set_ylim(0, max(1.0, queues.get_ylim()[1]))
    queues.set_ylabel("requests waiting")
    queues.set_title(f"queue per replica: {sim.preemptions:,} preemption{'' if sim.preemptions == 1 else 's'}")
    end = max(sim.duration_s, 1e-9)
    # each pool's replicas serving over time (an autoscaler's come and go), those still starting above them
    grid = sorted({0.0, end} | {t for r in sim.replicas for t in (r.started_s, r.ready_s, r.drained_s)
                                if t is not None and t <= end})
    bottom = [0] * len(grid)
    for i, pool in enumerate(sim.pools):
        mine = [r for r in sim.replicas if r.pool == pool.name]
        serving = [sum(1 for r in mine if r.ready_s <= t and (r.drained_s is None or t < r.drained_s)) for t in grid]
        top = [b + n for b, n in zip(bottom, serving, strict=True)]
        most = max(serving)
        count.fill_between(grid, bottom, top, color=f"C{i % 10}", alpha=0.5, step="post",
                           label=f"{pool.name}: {pool.replicas:,}" + (f" to {most:,}" if most != pool.replicas else ""))
        bottom = top
    starting = [sum(1 for r in sim.replicas if r.started_s <= t < r.ready_s and (r.drained_s is None or
                                                                              t < r.drained_s)) for t in grid]
    if any(starting):
        count.fill_between(grid, bottom, [b + n for b, n in zip(bottom, starting, strict=True)], color="gray",
                           alpha=0.25, step="post", hatch="//", label="starting")
    count.set_ylim(0, max(b + n for b, n in zip(bottom, starting, strict=True)) * 1.15 + 0.5)
    count.set_ylabel("replicas")
    count.set_title(f"replicas over time ({sim.router} router)")
    from matplotlib.ticker import MaxNLocator

    for ax in (queues, count):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (usage, queues, count):
        ax.set_xlabel("simulated time (s)")
        ax.set_xlim(0, end)
        if len(ax.get_legend_handles_labels()[0]) <= 2 * EACH_REPLICA:
            ax.legend(fontsize=7, loc="upper right", ncol=2 if len(ax.get_legend_handles_labels()[0]) > 8 else 1)
    setup = sim.pools[0].setup
    first = sum(p.replicas for p in sim.pools)
    shape = (f"an expert-parallel group of {first:,} data-parallel ranks (each a replica here)"
             if setup.expert_group is not None else f"a fleet of {first:,} replica{'' if first == 1 else 's'}")
    fig.suptitle(f"{setup.model}: {shape}"
                 f"{' (autoscaled)' if sim.autoscale else ''}, {sim.requests:,} requests; times are "
                 f"{times_are(setup.time_model.basis)}", fontsize=10)
    if caption:
        fig.text(0.5, 0.01, caption, ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 1))
    return _save(plt, fig, path, force)


def plot_quality(report: Report, path: str, force: bool = False) -> bool:
    """`kvbudget quality --plot FILE`: each format's KL and top-1 change against its memory (bits per value,
    or the engine's bytes per token), KL by position in the window, and per-layer KL when measured. Written as
    plot_plan writes its picture."""
    from kvbudget.quality.formats import bits_per_value

    plt = _pyplot(path, force)
    panels = 3 if report.layers is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))
    ax = axes[0]
    positive = [r.kl_mean.value for r in report.results if r.kl_mean.value > 0]
    floor = min(positive) / 10 if positive else 1e-6  # where a KL of exactly 0 is drawn
    for i, r in enumerate(report.results):
        x, y = bits_per_value(r.variant), max(r.kl_mean.value, floor)
        low, high = max(r.kl_mean.low, floor), max(r.kl_mean.high, floor)
        ax.errorbar([x], [y], yerr=[[y - low], [high - y]], fmt="o", capsize=3, color=f"C{i}")
        kl = f"KL {r.kl_mean.value:.2g}" if r.kl_mean.value else "KL 0"
        ax.annotate(f"{r.variant}: {kl}, top-1 changed {1 - r.top1.value:.1%}", (x, y), textcoords="offset points",
                    xytext=(6, -3), fontsize=7.5)
    ax.set_yscale("log")
    ax.set_xlabel("bits per stored value (K and V mean, block scales included)")
    ax.set_xlim(0, 36)
    ax.set_ylabel("mean KL against the untouched cache (nats)")
    ax.set_title("cost against memory (95% intervals over windows)", fontsize=10)
    ax.set_xticks([4, 8, 16, 32])
    ax.grid(alpha=0.3)
    ax = axes[1]
    for i, r in enumerate(report.results):
        values = list(r.kl_by_position)
        if not values:
            continue
        width = max(1, len(values) // 32)
        means = [sum(values[i:i + width]) / len(values[i:i + width]) for i in range(0, len(values), width)]
        ax.plot([report.first + j + width / 2 for j in range(0, len(values), width)], means, label=r.variant,
                color=f"C{i}")
    ax.set_yscale("log")
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("mean KL (nats)")
    ax.set_title(f"KL by position, mean over {report.results[0].windows} windows", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if report.layers is not None:
        ax = axes[2]
        ax.bar(range(len(report.layers)), report.layers, color="tab:red")
        ax.set_xlabel("attention layer")
        ax.set_ylabel("mean KL (nats)")
        ax.set_title(f"{report.layers_variant} in one layer at a time", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{report.model}: what each KV cache format costs ({report.context:,}-token windows)",
                 fontsize=11)
    fig.tight_layout()
    return _save(plt, fig, path, force)
