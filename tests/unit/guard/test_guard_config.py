"""The guard's configuration: one typed record, read once from its YAML and checked as it is read (guard.config).
A value of the wrong type, NaN or a meaningless count is one line naming the file and the key, exit status 2."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import FrozenInstanceError

import pytest

yaml = pytest.importorskip("yaml")

from kvbudget.cli import main  # noqa: E402
from kvbudget.errors import KVBudgetError  # noqa: E402
from kvbudget.guard.config import GuardConfig, LevelSetting, parse, read  # noqa: E402
from kvbudget.levels import HYSTERESIS, LEVELS  # noqa: E402


def guard_cli(tmp_path, capsys, text: str, *flags: str) -> tuple[int, str]:
    path = tmp_path / "guard.yaml"
    path.write_text(text)
    code = main(["guard", "--config", str(path), "--upstream", "http://127.0.0.1:9", "--listen", "192.0.2.1:1",
                 *flags])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


@pytest.mark.parametrize(("text", "key", "why"), [
    ("api_keys: secret\n", "api_keys", "not one string"),  # was: every character of "secret" a valid key
    ("priority_keys: vip\n", "priority_keys", "not one string"),
    ("api_keys: 5\n", "api_keys", "list of keys"),
    ("api_keys: [k, 5]\n", "api_keys", "each a string"),
    ("upstreams: [5]\n", "upstreams", "list of URLs"),
    ("upstreams: http://a\n", "upstreams", "not one string"),
    ("kv_budget_bytes: abc\n", "kv_budget_bytes", "whole number"),
    ("hysteresis: x\n", "hysteresis", "number"),
    ("max_tokens_fraction: abc\n", "max_tokens_fraction", "fraction above 0 and at most 1"),
    ("header_timeout: .nan\n", "header_timeout", "number of seconds"),
    ("header_timeout: .inf\n", "header_timeout", "number of seconds"),
    ("connect_timeout: -1\n", "connect_timeout", "above 0"),
    ("staleness_s: 0\n", "staleness_s", "above 0"),
    ("default_max_tokens: -5\n", "default_max_tokens", "from 1 to 2,147,483,647"),
    ("max_waiting: 0\n", "max_waiting", "from 1"),
    # issue 50: keys only from lists of distinct strings a bearer token can carry
    ("api_keys: ''\n", "api_keys", "not one string"),
    ("api_keys: ['']\n", "api_keys", "each a string"),
    ("api_keys: [k1, k2, k1]\n", "api_keys", "entry 3 repeats entry 1"),
    ("priority_keys: ['my key']\n", "priority_keys", "spaces or characters a bearer token cannot carry"),
    ("priority_keys: [\"k\\n\"]\n", "priority_keys", "spaces or characters a bearer token cannot carry"),
    # every timeout, interval, fraction and count finite and within its range
    ("header_timeout: 1e400\n", "header_timeout", "at most 86,400"),
    ("body_timeout: 86401\n", "body_timeout", "at most 86,400"),
    ("poll_interval: 0\n", "poll_interval", "of at least 0.05"),
    ("poll_interval: .nan\n", "poll_interval", "of at least 0.05"),
    ("staleness_s: 1\npoll_interval: 1\n", "staleness_s", "at least twice the poll interval (2 s)"),
    ("hysteresis: 2\n", "hysteresis", "at most 1"),
    ("retry_after_s: abc\n", "retry_after_s", "whole number from 0 to 86,400"),
    ("retry_after_s: 100000\n", "retry_after_s", "whole number from 0 to 86,400"),
    ("kv_budget_bytes: 1" + "0" * 400 + "\n", "kv_budget_bytes", "from 1 to 9,007,199,254,740,992"),
    ("max_tokens_cap: 4294967296\n", "max_tokens_cap", "from 1 to 2,147,483,647"),
    ("fail_open: maybe\n", "fail_open", "true or false"),
    ("levels: [{name: warn, threshold: .nan}]\n", "levels", "numeric threshold"),
    ("levels: {warn: 0.5}\n", "levels", "list of levels"),
])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, key, why):
    code, err = guard_cli(tmp_path, capsys, text)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"kvbudget: error: {tmp_path / 'guard.yaml'}: {key}") and why in err, err
    with pytest.raises(KVBudgetError) as exc:
        parse(yaml.safe_load(text), "guard.yaml")
    assert exc.value.param == key and "--" not in str(exc.value) and "\n" not in str(exc.value)


def test_a_bad_key_list_never_shows_the_keys(tmp_path, capsys):
    for text in ("api_keys: s3cret-key\n", "priority_keys: [s3cret-key, 5]\n"):
        code, err = guard_cli(tmp_path, capsys, text)
        assert code == 2 and "must be a list of keys" in err and "s3cret" not in err, err


def test_an_unknown_key_is_named_with_its_file_and_a_fix(tmp_path, capsys):
    code, err = guard_cli(tmp_path, capsys, "max_waitng: 5\n")
    assert code == 2 and err.count("\n") == 1
    assert f"{tmp_path / 'guard.yaml'}: unknown key 'max_waitng'; did you mean 'max_waiting'?" in err
    code, err = guard_cli(tmp_path, capsys, "colour: blue\n")
    assert code == 2 and "unknown key 'colour'; remove it (the guard reads upstreams, engine" in err
    code, err = guard_cli(tmp_path, capsys, "levels: [{name: warn, threshold: 0.5, colour: red}]\n")
    assert code == 2 and "levels: entry 1: unknown key 'colour'" in err


def test_flags_are_checked_as_the_file_is_and_named_as_flags(tmp_path, capsys):
    for flags, shown in ((["--poll-interval", "0"], "--poll-interval: must be a number of seconds of at least 0.05"),
                         (["--poll-interval", "nan"], "--poll-interval: must be a number of seconds of at least 0.05"),
                         (["--staleness", "-1"], "--staleness: must be a number of seconds above 0"),
                         (["--staleness", "inf"], "--staleness: must be a number of seconds above 0 and at most "
                                                  "86,400"),
                         (["--staleness", "abc"], "--staleness: takes a number of seconds, not 'abc'"),
                         (["--poll-interval", "6"], "--staleness: must be at least twice the poll interval (12 s)"),
                         (["--poll-interval", "5", "--staleness", "8"], "--staleness: must be at least twice the "
                                                                        "poll interval (10 s)")):
        code, err = guard_cli(tmp_path, capsys, "{}\n", *flags)
        assert code == 2 and err.startswith(f"kvbudget: error: {shown}") and err.count("\n") == 1, err


def test_the_record_is_typed_frozen_and_keyword_only():
    config = parse({"api_keys": ["a"], "upstreams": ["http://x"], "max_connections": 50}, "g.yaml",
                   flags={"api_keys": ["b"], "upstreams": [], "staleness_s": 3.0})
    assert config.api_keys == frozenset({"a", "b"})  # the command line's keys add to the file's
    assert config.upstreams == ("http://x",)  # none on the command line: the file's
    assert config.policy.staleness_s == 3.0 and config.limits.max_connections == 50
    with pytest.raises(FrozenInstanceError):
        config.max_body_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        GuardConfig("http://x")  # type: ignore[misc]


def test_the_record_round_trips_the_file_plan_writes(tmp_path, capsys):
    out = tmp_path / "guard.yaml"
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--guard-config", str(out),
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    config = read(str(out))
    assert config.model == "llama-3.1-8b" and config.engine == "vllm" and config.gpu == "L4" and config.tp == 1
    assert config.kv_budget_bytes == plan["kv_memory_bytes"] and config.max_model_len == 8192
    assert config.policy.thresholds == tuple(lv.threshold for lv in LEVELS)
    assert config.policy.hysteresis == HYSTERESIS
    assert config.levels == tuple(LevelSetting(name=lv["name"], action=lv["action"], threshold=lv["fraction"],
                                               kv_bytes=lv["kv_bytes"], tokens=lv["tokens"], requests=lv["requests"])
                                  for lv in plan["degradation"])
    # and the file it writes from a record is the same file, but for the comment on the engine's own queue limits
    from kvbudget.guard.config import write_config

    written, comment = out.read_text().split("# vllm's own admission from the reject level: ")
    assert comment.startswith("--max-num-queued-reqs ")

    assert write_config(model=config.model, engine=config.engine, gpu=config.gpu, tp=config.tp,
                        kv_budget_bytes=config.kv_budget_bytes, kv_cache_tokens=config.kv_cache_tokens,
                        bytes_per_token=config.bytes_per_token,
                        fixed_bytes_per_sequence=config.fixed_bytes_per_sequence,
                        max_model_len=config.max_model_len,
                        levels=[_Row(lv) for lv in config.levels]) == written


class _Row:
    def __init__(self, lv: LevelSetting):
        self.name, self.fraction, self.action = lv.name, lv.threshold, lv.action
        self.kv_bytes, self.tokens, self.requests = lv.kv_bytes, lv.tokens, lv.requests


def test_alerts_and_simulate_read_the_same_checked_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("api_keys: secret\n")
    assert main(["alerts", "--guard-config", str(bad), "--out", str(tmp_path)]) == 2
    assert f"{bad}: api_keys: must be a list of keys" in capsys.readouterr().err
    assert main(["simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8k", "--rate", "1", "--requests", "5",
                 "--guard-config", str(bad)]) == 2
    assert f"{bad}: api_keys: must be a list of keys" in capsys.readouterr().err


def test_decisions_go_through_the_kvbudget_guard_logger_as_json_lines():
    from kvbudget.guard.log import JsonLines, event, guard_log

    shared = guard_log()
    assert shared is logging.getLogger("kvbudget.guard") and not shared.propagate
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    handler.setFormatter(JsonLines())
    shared.addHandler(handler)  # what someone shipping the decisions elsewhere does
    try:
        event(shared, {"event": "decision", "level": 2})
    finally:
        shared.removeHandler(handler)
    line = json.loads(seen.getvalue())
    assert set(line) == {"ts", "event", "level"} and line["level"] == 2
    own = io.StringIO()
    event(guard_log(own), {"event": "pool", "tokens": 5})  # a guard's own stream: there alone
    assert json.loads(own.getvalue())["tokens"] == 5 and seen.getvalue().count("\n") == 1
