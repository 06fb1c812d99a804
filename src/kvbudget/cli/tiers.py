"""The KV tiers beyond the GPU, as `estimate` and `plan` print them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.offload import HostReport
from kvbudget.reuse import TierAdvice
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console


def seconds(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def render_host(out: Console, report: HostReport) -> None:
    """One table of the tiers, one of prefixes by length, then where each figure comes from."""
    from rich.table import Table

    tiers = Table(title="KV beyond the GPU")
    for name in ("tier", "stores by", "holds", "takes"):
        tiers.add_column(name, justify="left" if name == "tier" else "right")
    for t in report.tiers:
        tiers.add_row(f"{t.backend}, {t.medium}", f"{t.unit} of {t.unit_tokens:,} tokens",
                      f"{t.tokens:,} tokens", format_bytes(t.host_bytes) + (" pinned" if t.pinned else ""))
    out.print(tiers)
    if report.lengths:
        prefixes = Table(title="Whole prefixes each tier keeps, and the time to load one back")
        prefixes.add_column("prefix", justify="right")
        for t in report.tiers:
            prefixes.add_column(f"{t.backend}, {t.medium}", justify="right")
        for n in report.lengths:
            cells = []
            for t in report.tiers:
                load = report.load_seconds(t, n)
                cells.append(f"{t.prefixes(n):,}" + ("" if load is None else f" ({seconds(load)})"))
            prefixes.add_row(f"{n:,}", *cells)
        out.print(prefixes)
    for t in report.tiers:
        out.print(f"  {t.backend}, {t.medium} ({t.setting}): {t.movement}; evicts the {t.policy} (from {t.source})")
        for note in t.notes:
            out.print(f"    {note}")
    if report.link is None:
        out.print("  [yellow]load times:[/] give a GPU from the table (kvbudget gpus) with a host link")
    else:
        out.print(f"  load times over {report.link.name}, {report.link.bytes_per_s / 1e9:,.0f} GB/s each way: "
                  f"{report.link.source}; a disk tier's depend on the drive (not estimated)")


def render_advice(out: Console, advice: TierAdvice) -> None:
    """The host-tier sizes tried on a trace, and whether one pays."""
    from rich.table import Table

    table = Table(title=f"Host tier sizes on {advice.trace} ({advice.requests:,} requests): estimates")
    for name in ("host memory", "tier holds", "prompt tokens from cache"):
        table.add_column(name, justify="right")
    table.add_row("none", f"GPU: {advice.gpu_tokens:,} tokens", f"{advice.gpu_share:.1%}")
    for s in advice.sizes:
        given = " (given)" if s.memory == advice.given else ""
        table.add_row(format_bytes(s.memory) + given, f"{s.tokens:,} tokens", f"{s.share:.1%}")
    out.print(table)
    verdict = (f"a tier of {format_bytes(advice.recommended)} pays" if advice.recommended is not None else
               "no host tier pays")
    out.print(f"  {verdict}: {advice.reason}")
    out.print("  shares: an LRU cache of the trace's prefix pieces replayed in order (its error against simulate: "
              f"the accuracy page); times: {advice.basis}")
