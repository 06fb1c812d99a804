"""How long one engine step takes: a roofline over the GPU catalog's peak figures, or a fit to measured steps.

Scheduling is exact; time is not. By default a step reads the active weights once and every scheduled request's
KV cache, and does about 2 FLOPs per active parameter per token: it takes the longer of the two at the card's
datasheet peaks times an efficiency, plus a fixed overhead. The efficiencies and overhead below are estimates
(labelled so wherever times are shown). `calibrate` fits a step time to measured steps instead: a fixed part,
a part per token attended over and a part per token computed, added (the form a least-squares fit can pin down
from what a recorder sees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbudget.errors import KVBudgetError
from kvbudget.files import parse_json_text, read_lines

# Estimates, not measurements: what fraction of the datasheet peak a serving engine reaches, and what a step
# costs beyond reading and computing (scheduling, sampling, kernel launches).
BANDWIDTH_EFFICIENCY = 0.7
COMPUTE_EFFICIENCY = 0.5
STEP_OVERHEAD_S = 0.002
NOMINAL = "nominal peaks (no GPU figures)"


@dataclass(frozen=True, kw_only=True)
class TimeModel:
    """A step's seconds from its tokens, the cached tokens it attends over, the (query, key) pairs its attention
    computes and the sequences it runs: `max(weights + per_context * context, per_token * tokens)` (roofline and
    fitted kernels) or their sum (calibrated), plus the overhead and the added costs."""

    weights: float  # seconds to read the weights once
    per_context: float  # seconds per cached token attended over (overlapped with computing under "max")
    per_token: float  # seconds per token computed (overlapped with reading under "max")
    overhead: float  # seconds per step
    bound: str = "max"  # "max" (the slower of reading and computing) or "sum" (calibrated)
    token_cost: float = 0.0  # seconds added per token (norms, activations, all-reduces)
    context_cost: float = 0.0  # seconds added per cached token attended over (attention's KV read)
    pair_cost: float = 0.0  # seconds added per (query, key) pair beyond one per cached token (prefill chunks)
    seq_cost: float = 0.0  # seconds added per sequence in the step (LM head, sampler, attention per sequence)
    # seconds every request spends outside the engine (HTTP, tokenizing, streaming back), added to its TTFT and
    # end-to-end latency; 0 unless calibrated on latencies a client measured
    request_latency: float = 0.0
    request_per_token: float = 0.0  # seconds per prompt token outside the engine (tokenizing), beside request_latency
    # a stage beside the GPU that a step cannot outrun (the engine's frontend streaming every sequence's token; the
    # engine's own CPU work where it overlaps the GPU's): a step takes at least pace + pace_per_seq x sequences
    pace: float = 0.0
    pace_per_seq: float = 0.0
    # a mixture of experts: seconds to read every routed expert's weights (not in `weights`), and the share of the
    # experts one token routes to; a step of n tokens reads the experts it routes to: 1 - (1 - share)^n of them
    # (routing taken as uniform and independent)
    experts: float = 0.0
    expert_share: float = 0.0
    basis: str = "roofline estimate"
    # the held-out validation whose error band these times carry (kvbudget.simulation.bands.Basis' value: fitted
    # kernels, measured or transferred); "" where none applies (the roofline, a calibration, a model given)
    band_basis: str = ""

    @classmethod
    def roofline(cls, weight_bytes: float, kv_bytes_per_token: float, flops_per_token: float, bandwidth: float,
                 peak_flops: float, basis: str = "roofline estimate") -> TimeModel:
        read = bandwidth * BANDWIDTH_EFFICIENCY
        return cls(weights=weight_bytes / read, per_context=kv_bytes_per_token / read,
                   per_token=flops_per_token / (peak_flops * COMPUTE_EFFICIENCY), overhead=STEP_OVERHEAD_S,
                   bound="max", basis=basis)

    @classmethod
    def fitted(cls, overhead: float, per_context: float, per_token: float, basis: str) -> TimeModel:
        """A calibrated step time: the three parts added."""
        return cls(weights=0.0, per_context=per_context, per_token=per_token, overhead=overhead, bound="sum",
                   basis=basis)

    def step_seconds(self, tokens: int, context_tokens: Any, pairs: int | None = None,
                     sequences: int | None = None) -> Any:
        """One step computing `tokens` new tokens for `sequences` sequences (default: one token each) while
        attending over `context_tokens` cached ones in `pairs` (query, key) pairs (default: one query each, as
        decoding does; `pair_cost` counts the pairs beyond those). `context_tokens` may be a numpy array of
        whole numbers (a run of decode steps, `pairs` None): then an array of each step's seconds, each the
        same float as the step alone."""
        array = hasattr(context_tokens, "dtype")
        read = self.weights_read(tokens) + self.per_context * context_tokens
        compute = self.per_token * tokens
        if self.bound == "sum":
            base = read + compute
        else:
            base = _larger(read, compute) if array else read if read > compute else compute
        fixed = self.overhead + self.token_cost * tokens + self.seq_cost * (tokens if sequences is None
                                                                             else sequences)
        total = base + fixed + self.context_cost * context_tokens
        if pairs is not None:  # (none beyond one per cached token: adding 0.0 would change no float)
            total += self.pair_cost * (pairs - context_tokens)
        pace = self.pace + self.pace_per_seq * (tokens if sequences is None else sequences)
        if array:
            return _larger(total, pace)
        return total if total >= pace else pace

    def outside_seconds(self, prompt_tokens: int) -> float:
        """Seconds a request of `prompt_tokens` spends outside the engine, added to its TTFT and end to end."""
        return self.request_latency + self.request_per_token * prompt_tokens

    def weights_read(self, tokens: int) -> float:
        """Seconds a step of `tokens` tokens spends reading weights: all of them, and the experts it routes to."""
        if not self.experts:
            return self.weights
        return self.weights + self.experts * (1.0 - (1.0 - self.expert_share) ** tokens)

    def scaled(self, fixed: float, work: float, basis: str, request_latency: float = 0.0) -> TimeModel:
        """This step time with its fixed cost per step times `fixed` and everything else times `work`, and
        `request_latency` outside the engine (a calibration of a kernel model); the host's measured costs outside
        the GPU (request_per_token, pace) stay as they are."""
        return TimeModel(weights=self.weights * work, per_context=self.per_context * work,
                         per_token=self.per_token * work, overhead=self.overhead * fixed, bound=self.bound,
                         token_cost=self.token_cost * work, context_cost=self.context_cost * work,
                         pair_cost=self.pair_cost * work, seq_cost=self.seq_cost * work,
                         request_latency=request_latency, request_per_token=self.request_per_token,
                         pace=self.pace, pace_per_seq=self.pace_per_seq, experts=self.experts * work,
                         expert_share=self.expert_share, basis=basis)

    def to_dict(self) -> dict[str, float | str]:
        return dict(self.__dict__)


def _larger(x: Any, floor: float) -> Any:
    """numpy's elementwise larger of an array `x` and `floor`: for each element the float `x if x > floor else
    floor` gives (a step alone)."""
    import numpy  # (an array is numpy's: imported by then)

    return numpy.maximum(x, floor)


@dataclass(frozen=True)
class MeasuredStep:
    tokens: int
    context_tokens: int
    seconds: float


def read_measured_steps(path: str | Path) -> list[MeasuredStep]:
    """Step times from a log of kvbudget's vLLM recorder (kvbudget.simulation.recorder): each step that the next
    one followed directly (no request arrived between, so the engine was not idle), timed start to start."""
    name = str(path)
    out: list[MeasuredStep] = []
    before: tuple[int, int, float] | None = None
    for line, text in enumerate(read_lines(path, "calibrate", "recorder log"), 1):
        if not text.strip():
            continue
        rec = parse_json_text(text, f"{name}:{line}", "calibrate", "recorder log line")
        if not isinstance(rec, dict):
            raise KVBudgetError(f"{name}:{line}: expected a JSON object", param="calibrate")
        if "add" in rec:  # the engine may have been idle before it
            before = None
        if "step" not in rec:
            continue
        try:
            tokens, context, t = int(rec["tokens"]), int(rec["context"]), float(rec["t"])
        except (KeyError, TypeError, ValueError, OverflowError):  # missing, not numbers, an infinite count
            t = math.nan
        if not math.isfinite(t):
            raise KVBudgetError(f"{name}:{line}: a step without tokens, context and t; record with "
                                "kvbudget.simulation.recorder", param="calibrate")
        if before is not None and t > before[2]:
            out.append(MeasuredStep(before[0], before[1], t - before[2]))
        before = (tokens, context, t) if tokens else None
    return out


def calibrate(steps: Sequence[MeasuredStep], source: str = "measured steps") -> TimeModel:
    """The step time that best fits measured steps (least squares, no negative part):
    overhead + per_context * context + per_token * tokens."""
    if len(steps) < 3:
        raise KVBudgetError(f"calibrate: {len(steps)} measured steps; at least 3 are needed", param="calibrate")
    rows = [[1.0, float(s.context_tokens), float(s.tokens)] for s in steps]
    overhead, per_context, per_token = nonnegative_fit(rows, [s.seconds for s in steps])
    return TimeModel.fitted(overhead, per_context, per_token, f"calibrated on {len(steps)} {source}")


def nonnegative_fit(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares with no negative coefficient: a column whose coefficient comes out negative is dropped
    (its coefficient 0) and the rest refitted. Columns are scaled to their largest value while solving."""
    k = len(rows[0])
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(k)]
    used = list(range(k))
    while True:
        fit = _least_squares([tuple(r[j] / scale[j] for j in used) for r in rows], list(ys))
        negative = [j for j, v in zip(used, fit, strict=True) if v < 0]
        if not negative:
            break
        used.remove(negative[0])
    out = [0.0] * k
    for j, v in zip(used, fit, strict=True):
        out[j] = v / scale[j]
    return out


def _least_squares(rows: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Solve the normal equations by Gaussian elimination with partial pivoting."""
    k = len(rows[0]) if rows else 0
    m = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    v = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-30:
            raise KVBudgetError("calibrate: the measured steps do not vary enough to fit a step time",
                                param="calibrate")
        m[col], m[pivot] = m[pivot], m[col]
        v[col], v[pivot] = v[pivot], v[col]
        for r in range(k):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
                v[r] -= f * v[col]
    return [v[i] / m[i][i] for i in range(k)]
