"""`kvbudget simulate` on the command line: JSON, tables, files, sweeps, searches and its one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from simkit import AZURE, LLAMA, cli

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.workload import exponential_lengths, read_trace, rescale, synthetic
from kvbudget.simulation.run import simulate


def test_cli_json_timeline_and_plot_agree_with_the_api(capsys, tmp_path):
    timeline, picture, each = tmp_path / "steps.csv", tmp_path / "sim.png", tmp_path / "requests.csv"
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "100:400",
                         "--no-prefix-caching", "--json", "--timeline", str(timeline), "--plot", str(picture),
                         "--per-request", str(each))
    assert code == 0, err
    data = json.loads(out)
    api = simulate(LLAMA, rescale(read_trace(AZURE), start=100, count=400), gpu="H100", prefix_caching=False)
    assert data["requests"] == api.requests == 400
    # (--timeline watches every step: the runs go step by step, their seconds equal to the closed form's to rounding)
    assert data["ttft_s"]["p99"] == pytest.approx(api.ttft.p99, rel=1e-9) and data["preemptions"] == api.preemptions
    rows = timeline.read_text().splitlines()
    assert rows[0] == "time_s,tokens,kv_usage,running,waiting" and len(rows) == api.steps + 1
    assert float(rows[-1].split(",")[0]) == pytest.approx(api.duration_s, abs=1e-6)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = [line.split(",") for line in each.read_text().splitlines()[1:]]
    assert len(done) == 400
    assert sorted(float(row[4]) for row in done) == pytest.approx(list(api.ttft_sorted), abs=1e-6)
    trace_rows = list(rescale(read_trace(AZURE), start=100, count=400))
    assert sorted(int(row[2]) for row in done) == sorted(r.prompt_tokens for r in trace_rows)

def test_cli_table_credits_the_azure_trace(capsys):
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "0:50")
    assert code == 0
    assert "Microsoft Azure Public Dataset" in out and "time to first token" in out

def test_cli_sweep_and_rate_search(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--rate", "1", "--requests", "60",
                         "--max-model-len", "8192", "--sweep", "kv-dtype=auto,fp8", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["settings"]["kv_dtype"] for r in rows] == ["auto", "fp8"]
    # an fp8 cache holds twice the tokens in the same budget (on an H100 FlashAttention 3 runs either; on an Ampere
    # or Ada card vLLM runs an fp8 cache on FlashInfer, whose workspace takes 394 MiB of the budget)
    slots = [r["result"]["setup"]["num_blocks"] for r in rows]
    assert slots[1] == pytest.approx(2 * slots[0], rel=0.01)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--trace", AZURE, "--slice", "0:300",
                         "--find-max-rate", "--slo", "ttft_p99=500ms", "--json")
    assert code == 0, err
    found = json.loads(out)
    met = [scale for scale, ok in found["tried"] if ok]
    failed = [scale for scale, ok in found["tried"] if not ok]
    assert found["rate_scale"] == max(met) and found["best"]["ttft_s"]["p99"] <= 0.5
    assert min(failed) > found["rate_scale"]

@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "--rate: '0' must be a number above 0"),
    (["--trace", "x.csv", "--rate", "2"], "give --trace FILE, --request-log FILE or --rate N"),
    (["--rate", "2", "--slice", "abc"], "--slice 'abc'"),
    (["--rate", "2", "--allocator", "buddy"], "--allocator buddy: choose paged"),
    (["--rate", "2", "--find-max-rate"], "--find-max-rate needs --slo"),
    (["--rate", "2", "--find-max-rate", "--slo", "ttft=2s"], "--slo ttft: name a latency"),
    (["--rate", "2", "--sweep", "colour=red"], "--sweep 'colour=red'"),
    (["--trace", "/nonexistent/trace.csv"], "trace /nonexistent/trace.csv"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err

def test_windows_and_state_groups_are_simulated_with_and_without_prefix_caching(capsys):
    from kvbudget.engines.vllm.blocks import BlockGroup, SlidingGroup, StateGroup
    from kvbudget.engines.vllm.cached import CachedHybridScheduler

    code, out, err = cli(capsys, "simulate", "qwen3-next-80b-a3b", "--gpu", "H200", "--tp", "2", "--rate", "1",
                         "--requests", "20")
    assert code == 0 and "the scheduling itself is exact" in " ".join(out.split()), err  # gated delta net
    code, out, err = cli(capsys, "simulate", "falcon-h1-7b", "--gpu", "H200", "--rate", "1", "--requests", "20")
    assert code == 0 and "Mamba-2" in out and "an estimate" in " ".join(out.split()), err  # from source
    mixed = (SlidingGroup(span=300, block_size=128, admission_cap=6), StateGroup(block_size=128),
             BlockGroup(block_size=128))
    with pytest.raises(KVBudgetError, match="prefix_caching=False"):
        CachedHybridScheduler(SchedulerConfig(num_blocks=200, block_size=128, max_num_seqs=8,
                                              max_num_batched_tokens=2048, max_model_len=4096), mixed)
    code, _, err = cli(capsys, "simulate", "mistral-7b", "--gpu", "H100", "--rate", "1", "--requests", "20")
    assert code == 0, err  # sliding windows are simulated with prefix caching too
    gemma = kvbudget.load_model("gemma-2-9b")
    run = lambda window: simulate(  # noqa: E731
        replace(gemma, layers=tuple(replace(spec, window=window) if hasattr(spec, "window") else spec
                                    for spec in gemma.layers)),
        synthetic(4, 300, exponential_lengths(3000, 300, 8000), seed=2), gpu="L40S", max_model_len=8192,
        prefix_caching=False)
    narrow, wide = run(512), run(4096)
    assert narrow.completed == wide.completed == 300
    # a narrower window holds fewer blocks per request: fewer preemptions, less waiting
    assert narrow.preemptions <= wide.preemptions and narrow.e2e.p99 <= wide.e2e.p99

def test_cli_llamacpp_slots_and_their_errors(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--rate", "1",
                         "--requests", "50", "--max-model-len", "8192", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["setup"]["allocator"] == "slots" and r["completed"] == 50
    # the planner's answer: how many 8,192-cell slots the L4's KV budget holds
    cap = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="llamacpp", gpu="L4", max_model_len=8192,
                        recommend=False).capacity
    assert r["setup"]["max_num_seqs"] == int(cap.max_concurrency) and r["setup"]["max_model_len"] == 8192
    for argv, message in ((["--num-blocks", "100"], "--num-blocks: llama.cpp has no KV blocks; give its slots "
                                                     "(--max-num-seqs) and their context (--max-model-len)"),
                          (["--max-num-seqs", "64"], "would fail to allocate")):
        code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "L4", "--rate",
                             "1", "--max-model-len", "8192", *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1", "--kv-unified")
    assert code == 2 and "--kv-unified: a llama.cpp setting" in err, err

def test_cli_sglang_is_labelled_an_estimate(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100", "--rate", "2",
                         "--requests", "50", "--max-model-len", "8192", "--json")
    assert code == 0, err
    r = json.loads(out)
    tokens = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="sglang", gpu="H100", max_model_len=8192,
                           recommend=False).capacity.kv_cache_tokens
    assert r["setup"]["num_blocks"] == tokens and r["setup"]["max_num_batched_tokens"] == 8192
    assert r["setup"]["max_num_seqs"] == min(max(min(int(tokens / 8192 * 512), 4096), 2048), tokens // 2)
    assert any("SGLang 0.5.23's source" in n and "estimate" in n for n in r["notes"])
    code, _, err = cli(capsys, "simulate", "falcon-h1-7b", "--engine", "sglang", "--gpu", "H100", "--rate", "2")
    assert code == 2 and "recurrent state" in err, err

def test_sweep_backends_give_the_single_process_answer(capsys):
    argv = ("simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "2", "--requests", "80", "--max-model-len", "8192",
            "--sweep", "kv-dtype=auto,fp8", "rate-scale=1,4", "--json")
    answers = {}
    for backend in ("serial", "process"):
        code, out, err = cli(capsys, *argv, "--backend", backend)
        assert code == 0, err
        answers[backend] = json.loads(out)
    assert answers["process"] == answers["serial"]
    assert [(r["settings"]["kv_dtype"], r["settings"]["rate_scale"]) for r in answers["serial"]] == [
        ("auto", 1.0), ("auto", 4.0), ("fp8", 1.0), ("fp8", 4.0)]
    assert len({r["result"]["requests_per_s"] for r in answers["serial"]}) > 1  # the settings did change the runs


def test_the_binding_target_is_shown_in_the_units_the_objectives_were_written_in(capsys):
    """`--find-max-rate` that nothing meets names what the slowest rate missed, in ms or s as the user wrote each
    objective, not in raw seconds."""
    import re

    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--rate", "5", "--requests", "200",
                       "--find-max-rate", "--slo", "ttft_p99=1ms,tpot_p99=0.001s")
    assert code == 1
    found = re.search(r"binding target: ttft_p99 ([\d.]+) ms > 1 ms; tpot_p99 ([\d.]+) s > 0\.001 s$", err.strip())
    assert found, err
    lowest = float(re.search(r"even at ([\d.]+)x", err).group(1))
    slowest = simulate(LLAMA, rescale(synthetic(5.0, 200, exponential_lengths(161, 338), seed=0), 1 / 1024),
                       gpu="H100-80GB")
    assert lowest == pytest.approx(1 / 1024, rel=1e-3)
    assert float(found.group(1)) == pytest.approx(slowest.ttft.p99 * 1000, rel=0.01)
    assert float(found.group(2)) == pytest.approx(slowest.tpot.p99, rel=0.01)


def test_missed_objectives_read_in_their_units():
    from types import SimpleNamespace

    from kvbudget.simulation.search import missed, parse_slo

    sim = SimpleNamespace(requests=10, completed=10, metric={"ttft_p99": 0.013764, "e2e_p50": 2.345}.get)
    assert missed(sim, parse_slo("ttft_p99=1ms,e2e_p50=2s")) == ("ttft_p99 13.8 ms > 1 ms", "e2e_p50 2.35 s > 2 s")
    assert missed(sim, parse_slo("ttft_p99=0.01s")) == ("ttft_p99 0.0138 s > 0.01 s",)
    assert missed(sim, {"ttft_p99": 0.001, "e2e_p50": 1.5}) == ("ttft_p99 13.8 ms > 1 ms", "e2e_p50 2.35 s > 1.5 s")
    assert parse_slo("ttft_p99=250ms") == {"ttft_p99": 0.25}
