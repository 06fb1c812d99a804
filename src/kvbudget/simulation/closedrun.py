"""A run of pure decode steps in closed form: the clock, the stop at the next arrival, the samples and the running
totals of `take` (simulation/decoding.py) from sums over the run instead of a pass over its steps, in time that
grows with the running requests and the samples, not the steps.

Where it applies: nothing is read per cached token inside the step's max (`_head`), the cost per attended token is not
negative, the slots are tokens (no hybrid groups), no hook watches each step, and the scheduler says at which step
each running request takes its next block (`block_phases`). A step of r sequences over c cached tokens lasts
`max(head + context_cost x c, pace)`; the context grows by r a step; so the first m steps last `S(m)`, the pace times
the steps below it plus an arithmetic series, summed exactly in integers and scaled once. The reference adds step by
step: its clock and this one differ by rounding (a few units in the last place of the run's seconds), and the steps,
their order and what each request gets are the same (tests/unit/simulation/test_fast_path.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvbudget.engines.scheduling.seq import Queues
    from kvbudget.engines.scheduling.timing import TimeModel


class Clock(Protocol):
    """What a run of decode steps advances: the clock loop's running totals (simulation/run.py's `_Run`)."""

    t: float
    usage_time: float
    slot_time: list[float]
    peak_usage: float
    next_sample: float
    tm: TimeModel
    on_step: Callable[..., None] | None

    scrape: float  # a fleet's gauge scrapes' interval (inf: none)
    next_scrape: float  # their next instant
    next_line: float  # the timeline's next instant (`next_sample`: the sooner of the two)

    def sampled(self, t: float, usage: float, running: int, waiting: int) -> float: ...


class _Series:
    """The seconds of the first m steps of a run: `m0` steps at the pace, then head + cost x (c0 + i r)."""

    __slots__ = ("c0", "cost", "head", "k", "m0", "pace", "r")

    def __init__(self, head: float, cost: float, pace: float, c0: int, r: int, k: int) -> None:
        self.head, self.cost, self.pace, self.c0, self.r, self.k = head, cost, pace, c0, r, k
        self.m0 = self._paced()

    def step(self, i: int) -> float:
        """Step i's seconds before the pace, as the loop computes them (the context a whole number as a float)."""
        return self.head + self.cost * float(self.c0 + i * self.r)

    def _paced(self) -> int:
        """How many steps from the first the pace holds (a step is longer than the one before, or as long)."""
        k, pace = self.k, self.pace
        if self.step(0) >= pace:
            return 0
        if self.cost == 0.0:
            return k
        guess = (pace - self.head) / self.cost - self.c0
        m = 0 if guess <= 0 else k if guess / self.r >= k else int(guess / self.r)
        while m > 0 and self.step(m - 1) >= pace:
            m -= 1
        while m < k and self.step(m) < pace:
            m += 1
        return m

    def seconds(self, m: int) -> float:
        """The first m steps' seconds, S(m)."""
        m0 = self.m0
        if m <= m0:
            return m * self.pace
        n = m - m0
        tokens = n * self.c0 + self.r * (m * (m - 1) - m0 * (m0 - 1)) // 2  # context summed over steps m0..m-1
        return m0 * self.pace + n * self.head + self.cost * tokens

    def first(self, t0: float, x: float) -> int:
        """The first m in 1..k whose end t0 + S(m) is at or past x (k where none is): from the series' inverse,
        checked, and by bisection where rounding put the inverse off by more than a step."""
        k, y = self.k, x - t0
        m0, pace = self.m0, self.pace
        if y <= m0 * pace:
            m = math.ceil(y / pace) if pace > 0.0 else 1
        else:
            b, a = self.step(m0), self.cost * self.r
            rest = y - m0 * pace
            half = b - a / 2
            root = math.sqrt(half * half + 2.0 * a * rest)
            n = 2.0 * rest / (half + root) if half > 0.0 else (root - half) / a  # (no cancellation either way)
            m = m0 + math.ceil(n) if n < k else k
        m = min(max(m, 1), k)
        if t0 + self.seconds(m) >= x:
            if m == 1 or t0 + self.seconds(m - 1) < x:
                return m
            lo, hi = 0, m - 1  # the answer is in (lo, hi]
        else:
            if m == k or t0 + self.seconds(m + 1) >= x:
                return min(m + 1, k)
            if t0 + self.seconds(k) < x:
                return k
            lo, hi = m + 1, k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if t0 + self.seconds(mid) >= x:
                hi = mid
            else:
                lo = mid
        return hi

    def sums(self, a: int, b: int) -> tuple[int, int, int]:
        """Over steps a..b-1: their number, their contexts summed, their contexts squared summed."""
        n = b - a
        if n <= 0:
            return 0, 0, 0
        i1 = (b * (b - 1) - a * (a - 1)) // 2
        i2 = ((b - 1) * b * (2 * b - 1) - (a - 1) * a * (2 * a - 1)) // 6
        c0, r = self.c0, self.r
        return n, n * c0 + r * i1, n * c0 * c0 + 2 * c0 * r * i1 + r * r * i2

    def weighted(self, n: int) -> float:
        """The first n steps' contexts, each times its seconds, summed."""
        m0 = min(self.m0, n)
        _, paced, _ = self.sums(0, m0)
        _, c1, c2 = self.sums(m0, n)
        return self.pace * paced + self.head * c1 + self.cost * c2

    def at_takes(self, phase: int, bs: int, n: int) -> tuple[int, float]:
        """A request that takes a block at steps phase, phase + bs, ... below n: how many it takes, and S(s)
        summed over those steps s."""
        if phase >= n:
            return 0, 0.0
        count = (n - 1 - phase) // bs + 1
        m0 = self.m0
        paced = 0 if m0 < phase else min(count, (m0 - phase) // bs + 1)  # takes at steps s <= m0: S(s) = s pace
        total = self.pace * (paced * phase + bs * (paced * (paced - 1) // 2)) if paced else 0.0
        rest = count - paced
        if rest:
            j0, j1 = paced, count
            sj = (j1 * (j1 - 1) - j0 * (j0 - 1)) // 2
            sj2 = ((j1 - 1) * j1 * (2 * j1 - 1) - (j0 - 1) * j0 * (2 * j0 - 1)) // 6
            s1 = rest * phase + bs * sj  # the steps summed
            s2 = rest * phase * phase + 2 * phase * bs * sj + bs * bs * sj2  # ... squared
            beyond = s1 - rest * m0  # (s - m0) summed
            pairs = (s2 - s1) - rest * m0 * (m0 - 1)  # s(s - 1) - m0(m0 - 1) summed: even
            total += rest * m0 * self.pace + beyond * self.head + self.cost * (beyond * self.c0 + self.r * pairs // 2)
        return count, total


def closed_run(run: Clock, sched: Queues, k: int, arrival: float,
               given: tuple[int, int, float, list[int]]) -> tuple[int, float] | None:
    """`take` for up to k steps in closed form (see the module's text): the steps taken and the clock after them;
    None where it does not apply (blocks shared between the running requests: the slots beyond the context could
    run out within the run, which the loop counts step by step). `given`: the running requests, the tokens the
    first step attends over, the step's seconds but the cost per cached token (`_head`), and `block_phases()`."""
    r, c0, head, phases = given
    bs = sched.cfg.block_size
    free, usable = sched.free_blocks()
    held = (usable - free) * bs
    if held + r - sum(phases) < c0:  # (without shared blocks the slots never fall below the context)
        return None
    tm = run.tm
    series = _Series(head, tm.context_cost, tm.pace + tm.pace_per_seq * r, c0, r, k)
    t0 = run.t
    n, seconds = k, series.seconds(k)
    if t0 + seconds > arrival:  # (at k steps, and past: the first step at or past the arrival may come sooner)
        n = series.first(t0, arrival)
        seconds = series.seconds(n)
    end = t0 + seconds
    takes, at_takes = 0, 0.0
    for p in phases:
        count, s = series.at_takes(p, bs, n)
        takes += count
        at_takes += s
    taken_time = takes * seconds - at_takes  # blocks taken so far, each step times its seconds, summed
    run.usage_time += (1.0 - free / usable) * seconds + taken_time / usable
    states = series.weighted(n)
    run.slot_time[0] += states
    run.slot_time[2] += held * seconds + bs * taken_time - states

    def taken(i: int) -> int:  # blocks taken in steps 0..i
        return sum((i - p) // bs + 1 for p in phases if p <= i)

    last = taken(n - 1)
    if last:
        peak = 1.0 - (free - last) / usable
        if peak > run.peak_usage:
            run.peak_usage = peak
    waiting = len(sched.waiting)
    if n > 1:
        _skip_scrapes(run, t0 + series.seconds(n - 1))
    m = 0
    while end >= run.next_sample:  # the samples and scrapes: the first step at or past each instant, at most one
        m = max(series.first(t0, run.next_sample), m + 1)  # a step (as the loop: an instant the rounding of
        if m > n:                                          # floor(t / interval) leaves at t waits for the next step)
            break
        run.next_sample = run.sampled(t0 + series.seconds(m), 1.0 - (free - taken(m - 1)) / usable, r, waiting)
    return n, end


def _skip_scrapes(run: Clock, before: float) -> None:
    """A run whose steps but the last end by `before`, before anything can read the gauge: the scrapes at instants
    before one certainly at or before `before` (the one before the latest: the rounding of `floor` may put the
    latest past it) would be kept only until that one's is (by `before`), never read, so they are not taken (the
    timeline's samples are); from that instant on the scrapes are those the loop would take."""
    if run.scrape < math.inf:
        latest = (math.floor(before / run.scrape) - 1) * run.scrape
        if latest > run.next_scrape:
            run.next_scrape = latest
            run.next_sample = min(run.next_line, latest)
