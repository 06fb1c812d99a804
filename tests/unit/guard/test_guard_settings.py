"""The guard's settings do at run time what they say at start (issue 50): the file's values are not replaced by a
flag's default, a flag given replaces them and says so, the config file is read with bounds, /readyz reflects the
engine's health, and the sidecar's /metrics is served from the last poll. Real sockets, a local upstream."""

from __future__ import annotations

import io
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
yaml = pytest.importorskip("yaml")

from kvbudget.cli import main  # noqa: E402
from kvbudget.commands.guard import GuardRequest, flags  # noqa: E402
from kvbudget.guard.config import read  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402

MSGS = [{"role": "user", "content": "x"}]


def cli(tmp_path, capsys, content: bytes | str, *args: str) -> tuple[int, str]:
    path = tmp_path / "guard.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = main(["guard", "--config", str(path), "--upstream", "http://127.0.0.1:9", "--listen",
                 "192.0.2.1:1", *args])  # never bound (TEST-NET): a config the guard accepts stops there
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("content", "said"), [
    ("a: " + "[" * 100_000 + "]" * 100_000, "more than 64 levels deep"),  # a RecursionError traceback
    (b"\xff\xfe\x00 binary", "not UTF-8 text"),  # a UnicodeDecodeError traceback
    ("retry_after_s: " + "9" * 5000, "invalid YAML (Exceeds the limit"),  # Python's 4,300-digit ValueError
    ("# " + "x" * (16 << 20), "kvbudget reads YAML files of up to 16,777,216 bytes"),
])
def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path, capsys, content, said):
    code, err = cli(tmp_path, capsys, content)
    assert code == 2 and err.count("\n") == 1 and said in err and "Traceback" not in err, err[:300]


def settings(tmp_path, text: str, *args: str):
    """The configuration `kvbudget guard --config FILE ARGS` runs with (the command line's reading of its flags)."""
    import argparse

    from kvbudget.cli.common import add_options, request_of  # the command line's own reading of its flags

    path = tmp_path / "guard.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_options(parser, GuardRequest)
    ask = request_of(GuardRequest, parser.parse_args(["--config", str(path), "--upstream", "http://x", *args]))
    return read(str(path), "config", flags(ask)), str(path)


def test_a_flags_default_does_not_replace_the_files_value(tmp_path):
    """`fail_open: false` had no effect and `staleness_s: 3` was read as 10: the flags' defaults (--staleness 10,
    no --fail-closed, --poll-interval 1) were merged over the file as if given."""
    config, _ = settings(tmp_path, "fail_open: false\nstaleness_s: 3\npoll_interval: 0.5\n")
    assert config.policy.fail_open is False and config.policy.staleness_s == 3.0 and config.poll_interval == 0.5
    assert config.notes == ()
    config, _ = settings(tmp_path, "{}\n")  # the defaults where neither says
    assert config.policy.fail_open is True and config.policy.staleness_s == 10.0 and config.poll_interval == 1.0


def test_a_flag_given_replaces_the_files_value_and_says_so(tmp_path):
    config, path = settings(tmp_path, "fail_open: true\nstaleness_s: 3\n", "--staleness", "4", "--fail-closed")
    assert config.policy.staleness_s == 4.0 and config.policy.fail_open is False
    from kvbudget.errors import spell

    said = [spell(n, command_line=True) for n in config.notes]
    assert said == [f"--staleness 4 replaces staleness_s: 3.0 in {path}",
                    f"--fail-closed replaces fail_open: true in {path}"], said
    assert spell(config.notes[0]) == f"staleness 4 replaces staleness_s: 3.0 in {path}"


def test_the_cli_prints_the_replacement_and_the_budget_flag_by_its_name(tmp_path, capsys, fake_engine):
    """The notes the guard starts with name the command line's flag (`--kv-memory`), where it said `kv_memory`."""
    from kvbudget.commands.guard import answer

    path = tmp_path / "guard.yaml"
    path.write_text("staleness_s: 3\nkv_budget_bytes: 1000000000\n")
    serving = answer(GuardRequest(config=str(path), upstream=[fake_engine.url], model="llama-3.1-8b",
                                  staleness="5"))
    text = "\n".join(serving.notes)
    assert f"--staleness 5 replaces staleness_s: 3.0 in {path}" in text
    assert "give --kv-memory to override" in text and "kv_memory" not in text, text
    assert "the config's kv_budget_bytes 1,000,000,000 (the plan's estimate) until it is read" in text


def guard_for(url: str, **kw):
    guard, _ = build_guard([url], "vllm", decision_log=io.StringIO(), **kw)
    return guard


def wait_for(check, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_fail_closed_from_the_file_rejects_and_readyz_says_why(fake_engine, serve):
    """`fail_open: false` in the file: with the engine's metrics failing, requests are refused and /readyz says
    503 with the reason (it said ready while the guard rejected everything)."""
    guard = guard_for(fake_engine.url, config={"fail_open": False, "staleness_s": 0.3}, poll_interval=0.05)
    with serve(guard.app()) as g:
        wait_for(lambda: httpx.get(f"{g.url}/readyz").status_code == 200)
        fake_engine.metrics_fail = True
        wait_for(lambda: httpx.get(f"{g.url}/readyz").status_code == 503)
        answer = httpx.get(f"{g.url}/readyz").json()
        assert "its KV usage is stale" in answer["reason"] and answer["replicas"][0]["ready"] is False, answer
        refused = httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}, timeout=10)
        assert refused.status_code == 503 and "stale (fail-closed)" in refused.json()["error"]["message"]
        fake_engine.metrics_fail = False
        wait_for(lambda: httpx.get(f"{g.url}/readyz").status_code == 200)


def test_readyz_is_out_while_every_answer_fails_and_back_when_one_succeeds(fake_engine, serve):
    """An engine answering 500 to every completion while its metrics were fine: /readyz stayed 200."""
    guard = guard_for(fake_engine.url, poll_interval=0.05, staleness=2.0)
    with serve(guard.app()) as g:
        wait_for(lambda: httpx.get(f"{g.url}/readyz").status_code == 200)
        fake_engine.status = 500
        for _ in range(3):
            assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}, timeout=10).status_code == 500
        answer = httpx.get(f"{g.url}/readyz")
        assert answer.status_code == 503, answer.text
        assert "its last 3 answers failed (the last: status 500)" in answer.json()["reason"]
        fake_engine.status = 200  # the router may still send one (or a client comes directly): it succeeds
        assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}, timeout=10).status_code == 200
        assert httpx.get(f"{g.url}/readyz").status_code == 200


def test_the_sidecars_metrics_come_from_the_last_poll(fake_engine, serve):
    """Every unauthenticated GET of the sidecar's /metrics scraped the engine: a slow engine's /metrics made
    each one slow, and anyone could drive the engine's scrapes. Now it republishes the last poll."""
    guard = guard_for(fake_engine.url, model="llama-3.1-8b", kv_memory=2**30, max_model_len=8192, sidecar=True,
                      poll_interval=30, staleness=60)
    fake_engine.usage = 0.25
    with serve(guard.app()) as side:
        assert 'vllm:kv_cache_usage_perc{engine="0"} 0.25' in httpx.get(f"{side.url}/metrics").text
        fake_engine.usage, fake_engine.slow_metrics = 0.5, 2.0
        started = time.monotonic()
        for _ in range(5):
            text = httpx.get(f"{side.url}/metrics", timeout=10).text
        assert time.monotonic() - started < 1.5  # was 5 x 2 s: a scrape each
        assert 'vllm:kv_cache_usage_perc{engine="0"} 0.25' in text  # the last poll's, not a new scrape
