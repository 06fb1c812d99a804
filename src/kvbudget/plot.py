"""`kvbudget plan --plot FILE`: GPU memory as a stacked bar, and KV bytes against context with the budget
line, so the point where it runs out is visible. matplotlib is an optional extra (kvbudget[plot])."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

from kvbudget.errors import KVBudgetError
from kvbudget.estimator import estimate
from kvbudget.planner import Plan
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.simulation import Simulation


def _pyplot(path: str) -> Any:
    """matplotlib's pyplot, once the path is known to be writable as .png or .svg."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".png", ".svg"):
        raise KVBudgetError(f"plot {path}: write a .png or .svg file", param="plot")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise KVBudgetError(f"plot: folder {folder} does not exist", param="plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KVBudgetError("plot: drawing needs matplotlib: pip install 'kvbudget[plot]'", param="plot") from None
    return plt


def _save(plt: Any, fig: Any, path: str) -> None:
    """Write the figure whole or not at all: a temporary file beside it, then a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=os.path.splitext(path)[1].lower(), prefix=".kvbudget-")
    os.close(fd)
    try:
        fig.savefig(tmp)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def plot_plan(p: Plan, path: str) -> None:
    """Write the plan's picture to `path` (.png or .svg), whole or not at all."""
    plt = _pyplot(path)
    fig, (bar, curve) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 3]})
    total = p.term_bytes("gpu")
    keys = {t.key for t in p.stack}
    slices = [(name, p.term_bytes(key)) for key, name in (("weights", "weights"), ("activation", "activation"),
                                                          ("overhead", "overhead")) if key in keys]
    slices.append(("KV budget", max(p.kv_memory_bytes, 0)))
    rest = "not given to the engine" if "weights" in keys else "the rest (not broken down: KV budget given)"
    slices.append((rest, max(total - sum(v for _, v in slices), 0)))
    bottom = 0.0
    for name, value in slices:
        bar.bar([p.gpu], [value / GIB], bottom=[bottom], label=f"{name} {value / GIB:.1f} GiB")
        bottom += value / GIB
    bar.set_ylabel("GiB (one GPU)")
    bar.set_title("GPU memory")
    bar.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, -0.45))

    top = p.capacity.max_model_len
    contexts = sorted({max(1, top * i // 40) for i in range(1, 41)})
    sequences = p.estimate.points[0].sequences
    dtypes = [p.estimate.allocation.kv_dtype.name]
    cheaper = p.engine.cheaper_kv_dtype(p.estimate.allocation.kv_dtype)
    for dtype in dtypes + ([cheaper] if cheaper else []):
        try:
            est = estimate(p.model, engine=p.engine, kv_dtype=dtype, batch=[sequences], context=contexts, tp=p.tp,
                           pp=p.pp, options=p.options)
        except KVBudgetError:
            continue
        curve.plot(contexts, [pt.kv_bytes / GIB for pt in est.points],
                   label=f"{est.allocation.kv_dtype.name} KV, {sequences} sequence(s)")
        if dtype == dtypes[0] and any(pt.kv_bytes != pt.uncapped_kv_bytes for pt in est.points):
            curve.plot(contexts, [pt.uncapped_kv_bytes / GIB for pt in est.points], linestyle=":",
                       label="without window caps")
    curve.axhline(p.kv_memory_bytes / GIB, color="red", linestyle="--", label="KV budget")
    curve.set_xlabel("context (tokens per sequence)")
    curve.set_ylabel("KV cache (GiB per GPU)")
    curve.set_title(f"{p.model.name} on {p.engine.name}")
    curve.legend(fontsize=8)
    fig.tight_layout()
    _save(plt, fig, path)


def plot_simulation(sim: Simulation, path: str, caption: str = "") -> None:
    """A simulation's picture: KV usage over time, running and waiting requests, latency distributions;
    `caption` (a trace's credit) goes under it."""
    plt = _pyplot(path)
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
    for name, values in (("time to first token", sim.ttft_sorted), ("end to end", sim.e2e_sorted)):
        if values:
            n = len(values)
            cdf.plot(values, [(i + 1) / n for i in range(n)], label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("seconds (log scale; times are " + ("estimates)" if "estimate" in s.time_model.basis
                                                        else "calibrated)"))
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("latency distribution")
    cdf.legend(fontsize=8)
    memory = (f"{s.num_blocks:,} blocks of {s.block_size}" if s.allocator == "paged" else
              f"{s.token_slots:,} token slots")
    fig.suptitle(f"{s.model} on {s.engine} ({s.allocator}), {s.gpu or 'no GPU named'}: {memory}; "
                 f"{sim.requests:,} requests", fontsize=10)
    if "estimate" in s.scheduling:  # a scheduler followed from source only says so on the picture too
        caption = "; ".join(x for x in (s.scheduling, caption) if x)
    if caption:
        fig.text(0.5, 0.01, caption, ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 1))
    _save(plt, fig, path)
