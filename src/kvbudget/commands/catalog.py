"""`models`, `gpus` and `traces`: the bundled catalogs, each a list of rows (what --json prints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbudget.commands.options import option


@dataclass(frozen=True, kw_only=True)
class CatalogRequest:
    """What `models`, `gpus` or `traces` is asked, as given."""

    json: bool = option("print JSON", False, web=False)


def models() -> list[dict[str, Any]]:
    """Every bundled model config: its name, Hub id, family, layers, dtype, length, cache kinds and source."""
    from kvbudget import catalog
    from kvbudget.model.load import load_model

    rows: list[dict[str, Any]] = []
    for entry in catalog.entries():
        spec = load_model(entry.name)
        rows.append({"name": entry.name, "hf_id": entry.hf_id, "model_type": spec.model_type,
                     "layers": spec.num_layers, "dtype": spec.dtype,
                     "max_position_embeddings": spec.max_position_embeddings,
                     "cache": spec.kinds(), "source": entry.source, "note": entry.note})
    return rows


def gpus() -> list[dict[str, Any]]:
    """Every GPU of the table with what its simulated step times rest on."""
    from kvbudget.gpus import gpus as table
    from kvbudget.simulation.steptimes import step_times_basis

    return [dict(g.__dict__, step_times=step_times_basis(g.name)) for g in table()]


def traces() -> list[dict[str, Any]]:
    """Every bundled request trace, with its credit, licence and file."""
    from kvbudget.traces import bundled

    return [{**t.__dict__, "path": t.path} for t in bundled()]
