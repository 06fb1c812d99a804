"""The held-out runs on GPUs the step times were not fitted on (benchmarks/data/served/runs.json): read from the
block `benchmark_serving.py` prints, marked as validation data with their source and licence, and replayed as they
were sent (every request at once)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# vLLM 0.10's benchmark_serving.py block as dennislee22/vLLM-benchmarking pasted it (Test 2, 1 prompt)
BLOCK = """Successful requests:                     1
Benchmark duration (s):                  9.06
Total input tokens:                      1024
Total generated tokens:                  1024
Request throughput (req/s):              0.11
Output token throughput (tok/s):         113.07
Total Token throughput (tok/s):          226.14
---------------Time to First Token----------------
Mean TTFT (ms):                          34.69
Median TTFT (ms):                        34.69
P99 TTFT (ms):                           34.69
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          8.82
Median TPOT (ms):                        8.82
P99 TPOT (ms):                           8.82
---------------Inter-token Latency----------------
Mean ITL (ms):                           8.82
Median ITL (ms):                         8.76
P99 ITL (ms):                            10.24"""


@pytest.fixture(scope="module")
def modules():
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "scripts")]
    import extract_served_runs
    import served

    yield served, extract_served_runs
    del sys.path[:2]


def test_a_printed_block_is_read_in_seconds(modules):
    _, extract = modules
    figures = extract.bench_block(BLOCK)
    assert (figures["requests"], figures["input_tokens"], figures["output_tokens"]) == (1, 1024, 1024)
    assert figures["duration_s"] == 9.06
    m = figures["measured"]
    assert m["ttft_s"] == {"mean": 0.03469, "p50": 0.03469, "p99": 0.03469}
    assert m["tpot_s"]["mean"] == 0.00882 and m["itl_s"] == {"mean": 0.00882, "p50": 0.00876, "p99": 0.01024}
    assert "e2e_s" not in m  # 0.10's default percentile metrics print no end-to-end latency


def test_every_run_is_validation_data_with_its_source_and_licence(modules):
    served, _ = modules
    runs = served.runs()
    assert len({r["id"] for r in runs}) == len(runs)
    for run in runs:
        assert run["split"] == "validate", run["id"]
        assert run["source"].startswith("github:") and run["licence"], run["id"]
    heldout = [r for r in runs if "load" in r]
    # A100s (80 GB on one node at TP 1 and 2; 40 GB across two nodes) and eight H200s, vLLM 0.10.1.1 and 0.11.0
    assert {(r["gpu"], r["tp"], r.get("nodes")) for r in heldout} == {("A100-80GB", 1, 1), ("A100-80GB", 2, 1),
                                                                      ("A100-40GB", 2, 2), ("H200", 8, 1)}
    assert {r["engine"] for r in heldout} == {"vLLM 0.10.1.1", "vLLM 0.11.0"}
    assert len(heldout) == 55 + 20


def test_a_performance_lab_baseline_keeps_its_page_s_figures(modules):
    """gpustack's Qwen3-14B page on one A100 SXM: `vllm serve Qwen/Qwen3-14B` (vLLM 0.11.0's defaults) and the
    "random 4K input" block (4,000 tokens in, 200 out, 500 prompts) as the page prints it."""
    served, _ = modules
    (run,) = [r for r in served.runs() if r["id"] == "gpustack-qwen3-14b-a100-random-4k"]
    assert (run["gpu"], run["model"], run["tp"], run["engine"]) == ("A100-80GB", "qwen3-14b", 1, "vLLM 0.11.0")
    assert (run["load"]["input_len"], run["load"]["output_len"], run["requests"]) == (4000, 200, 500)
    assert (run["input_tokens"], run["output_tokens"]) == (1997942, 99783)
    assert run["measured"]["ttft_s"]["mean"] == 197.62503 and run["measured"]["tpot_s"]["p99"] == 0.2835
    assert (run["max_num_batched_tokens"], run["max_num_seqs"]) == (2048, 256)  # 0.11 serves an A100 so
    assert run["licence"].startswith("Apache-2.0") and "qwen3-14b/a100.md" in run["source"]


def test_a_block_is_replayed_as_sent_every_request_at_once(modules):
    """200 prompts of 1,024 random tokens asked for 1,024 out: the block counts 204,007 prompt and 201,481 output
    tokens (the random text re-tokenizes a little longer, and without --ignore-eos some outputs stop early), so
    200 requests of 1,020 and 1,007 tokens at time 0."""
    served, _ = modules
    (run,) = [r for r in served.runs() if r["id"] == "a100-qwen2-7b-test2-15"]
    assert (run["input_tokens"], run["output_tokens"], run["requests"]) == (204007, 201481, 200)
    reqs = served.block_requests(run)
    assert len(reqs) == 200 and {(r.arrival, r.prompt_tokens, r.output_tokens) for r in reqs} == {(0.0, 1020, 1007)}


def test_a_replayed_block_compares_like_with_like_and_says_what_it_leaves_out(modules):
    served, _ = modules
    runs = {r["id"]: r for r in served.runs()}
    (case,) = served.replay(runs["a100-qwen2-7b-test2-01"])  # one request, TP 2
    assert case.load == "1 at once" and case.rate == math.inf and not case.excluded
    assert served.basis_kind(case) == "measured"  # the A100 SXM has kernels measured by aiconfigurator
    # the end-to-end mean is derived alike on both sides: TTFT + TPOT x (1,024 - 1)
    assert case.real["e2e"]["mean"] == pytest.approx(0.03469 + 0.00882 * 1023)
    sim = case.simulated
    assert sim["e2e"]["mean"] == pytest.approx(sim["ttft"]["mean"] + sim["tpot"]["mean"] * 1023)
    (across,) = served.replay(runs["a100-qwen2-7b-test1-01"])  # two nodes: over the network the log implies
    assert not across.excluded and "all-reduce over ethernet" in across.basis
    (timeouts,) = served.replay(runs["a100-qwen2-7b-test3-04"])  # 2,000 sent, 1,633 answered
    assert timeouts.excluded.startswith("client timeouts failed 18%")


def test_the_table_groups_by_gpu_basis_tp_and_load_and_lists_what_it_left_out(modules):
    """Test 4 (one A100-80GB, TP 1): 1, 10, 200 and 500 prompts at once fall in the four load groups; the run
    that lost 18% of its requests to client timeouts is listed below the table with its reason."""
    served, _ = modules
    runs = {r["id"]: r for r in served.runs()}
    ids = ["a100-qwen2-7b-test4-01", "a100-qwen2-7b-test4-02", "a100-qwen2-7b-test4-08", "a100-qwen2-7b-test4-09",
           "a100-qwen2-7b-test3-04"]
    assert [runs[i]["requests"] for i in ids] == [1, 10, 200, 500, 1633]
    rows = served.heldout_table([c for i in ids for c in served.replay(runs[i])])
    assert rows[0].startswith("| GPU | basis | TP | load | runs | TTFT abs. | TTFT signed | TPOT abs. |")
    assert [r.split(" | ")[:5] for r in rows[2:6]] == [["| A100-80GB", "measured", "1", load, "1"] for load in (
        "1 at once", "2-50 at once", "51-200 at once", "> 200 at once")]
    assert rows[6].startswith("\nLeft out (1): client timeouts failed 18%") and rows[6].endswith("test3-04")


def test_the_benchmarks_test_run_goes_first_and_leaves_the_first_prompt_cached(modules):
    """benchmark_serving.py sends the first prompt alone before timing (serve.py: "Starting initial single prompt
    test run..."): replayed, it goes at 0 and the timed requests long after; the one-request run's TTFT is then a
    cache hit, far below the same run replayed without the test run (a whole 1,024-token prefill)."""
    served, _ = modules
    runs = {r["id"]: r for r in served.runs()}
    reqs = served.block_requests(runs["a100-qwen2-7b-test2-15"])
    sent = served.with_test_run(reqs)
    assert sent[0].id == "test" and sent[0].prefix == sent[1].prefix != () and sent[2].prefix != sent[1].prefix
    assert {r.arrival for r in sent[1:]} == {served.TIMED_FROM}
    run = runs["a100-qwen2-7b-test5-01"]
    (case,) = served.replay(run)
    model = served.model_of(run["model"])
    cold = served.simulate(model, iter(served.block_requests(run)), **served.settings(run))
    assert case.simulated["ttft"]["mean"] < cold.ttft.mean / 2


# the engine's statistics lines as dennislee22/vLLM-benchmarking pasted them after a block (Test 5, 200 prompts;
# the first line cut at its start, as the README has it after some blocks)
ENGINE_LOG = """, Running: 10 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.5%, Prefix cache hit rate: 53.7%
(APIServer pid=2739) INFO 09-04 01:35:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg \
generation throughput: 5737.5 tokens/s, Running: 195 reqs, Waiting: 0 reqs, GPU KV cache usage: 66.8%, Prefix cache \
hit rate: 33.3%
(APIServer pid=2739) INFO 09-04 01:35:10 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg \
generation throughput: 5380.9 tokens/s, Running: 195 reqs, Waiting: 0 reqs, GPU KV cache usage: 78.4%, Prefix cache \
hit rate: 33.3%"""


def _log(at, prompt, generation, running, waiting, usage):
    return {"at": at, "prompt_tokens_per_s": prompt, "generation_tokens_per_s": generation, "running": running,
            "waiting": waiting, "kv_usage": usage}


def test_the_engine_log_after_a_block_is_read_from_whole_lines(modules):
    _, extract = modules
    assert extract.engine_log(ENGINE_LOG) == [_log("09-04 01:35:00", 0.0, 5737.5, 195, 0, 0.668),
                                              _log("09-04 01:35:10", 0.0, 5380.9, 195, 0, 0.784)]


def test_a_pure_decode_interval_gives_the_engine_s_own_step(modules):
    """Only an interval that decoded alone counts (no prompt tokens, none waiting, the same sequences at both ends):
    its step is the sequences over the generation throughput, its context the pool's share in use over them."""
    served, _ = modules
    run = {"num_gpu_blocks": 29053, "engine_log": [
        _log("a", 2836.3, 4789.1, 196, 0, 0.548),  # prefilling
        _log("b", 0.0, 5737.5, 195, 0, 0.668),  # one sequence fewer than at "a": some steps had 196
        _log("c", 0.0, 5380.9, 195, 0, 0.784),  # the one pure interval
        _log("d", 0.0, 6241.3, 256, 238, 0.964),  # others waiting (and running changed)
        _log("e", 0.0, 5749.3, 256, 261, 0.998)]}  # others waiting
    ((at, n, context, step),) = served.logged_decode_steps(run)
    assert (at, n) == ("c", 195)
    assert step == pytest.approx(0.036239, abs=1e-6)  # 195 / 5380.9
    assert context == pytest.approx(1730.66, abs=0.01)  # (0.668 + 0.784) / 2 x 29,053 x 16 / 195
    assert served.logged_decode_steps({"num_gpu_blocks": None, "engine_log": run["engine_log"]}) == []


def test_the_published_logs_give_decode_steps_beside_the_simulated_ones(modules):
    """runs.json keeps each block's engine log; Test 5's 200-prompt run decoded 195 sequences at 36.2 ms a step
    in the ten seconds to 01:35:10 (README.md)."""
    served, _ = modules
    run = {r["id"]: r for r in served.runs()}["a100-qwen2-7b-test5-08"]
    (d,) = served.decode_steps(run)
    assert (d.run, d.gpu, d.tp, d.at, d.sequences) == ("a100-qwen2-7b-test5-08", "A100-80GB", 1, "09-04 01:35:10", 195)
    assert d.real == pytest.approx(195 / 5380.9) and 1700 < d.context < 1760
    assert 0 < d.simulated < d.real and d.gap_per_sequence == pytest.approx((d.real - d.simulated) / 195)


def test_the_gap_is_a_line_over_the_sequences(modules):
    served, _ = modules
    steps = [served.DecodeStep(run="r", gpu="A100-80GB", tp=1, at=str(n), sequences=n, context=1000.0,
                               real=0.010 + 0.001 + 30e-6 * n, simulated=0.010) for n in (10, 50, 200)]
    fixed, per_seq = served.gap_line(steps)
    assert fixed == pytest.approx(0.001) and per_seq == pytest.approx(30e-6)
    with pytest.raises(ValueError, match="two batch sizes"):
        served.gap_line(steps[:1])
    assert "short by 1.00 ms + 30 µs a sequence" in "\n".join(served.decode_table(steps))


def test_a_run_records_its_server_so_that_runs_sharing_a_prefix_cache_are_known(modules):
    """The random dataset's prompts repeat from run to run (a fixed seed), so runs on one server share cached
    prompts: Test 5's 30 and 20 prompts ran after its 50 on the same server (README.md's log lines)."""
    served, extract = modules
    assert extract.server_of(ENGINE_LOG) == {"server_pid": 2739} and extract.server_of("no log") == {}
    runs = {r["id"]: r for r in served.runs()}
    fifty, thirty, twenty = (runs[f"a100-qwen2-7b-test5-{k:02d}"] for k in (5, 4, 3))
    assert fifty["server_pid"] == thirty["server_pid"] == twenty["server_pid"] == 136
    assert fifty["engine_log"][0]["at"] < thirty["engine_log"][0]["at"] < twenty["engine_log"][0]["at"]


def test_a_block_replayed_after_its_server_s_earlier_runs_finds_their_prompts_cached(modules):
    """The dataset's i-th prompt is the same in every run (seed 0, fixed lengths): Test 5's 30 prompts, sent after
    its 50 on the same server, were all cached (measured TTFT 0.24 s against the 50's 2.6 s); replayed after the
    50, their TTFT falls far below the replay on a fresh server."""
    served, _ = modules
    every = served.runs()
    runs = {r["id"]: r for r in every}
    thirty = runs["a100-qwen2-7b-test5-04"]
    assert [r["id"] for r in served.server_history(thirty, every)] == ["a100-qwen2-7b-test5-05"]
    assert [r["id"] for r in served.server_history(runs["a100-qwen2-7b-test5-03"], every)] == [
        "a100-qwen2-7b-test5-05", "a100-qwen2-7b-test5-04"]
    assert served.server_history(runs["a100-qwen2-7b-test5-05"], every) == []
    assert served.server_history({**thirty, "server_pid": None, "engine_log": []}, every) == []
    (fresh,) = served.replay(thirty)
    (warm,) = served.replay(thirty, earlier=[runs["a100-qwen2-7b-test5-05"]])
    assert warm.real == fresh.real and warm.simulated["ttft"]["mean"] < fresh.simulated["ttft"]["mean"] / 4
