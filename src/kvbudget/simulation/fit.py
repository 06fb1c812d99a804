"""Calibrating the time model on a benchmark run's per-request timings (`vllm bench serve --save-result
--save-detailed`), or on the latency histograms of vLLM's /metrics after it served a known trace: the step-time
parts that make the simulated latencies match the measured ones.

The run's own requests (start times, prompt and output lengths) are replayed through the simulator, and the
three parts of a calibrated step (a fixed part, a part per token attended over, a part per token computed) are
searched, by coordinate steps in log space, to bring the simulated TTFT and time-per-output-token
distributions (quantile by quantile, as log ratios) closest to the measured ones. The scheduling in each replay
is exact; the fit is as good as the three-part step time can be, and the docs' accuracy page says how good that is.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvbudget.engines.scheduling.timing import MeasuredStep, TimeModel, read_measured_steps
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError, named
from kvbudget.files import MAX_DOCUMENT_BYTES, read_document, read_json
from kvbudget.model.spec import ModelSpec
from kvbudget.simulation.run import Setup, simulate
from kvbudget.simulation.summary import BenchSummary, is_summary, read_summaries

MEAN_WEIGHT = 10.0  # the mean (_sum / _count) is exact, the buckets coarse: the fit leans on the mean


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram of one latency: cumulative fractions at its finite bounds, and its exact mean."""

    bounds: tuple[float, ...]
    fractions: tuple[float, ...]  # of the observations at or below each bound
    mean: float  # _sum / _count

    def gap(self, values: tuple[float, ...], zeros: int = 0) -> float:
        """How far sorted `values` (and `zeros` observations of 0) are from it: squared differences of the
        cumulative fractions at the bounds, plus the squared log ratio of the means."""
        n = len(values) + zeros
        if not n:
            return math.inf
        mean = sum(values) / n
        if not mean > 0 or not self.mean > 0:
            return math.inf
        shape = sum(((zeros + bisect_right(values, b)) / n - f) ** 2 for b, f in zip(self.bounds, self.fractions,
                                                                                     strict=True))
        return shape + MEAN_WEIGHT * math.log(mean / self.mean) ** 2


@dataclass(frozen=True)
class BenchRun:
    """The completed requests of a benchmark run and what was measured for them."""

    requests: tuple[Request, ...]  # in arrival order; id = their index
    measured: tuple[tuple[float, float | None], ...]  # per request: TTFT, mean inter-token latency (seconds)
    failed: int  # requests the run reports errors for (left out)
    histograms: tuple[Histogram, Histogram] | None = None  # from /metrics: TTFT and time per output token

    @property
    def ttft(self) -> tuple[float, ...]:
        return tuple(sorted(t for t, _ in self.measured))

    @property
    def tpot(self) -> tuple[float, ...]:
        return tuple(sorted(p for _, p in self.measured if p is not None))


TTFT_METRIC = "vllm:time_to_first_token_seconds"
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"  # per request: decode time / (outputs - 1), 0 for one


def read_calibration(path: str | Path, served: Callable[[], Iterable[Request]] | None = None
                     ) -> BenchRun | list[MeasuredStep] | tuple[BenchSummary, ...]:
    """What `--calibrate` was given: a benchmark result (one JSON object with start_times), the result blocks
    `vllm bench serve` prints (pasted text), a scrape of vLLM's /metrics (`served` gives the requests it served),
    or a recorder log."""
    try:
        big = Path(path).stat().st_size > MAX_DOCUMENT_BYTES  # a recorder log, read line by line
    except OSError as e:
        raise KVBudgetError(f"calibrate {path}: {e.strerror or e}", param="calibrate") from None
    text = "" if big else read_document(path, "calibrate")  # UTF-8 text, nested within bounds
    try:
        data = None if big else json.loads(text)
    except ValueError:  # not one JSON document (or a number past 4,300 digits): the line readers name the line
        data = None  # JSON Lines, Prometheus text (or neither: the recorder-log reader names the line)
    if isinstance(data, dict) and "start_times" in data:
        return read_bench_result(path)
    if data is None and is_summary(text) and f"{TTFT_METRIC}_bucket" not in text:
        return read_summaries(text, str(path))
    if data is None and f"{TTFT_METRIC}_bucket" in text:
        if served is None:
            raise KVBudgetError(f"calibrate {path}: vLLM's metrics say how long requests took, not which requests; "
                                f"give the trace the server served ({named('trace', 'FILE')})", param="calibrate")
        return read_metrics(path, tuple(served()))
    return read_measured_steps(path)


def read_metrics(path: str | Path, requests: tuple[Request, ...]) -> BenchRun:
    """A Prometheus scrape of vLLM's /metrics taken after it served exactly `requests` (from a fresh start): the
    TTFT and per-request time-per-output-token histograms, spread into one value per request by interpolating
    within buckets (as Prometheus's histogram_quantile does)."""
    name = str(path)
    text = Path(path).read_text(encoding="utf-8")
    ttft = _histogram(text, TTFT_METRIC, name)
    tpot = _histogram(text, TPOT_METRIC, name)
    n = len(requests)
    for metric, buckets in ((TTFT_METRIC, ttft), (TPOT_METRIC, tpot)):
        if round(buckets[-1][1]) != n:
            raise KVBudgetError(f"calibrate {name}: {metric} counts {buckets[-1][1]:.0f} requests, the trace has "
                                f"{n}: scrape a server started fresh that served exactly this trace",
                                param="calibrate")
    if n < 3:
        raise KVBudgetError(f"calibrate {name}: {n} requests; at least 3 are needed", param="calibrate")
    singles = _singles(requests)
    ttfts = _spread(ttft, n)
    tpots = _spread(tpot, n)[singles:]
    measured = tuple((t, tpots[i] if i < len(tpots) else None) for i, t in enumerate(ttfts))
    histograms = (_summary(text, TTFT_METRIC, ttft, name), _summary(text, TPOT_METRIC, tpot, name))
    return BenchRun(tuple(requests), measured, 0, histograms)


def _singles(requests: Iterable[Request]) -> int:
    """Requests of one output token: vLLM observes a time per output token of 0 for them."""
    return sum(1 for r in requests if r.output_tokens <= 1)


def _summary(text: str, metric: str, buckets: list[tuple[float, float]], name: str) -> Histogram:
    total = sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(metric)}_sum(?:{{[^}}]*}})? ([0-9.eE+-]+)$",
                                                          text, re.M))
    count = buckets[-1][1]
    if not total > 0:
        raise KVBudgetError(f"calibrate {name}: no {metric}_sum", param="calibrate")
    finite = [(b, c) for b, c in buckets if b != math.inf]
    return Histogram(tuple(b for b, _ in finite), tuple(c / count for _, c in finite), total / count)


def _histogram(text: str, metric: str, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram, summed over its label sets (one per engine)."""
    counts: dict[float, float] = {}
    pattern = rf"^{re.escape(metric)}_bucket{{([^}}]*)}} ([0-9.eE+-]+|NaN)$"
    for m in re.finditer(pattern, text, re.M):
        le = re.search(r'le="([^"]+)"', m.group(1))
        if le is None:
            continue
        bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
        counts[bound] = counts.get(bound, 0.0) + float(m.group(2))
    if math.inf not in counts:
        raise KVBudgetError(f"calibrate {name}: no {metric} histogram (its _bucket lines with le=\"+Inf\")",
                            param="calibrate")
    return sorted(counts.items())


def _spread(buckets: list[tuple[float, float]], n: int) -> list[float]:
    """n values at the ranks (i + 1/2) / n of a histogram: linear within a bucket, the highest finite bound in
    the +Inf bucket."""
    out = []
    finite = [b for b, _ in buckets if b != math.inf]
    top = finite[-1] if finite else 0.0
    j, lower, below = 0, 0.0, 0.0
    for i in range(n):
        rank = (i + 0.5) / n * buckets[-1][1]
        while buckets[j][1] < rank:
            lower, below = buckets[j][0], buckets[j][1]
            j += 1
        upper, count = buckets[j]
        if upper == math.inf:
            out.append(top)
        else:
            out.append(lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper)
    return out


def read_bench_result(path: str | Path) -> BenchRun:
    """`vllm bench serve --save-result --save-detailed` JSON: start_times, input_lens, output_lens, ttfts, itls."""
    name = str(path)
    data = read_json(path, "calibrate")
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
    requests = tuple(Request(arrival=s - first, prompt_tokens=p, output_tokens=o, id=str(i))
                     for i, (s, p, o, _, _) in enumerate(rows))
    return BenchRun(requests, tuple((r[3], r[4] if r[2] > 1 else None) for r in rows), failed)


def initial_model(bench: BenchRun) -> TimeModel:
    """A starting point for `calibrate_requests` (and a time model for the setup it is given)."""
    return _model(_start(bench), "before calibration")


def _start(bench: BenchRun) -> list[float]:
    tpot = statistics.median(bench.tpot) if bench.tpot else statistics.median(bench.ttft)
    mean_context = statistics.fmean(r.prompt_tokens + r.output_tokens / 2 for r in bench.requests)
    mean_prompt = statistics.fmean(r.prompt_tokens for r in bench.requests)
    return _start_from(tpot, statistics.median(bench.ttft), mean_context, mean_prompt)


def _start_from(tpot: float, ttft: float, mean_context: float, mean_prompt: float) -> list[float]:
    # mostly a fixed step, a little per token: a light start keeps the first replays out of a queueing collapse
    return [0.8 * tpot, 0.1 * tpot / mean_context, 0.3 * ttft / mean_prompt]


def calibrate_requests(model: ModelSpec, bench: BenchRun, setup: Setup) -> TimeModel:
    """The calibrated step time whose replay of `bench` best matches its measured TTFT and TPOT distributions.
    From a GPU's kernel (or roofline) model, two factors are fitted, one on its fixed costs per step and one on
    the rest (what the kernels' bandwidths and throughputs give), and the latency each request spends outside the
    engine; from `initial_model`, the three parts of a summed step. Coordinate steps on their logs, coarse to
    fine, each kept while it lowers the gap. (A request-by-request Gauss-Newton fit was tried: the replayed
    schedule changes in jumps as step times move, and it stalled far from the optimum.)"""
    start = setup.time_model
    n = len(bench.requests)
    if start.bound == "max":
        params = search(lambda p: _loss(model, bench, setup, start.scaled(p[0], p[1], "trial", p[2])),
                        [1.0, 1.0, START_LATENCY_S])
        return start.scaled(params[0], params[1], f"{start.basis}; calibrated on {n} benchmark requests "
                            f"(fixed costs x {params[0]:.2f}, the rest x {params[1]:.2f}, "
                            f"{params[2] * 1000:.1f} ms a request outside the engine)", params[2])
    params = search(lambda p: _loss(model, bench, setup, _model(p, "trial")), _start(bench))
    return _model(params, f"calibrated on {n} benchmark requests")


FACTORS = (4.0, 2.0, 1.4, 1.15, 1.05, 1.02)
START_LATENCY_S = 0.001  # where the search for a request's latency outside the engine starts (it scales it)


def search(loss: Callable[[list[float]], float], params: list[float]) -> list[float]:
    """Positive parameters that lower `loss`: coordinate steps by each of FACTORS in turn, kept while they help."""
    best = loss(params)
    for factor in FACTORS:
        improved = True
        while improved:
            improved = False
            for i in range(len(params)):
                for f in (factor, 1 / factor):
                    trial = list(params)
                    trial[i] *= f
                    value = loss(trial)
                    if value < best:
                        best, params, improved = value, trial, True
    return params


def _model(params: list[float], basis: str) -> TimeModel:
    overhead, per_context, per_token = params
    return TimeModel.fitted(overhead, per_context, per_token, basis)


def _loss(model: ModelSpec, bench: BenchRun, setup: Setup, time_model: TimeModel) -> float:
    sim = simulate(model, iter(bench.requests), setup=replace(setup, time_model=time_model))
    if bench.histograms is not None:
        ttft, tpot = bench.histograms
        return ttft.gap(sim.ttft_sorted) + tpot.gap(sim.tpot_sorted, _singles(bench.requests)) + \
            (len(bench.requests) - sim.completed) ** 2 / len(bench.requests)
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


def initial_summary_model(runs: Sequence[BenchSummary]) -> TimeModel:
    """A three-part step time to scale where the GPU has no kernel model (as fit.initial_model, from means)."""
    run = runs[0]
    return _model(_start_from(run.tpot or run.ttft, run.ttft, run.prompt_mean + run.output_mean / 2,
                              run.prompt_mean), "before calibration")


PRIOR = 1e-3  # a summary fit's pull of each scale towards 1: a scale the runs do not determine stays put
FAR = 5.0  # a summary fit's scale beyond this factor either way is said to be suspect in the basis


def calibrate_summaries(model: ModelSpec, runs: Sequence[BenchSummary], setup: Setup) -> TimeModel:
    """`setup`'s time model with what a step reads (weights, KV cache, fixed costs: what decoding waits on) and
    what it computes (per token and per attended pair: what a prompt's prefill waits on) each scaled, and, from
    two runs on, a latency outside the engine, so that the replays of `runs` give their measured mean TTFT and
    mean TPOT (squared log ratios; a replay that leaves requests unfinished is far off)."""
    start = setup.time_model
    rebuilt = [run.requests() for run in runs]
    three = len(runs) > 1

    def loss(p: list[float]) -> float:
        total, tm = 0.0, by_kind(start, p[0], p[1], "trial", p[2] if three else 0.0)
        for run, requests in zip(runs, rebuilt, strict=True):
            sim = simulate(model, iter(requests), setup=replace(setup, time_model=tm))
            if sim.ttft is None:
                return math.inf
            total += math.log(sim.ttft.mean / run.ttft) ** 2 + (len(requests) - sim.completed) ** 2 / len(requests)
            if run.tpot > 0 and sim.tpot is not None:
                total += math.log(sim.tpot.mean / run.tpot) ** 2
        return total

    p = search(lambda p: loss(p) + PRIOR * (math.log(p[0]) ** 2 + math.log(p[1]) ** 2),
               [1.0, 1.0, START_LATENCY_S] if three else [1.0, 1.0])
    outside = f", {p[2] * 1000:.1f} ms a request outside the engine" if three else \
        "; one run fits these two, a second at light load also the time a request spends outside the engine"
    if not all(1 / FAR < x < FAR for x in p[:2]):
        outside += (f"; a scale beyond {FAR:g}x of the model's: the run rebuilt may not be the one measured "
                    "(lengths that varied: calibrate on its --save-detailed JSON)")
    replays = "; ".join(f"line {r.line}: {r.completed} requests of {r.prompt_mean} + {r.output_mean} tokens, "
                        f"{r.arrivals()}" for r in runs)
    return by_kind(start, p[0], p[1], f"{start.basis}; calibrated on the mean TTFT and TPOT of {len(runs)} printed "
                   f"benchmark result{'s' if three else ''} (reading x {p[0]:.2f}, computing x {p[1]:.2f}{outside}; "
                   f"replayed as {replays})", p[2] if three else 0.0)


def by_kind(tm: TimeModel, read: float, compute: float, basis: str, request_latency: float = 0.0) -> TimeModel:
    """`tm` with what a step reads and its fixed costs times `read`, what it computes times `compute`."""
    return replace(tm, weights=tm.weights * read, per_context=tm.per_context * read, overhead=tm.overhead * read,
                   context_cost=tm.context_cost * read, seq_cost=tm.seq_cost * read, experts=tm.experts * read,
                   per_token=tm.per_token * compute, token_cost=tm.token_cost * compute,
                   pair_cost=tm.pair_cost * compute, request_latency=request_latency, basis=basis)
