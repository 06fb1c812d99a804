"""The guard's own Prometheus metrics (one registry per guard)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class GuardMetrics:
    def __init__(self) -> None:
        self._held: dict[str, tuple[Any, Any]] = {}
        self._decided: dict[tuple[str, str], Any] = {}
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("kvbudget_guard_decisions_total", "Requests by level and action",
                                 ["level", "action"], registry=r)
        self.observed = Gauge("kvbudget_guard_observed_usage", "Engine-reported KV usage (0-1)", ["replica"],
                              registry=r)
        self.predicted = Gauge("kvbudget_guard_predicted_usage", "Predicted KV usage of requests in flight (0-1)",
                               ["replica"], registry=r)
        self.usage = Gauge("kvbudget_guard_kv_usage", "What the guard acts on: the larger of observed (while fresh) "
                           "and predicted KV usage (0-1); point a router's KV-usage metric here", ["replica"],
                           registry=r)
        self.kv_budget = Gauge("kvbudget_guard_kv_budget_bytes", "The KV budget the guard predicts against, as the "
                               "replica's engine states its pool (absent where a budget was given)", ["replica"],
                               registry=r)
        self.level = Gauge("kvbudget_guard_level", "Current level per replica (0-3)", ["replica"], registry=r)
        self.metrics_age = Gauge("kvbudget_guard_metrics_age_seconds", "Age of the last successful scrape",
                                 ["replica"], registry=r)
        self.scrape_failures = Counter("kvbudget_guard_scrape_failures_total", "Failed metric scrapes", ["replica"],
                                       registry=r)
        self.upstream_errors = Counter("kvbudget_guard_upstream_errors_total", "Upstream failures",
                                       ["replica", "kind"], registry=r)
        self.added_latency = Histogram("kvbudget_guard_added_latency_seconds",
                                       "Time the guard adds before forwarding (from the whole request body "
                                       "read to the upstream request sent)",
                                       buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05), registry=r)
        self.in_flight = Gauge("kvbudget_guard_in_flight", "Requests in flight", ["replica"], registry=r)
        self.connections = Gauge("kvbudget_guard_connections", "Client connections open", registry=r)
        self.client_refused = Counter("kvbudget_guard_client_refused_total", "Requests refused at once because "
                                      "their client is at a per-client limit", ["reason"], registry=r)
        self.connections_refused = Counter("kvbudget_guard_connections_refused_total",
                                           "Client connections closed by a limit (too many, slow or large headers, "
                                           "slow body)", ["reason"], registry=r)

    def held(self, replica: str, predicted: float | None, in_flight: int) -> None:
        """Admission's observer: a replica's predicted usage and requests in flight (twice a request: the labelled
        series are looked up once per replica)."""
        series = self._held.get(replica)
        if series is None:
            series = self._held[replica] = (self.predicted.labels(replica), self.in_flight.labels(replica))
        if predicted is not None:
            series[0].set(predicted)
        series[1].set(in_flight)

    def decided(self, level: str, action: str) -> None:
        """One decision counted (its series looked up once)."""
        counter = self._decided.get((level, action))
        if counter is None:
            counter = self._decided[(level, action)] = self.decisions.labels(level, action)
        counter.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
