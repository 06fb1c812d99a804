"""`kvbudget alerts`: Prometheus alerting rules for the three levels on the engine's own KV gauge, and a
Grafana dashboard, for teams that want the alerts without the proxy."""

from __future__ import annotations

import json

from kvbudget.errors import KVBudgetError

# The engine's own KV usage as a 0-1 expression (llama.cpp has no gauge: the guard's own metric stands in).
USAGE_EXPR = {
    "vllm": "max by (instance) (vllm:kv_cache_usage_perc)",
    "sglang": "max by (instance) (sglang:token_usage)",
    "tgi": "max by (instance) (tgi_batch_current_max_tokens / tgi_batch_max_total_tokens)",
    "llamacpp": "max by (replica) (kvbudget_guard_observed_usage)",
}
LEVELS = (("KVCacheWarn", "warn", 0.70, "warning", "cap max_new_tokens"),
          ("KVCacheSingleSample", "single", 0.85, "warning", "force a single beam / sample"),
          ("KVCacheReject", "reject", 0.95, "critical", "new requests are being rejected with 503"))


def alert_rules(engine: str, thresholds: dict[str, float] | None = None, for_: str = "1m") -> str:
    if engine not in USAGE_EXPR:
        raise KVBudgetError(f"--engine {engine!r}: choose one of {', '.join(USAGE_EXPR)}")
    thresholds = thresholds or {}
    lines = ["# Prometheus alerting rules written by `kvbudget alerts`", "groups:", "  - name: kvbudget-kv-cache",
             "    rules:"]
    for alert, key, default, severity, meaning in LEVELS:
        value = thresholds.get(key, default)
        lines += [
            f"      - alert: {alert}",
            f"        expr: {USAGE_EXPR[engine]} >= {value}",
            f"        for: {for_}",
            "        labels:",
            f"          severity: {severity}",
            "        annotations:",
            f"          summary: \"KV cache at {{{{ $value | humanizePercentage }}}} on {{{{ $labels.instance }}}}\"",
            f"          description: \"{engine} KV usage is at or above {value:.0%}: {meaning}.\"",
        ]
    return "\n".join(lines) + "\n"


def dashboard(engine: str, thresholds: dict[str, float] | None = None) -> str:
    if engine not in USAGE_EXPR:
        raise KVBudgetError(f"--engine {engine!r}: choose one of {', '.join(USAGE_EXPR)}")
    thresholds = thresholds or {}
    steps = [{"color": "green", "value": None}] + [
        {"color": color, "value": thresholds.get(key, default)}
        for (_, key, default, _, _), color in zip(LEVELS, ("yellow", "orange", "red"))]
    panels = [
        {"id": 1, "type": "timeseries", "title": f"{engine} KV cache usage",
         "gridPos": {"h": 9, "w": 16, "x": 0, "y": 0},
         "targets": [{"expr": USAGE_EXPR[engine], "refId": "A"}],
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
    return json.dumps({"title": f"kvbudget: {engine} KV cache", "uid": f"kvbudget-{engine}", "schemaVersion": 39,
                       "time": {"from": "now-1h", "to": "now"}, "panels": panels}, indent=2) + "\n"
