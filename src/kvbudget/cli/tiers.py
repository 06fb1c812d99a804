"""The KV tiers beyond the GPU, as `estimate` and `plan` print them."""

from __future__ import annotations

from typing import Any

from kvbudget.offload import HostReport
from kvbudget.units import format_bytes


def seconds(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def render_host(out: Any, report: HostReport) -> None:
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
