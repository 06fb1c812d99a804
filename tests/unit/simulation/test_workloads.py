"""Reading workloads: the bundled traces, our JSONL, synthetic arrivals, and a bad line named by file and line."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
from simkit import LLAMA, TRACES

from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import exponential_lengths, read_trace, synthetic
from kvbudget.simulation.run import simulate


@pytest.mark.parametrize("text, where", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\nnot a date,1,2\n", ":3: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,abc,44\n", ":2: ContextTokens 'abc'"),
    ('{"arrival": 0, "prompt_tokens": 5, "output_tokens": 2}\n{"arrival": 1, "prompt_tokens": 0, '
     '"output_tokens": 2}\n', ":2: prompt_tokens 0"),
    ('{"arrival": 1, "prompt_tokens": 5, "output_tokens": 2}\n{"arrival": 0.5, "prompt_tokens": 5, '
     '"output_tokens": 2}\n', ":2: arrives"),
    ('{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1]}\n', ":1: hash_ids"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, [2]]}\n', ":1: hash_ids must list "
     "one integer id"),
    ('{"arrival": 0, "prompt_tokens": 5}\n', ":1: missing 'output_tokens'"),
    ("{not json\n", ":1: invalid JSON at column 2"),
    ("hello\n", ":1: not a trace"),
])
def test_a_bad_trace_line_is_named_by_file_and_line(tmp_path, text, where):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(KVBudgetError) as e:
        list(read_trace(path))
    assert f"{path}{where}" in str(e.value)

AZURE_HEAD = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = b"2023-11-16 18:15:46.6805900,374,44\n"
OURS_ROW = b'{"arrival": 0, "prompt_tokens": 5, "output_tokens": 2}\n'


@pytest.mark.parametrize("content, where", [
    (AZURE_HEAD + AZURE_ROW * 1000 + b"2023-11-16 18:15:47.0,\xff\xfe,2\n", ":1002: not UTF-8 text"),  # past 8 KB
    (OURS_ROW * 1000 + b'{"arrival": 1, "prompt_tokens": "\xc3", "output_tokens": 2}\n', ":1001: not UTF-8 text"),
    (AZURE_HEAD + AZURE_ROW + b"\x00\x01\x02,1,2\n" + AZURE_ROW, ":3: not UTF-8 text"),  # NUL: a binary file
    (OURS_ROW * 2 + b"\xff\xd8\xff\xe0 JFIF\n", ":3: not UTF-8 text"),
    (AZURE_HEAD + AZURE_ROW + b'"2023-11-16 18:15:47.0,1,2\n' + b"x" * 200_000 + b"\n", ":3: not the Azure CSV"),
    (OURS_ROW + b'{"arrival": 1, "prompt_tokens": ' + b"9" * 5000 + b', "output_tokens": 2}\n',
     ":2: invalid JSON: a number of over 4,300 digits"),
    (OURS_ROW + b'{"arrival": [' + b"[" * 100_000 + b"\n", ":2: nests [ and { more than 64 levels deep"),
    (OURS_ROW + b'{"arrival": 1, "prompt_tokens": 5, "output_tokens": 2, "pad": "' + b"x" * (2 << 20) + b'"}\n',
     ":2: a line longer than 1,048,576 bytes"),
])
def test_a_malformed_trace_is_one_line_naming_the_file_and_line(tmp_path, content, where):
    """Bytes that are not text, a quoted CSV field running on, a JSON line too deep, too long or with a number of
    5,000 digits: one KVBudgetError naming the file and line (a UnicodeDecodeError, csv.Error or RecursionError
    escaped the readers before)."""
    path = tmp_path / "trace.txt"
    path.write_bytes(content)
    with pytest.raises(KVBudgetError) as e:
        list(read_trace(path))
    assert str(e.value).startswith(f"{path}{where}") and "\n" not in str(e.value) and e.value.param == "trace"


@pytest.mark.parametrize("head", [b"", AZURE_HEAD, OURS_ROW])
def test_a_line_without_end_is_not_read_whole(tmp_path, head):
    """64 MiB without a newline (a binary file; 1 GB reads the same) is refused after its first MiB: bounded time
    and memory, on the first line (where the format is told) and on a later one."""
    path = tmp_path / "trace.jsonl"
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + (64 << 20))  # sparse: NUL bytes the disk does not hold
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KVBudgetError, match=f"trace.jsonl:{2 if head else 1}: a line longer than 1,048,576"):
            list(read_trace(path))
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 8 << 20 and time.perf_counter() - start < 2


def test_readers_take_the_real_traces_whole():
    azure = list(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"))
    assert len(azure) == 19366 and azure[0].arrival == 0 and azure[0].prompt_tokens == 374
    assert f"{len(azure) / azure[-1].arrival:.2f}" == "5.53"  # requests per second, as the trace README says
    moon = list(read_trace(TRACES / "mooncake_conversation_trace.jsonl"))
    assert len(moon) == 12031
    assert moon[0].shared_tokens == moon[0].prompt_tokens == 6758  # hash ids cover the prompt
    ours = Path(TRACES.parent / "nonexistent.jsonl")
    with pytest.raises(KVBudgetError, match="nonexistent.jsonl"):
        list(read_trace(ours))

def test_own_jsonl_with_a_shared_prefix(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"arrival": 0.5, "prompt_tokens": 300, "output_tokens": 20, "prefix": "sys", "prefix_tokens": 256},
        {"arrival": 0.7, "prompt_tokens": 400, "output_tokens": 20, "prefix": "sys", "prefix_tokens": 256}]))
    reqs = list(read_trace(path))
    assert [r.arrival for r in reqs] == [0, pytest.approx(0.2)]
    r = simulate(LLAMA, iter(reqs), gpu="H100")
    assert r.prefix_hit_tokens == 256 and r.prefix_queried_tokens == 700

def test_synthetic_poisson_has_the_asked_rate():
    reqs = list(synthetic(10.0, 5000, exponential_lengths(100, 50), seed=1))
    rate = len(reqs) / reqs[-1].arrival
    assert 9.5 < rate < 10.5
    assert 95 < sum(r.prompt_tokens for r in reqs) / len(reqs) < 105
