"""Workloads for the simulator: real traces, our own JSONL, OpenAI request logs, synthetic arrivals.

Every reader yields `Request`s in arrival order, one line at a time (a trace is never held whole), and names
the file and line of anything it cannot read. Arrival times are seconds from the trace's first request.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol

from kvbudget import validate
from kvbudget.errors import KVBudgetError
from kvbudget.files import parse_json_text, read_lines


class CountsLines(Protocol):
    """What counts a request log's prompts (`kvbudget.tokens.PromptCounter`): each JSON line's prompt tokens,
    its max_tokens (or None) and its body."""

    def count_lines(self, lines: Iterable[str]) -> Iterator[tuple[int, int | None, dict[str, Any]]]: ...

MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces (FAST'25 release README)


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request: when it arrives, how long its prompt is, how many tokens it generates.

    `prefix` names the prompt's shared pieces from its start, as (content id, tokens): two requests whose pieces
    agree hold identical tokens there, so the prefix cache can reuse them; the rest of the prompt is unique.
    """

    arrival: float  # seconds
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[tuple[Any, int], ...] = ()
    id: str = ""
    max_tokens: int | None = None  # what the client asked for, where known (output_tokens <= max_tokens)
    n: int = 1  # samples (vLLM runs n > 1 as n child sequences sharing the prompt); the beam width with beams
    beam_search: bool = False  # vLLM's API-layer beam search (use_beam_search): one engine request per beam per token
    session: str = ""  # the conversation or user it belongs to, where the trace says (a session router keys on it)

    @property
    def shared_tokens(self) -> int:
        return sum(n for _, n in self.prefix)


def samples(r: Request, key: Any) -> list[Request]:
    """A request of n > 1 samples as the n sequences vLLM's engine runs: the same prompt (its unique part now a
    piece named by `key`, so the prefix cache can share it) and each its own output."""
    if r.n == 1:
        return [r]
    shared = r.shared_tokens
    prompt = r.prefix + (((("prompt", key), r.prompt_tokens - shared),) if r.prompt_tokens > shared else ())
    child = Request(arrival=r.arrival, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, prefix=prompt,
                    id=r.id, max_tokens=r.max_tokens)
    return [child] * r.n


class TraceError(KVBudgetError):
    """A trace line that cannot be read."""

    def __init__(self, path: str, line: int, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}", param="trace")


MAX_TRACE_TOKENS = 1 << 24  # a prompt or output of one request: the longest context any model takes (2^24)
MAX_TRACE_LINE_BYTES = 1 << 20  # a Mooncake line of a 2^24-token prompt lists 32,768 hash ids: about 300 KB


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else f"<{value.bit_length()}-bit int>"
    return text if len(text) <= 40 else text[:37] + "..."


def _count(value: Any, path: str, line: int, field: str, allow_zero: bool = False) -> int:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        raise TraceError(path, line, f"{field} {_shown(value)} is not a number of tokens") from None
    if (not math.isfinite(number) or number != int(number) or number < (0 if allow_zero else 1)
            or number > MAX_TRACE_TOKENS):
        least = 0 if allow_zero else 1
        raise TraceError(path, line, f"{field} {_shown(value)} must be a whole number from {least} to "
                         f"{MAX_TRACE_TOKENS:,}")
    return int(number)


def _seconds(value: Any, path: str, line: int, field: str) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        raise TraceError(path, line, f"{field} {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise TraceError(path, line, f"{field} {value!r} must be a time ≥ 0")
    return number


def _ordered(requests: Iterator[tuple[int, Request]], path: str) -> Iterator[Request]:
    """Rebase arrivals on the first request and insist on arrival order (simulating needs it)."""
    first: float | None = None
    last = 0.0
    line = 1
    for line, r in requests:
        if first is None:
            first = r.arrival
        at = r.arrival - first
        if at < last - 1e-9:
            raise TraceError(path, line, f"arrives at {r.arrival} s, before the line above it; sort the trace by "
                             "arrival time")
        last = at
        yield Request(arrival=at, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, prefix=r.prefix,
                      id=r.id, max_tokens=r.max_tokens, n=r.n, beam_search=r.beam_search)
    if first is None:  # a header alone, or blank lines: nothing to run, which would be an empty report
        raise TraceError(path, line, "no requests in the trace (a header or blank lines only)")


def read_azure(path: str | Path) -> Iterator[Request]:
    """The Azure LLM inference trace CSV: TIMESTAMP (date and time), ContextTokens, GeneratedTokens."""
    name = str(path)

    def rows() -> Iterator[tuple[int, Request]]:
        reader = csv.reader(_lines(path))
        done = 0  # lines read into whole rows (a quoted field may take more than one)
        try:
            header = next(reader, None)
            want = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
            if header is None or [h.strip() for h in header[:3]] != want:
                raise TraceError(name, 1, f"expected the Azure trace header {','.join(want)}, found "
                                 f"{_shown(header)}")
            done = reader.line_num
            for row in reader:
                line = done = reader.line_num
                if len(row) < 3:
                    raise TraceError(name, line, f"expected 3 columns, found {len(row)}")
                try:
                    stamp = datetime.fromisoformat(row[0].strip()[:26]).replace(tzinfo=timezone.utc).timestamp()
                except ValueError:
                    raise TraceError(name, line, f"TIMESTAMP {_shown(row[0])} is not a date and time") from None
                yield line, Request(arrival=stamp, prompt_tokens=_count(row[1], name, line, "ContextTokens"),
                                    output_tokens=_count(row[2], name, line, "GeneratedTokens"), id=f"{line}")
        except csv.Error as exc:  # a quoted field that runs on past the field size limit: named where it starts
            raise TraceError(name, done + 1, f"not the Azure CSV ({exc})") from None

    return _ordered(rows(), name)


def read_jsonl(path: str | Path) -> Iterator[Request]:
    """Mooncake's JSONL (timestamp ms, input_length, output_length, hash_ids per 512 tokens) or ours:
    {"arrival": s, "prompt_tokens": n, "output_tokens": n, "prefix": "id", "prefix_tokens": n, "id": "...",
    "max_tokens": n (what the client asked for; the guard in the loop predicts with it), "n": samples (the beam
    width with "beam_search": true)}."""
    name = str(path)

    def rows() -> Iterator[tuple[int, Request]]:
        for line, text in enumerate(_lines(path), 1):
            if not text.strip():
                continue
            obj = parse_json_text(text, f"{name}:{line}", "trace", "trace line")
            if not isinstance(obj, dict):
                raise TraceError(name, line, "expected a JSON object")
            yield line, (_mooncake(obj, name, line) if "input_length" in obj else _ours(obj, name, line))

    return _ordered(rows(), name)


def _mooncake(obj: dict, path: str, line: int) -> Request:
    for field in ("timestamp", "input_length", "output_length"):
        if field not in obj:
            raise TraceError(path, line, f"Mooncake line without {field!r}")
    prompt = _count(obj["input_length"], path, line, "input_length")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or len(ids) * MOONCAKE_BLOCK < prompt or not all(type(h) is int for h in ids):
        raise TraceError(path, line, f"hash_ids must list one integer id per {MOONCAKE_BLOCK} prompt tokens")
    whole, rest = divmod(prompt, MOONCAKE_BLOCK)  # pieces by id (ints: no other reader's ids are ints)
    pieces = tuple(zip(ids[:whole], repeat(MOONCAKE_BLOCK))) + (((ids[whole], rest),) if rest else ())
    return Request(arrival=_seconds(obj["timestamp"], path, line, "timestamp") / 1000, prompt_tokens=prompt,
                   output_tokens=_count(obj["output_length"], path, line, "output_length"), prefix=pieces, id=str(line))


def _ours(obj: dict, path: str, line: int) -> Request:
    for field in ("arrival", "prompt_tokens", "output_tokens"):
        if field not in obj:
            raise TraceError(path, line, f"missing {field!r} (a line needs arrival, prompt_tokens, output_tokens)")
    prompt = _count(obj["prompt_tokens"], path, line, "prompt_tokens")
    pieces: tuple[tuple[Any, int], ...] = ()
    if "prefix" in obj:
        shared = _count(obj.get("prefix_tokens"), path, line, "prefix_tokens")
        if shared > prompt:
            raise TraceError(path, line, f"prefix_tokens {shared} is longer than prompt_tokens {prompt}")
        pieces = ((("id", str(obj["prefix"])), shared),)
    output = _count(obj["output_tokens"], path, line, "output_tokens")
    asked = None
    if obj.get("max_tokens") is not None:
        asked = _count(obj["max_tokens"], path, line, "max_tokens")
        if asked < output:
            raise TraceError(path, line, f"max_tokens {asked} is below output_tokens {output}")
    n = _count(obj.get("n", 1), path, line, "n")
    return Request(arrival=_seconds(obj["arrival"], path, line, "arrival"), prompt_tokens=prompt, output_tokens=output,
                   prefix=pieces, id=str(obj.get("id", line)), max_tokens=asked, n=n,
                   beam_search=_flag(obj.get("beam_search", False), path, line),
                   session=_session(obj.get("session", ""), path, line))


def _session(value: Any, path: str, line: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TraceError(path, line, f"session {_shown(value)} must be a string or a whole number (a conversation's "
                         "or user's name)")
    return str(value)


def _flag(value: Any, path: str, line: int) -> bool:
    if not isinstance(value, bool):
        raise TraceError(path, line, f"beam_search {value!r} must be true or false")
    return value


def _lines(path: str | Path) -> Generator[str, None, None]:
    """A trace's lines, each within MAX_TRACE_LINE_BYTES and UTF-8 (else one error naming the file and line)."""
    return read_lines(path, "trace", "trace", MAX_TRACE_LINE_BYTES)


def read_trace(path: str | Path) -> Iterator[Request]:
    """A trace by its contents: the Azure CSV, or JSONL (Mooncake's or ours); `path` may name a bundled trace
    (`azure-conv-2023`, see `kvbudget traces`)."""
    from kvbudget.traces import resolve

    p = Path(resolve(str(path)))
    lines = _lines(p)
    try:
        head = next(lines, "")
    finally:
        lines.close()
    if head.startswith("TIMESTAMP"):
        return read_azure(p)
    if head.lstrip().startswith("{"):
        return read_jsonl(p)
    raise TraceError(str(path), 1, "not a trace: expected the Azure CSV header (TIMESTAMP,ContextTokens,"
                     "GeneratedTokens) or JSON lines")


def rescale(requests: Iterable[Request], rate_scale: float = 1.0, start: int = 0,
            count: int | None = None) -> Iterator[Request]:
    """Replay `count` requests from the `start`-th, arriving `rate_scale` times as often (times divided by it)."""
    validate.number(rate_scale, "rate_scale")
    validate.count(start, "start")
    if count is not None:
        validate.positive(count, "count", "requests")
    return _rescaled(requests, rate_scale, start, count)


def _rescaled(requests: Iterable[Request], rate_scale: float, start: int, count: int | None) -> Iterator[Request]:
    first: float | None = None
    for i, r in enumerate(requests):
        if i < start:
            continue
        if count is not None and i >= start + count:
            return
        if first is None:
            first = r.arrival
        yield Request(arrival=(r.arrival - first) / rate_scale, prompt_tokens=r.prompt_tokens,
                      output_tokens=r.output_tokens, prefix=r.prefix, id=r.id,
                      max_tokens=r.max_tokens, n=r.n, beam_search=r.beam_search)


def request_log(path: str | Path, counter: CountsLines, lengths: Lengths, rate: float | None = None, seed: int = 0,
                cv: float = 1.0) -> Iterator[Request]:
    """An OpenAI chat request log (JSON Lines, as `kvbudget tokens` reads it) with prompt lengths counted exactly
    by `counter` (a `kvbudget.tokens.PromptCounter`). A request generates its max_tokens (or
    max_completion_tokens); one without either draws an output length from `lengths`. Arrivals come from each
    line's "arrival" (seconds) where every line has one, else at `rate` per second (Poisson, or gamma of `cv`)."""
    name = str(path)
    check_arrivals(rate, seed, cv)
    rng = random.Random(seed)
    gaps = _gaps(rate, cv, rng) if rate is not None else None

    def rows() -> Iterator[tuple[int, Request]]:
        t = 0.0
        for line, (prompt, max_tokens, body) in enumerate(counter.count_lines(read_lines(name, "request_log")), 1):
            if gaps is None:
                if "arrival" not in body:
                    raise TraceError(name, line, "no 'arrival' (seconds) in this request: give every line one, "
                                     "or a rate for synthetic arrivals")
                t = _seconds(body["arrival"], name, line, "arrival")
            elif line > 1:
                t += next(gaps)
            output = max_tokens if max_tokens else lengths(rng)[1]
            n = _count(body.get("n", 1), name, line, "n")
            beams = _flag(body.get("use_beam_search", False), name, line)
            yield line, Request(arrival=t, prompt_tokens=max(prompt, 1), output_tokens=output,
                                id=str(body.get("id", line)), max_tokens=max_tokens, n=n,
                                beam_search=beams)

    return _ordered(rows(), name)


MAX_CV = 100.0  # inter-arrival variation: 1 is Poisson, 2 to 4 bursty production traffic; past 100, one burst
MAX_SEED = validate.MAX_SEED  # a random seed: 64 bits
MAX_CLIENTS = 1_000_000  # a closed loop's clients (max_concurrency): one float each while it runs
MAX_REQUESTS = 10_000_000  # synthetic requests: each completed one is kept (~200 bytes), so a run stays under ~2 GB


def check_arrivals(rate: float | None, seed: int, cv: float) -> None:
    """Arrivals at `rate` per second (None: the requests' own), of variation `cv`, drawn with `seed`."""
    if rate is not None:
        validate.number(rate, "rate")
    validate.count(seed, "seed", 0, MAX_SEED)
    validate.number(cv, "cv", 0.0, MAX_CV)


def _gaps(rate: float, cv: float, rng: random.Random) -> Iterator[float]:
    shape = 1 / (cv * cv)
    while True:
        yield rng.gammavariate(shape, 1 / (rate * shape))


# -- synthetic ---------------------------------------------------------------------------------------------------

Lengths = Callable[[random.Random], tuple[int, int]]


def exponential_lengths(prompt_mean: float, output_mean: float, max_total: int | None = None) -> Lengths:
    """Geometric (discrete exponential) lengths with these means, each at least 1, clipped to `max_total`."""
    def draw(rng: random.Random) -> tuple[int, int]:
        p = max(1, round(rng.expovariate(1 / prompt_mean)))
        o = max(1, round(rng.expovariate(1 / output_mean)))
        if max_total is not None and p + o > max_total:
            p = min(p, max_total - 1)
            o = max_total - p
        return p, o
    return draw


def sampled_lengths(pool: Sequence[tuple[int, int]]) -> Lengths:
    """(prompt, output) pairs drawn with replacement from a trace's requests."""
    if not pool:
        raise KVBudgetError("the trace to sample lengths from has no requests", param="lengths")
    return lambda rng: pool[rng.randrange(len(pool))]


def synthetic(rate: float, count: int, lengths: Lengths, seed: int = 0, cv: float = 1.0) -> Iterator[Request]:
    """`count` requests arriving at `rate` per second: Poisson (cv = 1) or gamma inter-arrivals of that
    coefficient of variation (cv > 1 bursty, < 1 regular)."""
    check_arrivals(rate, seed, cv)
    validate.positive(count, "count", "requests", MAX_REQUESTS)
    return _synthetic(rate, count, lengths, seed, cv)


def _synthetic(rate: float, count: int, lengths: Lengths, seed: int, cv: float) -> Iterator[Request]:
    rng = random.Random(seed)
    gaps = _gaps(rate, cv, rng)
    t = 0.0
    for i in range(count):
        if i:
            t += next(gaps)
        p, o = lengths(rng)
        yield Request(arrival=t, prompt_tokens=p, output_tokens=o, id=str(i))
