"""`kvbudget alerts`: Prometheus alerting rules for the three levels on the engine's own KV gauge, and a
Grafana dashboard, for teams that want the alerts without the proxy."""

from __future__ import annotations

import json

from kvbudget.engines import Engine, get_engine, serving_engines
from kvbudget.errors import KVBudgetError
from kvbudget.guard.levels import LEVELS


def _usage_expr(engine: str | Engine) -> tuple[str, str]:
    chosen = get_engine(engine)
    if chosen.usage is None:
        names = ", ".join(e.name for e in serving_engines())
        raise KVBudgetError(f"engine {chosen.name!r}: it publishes no KV usage to alert on; choose one of {names}",
                            param="engine")
    return chosen.name, chosen.usage.promql


def alert_rules(engine: str | Engine, thresholds: dict[str, float] | None = None, for_: str = "1m") -> str:
    """Prometheus alerting rules, one per level, on the engine's own KV usage; `thresholds` by level name."""
    name, expr = _usage_expr(engine)
    thresholds = thresholds or {}
    lines = ["# Prometheus alerting rules written by `kvbudget alerts`", "groups:", "  - name: kvbudget-kv-cache",
             "    rules:"]
    for level in LEVELS:
        value = thresholds.get(level.name, level.threshold)
        lines += [
            f"      - alert: {level.alert}",
            f"        expr: {expr} >= {value}",
            f"        for: {for_}",
            "        labels:",
            f"          severity: {level.severity}",
            "        annotations:",
            "          summary: \"KV cache at {{ $value | humanizePercentage }} on {{ $labels.instance }}\"",
            f"          description: \"{name} KV usage is at or above {value:.0%}: {level.meaning}.\"",
        ]
    return "\n".join(lines) + "\n"


def dashboard(engine: str | Engine, thresholds: dict[str, float] | None = None) -> str:
    """A Grafana dashboard: the engine's KV usage with the levels as thresholds, and the guard's own signals."""
    name, expr = _usage_expr(engine)
    thresholds = thresholds or {}
    steps: list[dict[str, object]] = [{"color": "green", "value": None}]
    steps += [
        {"color": color, "value": thresholds.get(level.name, level.threshold)}
        for level, color in zip(LEVELS, ("yellow", "orange", "red"), strict=True)]
    panels = [
        {"id": 1, "type": "timeseries", "title": f"{name} KV cache usage",
         "gridPos": {"h": 9, "w": 16, "x": 0, "y": 0},
         "targets": [{"expr": expr, "refId": "A"}],
         "fieldConfig": {"defaults": {"unit": "percentunit", "min": 0, "max": 1,
                                      "thresholds": {"mode": "absolute", "steps": steps}}}},
        {"id": 2, "type": "timeseries", "title": "guard: observed vs predicted usage",
         "gridPos": {"h": 9, "w": 16, "x": 0, "y": 9},
         "targets": [{"expr": "kvbudget_guard_observed_usage", "refId": "A", "legendFormat": "observed {{replica}}"},
                     {"expr": "kvbudget_guard_predicted_usage", "refId": "B",
                      "legendFormat": "predicted {{replica}}"}],
         "fieldConfig": {"defaults": {"unit": "percentunit", "min": 0, "max": 1}}},
        {"id": 3, "type": "timeseries", "title": "guard decisions by level",
         "gridPos": {"h": 9, "w": 8, "x": 16, "y": 0},
         "targets": [{"expr": "sum by (level, action) (rate(kvbudget_guard_decisions_total[1m]))", "refId": "A"}]},
    ]
    return json.dumps({"title": f"kvbudget: {name} KV cache", "uid": f"kvbudget-{name}", "schemaVersion": 39,
                       "time": {"from": "now-1h", "to": "now"}, "panels": panels}, indent=2) + "\n"
