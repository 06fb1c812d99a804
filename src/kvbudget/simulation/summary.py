"""Calibrating on the result block `vllm bench serve` (and `benchmarks/benchmark_serving.py` before it) prints, as
people paste it: one or more blocks in a text file, with whatever text surrounds them.

A block says how many requests completed, their total prompt and output tokens, and the mean, median and
percentiles of TTFT and TPOT; not each request. The run is rebuilt from what it says: that many requests, each
with the mean prompt and output length (as `--dataset-name random` sends them), arriving all at once
(`--request-rate inf`, the default, which the block does not print), or at the configured rate (Poisson, seed 0),
or, under `--max-concurrency C`, the first C at once and the rest at the measured request throughput (the closed
loop's steady state, approximated). Two scales of the time model (what a step reads and what it computes) are
searched until the replays' mean TTFT and mean TPOT match the measured ones (`fit.calibrate_summaries`): one run
gives two equations, so two scales; a second run at light load also fits the time a request spends outside the
engine.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError

HEADER = "Serving Benchmark Result"
MAX_BLOCKS = 16  # result blocks in one file: each is replayed about a hundred times by the fit
MAX_BLOCK_REQUESTS = 20_000  # requests one block may rebuild (a replay each, about a hundred replays a block)
REQUIRED = {"Successful requests": "completed", "Benchmark duration (s)": "duration",
            "Total input tokens": "input_tokens", "Total generated tokens": "output_tokens",
            "Mean TTFT (ms)": "ttft_ms", "Mean TPOT (ms)": "tpot_ms"}
RATE = ("Request rate configured (RPS)", "Traffic request rate")  # vLLM since 0.7; older ones and SGLang
CONCURRENCY = ("Maximum request concurrency", "Max request concurrency")  # vLLM; SGLang
_CLOSE = re.compile(r"^[\s>|]*={20,}\s*$")  # the line of "=" that ends a block
_ROW = re.compile(r"^[\s>|]*([A-Za-z][^:]*?)\s*:\s*(\S+)\s*\|?\s*$")


@dataclass(frozen=True, kw_only=True)
class BenchSummary:
    """What one printed result block says of a run."""

    line: int  # where the block starts in its file
    completed: int
    failed: int
    duration: float  # seconds
    input_tokens: int
    output_tokens: int
    ttft: float  # mean, seconds
    tpot: float  # mean, seconds (of the requests with more than one output token)
    rate: float  # configured requests per second; inf: all at once
    concurrency: int | None  # --max-concurrency, where given

    @property
    def prompt_mean(self) -> int:
        return max(1, round(self.input_tokens / self.completed))

    @property
    def output_mean(self) -> int:
        return max(1, round(self.output_tokens / self.completed))

    def arrivals(self) -> str:
        """How the replay's arrivals are rebuilt, in words."""
        if self.concurrency is not None and self.concurrency < self.completed:
            return (f"the first {self.concurrency} at once, the rest at the measured "
                    f"{self.completed / self.duration:.2f} req/s (--max-concurrency {self.concurrency})")
        return "all at once" if math.isinf(self.rate) else f"Poisson at {self.rate:g} req/s"

    def requests(self) -> tuple[Request, ...]:
        """The run rebuilt: `completed` requests of the mean lengths, arriving as `arrivals` says."""
        n, prompt, output = self.completed, self.prompt_mean, self.output_mean
        if self.concurrency is not None and self.concurrency < n:
            gap = self.duration / n
            times = [0.0 if i < self.concurrency else (i - self.concurrency + 1) * gap for i in range(n)]
        elif math.isinf(self.rate):
            times = [0.0] * n
        else:
            rng, t, times = random.Random(0), 0.0, []
            for _ in range(n):
                times.append(t)
                t += rng.expovariate(self.rate)
        return tuple(Request(arrival=a, prompt_tokens=prompt, output_tokens=output, id=str(i))
                     for i, a in enumerate(times))


def is_summary(text: str) -> bool:
    """Whether `text` holds a printed result block (or what is left of one)."""
    return HEADER in text or "Mean TTFT (ms)" in text


def read_summaries(text: str, name: str) -> tuple[BenchSummary, ...]:
    """Every result block in `text` (a file's, named `name`), surrounding text left aside."""
    lines = text.splitlines()  # \r\n and \n alike
    starts = [i for i, line in enumerate(lines) if HEADER in line] or [0]
    if len(starts) > MAX_BLOCKS:
        raise KVBudgetError(f"calibrate {name}: {len(starts)} result blocks; at most {MAX_BLOCKS} (each is replayed "
                            "about a hundred times): keep the runs you want fitted", param="calibrate")
    out, after = [], 0  # `after`: where the text after the last block's closing line begins
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        close = next((i for i in range(start + 1, end) if _CLOSE.match(lines[i])), end - 1)
        out.append(_block(lines[start:close + 1], lines[after:start], start + 1, name))
        after = close + 1  # without a closing line, the block runs to the next: nothing is printed before that
    return tuple(out)


def _block(lines: Sequence[str], before: Sequence[str], line: int, name: str) -> BenchSummary:
    """One block's rows, and the rate and concurrency older releases print just before it (in `before`, the text
    since the previous block's closing line)."""
    rows: dict[str, str] = {}
    for text in before:  # the latest wins
        m = _ROW.match(text)
        if m and m.group(1) in (*RATE, *CONCURRENCY):
            rows[m.group(1)] = m.group(2)
    for text in lines:  # the block's own rows win over those before it
        m = _ROW.match(text)
        if m:
            rows[m.group(1)] = m.group(2)
    missing = [label for label in REQUIRED if label not in rows]
    where = f"calibrate {name}:{line}"
    if missing:
        raise KVBudgetError(f"{where}: not a whole `vllm bench serve` result block: no {', '.join(missing)} "
                            "line; paste the block as printed, from its '== Serving Benchmark Result ==' line to "
                            "the end of its Time per Output Token section", param="calibrate")
    values = {field: _number(rows[label], label, where) for label, field in REQUIRED.items()}
    completed = _count(values["completed"], "Successful requests", where, 1, MAX_BLOCK_REQUESTS)
    rate_text = next((rows[k] for k in RATE if k in rows), "inf")
    rate = _number(rate_text, RATE[0], where) if rate_text.lower() != "inf" else math.inf
    concurrency_text = next((rows[k] for k in CONCURRENCY if k in rows), None)
    concurrency = None
    if concurrency_text is not None and concurrency_text.isdigit():
        concurrency = _count(float(concurrency_text), CONCURRENCY[0], where, 1, 2**31 - 1)
    summary = BenchSummary(
        line=line, completed=completed,
        failed=_count(_number(rows.get("Failed requests", "0"), "Failed requests", where), "Failed requests", where),
        duration=values["duration"], input_tokens=_count(values["input_tokens"], "Total input tokens", where, 1),
        output_tokens=_count(values["output_tokens"], "Total generated tokens", where, 1),
        ttft=values["ttft_ms"] / 1000, tpot=values["tpot_ms"] / 1000, rate=rate, concurrency=concurrency)
    for label, value in (("Benchmark duration (s)", summary.duration), ("Mean TTFT (ms)", summary.ttft),
                         (RATE[0], summary.rate)):
        if not value > 0:
            raise KVBudgetError(f"{where}: {label} {value:g}: a run this block rebuilds needs it above 0",
                                param="calibrate")
    if summary.output_mean > 1 and not summary.tpot > 0:
        raise KVBudgetError(f"{where}: Mean TPOT (ms) 0 with {summary.output_mean} output tokens a request on "
                            "average: a block of a run that streamed its tokens is needed", param="calibrate")
    return summary


def _number(text: str, label: str, where: str) -> float:
    """A finite number of 0 or more (what every row the fit reads holds; a rate of inf is read before this)."""
    try:
        value = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise KVBudgetError(f"{where}: {label} {text[:40]!r}: expected a number of 0 or more", param="calibrate")
    return value


def _count(value: float, label: str, where: str, least: int = 0, most: int = 2**31 - 1) -> int:
    if value != int(value) or not least <= value <= most:
        raise KVBudgetError(f"{where}: {label} {value:g}: expected a whole number from {least:,} to {most:,}",
                            param="calibrate")
    return int(value)
