"""The closed form's inverse: the first step ending at or past an instant, found in few evaluations whatever the
step's parts (a cost per cached token many orders below the fixed part, a pace holding the first steps)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.simulation.closedrun import _Series


class Counted(_Series):
    __slots__ = ("calls",)

    def seconds(self, m: int) -> float:
        self.calls += 1
        return super().seconds(m)


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-4, 0.1), st.sampled_from([0.0, 1e-25, 1e-20, 1e-15, 1e-12, 1e-9, 1e-7, 1e-5]), st.floats(0.0, 0.2),
       st.integers(1, 200_000), st.integers(1, 256), st.integers(1, 2_000_000), st.floats(0.0, 1.0),
       st.floats(0.0, 3600.0))
def test_the_first_step_at_or_past_an_instant(head, cost, pace, c0, r, k, where, t0):
    series = Counted(head, cost, pace, c0, r, k)
    series.calls = 0
    x = t0 + where * 1.2 * series.seconds(k)  # (from before the run to past its end)
    series.calls = 0
    m = series.first(t0, x)
    assert 1 <= m <= k
    assert series.calls <= 2 * math.log2(k + 1) + 6  # (never a walk over the steps)
    if t0 + series.seconds(m) >= x:
        assert m == 1 or t0 + series.seconds(m - 1) < x
    else:
        assert m == k  # none reaches it


def test_the_steps_below_the_pace_take_the_pace():
    series = _Series(head=0.01, cost=1e-6, pace=0.02, c0=1000, r=2, k=10_000)
    # head + cost x (1000 + 2 i) >= 0.02 from i = 4,500
    assert series.m0 == 4500
    assert series.seconds(10) == 10 * 0.02
    assert math.isclose(series.seconds(4501), 4500 * 0.02 + 0.01 + 1e-6 * 10_000)


def test_an_instant_the_rounding_leaves_at_a_step_waits_for_the_next_step():
    """`_Run.sampled` may name as the next instant the one just reached ((floor(t / 0.05) + 1) x 0.05 is t itself
    for t = 2080.35): the step-by-step loop then samples again at the next step; the closed form too, never twice
    at one step (before: an endless loop)."""
    from types import SimpleNamespace

    from kvbudget.engines.scheduling.timing import TimeModel
    from kvbudget.simulation.closedrun import closed_run

    assert (math.floor(2080.35 / 0.05) + 1) * 0.05 <= 2080.35  # (the case)
    seen: list[float] = []

    class Clock:
        t, usage_time, peak_usage, next_sample, on_step, scrape = 0.0, 0.0, 0.0, 0.0, None, math.inf

        def __init__(self):
            self.slot_time = [0.0, 0.0, 0.0]
        tm = TimeModel.fitted(overhead=0.01, per_context=0.0, per_token=0.0, basis="test")

        def sampled(self, t, usage, running, waiting):
            seen.append(t)
            return t  # (the worst the rounding can do: the instant just reached)

    sched = SimpleNamespace(cfg=SimpleNamespace(block_size=16), waiting=[], free_blocks=lambda: (99, 100))
    # one request of 15 tokens in one block: 16 attended in its first step, its next block at the second
    n, end = closed_run(Clock(), sched, 50, math.inf, (1, 16, 0.01, [1]))
    assert n == 50 and len(seen) == 50 and seen == sorted(set(seen))  # one a step, each step once
