"""Scrapes each replica's KV usage from the engine's own gauge (`Engine.usage`) and keeps health and staleness."""

from __future__ import annotations

import asyncio
import logging
import time

from kvbudget.engines import Engine
from kvbudget.guard.metrics import GuardMetrics
from kvbudget.guard.policy import Replica
from kvbudget.guard.upstream import ConnectFailed, Pool, UpstreamError

log = logging.getLogger("kvbudget.guard")


class Poller:
    def __init__(self, engine: Engine, replicas: list[Replica], metrics: GuardMetrics, timeout: float,
                 interval: float):
        self.engine, self.replicas, self.metrics = engine, replicas, metrics
        self.timeout, self.interval = timeout, interval
        self.polled = False  # at least one round done

    async def poll_once(self, pool: Pool) -> None:
        gauge = self.engine.usage
        for replica in self.replicas:
            try:
                value = None
                if gauge is not None:
                    status, body, _ = await pool.get(f"{replica.url}{gauge.path}", self.timeout)
                    if status == 200:
                        value = gauge.read(body.decode("utf-8", "replace"))
                    elif gauge.health_path is None:
                        raise UpstreamError(f"{gauge.path} answered {status}")
                    else:  # the usage endpoint can be disabled; the server may still be alive
                        health, _, _ = await pool.get(f"{replica.url}{gauge.health_path}", self.timeout)
                        if health != 200:
                            raise UpstreamError(f"{gauge.health_path} answered {health}")
                replica.healthy = True
                if value is not None:
                    replica.observed, replica.observed_at = value, time.monotonic()
                    self.metrics.observed.labels(replica.url).set(value)
                else:
                    self.metrics.scrape_failures.labels(replica.url).inc()
            except ConnectFailed:  # nobody listening: not healthy
                replica.healthy = False
                self.metrics.scrape_failures.labels(replica.url).inc()
            except (UpstreamError, ValueError):  # slow or broken metrics: the usage goes stale
                self.metrics.scrape_failures.labels(replica.url).inc()
            if replica.observed is not None:
                self.metrics.metrics_age.labels(replica.url).set(time.monotonic() - replica.observed_at)
            self.metrics.level.labels(replica.url).set(replica.level)
        self.polled = True

    async def poll_forever(self, pool: Pool) -> None:
        while True:
            try:
                await self.poll_once(pool)
            except Exception:  # never let the poller die
                log.exception("metrics poll failed")
            await asyncio.sleep(self.interval)
