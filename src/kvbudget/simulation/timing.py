"""How long one engine step takes: a roofline over the GPU catalog's peak figures, with efficiency factors.

Scheduling is exact; time is not. A step reads the active weights once and every scheduled request's KV cache,
and does about 2 FLOPs per active parameter per token; it takes the longer of the two at the card's peak times
an efficiency, plus a fixed overhead. The defaults below are estimates (labelled so everywhere they are shown);
`calibrate` fits them to measured step times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvbudget.errors import KVBudgetError

# Estimates, not measurements: what fraction of the datasheet peak a serving engine reaches, and what a step
# costs beyond reading and computing (scheduling, sampling, kernel launches).
BANDWIDTH_EFFICIENCY = 0.7
COMPUTE_EFFICIENCY = 0.5
STEP_OVERHEAD_S = 0.002


@dataclass(frozen=True)
class TimeModel:
    weight_bytes: float  # read once per step (active weights on one GPU)
    kv_bytes_per_token: float  # read per cached token attended to, on one GPU
    flops_per_token: float  # per scheduled token, on one GPU
    bandwidth: float  # bytes/s, datasheet peak
    peak_flops: float  # FLOP/s, datasheet peak
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    overhead: float = STEP_OVERHEAD_S
    basis: str = "roofline estimate"  # or "calibrated on ..."

    def step_seconds(self, tokens: int, context_tokens: int) -> float:
        """One step computing `tokens` new tokens while attending over `context_tokens` cached ones."""
        weights, per_context, per_token, overhead = self.coefficients()
        read = weights + per_context * context_tokens
        compute = per_token * tokens
        return (read if read > compute else compute) + overhead

    def coefficients(self) -> tuple[float, float, float, float]:
        """(weights read, read per context token, compute per token, overhead), in seconds: a step takes
        max(weights + per_context * context, per_token * tokens) + overhead."""
        read = self.bandwidth * self.bandwidth_efficiency
        return (self.weight_bytes / read, self.kv_bytes_per_token / read,
                self.flops_per_token / (self.peak_flops * self.compute_efficiency), self.overhead)

    def to_dict(self) -> dict[str, float | str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class MeasuredStep:
    tokens: int
    context_tokens: int
    seconds: float


def calibrate(model: TimeModel, steps: Sequence[MeasuredStep], source: str = "measured steps") -> TimeModel:
    """The efficiencies and overhead that best fit measured steps (least squares on the step time).

    Each step is read-bound or compute-bound under the current factors; the fit is linear in 1/efficiency and
    the overhead, so it is solved exactly, then repeated until the bound each step falls on stops changing."""
    if len(steps) < 3:
        raise KVBudgetError(f"calibrate: {len(steps)} measured steps; at least 3 are needed", param="calibrate")
    current = model
    for _ in range(10):
        rows, ys = [], []
        for s in steps:
            read = (current.weight_bytes + current.kv_bytes_per_token * s.context_tokens) / current.bandwidth
            compute = current.flops_per_token * s.tokens / current.peak_flops
            bound_read = read / current.bandwidth_efficiency >= compute / current.compute_efficiency
            rows.append((read if bound_read else 0.0, 0.0 if bound_read else compute, 1.0))
            ys.append(s.seconds)
        a, b, c = _least_squares(rows, ys)
        fitted = replace(current, bandwidth_efficiency=1 / a if a > 0 else current.bandwidth_efficiency,
                         compute_efficiency=1 / b if b > 0 else current.compute_efficiency, overhead=max(c, 0.0),
                         basis=f"calibrated on {len(steps)} {source}")
        if fitted == current:
            break
        current = fitted
    return current


def _least_squares(rows: list[tuple[float, float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Solve the 3x3 normal equations (columns that are all zero get coefficient 0)."""
    n = 3
    used = [j for j in range(n) if any(r[j] for r in rows)]
    m = [[sum(r[i] * r[j] for r in rows) for j in used] for i in used]
    v = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in used]
    k = len(used)
    for col in range(k):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-30:
            raise KVBudgetError("calibrate: the measured steps do not vary enough to fit the time model",
                                param="calibrate")
        m[col], m[pivot] = m[pivot], m[col]
        v[col], v[pivot] = v[pivot], v[col]
        for r in range(k):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
                v[r] -= f * v[col]
    out = [0.0] * n
    for idx, j in enumerate(used):
        out[j] = v[idx] / m[idx][idx]
    return out[0], out[1], out[2]
