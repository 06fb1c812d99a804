"""Reading workloads: the bundled traces, our JSONL, synthetic arrivals, and a bad line named by file and line."""

from __future__ import annotations

import json
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
