"""The serving guard: policy tables, and the proxy driven by the official openai client against a local
upstream whose KV gauge the tests set (faults included). Real-engine runs are in tests/engines/."""

from __future__ import annotations

import io
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from kvbudget import KVBudgetError  # noqa: E402
from kvbudget.guard.policy import Policy, Replica, decide, level_for, rewrite  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402
from kvbudget.guard.signals import observed_usage, parse_prometheus  # noqa: E402

P = Policy()
NOW = 1000.0


def replica(observed=None, predicted=0.0, age=0.0, healthy=True, in_flight=0, url="http://a"):
    return Replica(url=url, observed=observed, observed_at=NOW - age, predicted=predicted, in_flight=in_flight,
                   healthy=healthy)


BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "n": 3, "best_of": 3}

# (replica states, priority, expected action, level, changes)
POLICY_TABLE = [
    ([replica(0.10)], False, "forward", 0, ()),
    ([replica(0.72)], False, "forward", 1, ("max_tokens 400->200",)),
    ([replica(0.20, predicted=0.74)], False, "forward", 1, ("max_tokens 400->200",)),  # prediction leads
    ([replica(0.86)], False, "forward", 2, ("max_tokens 400->200", "n 3->1", "best_of 3->1")),
    ([replica(0.96)], False, "reject", 3, ()),
    ([replica(0.96)], True, "forward", 2, ("max_tokens 400->200", "n 3->1", "best_of 3->1")),  # priority
    ([replica(0.995)], True, "reject", 3, ()),
    ([replica(0.96, age=60)], False, "forward", 0, ()),  # stale observation ignored (fail-open)
    ([replica(0.5, healthy=False)], False, "reject", 3, ()),  # nobody healthy
]


@pytest.mark.parametrize("states, priority, action, level, changes", POLICY_TABLE)
def test_policy_table(states, priority, action, level, changes):
    d = decide(BODY, states, P, priority, now=NOW)
    assert (d.action, d.level, d.changes) == (action, level, changes)
    if action == "forward":
        assert d.body["max_tokens"] <= BODY["max_tokens"] and BODY["max_tokens"] == 400  # input untouched


def test_routing_picks_headroom_then_fewest_in_flight():
    a, b, c = replica(0.5, url="a"), replica(0.2, in_flight=9, url="b"), replica(0.2, in_flight=1, url="c")
    assert decide(BODY, [a, b, c], P, now=NOW).replica == "c"
    stale = replica(0.0, age=60, url="stale")
    assert decide(BODY, [a, stale], P, now=NOW).replica == "a"  # a fresh replica beats a stale one


def test_fail_closed_rejects_on_stale_metrics():
    closed = Policy(fail_open=False)
    assert decide(BODY, [replica(0.1, age=60)], closed, now=NOW).action == "reject"


@pytest.mark.parametrize("pressures, levels", [
    ([0.96, 0.93, 0.91, 0.89, 0.5], [3, 3, 3, 2, 0]),
    ([0.72, 0.68, 0.66, 0.64], [1, 1, 1, 0]),
    ([0.10, 0.90], [0, 2]),
])
def test_hysteresis(pressures, levels):
    level, seen = 0, []
    for p in pressures:
        level = level_for(p, level, P)
        seen.append(level)
    assert seen == levels


def test_rewrite_variants():
    body = {"max_completion_tokens": 1000, "use_beam_search": True, "n": 1}
    out, changes = rewrite(body, 2, Policy(max_tokens_cap=64))
    assert out["max_completion_tokens"] == 64 and out["use_beam_search"] is False
    assert "max_tokens" not in out
    out, _ = rewrite({}, 1, P)  # no max_tokens: the default is assumed and capped
    assert out["max_tokens"] == P.default_max_tokens // 2


def test_policy_rejects_bad_thresholds():
    with pytest.raises(KVBudgetError):
        Policy(warn=0.9, single=0.8)


def test_observed_usage_parsers():
    assert parse_prometheus('vllm:kv_cache_usage_perc{a="1"} 0.25\nvllm:kv_cache_usage_perc{a="2"} 0.5\n',
                            "vllm:kv_cache_usage_perc") == 0.5
    assert observed_usage("vllm", "vllm:gpu_cache_usage_perc 0.3\n") == 0.3  # the old name still read
    assert observed_usage("sglang", "sglang:token_usage 0.4\n") == 0.4
    assert observed_usage("tgi", "tgi_batch_current_max_tokens 50\ntgi_batch_max_total_tokens 200\n") == 0.25
    old_slots = [{"n_ctx": 100, "n_past": 30}, {"n_ctx": 100, "n_past": 10}]
    assert observed_usage("llamacpp", json.dumps(old_slots)) == 0.2
    # the /slots of current llama-server: prompt + decoded tokens of the busy slots
    slots = [{"id": 0, "n_ctx": 2048, "is_processing": False},
             {"id": 1, "n_ctx": 2048, "is_processing": True, "n_prompt_tokens": 25,
              "next_token": [{"n_decoded": 999}]}]
    assert observed_usage("llamacpp", json.dumps(slots)) == 1024 / 4096
    assert observed_usage("hf", "") is None  # a library publishes no usage


# --- the proxy, end to end ---------------------------------------------------------------------------

@pytest.fixture
def engine(fake_engine):
    return fake_engine


def guard_for(urls, log=None, **kw):
    guard, notes = build_guard(urls, "vllm", poll_interval=0.05, staleness=kw.pop("staleness", 2.0),
                               decision_log=log or io.StringIO(), **kw)
    return guard, notes


def client(url, **kw):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20, **kw)


def settle():
    time.sleep(0.25)  # a few poll intervals


def test_levels_through_the_proxy(engine, serve):
    log = io.StringIO()
    guard, notes = guard_for([engine.url], log)
    assert any("observed usage alone" in n for n in notes)
    with serve(guard.app()) as g:
        c = client(g.url)
        msgs = [{"role": "user", "content": "hello"}]
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=100, n=2)
        assert engine.bodies[-1]["max_tokens"] == 100 and engine.bodies[-1]["n"] == 2
        engine.usage = 0.75
        settle()
        raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=100)
        assert engine.bodies[-1]["max_tokens"] == 50 and raw.headers["x-kvbudget-level"] == "1"
        engine.usage = 0.9
        settle()
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=100, n=3)
        assert engine.bodies[-1]["n"] == 1 and engine.bodies[-1]["max_tokens"] == 50
        engine.usage = 0.97
        settle()
        before = len(engine.bodies)
        with pytest.raises(openai.APIStatusError) as err:
            c.chat.completions.create(model="tiny", messages=msgs, max_tokens=100)
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "5"
        assert len(engine.bodies) == before  # never reached the engine
        high = client(g.url, default_headers={"x-kvbudget-priority": "high"})
        high.chat.completions.create(model="tiny", messages=msgs, max_tokens=100)
        assert len(engine.bodies) == before + 1
        metrics = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_decisions_total{action="reject",level="3"} 1.0' in metrics
        assert "kvbudget_guard_observed_usage" in metrics
        assert httpx.get(f"{g.url}/readyz").status_code == 503  # level 3 rejects new requests: out of rotation
        assert c.models.list().data[0].id == "tiny"
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert {line["action"] for line in lines} == {"forward", "reject"}
    assert all("hello" not in json.dumps(line) for line in lines)  # no prompt text in the decision log


def test_streaming_passes_chunks_through(engine, serve):
    guard, _ = guard_for([engine.url])
    with serve(guard.app()) as g:
        stream = client(g.url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "s"}],
                                                       stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        assert text == "t0 t1 t2 t3 t4 "


def test_upstream_dying_mid_stream_ends_the_clients_stream(engine, serve):
    engine.die_midstream = True
    guard, _ = guard_for([engine.url])
    with serve(guard.app()) as g:
        stream = client(g.url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "s"}],
                                                       stream=True)
        got = []
        with pytest.raises(openai.APIError):
            for chunk in stream:
                got.append(chunk.choices[0].delta.content)
        assert got == ["t0 ", "t1 "]
        assert "kvbudget_guard_in_flight{replica=" in httpx.get(f"{g.url}/metrics").text


def test_unreachable_upstream_is_502(serve, free_port):
    dead = f"http://127.0.0.1:{free_port()}"
    guard, _ = guard_for([dead])
    with serve(guard.app()) as g:
        with pytest.raises(openai.APIStatusError) as err:
            client(g.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert err.value.status_code in (502, 503)
        assert httpx.get(f"{g.url}/readyz").status_code == 503


def test_retry_on_another_replica_only_when_unreachable(engine, serve, free_port):
    dead = f"http://127.0.0.1:{free_port()}"
    guard, _ = guard_for([dead, engine.url])
    guard.replicas[0].healthy = True  # as if the dead one had looked fine at the last poll
    with serve(guard.app()) as g:
        guard.replicas[0].healthy = True
        client(g.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert engine.bodies  # reached the live replica


def test_bad_requests(engine, serve):
    guard, _ = guard_for([engine.url], config={"max_body_bytes": 1000})
    with serve(guard.app()) as g:
        assert httpx.post(f"{g.url}/v1/chat/completions", content=b"{oops").status_code == 400
        assert httpx.post(f"{g.url}/v1/chat/completions", content=b"[1]").status_code == 400
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        assert httpx.post(f"{g.url}/v1/chat/completions", content=big).status_code == 413


def test_headers_relayed_and_hop_by_hop_dropped(engine, serve):
    """A client's Expect: 100-continue is answered by the guard, not forwarded (the upstream would answer 100
    first); the upstream's content type reaches the client once, with the guard's level."""
    import socket

    guard, _ = guard_for([engine.url])
    with serve(guard.app()) as g:
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}).encode()
        with socket.create_connection(("127.0.0.1", g.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
                         b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body))
            assert sock.recv(1024).startswith(b"HTTP/1.1 100")
            sock.sendall(body)
            answer = b""
            while b'"usage"' not in answer:
                answer += sock.recv(65536)
        head = answer.split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 200") and head.count(b"content-type: application/json") == 1
        assert head.count(b"\r\nserver:") <= 1 and b"x-kvbudget-level: 0" in head
        assert engine.bodies[-1]["max_tokens"] == 4


def test_api_keys(engine, serve):
    guard, _ = guard_for([engine.url], api_keys=["s3cret"])
    with serve(guard.app()) as g:
        with pytest.raises(openai.AuthenticationError):
            client(g.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        ok = openai.OpenAI(base_url=f"{g.url}/v1", api_key="s3cret", max_retries=0)
        ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_stale_metrics_fail_open_and_fail_closed(engine, serve):
    engine.usage = 0.97
    guard, _ = guard_for([engine.url], staleness=0.3)
    closed, _ = guard_for([engine.url], staleness=0.3, fail_open=False)
    with serve(guard.app()) as g, serve(closed.app()) as gc:
        settle()
        engine.metrics_fail = True
        time.sleep(0.6)
        msgs = [{"role": "user", "content": "x"}]
        client(g.url).chat.completions.create(model="m", messages=msgs)  # fail-open: stale 97% not trusted
        with pytest.raises(openai.APIStatusError) as err:
            client(gc.url).chat.completions.create(model="m", messages=msgs)
        assert err.value.status_code == 503
        assert "kvbudget_guard_scrape_failures_total" in httpx.get(f"{g.url}/metrics").text


def test_prediction_catches_a_burst_before_the_gauge(engine, serve):
    """Requests in flight raise the predicted usage: later ones are capped, then rejected, although the
    engine's own gauge still reads 10%."""
    engine.slow_stream = 0.3
    budget = 131_072 * 10_000  # Llama-3.1-8B: room for 10,000 tokens
    guard, notes = guard_for([engine.url], model="llama-3.1-8b", kv_memory=budget)
    assert any("predicting with llama-3.1-8b" in n for n in notes)
    with serve(guard.app()) as g:
        c = client(g.url)
        msgs = [{"role": "user", "content": "x"}]
        streams = [c.chat.completions.create(model="m", messages=msgs, max_tokens=2_400, stream=True)
                   for _ in range(3)]  # 3 x ~2,400 tokens held: about 72% predicted
        r = c.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=2_400)
        assert r.headers["x-kvbudget-level"] == "1"
        more = [c.chat.completions.create(model="m", messages=msgs, max_tokens=2_400, stream=True)
                for _ in range(2)]
        with pytest.raises(openai.APIStatusError):
            c.chat.completions.create(model="m", messages=msgs, max_tokens=2_400)
        for s in streams + more:
            for _ in s:
                pass
        time.sleep(0.1)
        assert guard.replicas[0].predicted == 0.0  # released when the streams finished


def test_guard_cli_errors(capsys):
    from kvbudget.cli import main

    assert main(["guard"]) == 2
    assert "--upstream" in capsys.readouterr().err
    assert main(["guard", "--upstream", "ftp://x"]) == 2
    assert main(["guard", "--upstream", "http://127.0.0.1:1", "--engine", "foo"]) == 2
    assert main(["alerts", "--engine", "nope", "--out", "/tmp"]) == 2


def test_alerts_files(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    from kvbudget.cli import main

    assert main(["alerts", "--engine", "sglang", "--out", str(tmp_path)]) == 0
    rules = yaml.safe_load((tmp_path / "kvbudget-alerts.yaml").read_text())
    exprs = [r["expr"] for r in rules["groups"][0]["rules"]]
    assert exprs == [f"max by (instance) (sglang:token_usage) >= {t}" for t in (0.7, 0.85, 0.95)]
    board = json.loads((tmp_path / "kvbudget-dashboard.json").read_text())
    assert board["panels"][0]["targets"][0]["expr"] == "max by (instance) (sglang:token_usage)"


def test_slow_metrics_endpoint_counts_as_a_failed_scrape(engine, serve):
    engine.usage = 0.97
    guard, _ = guard_for([engine.url], staleness=0.3, config={"connect_timeout": 0.2})
    with serve(guard.app()) as g:
        settle()
        engine.slow_metrics = 1.0
        time.sleep(1.5)
        client(g.url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])  # stale: open
        assert "kvbudget_guard_scrape_failures_total" in httpx.get(f"{g.url}/metrics").text
        engine.slow_metrics = 0.0


def test_client_disconnecting_mid_stream_releases_the_request(engine, serve):
    engine.slow_stream = 0.2
    guard, _ = guard_for([engine.url], model="llama-3.1-8b", kv_memory=131_072 * 10_000)
    with serve(guard.app()) as g:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3000, "stream": True}
        with httpx.stream("POST", f"{g.url}/v1/chat/completions", json=body, timeout=10) as r:
            chunks = r.iter_raw()  # held: a dropped iterator would close the stream at once
            next(chunks)
            assert guard.replicas[0].in_flight == 1 and guard.replicas[0].predicted > 0.29
        deadline = time.time() + 5
        while guard.replicas[0].in_flight and time.time() < deadline:
            time.sleep(0.05)
        assert guard.replicas[0].in_flight == 0 and guard.replicas[0].predicted == 0.0


def test_sigterm_drains_in_flight_requests(engine, guard_process):
    """The guard process finishes a stream already admitted before it exits on SIGTERM."""
    import signal

    engine.slow_stream = 0.3
    with guard_process("--upstream", engine.url, "--poll-interval", "0.1") as (proc, url):
        stream = client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                     stream=True)
        first = next(iter(stream))
        proc.send_signal(signal.SIGTERM)
        rest = [chunk.choices[0].delta.content for chunk in stream]
        assert first.choices[0].delta.content == "t0 " and rest == ["t1 ", "t2 ", "t3 ", "t4 "]
        assert proc.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has drained
        assert f"kvbudget guard: listening on {url}" in proc.stderr.read().decode()


def test_yaml_config_sets_thresholds_and_limits():
    config = {"levels": [{"name": "warn", "threshold": 0.5}, {"name": "single-beam", "threshold": 0.6},
                         {"name": "reject", "threshold": 0.7}], "hysteresis": 0.02, "max_body_bytes": 1234,
              "idle_timeout": 7.0, "kv_budget_bytes": 131_072 * 1000, "api_keys": ["k"]}
    guard, notes = build_guard(["http://127.0.0.1:9"], "vllm", config=config, model="llama-3.1-8b")
    assert guard.config.policy.thresholds == (0.5, 0.6, 0.7) and guard.config.policy.hysteresis == 0.02
    assert guard.config.max_body_bytes == 1234 and guard.config.idle_timeout == 7.0
    assert guard.config.api_keys == frozenset({"k"})
    # the config's kv_budget_bytes (the plan's estimate) serves until the engine's own pool is read (issue 50)
    assert guard.prediction.predictor.budget is None
    assert guard.replicas[0].budget == 131_072 * 1000 and "kv_budget_bytes" in guard.replicas[0].pool


def test_alert_firings_follow_prometheus_for_semantics():
    from kvbudget.guard.alerts import Firing, _values, firings

    # scraped every 15 s; at or above 0.7 from 30 s: pending, firing once it has held 60 s (at 90 s), gone at 150 s
    usage = [0.1, 0.2, 0.7, 0.8, 0.9, 0.75, 0.71, 0.7, 0.69, 0.9, 0.9]
    assert firings(usage, 15, 0.7, "W") == [Firing("W", 90, 120)]
    assert firings(usage, 15, 0.7, "W")[0].end_s == 8 * 15
    assert firings([0.9] * 5, 15, 0.7, "W") == [Firing("W", 60, None)]  # still firing at the end
    assert firings([0.9, 0.1] * 10, 15, 0.7, "W") == []  # flapping never holds
    assert _values([0, 0, 0, 0.5, 1, 1]) == "0+0x2 0.5 1+0x1"


def test_prometheus_series_file_and_its_errors(tmp_path, capsys):
    import yaml

    from kvbudget.cli import main

    target = tmp_path / "series.yaml"
    assert main(["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "4", "--requests", "200", "--max-model-len",
                 "8192", "--prometheus-series", str(target), "--json"]) == 0
    err = capsys.readouterr().err
    loaded = yaml.safe_load(target.read_text())
    names = [s["series"] for s in loaded["tests"][0]["input_series"]]
    assert names == [f'vllm:{name}{{instance="simulated"}}' for name in ("kv_cache_usage_perc", "num_requests_running",
                                                                          "num_requests_waiting")]
    assert "alerts of `kvbudget alerts` in this run:" in err
    assert main(["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "4", "--prometheus-series", str(target),
                 "--force", "--prometheus-interval", "0"]) == 2
    assert "--prometheus-interval: '0' must be a number above 0" in capsys.readouterr().err


def test_max_waiting_sheds_on_the_engines_queue_in_the_policy():
    queue = Policy(max_waiting=5)
    full = Replica(url="http://a", observed=0.30, observed_at=NOW, waiting=5)
    d = decide(dict(BODY), [full], queue, now=NOW)
    assert (d.action, d.level, d.replica) == ("reject", 0, "http://a")
    assert d.reason == "5 requests waiting in the engine's queue, at or above max_waiting 5"
    assert decide(dict(BODY), [full], queue, priority=True, now=NOW).action == "forward"  # priority passes
    assert decide(dict(BODY), [full], Policy(), now=NOW).action == "forward"  # off by default
    short = Replica(url="http://a", observed=0.30, observed_at=NOW, waiting=4)
    assert decide(dict(BODY), [short], queue, now=NOW).action == "forward"
    # a replica with room in its queue is chosen over one with more KV headroom and a full queue
    emptier = Replica(url="http://b", observed=0.10, observed_at=NOW, waiting=9)
    fuller = Replica(url="http://c", observed=0.60, observed_at=NOW, waiting=0)
    d = decide(dict(BODY), [emptier, fuller], queue, now=NOW)
    assert (d.action, d.replica) == ("forward", "http://c")
    # a stale reading of the queue is not acted on (fail-open: the prediction alone)
    stale = Replica(url="http://a", observed=0.30, observed_at=NOW - 60, waiting=50)
    assert decide(dict(BODY), [stale], queue, now=NOW).action == "forward"
    for bad in (0, -1, True, 2.5, "5"):
        with pytest.raises(KVBudgetError, match="max_waiting"):
            Policy(max_waiting=bad)


def test_max_waiting_through_the_proxy_reads_the_engines_queue_gauge(engine, serve):
    log = io.StringIO()
    guard, notes = guard_for([engine.url], log, config={"max_waiting": 4})
    assert any("vllm:num_requests_waiting" in n for n in notes)
    engine.waiting = 6
    with serve(guard.app()) as g:
        settle()
        c = client(g.url)
        msgs = [{"role": "user", "content": "hello"}]
        before = len(engine.bodies)
        with pytest.raises(openai.APIStatusError) as err:
            c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10)
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "5"
        assert err.value.body["message"].startswith("the server is busy (6 requests waiting")
        assert len(engine.bodies) == before  # never reached the engine
        assert httpx.get(f"{g.url}/readyz").json()["replicas"][0]["waiting"] == 6
        client(g.url, default_headers={"x-kvbudget-priority": "high"}).chat.completions.create(
            model="tiny", messages=msgs, max_tokens=10)
        assert len(engine.bodies) == before + 1
        engine.waiting = 1
        settle()
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10)
        assert len(engine.bodies) == before + 2
        metrics = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_decisions_total{action="reject",level="0"} 1.0' in metrics
    rejected = [json.loads(line) for line in log.getvalue().splitlines() if '"reject"' in line]
    assert [r["reason"] for r in rejected] == ["6 requests waiting in the engine's queue, at or above max_waiting 4"]
    with pytest.raises(KVBudgetError, match="max_waiting"):
        guard_for([engine.url], config={"max_waiting": 0})
