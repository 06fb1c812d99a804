"""Scrapes each replica's KV usage from the engine's own gauge (`Engine.usage`), the requests waiting in its queue
(`Engine.queue_gauges`) where the policy sheds on them, and the KV pool it states (`ReportsPool`) where the guard
predicts without a given budget; keeps health and staleness."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kvbudget.engines import Engine
from kvbudget.engines.metrics import PoolReport, ReportsPool, parse_prometheus
from kvbudget.errors import KVBudgetError
from kvbudget.guard.log import event, guard_log
from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import Replica
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError


class Poller:
    """Each replica is scraped on its own schedule, every `interval` seconds, each scrape bounded by `timeout` in
    all (not per read): a replica whose metrics hang or trickle goes stale alone, and the others are still read."""

    def __init__(self, engine: Engine, replicas: list[Replica], metrics: GuardMetrics, timeout: float,
                 interval: float, pool_budget: Callable[[PoolReport], int] | None = None,
                 log: logging.Logger | None = None, queue: bool = False):
        self.engine, self.replicas, self.metrics = engine, replicas, metrics
        self.queue = queue and engine.queue_gauges is not None  # read the waiting requests' gauge
        self.timeout, self.interval = timeout, interval
        self.pool_budget = pool_budget if isinstance(engine, ReportsPool) else None
        self.log = log or guard_log()  # pool changes, as events
        self.polled = False  # every replica scraped (or given up on) at least once

    async def poll_once(self, pool: Pool) -> None:
        """One scrape of every replica, side by side."""
        await asyncio.gather(*(self.poll_replica(pool, r) for r in self.replicas))
        self.polled = True

    async def poll_replica(self, pool: Pool, replica: Replica) -> None:
        try:
            await asyncio.wait_for(self._scrape(pool, replica), self.timeout)
        except asyncio.TimeoutError:  # slow or trickling metrics: the usage goes stale
            self.metrics.scrape_failures.labels(replica.url).inc()
        if replica.observed is not None:  # the age of the last complete scrape
            self.metrics.metrics_age.labels(replica.url).set(time.monotonic() - replica.observed_at)
        self.metrics.level.labels(replica.url).set(replica.level)

    async def _scrape(self, pool: Pool, replica: Replica) -> None:
        gauge = self.engine.usage
        try:
            value = None
            if gauge is not None:
                status, body, _ = await pool.get(f"{replica.url}{gauge.path}", self.timeout)
                replica.exposition = body if status == 200 and gauge.path == "/metrics" else b""
                if self.pool_budget is not None:
                    await self._read_pool(pool, replica, body if status == 200 else None, gauge.path)
                if status == 200:
                    value = gauge.read(body.decode("utf-8", "replace"))
                    if value is not None and not 0.0 <= value <= 1.5:  # NaN, infinite, negative: not a usage
                        raise UpstreamError(f"{gauge.path} reads an impossible usage {value}")
                elif gauge.health_path is None:
                    raise UpstreamError(f"{gauge.path} answered {status}")
                else:  # the usage endpoint can be disabled; the server may still be alive
                    health, _, _ = await pool.get(f"{replica.url}{gauge.health_path}", self.timeout)
                    if health != 200:
                        raise UpstreamError(f"{gauge.health_path} answered {health}")
            replica.healthy = True
            if value is not None:
                if self.queue and gauge is not None:
                    replica.waiting = await self._waiting(pool, replica, body if gauge.path == "/metrics" else None)
                replica.observed, replica.observed_at = value, time.monotonic()
                self.metrics.observed.labels(replica.url).set(value)
            else:
                self.metrics.scrape_failures.labels(replica.url).inc()
        except ConnectFailed:  # nobody listening: not healthy
            replica.healthy, replica.exposition = False, b""
            self.metrics.scrape_failures.labels(replica.url).inc()
        except (UpstreamError, ValueError):  # broken metrics: the usage goes stale
            replica.exposition = b""
            self.metrics.scrape_failures.labels(replica.url).inc()

    async def _waiting(self, pool: Pool, replica: Replica, scraped: bytes | None) -> int | None:
        """The requests waiting in the engine's queue (its /metrics; the usage scrape's body where that is it)."""
        assert self.engine.queue_gauges is not None
        if scraped is None:
            status, scraped, _ = await pool.get(f"{replica.url}/metrics", self.timeout)
            if status != 200:
                return None
        value = parse_prometheus(scraped.decode("utf-8", "replace"), self.engine.queue_gauges[1])
        return int(value) if value is not None and 0 <= value < 1e9 else None

    async def _read_pool(self, pool: Pool, replica: Replica, scraped: bytes | None, scraped_path: str) -> None:
        """The pool the replica's engine states (its usage scrape's body where it is the same endpoint); a change
        of budget is logged (a restart with other settings)."""
        assert self.pool_budget is not None and isinstance(self.engine, ReportsPool)
        gauge = self.engine.pool_gauge
        report = None
        for path in gauge.paths:
            body = scraped if path == scraped_path else None
            if body is None:
                status, body, _ = await pool.get(f"{replica.url}{path}", self.timeout)
                if status != 200:
                    continue
            try:
                report = gauge.read(body.decode("utf-8", "replace"))
            except ValueError:  # not JSON, or not the engine's
                report = None
            if report is not None:
                break
        if report is None:
            return
        try:
            budget = self.pool_budget(report)
        except KVBudgetError as exc:  # the engine's rules refuse the pool it states: predict without it
            if replica.pool != str(exc):
                replica.pool = str(exc)
                event(self.log, {"event": "pool_unusable", "replica": replica.url, "source": report.source,
                                 "reason": str(exc)})
            return
        if budget != replica.budget or report.source != replica.pool:  # a restart, or the config's estimate replaced
            before, was = replica.budget, replica.pool
            replica.budget, replica.pool = budget, report.source
            self.metrics.kv_budget.labels(replica.url).set(budget)
            event(self.log, {"event": "pool", "replica": replica.url, "tokens": report.tokens, "budget_bytes": budget,
                             "source": report.source,
                             **({"previous_bytes": before, "previous_source": was} if before is not None else {})})

    async def poll_forever(self, pool: Pool) -> None:
        """Every replica scraped again each `interval`, after the first scrape (`poll_once`) has run."""
        await asyncio.gather(*(self._poll_forever(pool, r) for r in self.replicas))

    async def _poll_forever(self, pool: Pool, replica: Replica) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll_replica(pool, replica)
            except Exception:  # never let the poller die
                guard_log().exception("metrics poll of %s failed", replica.url)  # a note, on stderr
