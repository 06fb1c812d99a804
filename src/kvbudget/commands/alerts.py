"""`alerts`: Prometheus alert rules and a Grafana dashboard for the guard's three levels."""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.commands.guard import _engines
from kvbudget.commands.options import option


@dataclass(frozen=True, kw_only=True)
class AlertsRequest:
    """What `alerts` is asked, as given."""

    engine: str = option(_engines("default vllm"), "vllm")
    guard_config: str | None = option("take the thresholds from this guard YAML")
    out: str = option("folder for kvbudget-alerts.yaml and kvbudget-dashboard.json", ".")


@dataclass(frozen=True)
class Alerts:
    """The rules file's text and the dashboard's."""

    rules: str
    dashboard: str


def answer(ask: AlertsRequest) -> Alerts:
    """The rules and dashboard for the engine, with the thresholds of the guard's configuration when given."""
    from kvbudget.guard.alerts import alert_rules, dashboard, thresholds_of
    from kvbudget.guard.config import read

    thresholds = thresholds_of(read(ask.guard_config, "guard_config")) if ask.guard_config else {}
    return Alerts(alert_rules(ask.engine, thresholds), dashboard(ask.engine, thresholds))
