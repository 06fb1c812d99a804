"""Acceptance given by the user (`--acceptance`) or read from an engine's own metrics lines (`--acceptance-from`):
vLLM's "SpecDecoding metrics" (per-position acceptance, made conditional), SGLang's "accept len" (a mean alone, the
constant rate whose chain gives it). The expected rates are worked out by hand from the logs' numbers
(tests/data/logs/speculative/sources.json names each thread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simkit import cli

from kvbudget.commands.recommend import RecommendRequest, _speculatives
from kvbudget.engines import get_engine
from kvbudget.engines.speclog import ReadsAcceptanceLogs, acceptance_in_file
from kvbudget.errors import KVBudgetError
from kvbudget.speculative import LoggedAcceptance, SpecMethod, Speculative, constant_rate

LOGS = Path(__file__).parents[2] / "data" / "logs" / "speculative"
VLLM_NGRAM = str(LOGS / "vllm-pr-24127-ngram-metrics.log")  # k=5: 0.983, 0.949, 0.915, 0.881, 0.712; mean 5.44
VLLM_DFLASH = str(LOGS / "vllm-aeon7-issue-6-dflash-metrics.log")  # k=15: 0.600, 0.385, 0.215, 0.108, 0.062, 0 ...
SGLANG = str(LOGS / "sglang-npu-pr-608-decode-accept.log")  # accept len 3.05, 2.63, then 2.83 (the last)


def _ngram(k: int) -> Speculative:
    return Speculative(method=SpecMethod.NGRAM, num_tokens=k)


def test_vllm_and_sglang_read_acceptance_lines():
    assert isinstance(get_engine("vllm"), ReadsAcceptanceLogs) and isinstance(get_engine("sglang"), ReadsAcceptanceLogs)


def test_vllm_per_position_made_conditional():
    spec = acceptance_in_file(VLLM_NGRAM, _ngram(5))
    # by hand: 0.983; 0.949 / 0.983; 0.915 / 0.949; 0.881 / 0.915; 0.712 / 0.881
    assert spec.acceptance == pytest.approx((0.983, 0.965412, 0.964173, 0.962842, 0.808173), abs=1e-5)
    # the chain gives back the logged mean acceptance length: 1 + 0.983 + 0.949 + 0.915 + 0.881 + 0.712 = 5.44
    assert 1 + spec.expected_accepted(5) == pytest.approx(5.44, abs=1e-9)
    assert spec.acceptance_source.startswith(f"read from {VLLM_NGRAM}: the last of 1 vllm metrics lines, "
                                             "per-position acceptance 0.983, 0.949")


def test_vllm_positions_past_k_are_dropped_and_past_the_log_take_the_last():
    assert acceptance_in_file(VLLM_NGRAM, _ngram(2)).acceptance == pytest.approx((0.983, 0.965412), abs=1e-5)
    longer = acceptance_in_file(VLLM_NGRAM, _ngram(7))
    assert longer.rates()[5:] == pytest.approx((0.808173, 0.808173), abs=1e-5)
    assert "positions past the 5 logged take the last" in longer.acceptance_source


def test_vllm_newer_wording_with_positions_never_accepted():
    """The 'Mean acceptance length' first, 'Avg Draft acceptance rate' after the rates; zeros past position 5."""
    spec = acceptance_in_file(VLLM_DFLASH, _ngram(15))
    # 0.6; 0.385 / 0.6; 0.215 / 0.385; 0.108 / 0.215; 0.062 / 0.108; then 0 (after 0.062, nothing accepted)
    assert spec.acceptance == pytest.approx((0.6, 0.641667, 0.558442, 0.502326, 0.574074) + (0.0,) * 10, abs=1e-5)


def test_sglang_accept_len_alone_gives_the_constant_rate_for_k():
    spec = acceptance_in_file(SGLANG, _ngram(3))
    (p,) = spec.acceptance
    # the last line's 2.83: 1 + p + p^2 + p^3 = 2.83; p = 0.772 gives 1.82808, 0.773 gives 1.83195
    assert 0.772 < p < 0.773 and p + p ** 2 + p ** 3 == pytest.approx(1.83, abs=1e-5)
    assert "the last of 3 sglang metrics lines, mean acceptance length 2.83 alone" in spec.acceptance_source
    assert "at k=3" in spec.acceptance_source


def test_constant_rate_ends():
    assert constant_rate(1.0, 4) == 0.0 and constant_rate(5.0, 4) == 1.0
    assert constant_rate(2.0, 1) == 1.0 and constant_rate(1.5, 1) == pytest.approx(0.5)
    with pytest.raises(KVBudgetError, match=r"mean acceptance length of 5.44 cannot come from 3 draft tokens"):
        constant_rate(5.44, 3)


def test_a_log_without_metrics_lines_is_refused(tmp_path):
    log = tmp_path / "start.log"
    log.write_text("INFO 09-09 11:51:35 [core.py:100] nothing about drafts\n")
    with pytest.raises(KVBudgetError, match="no acceptance metrics line found") as e:
        acceptance_in_file(str(log), _ngram(2))
    assert e.value.param == "acceptance_from"


def test_a_log_without_per_position_or_mean_is_refused():
    with pytest.raises(KVBudgetError, match="neither a per-position acceptance nor a mean"):
        LoggedAcceptance(line="SpecDecoding metrics: Accepted: 1 tokens").rates(2)


SIM = ("simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "8192", "--rate", "1000", "--requests",
       "4", "--prompt-tokens", "128", "--output-tokens", "16", "--max-concurrency", "2", "--speculative", "ngram",
       "--num-speculative-tokens", "3", "--json")


def test_simulate_states_the_rates_given(capsys):
    code, out, err = cli(capsys, *SIM, "--acceptance", "0.9, 0.5")
    assert code == 0, err
    drafting = json.loads(out)["setup"]["drafting"]
    assert (drafting["acceptance"], drafting["acceptance_source"]) == ([0.9, 0.5, 0.5], "given")


def test_simulate_states_the_log_read(capsys):
    code, out, err = cli(capsys, *SIM, "--acceptance-from", SGLANG)
    assert code == 0, err
    assert json.loads(out)["setup"]["drafting"]["acceptance_source"].startswith(f"read from {SGLANG}")


@pytest.mark.parametrize(("extra", "message"), [
    (("--acceptance", "0.9,x"), "--acceptance: 'x' is not a number"),
    (("--acceptance", "1.5"), "--acceptance: '1.5' must be a number from 0 up to 1"),
    (("--acceptance", "0.9,0.8,0.7,0.6"), "--acceptance: 4 rates for 3 draft tokens a step"),
    (("--acceptance", "0.5", "--acceptance-from", SGLANG), "give the rates or --acceptance-from a log, not both"),
    (("--acceptance-from", "/nonexistent/x.log"), "--acceptance-from /nonexistent/x.log: cannot read it"),
    (("--acceptance-from", VLLM_NGRAM, "--num-speculative-tokens", "1"), None),  # 5 positions logged, k=1: fine
])
def test_simulate_bad_acceptance_is_one_line(capsys, extra, message):
    code, out, err = cli(capsys, *SIM, *extra)
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_acceptance_without_drafts_is_refused(capsys):
    code, _, err = cli(capsys, *SIM[:16], "--acceptance", "0.5")
    assert code == 2 and "--acceptance: goes with --speculative or --num-speculative-tokens" in err, err


def test_recommend_carries_the_rates_to_each_draft_count():
    ask = RecommendRequest(model="llama-3.1-8b", slo="ttft_p99=1s", speculative="ngram", acceptance="0.9,0.8,0.7")
    none, two, three = _speculatives(ask, (0, 2, 3))
    assert none is None and two is not None and three is not None
    assert (two.acceptance, three.acceptance) == ((0.9, 0.8), (0.9, 0.8, 0.7))
    with pytest.raises(KVBudgetError, match="goes with"):
        _speculatives(RecommendRequest(model="llama-3.1-8b", slo="ttft_p99=1s", acceptance="0.5"), (0,))


def test_only_the_end_of_a_long_log_is_read(tmp_path, monkeypatch):
    import kvbudget.engines.speclog as speclog

    first = "INFO SpecDecoding metrics: Mean acceptance length: 1.50, Per-position acceptance rate: 0.500\n"
    last = "INFO SpecDecoding metrics: Mean acceptance length: 1.80, Per-position acceptance rate: 0.800\n"
    log = tmp_path / "long.log"
    log.write_text(first + "x" * 500 + "\n" + last)
    monkeypatch.setattr(speclog, "ACCEPTANCE_LOG_TAIL_BYTES", 200)
    spec = acceptance_in_file(str(log), _ngram(1))
    assert spec.acceptance == (0.8,)
    assert "(its last 0 MiB): the last of 1 vllm metrics lines" in spec.acceptance_source


def test_a_pipe_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(KVBudgetError, match="not a regular file") as e:
        acceptance_in_file(str(fifo), _ngram(1))
    assert e.value.param == "acceptance_from"


def test_recommend_says_where_the_acceptance_came_from(capsys):
    code, out, err = cli(capsys, "recommend", "llama-3.1-8b", "--rate", "2", "--requests", "6", "--max-model-len",
                         "8192", "--gpus", "H100-80GB", "--max-gpus", "1", "--tp", "1", "--kv-dtype", "auto",
                         "--backend", "serial", "--no-disagg", "--gpu-price", "2.49", "--slo", "ttft_p99=30s",
                         "--speculative", "ngram", "--num-speculative-tokens", "0,3", "--acceptance-from", SGLANG)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "note: speculative decoding's acceptance per position: 0.772, 0.772, 0.772 (read from" in flat
