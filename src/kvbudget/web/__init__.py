"""`kvbudget web`: the planner, the comparison and the simulator as one page, served with its JSON API.

Needs the `web` extra (Starlette, uvicorn, and httptools and prometheus_client for the guard's connection limits,
which its server shares): `pip install 'kvbudget[web]'`. The API answers with exactly what the CLI's --json
prints (`kvbudget.web.api` runs the CLI's own parser and functions); the page draws its charts as SVG itself, so
it works offline.
"""

from __future__ import annotations

from typing import Any


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The Starlette app (see `kvbudget.web.app.create_app`)."""
    from kvbudget.web.app import create_app as create

    return create(*args, **kwargs)
