"""`kvbudget alerts`: Prometheus alerting rules for the three levels on the engine's own KV gauge, and a
Grafana dashboard, for teams that want the alerts without the proxy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.engines import Engine, get_engine, serving_engines
from kvbudget.engines.base import UsageGauge
from kvbudget.errors import KVBudgetError
from kvbudget.levels import LEVELS

if TYPE_CHECKING:
    from kvbudget.guard.config import GuardConfig

FOR_S = 60  # an alert fires once its level has held this long (its `for:`)


def _gauge(engine: str | Engine) -> tuple[str, UsageGauge]:
    chosen = get_engine(engine)
    if chosen.usage is None:
        names = ", ".join(e.name for e in serving_engines())
        raise KVBudgetError(f"engine {chosen.name!r}: it publishes no KV usage to alert on; choose one of {names}",
                            param="engine")
    return chosen.name, chosen.usage


def thresholds_of(guard_config: GuardConfig) -> dict[str, float]:
    """Each level's threshold by name, as a guard's configuration (e.g. the file `kvbudget plan --guard-config`
    writes, read with `guard.config.read`) sets them."""
    return {level.name: getattr(guard_config.policy, level.key) for level in LEVELS}


def _summary(by: str) -> str:
    return f"KV cache at {{{{ $value | humanizePercentage }}}} on {{{{ $labels.{by} }}}}"


def _description(engine: str, level_threshold: float, meaning: str) -> str:
    return f"{engine} KV usage is at or above {level_threshold:.0%}: {meaning}."


def alert_rules(engine: str | Engine, thresholds: dict[str, float] | None = None) -> str:
    """Prometheus alerting rules, one per level, on the engine's own KV usage; `thresholds` by level name."""
    name, gauge = _gauge(engine)
    expr, for_ = gauge.promql, f"{FOR_S // 60}m"
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
            f"          summary: \"{_summary(gauge.by)}\"",
            f"          description: \"{_description(name, value, level.meaning)}\"",
        ]
    return "\n".join(lines) + "\n"


def dashboard(engine: str | Engine, thresholds: dict[str, float] | None = None) -> str:
    """A Grafana dashboard: the engine's KV usage with the levels as thresholds, and the guard's own signals."""
    name, gauge = _gauge(engine)
    expr = gauge.promql
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


@dataclass(frozen=True)
class Firing:
    """One stretch of time an alert fired in a replayed run: from `start_s`, until `end_s` (None: still at the end)."""

    alert: str
    start_s: float
    end_s: float | None


def _humanize_percentage(value: float) -> str:
    """Prometheus's template function humanizePercentage: Go's %.4g of the value times 100, and a percent sign."""
    return f"{value * 100:.4g}%"


def _values(points: Sequence[float]) -> str:
    """promtool's input_series notation, runs of one value written as `v+0xN` (v, then N more of it)."""
    out: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[i]:
            j += 1
        text = f"{points[i]:g}"
        out.append(text if j == i else f"{text}+0x{j - i}")
        i = j + 1
    return " ".join(out)


def firings(usage: Sequence[float], interval_s: float, threshold: float, alert: str) -> list[Firing]:
    """When an alert on `usage >= threshold` with FOR_S fires, evaluated as Prometheus does at every sample:
    pending from the first sample at or above, firing once it has held FOR_S, gone at the first sample below."""
    out: list[Firing] = []
    active: int | None = None
    fired: float | None = None
    for i, value in enumerate(usage):
        if value >= threshold:
            active = i if active is None else active
            if fired is None and (i - active) * interval_s >= FOR_S:
                fired = i * interval_s
        else:
            if fired is not None:
                out.append(Firing(alert, fired, i * interval_s))
            active = fired = None
    if fired is not None:
        out.append(Firing(alert, fired, None))
    return out


def promtool_test(engine: str | Engine, samples: Sequence[tuple[float, float, int, int]], duration_s: float,
                  interval_s: float = 15.0, thresholds: dict[str, float] | None = None,
                  rules_file: str = "kvbudget-alerts.yaml", instance: str = "simulated") -> tuple[str, list[Firing]]:
    """A `promtool test rules` file replaying a run: the engine's usage and queue gauges as input series sampled
    every `interval_s` (the last `samples` entry (time, usage, running, waiting) at or before each scrape), and,
    as alert tests, when each level's alert of `kvbudget alerts` starts and stops firing. Also those firings."""
    name, gauge = _gauge(engine)
    chosen = get_engine(engine)
    if gauge.series is None or chosen.queue_gauges is None:
        raise KVBudgetError(f"engine {name!r}: its usage gauge is a ratio of two; no series to write",
                            param="engine")
    if not interval_s > 0:
        raise KVBudgetError(f"prometheus interval: {interval_s:g} must be above 0 seconds", param="interval")
    thresholds = thresholds or {}
    ticks = int(duration_s // interval_s) + 1
    ordered = sorted(samples)
    usage, running, waiting = [0.0] * ticks, [0] * ticks, [0] * ticks
    k = -1
    for tick in range(ticks):
        while k + 1 < len(ordered) and ordered[k + 1][0] <= tick * interval_s + 1e-9:
            k += 1
        if k >= 0:
            usage[tick], running[tick], waiting[tick] = round(ordered[k][1], 4), ordered[k][2], ordered[k][3]
    label = f'{{{gauge.by}="{instance}"}}'
    every = f"{interval_s:g}s"
    lines = [f"# promtool test rules: a replayed run through {name}, scraped every {every}; written by kvbudget",
             "# simulate --prometheus-series. The alert tests say when each alert of `kvbudget alerts` fires and",
             "# stops; `promtool test rules` on this file checks them with Prometheus's own rule evaluation.",
             "rule_files:", f"  - {rules_file}", f"evaluation_interval: {every}", "tests:",
             f"  - interval: {every}", "    input_series:"]
    for metric, points in ((gauge.series, usage), (chosen.queue_gauges[0], running),
                           (chosen.queue_gauges[1], waiting)):
        lines += [f"      - series: '{metric}{label}'", f"        values: '{_values(points)}'"]
    found: list[Firing] = []
    tests: list[str] = []

    def none_firing(at_s: float, alert: str) -> list[str]:
        return [f"      - eval_time: {at_s:g}s", f"        alertname: {alert}", "        exp_alerts: []"]

    for level in LEVELS:
        value = thresholds.get(level.name, level.threshold)
        episodes = firings(usage, interval_s, value, level.alert)
        found += episodes
        for episode in episodes:
            at = round(episode.start_s / interval_s)
            tests += [f"      - eval_time: {episode.start_s:g}s", f"        alertname: {level.alert}",
                      "        exp_alerts:", "          - exp_labels:", f"              severity: {level.severity}",
                      f"              {gauge.by}: {instance}", "            exp_annotations:",
                      f"              summary: \"KV cache at {_humanize_percentage(usage[at])} on {instance}\"",
                      f"              description: \"{_description(name, value, level.meaning)}\""]
            if episode.end_s is not None:
                tests += none_firing(episode.end_s, level.alert)
        if not episodes:  # never fired: checked at the end of the run
            tests += none_firing((ticks - 1) * interval_s, level.alert)
    lines += ["    alert_rule_test:", *tests]
    return "\n".join(lines) + "\n", found
