"""Runs of pure decode steps at once (the simulator's fast path): the clock and the running totals advanced k
steps in a Python loop, or for a long run in numpy arrays, each float the same as step by step (the reference,
`simulate(fast=False)`; tests/unit/simulation/test_fast_path.py checks both kernels against it); or, where a run
may be long and its steps' seconds are a line in the context, in closed form (simulation/closedrun.py: the same
steps, the seconds to rounding).

numpy adds in order in `np.add.accumulate` (not in its sums), and a step's seconds over an array of contexts come
from the same `TimeModel.step_seconds`; whole numbers stay exact as floats below 2^53.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.simulation.closedrun import Clock, closed_run

if TYPE_CHECKING:

    from kvbudget.engines.scheduling.seq import Queues
    from kvbudget.engines.scheduling.timing import TimeModel

# runs of pure decode steps in closed form where they may last this many steps and more (their cost grows with the
# running requests: below, the loop's pass over the steps costs less)
CLOSED_RUN = 16
CLOSED_PER_SEQ = 6
ARRAY_RUN = 120  # decode runs of this many steps or more go through numpy, where installed (below, its calls cost more)


@dataclass(frozen=True)
class Sample:
    """The engine's state after the first step at or past each sampling instant."""

    time: float
    usage: float  # vLLM's KV cache usage gauge (0..1)
    running: int
    waiting: int


_NUMPY: list[Any] = [0]  # long runs seen; then numpy, once looked for (None: not installed)
FEW = 6  # numpy runs of up to this many sequences count their blocks sequence by sequence (else by phase)
IMPORT_AFTER = 1000  # long runs in Python loops before numpy is imported (about the time its import takes)


def _numpy() -> Any:
    """numpy for a long decode run where installed, else None: at once where something has imported it, else
    after `IMPORT_AFTER` long runs (a short simulation does not pay for the import)."""
    if len(_NUMPY) == 1:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            _NUMPY[0] += 1
            if _NUMPY[0] < IMPORT_AFTER:
                return None
            try:
                import numpy
            except ImportError:
                numpy = None
        _NUMPY.append(numpy)
    return _NUMPY[1]


def _fixed(tm: TimeModel, r: int) -> float:
    """A decode step's added costs for r sequences, as step_seconds adds them (no attended pairs beyond its
    context)."""
    return tm.overhead + tm.token_cost * r + tm.seq_cost * r


def _head(tm: TimeModel, r: int) -> float | None:
    """All of a decode step of r sequences but the cost per cached token outside the max, as step_seconds adds
    it, where nothing is read per cached token inside the max (then that part is constant); else None."""
    if tm.per_context != 0.0:
        return None
    weights, compute = tm.weights_read(r), tm.per_token * r
    return (weights + compute if tm.bound == "sum" else (weights if weights > compute else compute)) + _fixed(tm, r)


def _steps_to(run: Clock, arrival: float, k: int, r: int, context: int) -> int:
    """At most k steps, no more than reach `arrival` (a step lasts at least as long as the first: the context
    only grows); any fewer would be as exact, the next turn going on where this one stopped."""
    if arrival == math.inf:
        return k
    first = run.tm.step_seconds(r, context, None, r)
    if first <= 0.0 or (arrival - run.t) / first >= k:
        return k
    return min(k, math.ceil((arrival - run.t) / first) + 1)


def take(run: Clock, sched: Queues, k: int, arrival: float) -> tuple[int, float]:
    """Up to k pure decode steps, stopping after the one that ends at or past `arrival`: the running totals of
    `run` advanced as step by step (not its clock); the steps taken and the clock after them. A run that may be long
    goes to `closed_run` where it applies, else to `_arrays`; the rest is the loop."""
    r = len(sched.running)
    context = sched.context_tokens()
    tm = run.tm
    head = _head(tm, r)
    if head is not None and run.on_step is None and not sched.hybrid and tm.context_cost >= 0.0:
        least = CLOSED_RUN + CLOSED_PER_SEQ * r
        first = head + tm.context_cost * context  # (the shortest step: before the pace, which only lengthens it)
        if k >= least and (arrival - run.t >= least * first) and (phases := sched.block_phases()) is not None:
            closed = closed_run(run, sched, k, arrival, (r, context, head, phases))
            if closed is not None:
                return closed
    if k >= ARRAY_RUN:  # (a short run stops at the arrival as cheaply as it would be capped)
        k = _steps_to(run, arrival, k, r, context)
        if k >= ARRAY_RUN and (np := _numpy()) is not None:
            return _arrays(run, np, sched, k, arrival, context)
    bs = sched.cfg.block_size
    takes = sched.new_blocks_by_step(k)
    pace = tm.pace + tm.pace_per_seq * r  # (a step cannot outrun it)
    free, usable = sched.free_blocks()
    held = (usable - free) * bs
    waiting = len(sched.waiting)
    on_step = run.on_step
    blocks_as_states = sched.hybrid
    if head is not None and not blocks_as_states and on_step is None:  # the common case, in its own loop
        return _plain(run, takes, (head, tm.context_cost, pace, r, waiting, bs), float(context), (free, usable, held),
                      arrival)
    states_time, internal_time = run.slot_time[0], run.slot_time[2]
    weights, per_context, compute = tm.weights_read(r), tm.per_context, tm.per_token * r
    fixed = _fixed(tm, r)
    context_cost = tm.context_cost
    summed = tm.bound == "sum"
    usage = 1.0 - free / usable
    t, usage_time, next_sample = run.t, run.usage_time, run.next_sample
    running = r
    done = 0
    peak = run.peak_usage
    for take in takes:
        if take:
            free -= take
            usage = 1.0 - free / usable
            held = (usable - free) * bs
            if usage > peak:  # (hybrid windows free blocks: usage can fall within a run)
                peak = usage
        if head is None:
            read = weights + per_context * context  # (as step_seconds computes it, to the last bit)
            base = read + compute if summed else (read if read > compute else compute)
            dt = base + fixed + context_cost * context
        else:
            dt = head + context_cost * context
        dt = dt if dt >= pace else pace
        t += dt
        usage_time += usage * dt
        if blocks_as_states:  # hybrid groups: every block in use counts as token states (see memory())
            states_time += held * dt
        else:
            states_time += context * dt  # the cached tokens are the context attended over
            if held > context:
                internal_time += (held - context) * dt
        context += r
        done += 1
        if t >= next_sample:
            next_sample = run.sampled(t, usage, running, waiting)
        if on_step is not None:
            on_step(t, r, usage, running, waiting)
        if t >= arrival:
            break
    run.usage_time, run.next_sample = usage_time, next_sample
    run.slot_time[0], run.slot_time[2] = states_time, internal_time
    run.peak_usage = peak
    return done, t


def _plain(run: Clock, takes: list[int], step: tuple[float, float, float, int, int, int], context: float,
           blocks: tuple[int, int, int], arrival: float) -> tuple[int, float]:
    """`take`'s loop where nothing is read per cached token inside the max, the slots are tokens (no hybrid
    groups) and no hook watches each step: the same floats in the same order, fewer tests per step (the context a
    float: whole numbers, exact, the same in every product)."""
    head, context_cost, pace, r, waiting, bs = step
    free, usable, held = blocks
    t, usage_time, next_sample, peak = run.t, run.usage_time, run.next_sample, run.peak_usage
    states_time, internal_time = run.slot_time[0], run.slot_time[2]
    usage = 1.0 - free / usable
    mark = next_sample if next_sample < arrival else arrival  # (one test a step for both)
    done = 0
    for take in takes:
        if take:
            free -= take
            usage = 1.0 - free / usable
            held = (usable - free) * bs
            if usage > peak:
                peak = usage
        dt = head + context_cost * context
        if dt < pace:
            dt = pace
        t += dt
        usage_time += usage * dt
        states_time += context * dt
        if held > context:
            internal_time += (held - context) * dt
        context += r
        done += 1
        if t >= mark:
            if t >= next_sample:
                next_sample = run.sampled(t, usage, r, waiting)
            if t >= arrival:
                break
            mark = next_sample if next_sample < arrival else arrival
    run.usage_time, run.next_sample = usage_time, next_sample
    run.slot_time[0], run.slot_time[2] = states_time, internal_time
    run.peak_usage = peak
    return done, t


def _arrays(run: Clock, np: Any, sched: Queues, k: int, arrival: float, first: int) -> tuple[int, float]:
    """`take`'s loop in numpy arrays, float for float: row by row, the clock, the usage integral and the
    slot integrals, each added in order from its running total by one `np.add.accumulate`; `first` the tokens the
    first step attends over."""
    r, waiting = len(sched.running), len(sched.waiting)
    # whole numbers as floats (exact below 2^53: the same floats as Python's int-to-float in the loop)
    phases = sched.block_phases()
    if phases is None:
        taken = np.fromiter(sched.new_blocks_by_step(k), float, k)
    else:  # (a block every block_size steps from each phase: no list of k)
        bs = sched.cfg.block_size
        period = np.bincount(phases, minlength=bs) if r > FEW else None
        if period is not None and len(period) == bs:  # (every phase within the first block_size steps)
            taken = np.resize(period.astype(float), k)
        else:
            taken = np.zeros(k)
            for j in phases:
                taken[j::bs] += 1.0
    np.add.accumulate(taken, out=taken)  # blocks, step by step
    context = np.arange(first, first + r * k, r, dtype=float)  # attended over in each step (first + i r, exact)
    free, usable = sched.free_blocks()
    usage = np.subtract(free, taken)
    usage /= usable
    np.subtract(1.0, usage, out=usage)  # (1.0 - free / usable, as the loop has it)
    rows = np.empty((4, k + 1))
    rows[0, 0], rows[1, 0], rows[2, 0], rows[3, 0] = run.t, run.usage_time, run.slot_time[0], run.slot_time[2]
    tm = run.tm
    head = _head(tm, r)
    if head is None:
        dt = rows[0, 1:] = tm.step_seconds(r, context, None, r)
    else:  # (the loop's sum: the same floats as step_seconds gives, in fewer passes)
        dt = np.multiply(context, tm.context_cost, out=rows[0, 1:])
        dt += head
        pace = tm.pace + tm.pace_per_seq * r
        if tm.context_cost < 0.0 or first * tm.context_cost + head < pace:  # (else no step is below it: the
            np.maximum(dt, pace, out=dt)                                      # first is the shortest)
    np.multiply(usage, dt, out=rows[1, 1:])
    held = np.multiply(taken, sched.cfg.block_size)
    held += (usable - free) * sched.cfg.block_size  # token slots in blocks in use
    if sched.hybrid:  # every block in use counts as token states (see memory())
        np.multiply(held, dt, out=rows[2, 1:])
        rows[3, 1:] = 0.0  # (x + 0.0 is x: as if not added)
    else:
        np.multiply(context, dt, out=rows[2, 1:])
        held -= context
        np.maximum(held, 0, out=held)  # (held beyond the context; 0: adds 0.0, as if not added)
        np.multiply(held, dt, out=rows[3, 1:])
    np.add.accumulate(rows, axis=1, out=rows)
    done = min(k, int(rows[0, 1:].searchsorted(arrival)) + 1)  # through the first step ending at or past it
    run.usage_time, run.slot_time[0], run.slot_time[2] = rows[1:, done].tolist()
    if sched.hybrid:  # (windows free blocks: usage can fall within a run) the highest after a step that took
        took = usage[:done][np.diff(taken[:done], prepend=0) != 0]
        peak = float(took.max()) if took.size else 0.0
    else:  # blocks are only taken: the usage after the last step that took one
        peak = float(usage[done - 1]) if taken[done - 1] else 0.0
    if peak > run.peak_usage:
        run.peak_usage = peak
    times = rows[0, 1:done + 1]
    end = float(times[-1])
    if end >= run.next_sample:  # the samples and scrapes: the first step at or past each instant
        j = int(times.searchsorted(run.next_sample))
        later = times[j:].tolist()  # (from the first on: a scrape every 50 ms can fall many times in a run)
        i = 0
        while i < done - j:
            run.next_sample = run.sampled(later[i], float(usage[j + i]), r, waiting)
            i = bisect.bisect_left(later, run.next_sample, i + 1)
    if run.on_step is not None:
        for t, u in zip(times.tolist(), usage[:done].tolist(), strict=True):
            run.on_step(t, r, u, r, waiting)
    return done, end
