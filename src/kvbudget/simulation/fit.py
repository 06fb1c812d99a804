"""Calibrating the time model on a benchmark run's per-request timings (`vllm bench serve --save-result
--save-detailed`): the step-time parts that make the simulated latencies match the measured ones.

The run's own requests (start times, prompt and output lengths) are replayed through the simulator, and the
three parts of a calibrated step (a fixed part, a part per token attended over, a part per token computed) are
searched, by coordinate steps in log space, to bring the simulated TTFT and time-per-output-token
distributions (quantile by quantile, as log ratios) closest to the measured ones. The scheduling in each replay
is exact; the fit is as good as the three-part step time can be, and the README says how good that is.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.simulation.run import Setup, simulate
from kvbudget.simulation.timing import MeasuredStep, TimeModel, read_measured_steps
from kvbudget.simulation.workload import Request


@dataclass(frozen=True)
class BenchRun:
    """The completed requests of a benchmark run and what was measured for them."""

    requests: tuple[Request, ...]  # in arrival order; id = their index
    measured: tuple[tuple[float, float | None], ...]  # per request: TTFT, mean inter-token latency (seconds)
    failed: int  # requests the run reports errors for (left out)

    @property
    def ttft(self) -> tuple[float, ...]:
        return tuple(sorted(t for t, _ in self.measured))

    @property
    def tpot(self) -> tuple[float, ...]:
        return tuple(sorted(p for _, p in self.measured if p is not None))


def read_calibration(path: str | Path) -> BenchRun | list[MeasuredStep]:
    """What `--calibrate` was given: a benchmark result (one JSON object with start_times) or a recorder log."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise KVBudgetError(f"calibrate {path}: {e.strerror or e}", param="calibrate") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None  # JSON Lines (or not JSON at all: the recorder-log reader names the line)
    if isinstance(data, dict) and "start_times" in data:
        return read_bench_result(path)
    return read_measured_steps(path)


def read_bench_result(path: str | Path) -> BenchRun:
    """`vllm bench serve --save-result --save-detailed` JSON: start_times, input_lens, output_lens, ttfts, itls."""
    name = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise KVBudgetError(f"calibrate {name}: {e.strerror or e}", param="calibrate") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KVBudgetError(f"calibrate {name}: not a JSON benchmark result ({e})", param="calibrate") from None
    fields = ("start_times", "input_lens", "output_lens", "ttfts", "itls")
    if not isinstance(data, dict) or any(not isinstance(data.get(f), list) for f in fields):
        raise KVBudgetError(f"calibrate {name}: expected a `vllm bench serve` result saved in detail, with "
                            f"{', '.join(fields)}", param="calibrate")
    n = len(data["start_times"])
    if any(len(data[f]) != n for f in fields):
        raise KVBudgetError(f"calibrate {name}: {', '.join(fields)} differ in length", param="calibrate")
    errors = data.get("errors") or [""] * n
    rows = []
    failed = 0
    for i in range(n):
        try:
            start, prompt, output = float(data["start_times"][i]), int(data["input_lens"][i]), \
                int(data["output_lens"][i])
            ttft = float(data["ttfts"][i])
            itls = [float(x) for x in data["itls"][i]]
        except (TypeError, ValueError):
            raise KVBudgetError(f"calibrate {name}: request {i}: unreadable timings", param="calibrate") \
                from None
        if errors[i] or output < 1 or prompt < 1 or not ttft > 0:
            failed += 1
            continue
        rows.append((start, prompt, output, ttft, statistics.fmean(itls) if itls else None))
    if len(rows) < 3:
        raise KVBudgetError(f"calibrate {name}: {len(rows)} completed requests; at least 3 are needed",
                            param="calibrate")
    rows.sort()
    first = rows[0][0]
    requests = tuple(Request(s - first, p, o, id=str(i)) for i, (s, p, o, _, _) in enumerate(rows))
    return BenchRun(requests, tuple((r[3], r[4] if r[2] > 1 else None) for r in rows), failed)


def initial_model(bench: BenchRun) -> TimeModel:
    """A starting point for `calibrate_requests` (and a time model for the setup it is given)."""
    return _model(_start(bench), "before calibration")


def _start(bench: BenchRun) -> list[float]:
    tpot = statistics.median(bench.tpot) if bench.tpot else statistics.median(bench.ttft)
    mean_context = statistics.fmean(r.prompt_tokens + r.output_tokens / 2 for r in bench.requests)
    mean_prompt = statistics.fmean(r.prompt_tokens for r in bench.requests)
    # mostly a fixed step, a little per token: a light start keeps the first replays out of a queueing collapse
    return [0.8 * tpot, 0.1 * tpot / mean_context, 0.3 * statistics.median(bench.ttft) / mean_prompt]


def calibrate_requests(model: ModelSpec, bench: BenchRun, setup: Setup) -> TimeModel:
    """The calibrated step time whose replay of `bench` best matches its measured TTFT and TPOT distributions:
    coordinate steps on the logs of the three parts, coarse to fine, each kept while it lowers the gap. (A
    request-by-request Gauss-Newton fit was tried: the replayed schedule changes in jumps as step times move,
    and it stalled far from the optimum.)"""
    params = _start(bench)
    best = _loss(model, bench, setup, params)
    for factor in FACTORS:
        improved = True
        while improved:
            improved = False
            for i in range(len(params)):
                for f in (factor, 1 / factor):
                    trial = list(params)
                    trial[i] *= f
                    loss = _loss(model, bench, setup, trial)
                    if loss < best:
                        best, params, improved = loss, trial, True
    return _model(params, f"calibrated on {len(bench.requests)} benchmark requests")


FACTORS = (4.0, 2.0, 1.4, 1.15, 1.05, 1.02)


def _model(params: list[float], basis: str) -> TimeModel:
    overhead, per_context, per_token = params
    return TimeModel.fitted(overhead, per_context, per_token, basis)


def _loss(model: ModelSpec, bench: BenchRun, setup: Setup, params: list[float]) -> float:
    sim = simulate(model, iter(bench.requests), setup=replace(setup, time_model=_model(params, "trial")))
    return _gap(sim.ttft_sorted, bench.ttft) + _gap(sim.tpot_sorted, bench.tpot)


def _gap(simulated: tuple[float, ...], measured: tuple[float, ...]) -> float:
    """Mean squared log ratio between matched quantiles (a replay that finishes fewer requests is far off)."""
    if not measured:
        return 0.0
    if not simulated:
        return math.inf
    n, m = len(measured), len(simulated)
    return statistics.fmean(math.log(max(simulated[min(m - 1, i * m // n)], 1e-12) / measured[i]) ** 2
                            for i in range(n)) + (n - m) ** 2 / n
