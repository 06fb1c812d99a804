"""Hostile values on every numeric option of every command: one line on stderr, exit 2, never a traceback, and
before any heavy work. The readers of sizes, counts and numbers, the Python API's own checks, and the options that
were accepted and then ignored."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from kvbudget.cli import main
from kvbudget.errors import KVBudgetError

DATA = Path(__file__).parents[1] / "data" / "logs"
HOSTILE = ("", "-1", "nan", "inf", "-inf", "1e400", "1" + "0" * 400, "9" * 5000, "abc", "ünï", "x" * 5000, "1,2")
ZERO_REFUSED = ("0",)

ESTIMATE = ("estimate", "llama-3.1-8b")
PLAN = ("plan", "llama-3.1-8b", "--gpu", "H100-80GB")
COMPARE = ("compare", "llama-3.1-8b", "mistral-7b", "--gpu", "H100-80GB")
SIMULATE = ("simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--rate", "5", "--requests", "20")
SYNTHETIC = ("simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--requests", "20")  # --rate given by the case
GUARD = ("guard", "--upstream", "http://127.0.0.1:9", "--model", "llama-3.1-8b")

# (command line, flag, whether 0 is refused too)
NUMERIC = [
    *((ESTIMATE, f, True) for f in ("--batch", "--beams", "--context", "--tp", "--pp", "--kv-memory",
                                    "--block-size", "--max-num-batched-tokens", "--num-speculative-tokens",
                                    "--offload-memory")),
    ((*ESTIMATE, "--kv-memory", "20GiB"), "--max-model-len", True),
    ((*ESTIMATE, "--offload-memory", "64GiB"), "--offload-disk", True),
    *((PLAN, f, True) for f in ("--gpu-memory", "--gpus", "--tp", "--pp", "--max-model-len", "--concurrency",
                                "--beams", "--weights", "--utilization", "--kv-memory", "--max-num-seqs")),
    *((PLAN, f, False) for f in ("--activation", "--overhead")),
    ((*PLAN, "--enable-lora"), "--max-loras", True),
    ((*PLAN, "--enable-lora"), "--max-lora-rank", True),
    *((COMPARE, f, True) for f in ("--gpu-memory", "--context", "--tp", "--utilization", "--max-num-seqs")),
    *((SIMULATE, f, True) for f in ("--requests", "--cv", "--prompt-tokens", "--output-tokens", "--rate-scale",
                                    "--gpu-memory", "--kv-memory", "--utilization", "--weights", "--num-blocks",
                                    "--tp", "--pp", "--max-model-len", "--max-num-seqs", "--prometheus-interval",
                                    "--guard-poll-interval", "--disk-read", "--block-size")),
    *((SIMULATE, f, False) for f in ("--seed", "--long-prefill-token-threshold")),
    (SYNTHETIC, "--rate", True),
    ((*SIMULATE[:4], "--trace", "azure-conv-2023"), "--slice", True),
    ((*SIMULATE[:2], "--engine", "llamacpp", *SIMULATE[2:]), "--cache-ram", False),
    *((GUARD, f, True) for f in ("--kv-memory", "--max-model-len", "--max-tokens-cap", "--max-waiting",
                                 "--max-connections-per-client", "--max-in-flight-per-client")),
]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv: str) -> str:
    """The one line a refused command line prints (exit 2, no traceback)."""
    code, out, err = cli(capsys, *argv)
    assert code == 2, (argv[-2:], code, err[-300:])
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("kvbudget: error: "), err[:300]
    assert len(err) < 600, err  # a value thousands of characters long is shown cut
    return err


@pytest.mark.parametrize(("base", "flag", "zero"), NUMERIC, ids=[f"{b[0]}{f}" for b, f, _ in NUMERIC])
def test_every_numeric_option_refuses_hostile_values_in_one_line(capsys, monkeypatch, base, flag, zero):
    import kvbudget.guard.server

    monkeypatch.setattr(kvbudget.guard.server, "serve", lambda *a, **k: pytest.fail("the guard started"))
    for value in HOSTILE + (ZERO_REFUSED if zero else ()):
        if value == "1,2" and flag in ("--batch", "--context"):  # lists of values
            continue
        err = refused(capsys, *base, f"{flag}={value}")
        assert err.startswith(f"kvbudget: error: {flag}"), (value[:20], err)


def test_sizes_state_their_range_and_ask_for_a_unit(capsys):
    err = refused(capsys, "plan", "llama-3.1-8b", "--gpu-memory", "24")
    assert "--gpu-memory: 24 has no unit; write 24GiB (sizes below 1 MiB need a unit)" in err
    for flag in ("--kv-memory", "--weights", "--offload-memory"):
        assert "has no unit" in refused(capsys, "plan", "llama-3.1-8b", "--gpu", "L4", flag, "16")
    assert "more than 1 PiB" in refused(capsys, "plan", "llama-3.1-8b", "--gpu-memory", "1" + "0" * 400)
    assert "more than 1 PiB" in refused(capsys, "plan", "llama-3.1-8b", "--gpu-memory", "1025TiB")
    code, out, _ = cli(capsys, "plan", "llama-3.1-8b", "--gpu-memory", "25769803776", "--json")  # bytes, 24 GiB
    assert code == 0 and json.loads(out)["gpu_memory_bytes"] == 24 * 2**30


def test_counts_and_numbers_state_their_range(capsys):
    assert "from 0 to 18,446,744,073,709,551,615" in refused(capsys, *SIMULATE, "--seed", "abc")
    assert "above 0 up to 2,147,483,647" in refused(capsys, *SYNTHETIC, "--rate", "inf")
    assert "(at most 2,147,483,647)" in refused(capsys, "plan", "llama-3.1-8b", "--gpu", "L4", "--tp", "9" * 400)
    assert "above 0 up to 1" in refused(capsys, "compare", "llama-3.1-8b", "mistral-7b", "--gpu", "L4",
                                        "--utilization", "1.5")
    assert "(at most 10,000,000)" in refused(capsys, *SIMULATE[:-1], "20000000")


def test_the_python_api_checks_its_numbers():
    import kvbudget

    model = kvbudget.load_model("llama-3.1-8b")
    bad = [("gpu_memory", dict(gpu_memory=10**400)), ("utilization", dict(utilization=float("nan"))),
           ("utilization", dict(utilization=1.5)), ("kv_memory", dict(kv_memory=-1)), ("gpus", dict(gpus=10**12)),
           ("tp", dict(tp=10**400)), ("max_model_len", dict(max_model_len=0)),
           ("weights", dict(weights=float("inf"))), ("utilization", dict(kv_memory=2**30, utilization=0.9)),
           ("overhead", dict(kv_memory=2**30, overhead=0))]
    for param, settings in bad:
        with pytest.raises(KVBudgetError) as caught:
            kvbudget.plan(model, gpu="H100-80GB", **settings)
        assert caught.value.param == param, settings
    for param, settings in (("kv_memory", dict(kv_memory=2**60)), ("batch", dict(batch=[10**400])),
                            ("context", dict(context=[float("inf")]))):
        with pytest.raises(KVBudgetError) as caught:
            kvbudget.estimate(model, **settings)
        assert caught.value.param == param
    with pytest.raises(KVBudgetError, match="unknown GPU"):
        kvbudget.compare([model, model], gpu="RTX9090")
    with pytest.raises(KVBudgetError, match="utilization"):
        kvbudget.compare([model, model], gpu="L4", utilization=float("inf"))


def test_compare_refuses_an_unknown_gpu_as_plan_does(capsys):
    plan_err = refused(capsys, "plan", "llama-3.1-8b", "--gpu", "RTX9090")
    compare_err = refused(capsys, "compare", "llama-3.1-8b", "mistral-7b", "--gpu", "RTX9090")
    assert compare_err == plan_err


def test_attention_backend_is_checked_against_what_the_engine_takes(capsys):
    err = refused(capsys, "estimate", "deepseek-v3", "--attention-backend", "NOPE")
    assert "FLASHMLA" in err and "TRITON_MLA" in err
    assert "none for llama-3.1-8b" in refused(capsys, "estimate", "llama-3.1-8b", "--attention-backend", "FLASHMLA")
    assert "flash, no-flash" in refused(capsys, "estimate", "llama-3.1-8b", "--engine", "llamacpp",
                                        "--attention-backend", "NOPE")
    assert "--attention-backend" in refused(capsys, "plan", "llama-3.1-8b", "--gpu", "L4", "--engine", "sglang",
                                            "--attention-backend", "FLASHMLA")
    code, out, _ = cli(capsys, "estimate", "deepseek-v3", "--attention-backend", "flashmla", "--json")
    assert code == 0


def test_a_kv_budget_beside_what_would_derive_it_is_refused(capsys):
    for flag, value in (("--utilization", "0.5"), ("--activation", "1GiB"), ("--overhead", "0")):
        err = refused(capsys, "plan", "llama-3.1-8b", "--gpu", "L4", "--kv-memory", "10GiB", flag, value)
        assert err.startswith(f"kvbudget: error: {flag}: a given --kv-memory is the KV budget itself")
    err = refused(capsys, *SIMULATE, "--kv-memory", "10GiB", "--utilization", "0.5")
    assert "--utilization" in err
    err = refused(capsys, "simulate", "llama-3.1-8b", "--kv-memory", "10GiB", "--utilization", "0.5", "--rate", "1")
    assert "--utilization: goes with --gpu or --gpu-memory" in err
    assert "--utilization: goes with" in refused(capsys, "compare", "llama-3.1-8b", "mistral-7b",
                                                 "--utilization", "0.5")


def test_intervals_are_read_whether_or_not_their_output_is_asked_for(capsys):
    assert "--prometheus-interval" in refused(capsys, *SIMULATE, "--prometheus-interval", "abc")
    assert "--guard-poll-interval" in refused(capsys, *SIMULATE, "--guard-poll-interval", "0")


def test_a_slice_past_the_end_names_the_traces_length(capsys):
    err = refused(capsys, *SIMULATE[:4], "--trace", "azure-conv-2023", "--slice", "99999999:10")
    assert "past the end of the trace's 19,366 requests" in err


def test_a_trace_with_only_a_header_is_refused(capsys, tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert "empty.csv:1: no requests in the trace" in refused(capsys, *SIMULATE[:4], "--trace", str(trace))


def test_a_rate_search_that_nothing_meets_exits_1_naming_the_binding_target(capsys):
    code, out, err = cli(capsys, *SIMULATE, "--find-max-rate", "--slo", "ttft_p99=1ms")
    assert code == 1
    assert "binding target: ttft_p99" in err and " ms > 1 ms" in err


def test_simulate_offers_the_longest_max_model_len_that_fits(capsys):
    err = refused(capsys, "simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "1")
    assert "max_model_len 131,072 tokens, which needs 8,192 blocks" in err
    plan_code, plan_out, _ = cli(capsys, "plan", "llama-3.1-8b", "--gpu", "L4", "--json")
    longest = json.loads(plan_out)["capacity"]["estimated_max_model_len"]
    assert f"--max-model-len {longest} (the longest that fits" in err


def test_size_reader_memory_is_bounded():
    from kvbudget.units import parse_size

    tracemalloc.start()
    try:
        for _ in range(3):
            with pytest.raises(KVBudgetError):
                parse_size("9" * 100_000 + "GiB", "kv_memory")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000


def test_check_log_reads_the_start_up_section_in_bounded_memory(capsys, tmp_path):
    from kvbudget.commands import checklog

    start_up = (DATA / "vllm-0.10-issue-23278-gpt-oss-120b-negative.log").read_text()
    traffic = "INFO 05-01 12:00:00 [logger.py:41] Received request chatcmpl-1: prompt: 'hello'\n" * 200_000  # 16 MB
    big = tmp_path / "big.log"
    big.write_text(start_up + traffic)
    tracemalloc.start()
    try:
        text = checklog.read_log(str(big))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.startswith(start_up) and len(text) <= checklog.MAX_LOG_CHARS + checklog.MAX_LINE_CHARS
    assert peak < 4 * checklog.MAX_LOG_CHARS  # the 16 MB file is never held whole (8 MiB of text kept, at most)
    assert "read the first 8 MiB" in capsys.readouterr().err
    started = tmp_path / "started.log"
    started.write_text(start_up + "INFO:     Application startup complete.\n" + traffic)
    assert checklog.read_log(str(started)) == start_up + "INFO:     Application startup complete.\n"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, param", [
    ((*SIMULATE, "--sweep", "tp=1,2", "--timeline", "t.csv"), "--timeline"),
    ((*SIMULATE, "--find-max-rate", "--slo", "ttft_p99=2s", "--per-request", "r.csv"), "--per-request"),
    ((*SIMULATE, "--sweep", "tp=1,2", "--plot", "p.png"), "--plot"),
    ((*SIMULATE, "--backend", "serial"), "--backend"),
    ((*SIMULATE, "--tokenizer", "gpt2"), "--tokenizer"),
    ((*SIMULATE, "--approximate"), "--approximate"),
    ((*PLAN, "--tokenizer", "gpt2"), "--tokenizer"),
    ((*ESTIMATE, "--approximate"), "--approximate"),
])
def test_options_that_would_be_ignored_are_refused(capsys, tmp_path, monkeypatch, argv, param):
    """An option the rest of the command line leaves without effect is refused, naming it, before any run."""
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, *argv)
    assert line.startswith(f"kvbudget: error: {param}") or f"{param} goes with" in line, line
    assert not list(tmp_path.iterdir())
