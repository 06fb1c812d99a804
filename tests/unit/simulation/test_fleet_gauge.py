"""A fleet's gauge scrapes, kept apart from its timeline: a router reading the usage gauge sees it as scraped every
`refresh` seconds whatever the timeline's sample interval, the timeline keeps the user's interval, and a replica
keeps only the scrapes a later read can still show."""

from __future__ import annotations

import math
from dataclasses import replace

from simkit import AZURE, LLAMA

from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.simulation.fleet import LeastKV, Pool, simulate_fleet
from kvbudget.simulation.run import setup_for

SMALL = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30)


def azure(n: int = 300, scale: float = 8.0) -> list[Request]:
    return [replace(r, prompt_tokens=min(r.prompt_tokens, 6000)) for r in rescale(read_trace(AZURE), scale, 0, n)]


def routed(router: object, sample_interval: float) -> tuple[dict[int, list[str]], object]:
    sent: dict[int, list[str]] = {}
    fleet = simulate_fleet(LLAMA, azure(), [Pool(name="m", setup=SMALL, replicas=3)], router,  # type: ignore[arg-type]
                           sample_interval=sample_interval,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r.id))
    return sent, fleet


def test_least_kv_keeps_the_timeline_at_the_users_interval():
    """The 50 ms scrapes are the router's: the timeline has at most one sample in each second (the default)."""
    _, fleet = routed("least-kv", 1.0)
    for rep in fleet.replicas:  # type: ignore[attr-defined]
        seconds = [math.floor(s.time) for s in rep.simulation.timeline]
        assert seconds == sorted(set(seconds)) and len(seconds) > 5


def test_the_gauge_is_scraped_at_its_refresh_whatever_the_timeline():
    """A timeline sampled every 10 ms or every 10 s: the same routes and the same schedules, the gauge read every
    50 ms either way (the timeline alone differs)."""
    (fine_sent, fine), (coarse_sent, coarse) = routed("least-kv", 0.01), routed("least-kv", 10.0)
    assert fine_sent == coarse_sent
    for a, b in zip(fine.replicas, coarse.replicas, strict=True):  # type: ignore[attr-defined]
        assert len(a.simulation.timeline) > 20 * len(b.simulation.timeline)
        assert replace(a.simulation, timeline=()) == replace(b.simulation, timeline=())


class Watching:
    """least-kv, checking after each choice how many scrapes each replica keeps."""

    name, lazy = "watching", True
    refresh = LeastKV().refresh  # (the fleet scrapes the gauges this often for it)

    def __init__(self) -> None:
        self.inner, self.most = LeastKV(), 0

    def choose(self, request, replicas, now):
        chosen = self.inner.choose(request, replicas, now)
        self.most = max(self.most, *(len(r.run.scrapes) for r in replicas))
        return chosen


def test_a_replica_keeps_only_the_scrapes_a_later_read_can_show():
    """Read at `now`, a replica keeps the latest scrape at or before it and at most one after (its last step may
    end past `now`): two at most, over any run; the routes those of least-kv itself."""
    watching = Watching()
    sent, _ = routed(watching, 1.0)
    assert 1 <= watching.most <= 2
    assert sent == routed("least-kv", 1.0)[0]
