"""The trace readers under random input (issue 50): random bytes, and the bundled traces' own lines mutated, give a
clear KVBudgetError naming the file and line, or requests within the limits (and, for the lines before the
mutation, the requests those lines hold), never another exception, in bounded time and memory."""

from __future__ import annotations

import json
import math
import tempfile
import time
import tracemalloc
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import TRACES

from kvbudget.engines.scheduling.workload import MAX_TRACE_TOKENS, Request, read_trace
from kvbudget.errors import KVBudgetError

FOLDER = Path(tempfile.mkdtemp(prefix="kvbudget-trace-fuzz-"))
# past 8 KB each: a reader that decodes text in blocks meets a mutated line's bytes only there
AZURE = (TRACES / "AzureLLMInferenceTrace_conv.csv").read_bytes().splitlines(keepends=True)[:300]
MOONCAKE = (TRACES / "mooncake_conversation_trace.jsonl").read_bytes().splitlines(keepends=True)[:60]


def _read(content: bytes) -> list[Request] | None:
    """The requests in `content`, or None where the reader refused it in one line naming the file and a line."""
    path = FOLDER / "trace.txt"
    path.write_bytes(content)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        requests = list(read_trace(path))
    except KVBudgetError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith(f"{path}:") and text[len(f"{path}:")].isdigit(), text
        assert exc.param == "trace"
        return None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert time.perf_counter() - start < 2 and peak < 4 << 20
    assert requests and requests[0].arrival == 0
    for before, r in pairwise(requests):
        assert before.arrival <= r.arrival + 1e-9  # the order the readers insist on
    for r in requests:
        assert math.isfinite(r.arrival)
        assert 1 <= r.prompt_tokens <= MAX_TRACE_TOKENS and 1 <= r.output_tokens <= MAX_TRACE_TOKENS
        assert r.shared_tokens <= r.prompt_tokens
    return requests


def _expected(lines: list[bytes]) -> dict[str, tuple[float, int, int]]:
    """id: (seconds since the first line, prompt, output) of intact trace lines, read here by their formats' own
    descriptions (the Azure CSV's TIMESTAMP to the microsecond; Mooncake's timestamp in milliseconds)."""
    if lines[0].startswith(b"TIMESTAMP"):
        rows = [line.decode().strip().split(",") for line in lines[1:]]
        stamps = [datetime.strptime(row[0][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp() for row in rows]
        return {str(i): (s - stamps[0], int(row[1]), int(row[2]))
                for i, (s, row) in enumerate(zip(stamps, rows, strict=True), 2)}
    objs = [json.loads(line) for line in lines]
    return {str(i): ((o["timestamp"] - objs[0]["timestamp"]) / 1000, o["input_length"], o["output_length"])
            for i, o in enumerate(objs, 1)}


@settings(max_examples=150, deadline=None)
@given(head=st.sampled_from([b"", AZURE[0], AZURE[0] + AZURE[1], MOONCAKE[0]]), noise=st.binary(max_size=600))
def test_random_bytes(head, noise):
    _read(head + noise)


MUTATIONS = st.one_of(
    st.tuples(st.just("replace"), st.binary(max_size=40)),
    st.tuples(st.just("insert"), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("insert"), st.sampled_from([b"\xff", b"\x00", b"\n", b'"', b",", b"[" * 70, b"9" * 5000,
                                                   b"-", b"1e400", b"NaN", b"{", b"}"])),
    st.tuples(st.just("delete"), st.binary(min_size=1, max_size=1)),
    st.tuples(st.just("truncate"), st.just(b"")),
)


@settings(max_examples=200, deadline=None)
@given(source=st.sampled_from([AZURE, MOONCAKE]), data=st.data(), mutation=MUTATIONS)
def test_mutated_real_lines(source, data, mutation):
    count = data.draw(st.integers(2, len(source)), label="lines")
    lines = list(source[:count])
    k = data.draw(st.integers(0, count - 1), label="line")
    at = data.draw(st.integers(0, len(lines[k])), label="at")
    kind, stuff = mutation
    line = lines[k]
    lines[k] = {"replace": lambda: stuff, "insert": lambda: line[:at] + stuff + line[at:],
                "delete": lambda: line[:at] + line[at + int.from_bytes(stuff or b"\x01", "big") % 20 + 1:],
                "truncate": lambda: line[:at]}[kind]()
    requests = _read(b"".join(lines))
    first = 1 if source is AZURE else 0  # the first line holding a request
    if requests is None or k <= first:
        return
    expected = _expected(source[:k])
    got = {r.id: (r.arrival, r.prompt_tokens, r.output_tokens) for r in requests if r.id in expected}
    assert got.keys() == expected.keys()
    for key, (arrival, prompt, output) in expected.items():
        assert got[key][1:] == (prompt, output) and abs(got[key][0] - arrival) < 1e-6
