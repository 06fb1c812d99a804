"""`alerts`: Prometheus alert rules and a Grafana dashboard for the guard's three levels."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.commands.guard import _engines
from kvbudget.commands.options import force_field, option
from kvbudget.errors import KVBudgetError


@dataclass(frozen=True, kw_only=True)
class AlertsRequest:
    """What `alerts` is asked, as given."""

    engine: str = option(_engines("default vllm"), "vllm")
    guard_config: str | None = option("take the thresholds from this guard YAML")
    out: str = option("folder for kvbudget-alerts.yaml and kvbudget-dashboard.json (made if missing)", ".")
    force: bool = force_field()


@dataclass(frozen=True)
class Alerts:
    """The rules file's text and the dashboard's."""

    rules: str
    dashboard: str


FILES = ("kvbudget-alerts.yaml", "kvbudget-dashboard.json")  # the rules, the dashboard


def targets(ask: AlertsRequest) -> tuple[str, str]:
    """The two files `out` gets, its folder made if missing and both checked before any work
    (kvbudget.files.check_target): they are written together or not at all."""
    import os

    from kvbudget.files import cannot_write, check_targets

    if os.path.exists(ask.out) and not os.path.isdir(ask.out):
        raise KVBudgetError(f"out {ask.out}: a file, not a folder; name a folder (it is made if missing)", param="out")
    try:
        os.makedirs(ask.out, exist_ok=True)
    except OSError as exc:
        raise cannot_write(exc, ask.out, "out") from None
    rules, board = (os.path.join(ask.out, name) for name in FILES)
    check_targets(((rules, "out"), (board, "out")), ask.force)
    return rules, board


def answer(ask: AlertsRequest) -> Alerts:
    """The rules and dashboard for the engine, with the thresholds of the guard's configuration when given."""
    from kvbudget.guard.alerts import alert_rules, dashboard, thresholds_of
    from kvbudget.guard.config import read

    thresholds = thresholds_of(read(ask.guard_config, "guard_config")) if ask.guard_config else {}
    return Alerts(alert_rules(ask.engine, thresholds), dashboard(ask.engine, thresholds))
