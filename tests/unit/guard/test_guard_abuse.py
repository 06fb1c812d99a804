"""The guard against requests built to hurt it or to slip past its prediction (issue 12), each a regression test
that failed on the guard before the fix: on loopback, with a local upstream whose KV gauge the tests set."""

from __future__ import annotations

import io
import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from kvbudget import KVBudgetError  # noqa: E402
from kvbudget.engines import get_engine  # noqa: E402
from kvbudget.guard.admission import Admission  # noqa: E402
from kvbudget.guard.metrics import GuardMetrics  # noqa: E402
from kvbudget.guard.policy import Policy, Replica, decide  # noqa: E402
from kvbudget.guard.request import BadRequest, parse_json, read_request  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402
from kvbudget.guard.signals import Predictor  # noqa: E402
from kvbudget.model.load import load_model  # noqa: E402

LLAMA = load_model("llama-3.1-8b")  # 131,072 bytes per token on vLLM
CONTEXT = 32_768
BUDGET = 131_072 * 100_000  # room for 100,000 tokens


def admission(engine: str, max_model_len: int | None = CONTEXT, prompt: int = 100) -> Admission:
    chosen = get_engine(engine)
    return Admission([Replica(url="a")], Policy(), Predictor(chosen.allocate(LLAMA), BUDGET), lambda body: prompt,
                     GuardMetrics(), chosen, max_model_len)


def predicted_tokens(engine: str, body: dict, chat: bool = True, max_model_len: int | None = CONTEXT,
                     prompt: int = 100) -> int:
    """What the guard predicts a request holds, as tokens (prompt + output, summed over its sequences), from
    the bytes it holds: the engine's blocks round each sequence up, so whole-block lengths are used below."""
    a = admission(engine, max_model_len, prompt)
    asked = read_request(body, chat)
    held = a.request_bytes(body, asked, a.prompt_tokens(body, asked))
    assert a.predictor is not None
    per_token = a.predictor.allocation.bytes_per_token
    assert held % per_token == 0
    return held // per_token


def blocks(engine: str, *tokens: int) -> int:
    """Those sequence lengths as the engine holds them (whole blocks), in tokens."""
    allocation = get_engine(engine).allocate(LLAMA)
    return sum(allocation.sequence_bytes(t) for t in tokens) // allocation.bytes_per_token


MSGS = [{"role": "user", "content": "hi"}]


# --- item 4: the prediction reads a request as the engine does ----------------------------------------

@pytest.mark.parametrize("engine, body, tokens", [
    # vLLM and SGLang: max_completion_tokens wins over max_tokens (the guard used to read max_tokens first)
    ("vllm", {"max_tokens": 1, "max_completion_tokens": 6000}, 100 + 6000),
    ("sglang", {"max_tokens": 1, "max_completion_tokens": 6000}, 100 + 6000),
    ("sglang", {"max_tokens": 300, "max_completion_tokens": 0}, 100 + 300),  # `a or b`: a 0 falls through
    # llama.cpp: n_predict, then its aliases; -1 asks for no limit
    ("llamacpp", {"n_predict": 5000, "max_tokens": 10}, 100 + 5000),
    ("llamacpp", {"n_predict": -1, "max_tokens": 10}, 100 + 10),
    ("llamacpp", {"n_predict": -1}, CONTEXT),
    # TGI reads max_tokens only
    ("tgi", {"max_completion_tokens": 6000}, CONTEXT),
    # no limit at all: the rest of the context (the guard used to assume 1,024 tokens)
    ("vllm", {}, CONTEXT),
    # a limit past the context: the engine stops at the context
    ("vllm", {"max_tokens": 10**9}, CONTEXT),
])
def test_the_output_limit_is_read_as_the_engine_reads_it(engine, body, tokens):
    assert predicted_tokens(engine, {"messages": MSGS, **body}) == blocks(engine, tokens)


def test_completions_default_and_token_id_prompts_are_counted():
    # /v1/completions without max_tokens: 16 tokens on vLLM (OpenAI's legacy default), the context on llama.cpp
    assert predicted_tokens("vllm", {"prompt": "x"}, chat=False) == blocks("vllm", 100 + 16)
    assert predicted_tokens("llamacpp", {"prompt": "x"}, chat=False) == blocks("llamacpp", CONTEXT)
    # token ids count as themselves (they used to count as 0), one sequence per prompt of a batch
    ids = list(range(5000))
    assert predicted_tokens("vllm", {"prompt": ids, "max_tokens": 10}, chat=False) == blocks("vllm", 5010)
    assert predicted_tokens("vllm", {"prompt": [ids, ids[:100]], "max_tokens": 10},
                            chat=False) == blocks("vllm", 5010, 110)
    assert predicted_tokens("vllm", {"prompt": ["a", "b", "c"], "max_tokens": 10},
                            chat=False) == blocks("vllm", 110, 110, 110)


def test_without_a_context_length_an_absent_limit_is_the_policys_default():
    assert predicted_tokens("vllm", {"messages": MSGS}, max_model_len=None) == blocks(
        "vllm", 100 + Policy().default_max_tokens)
    assert predicted_tokens("vllm", {"messages": MSGS, "max_tokens": 50_000},
                            max_model_len=None) == blocks("vllm", 100 + 50_000)


def test_the_cap_lands_on_the_field_the_engine_reads():
    """llama.cpp reads n_predict before max_tokens: capping only max_tokens would let the request through."""
    a = admission("llamacpp")
    a.replicas[0].observed, a.replicas[0].observed_at = 0.72, 0.0
    body = {"messages": MSGS, "n_predict": 4000, "max_tokens": 4000}
    asked = read_request(body, True)
    d = a.decide(body, asked, a.prompt_tokens(body, asked), False, set(), now=0.0)
    assert d.level == 1 and d.body["n_predict"] == 2000 and d.body["max_tokens"] == 2000
    unlimited = {"messages": MSGS, "n_predict": -1}
    d = a.decide(unlimited, read_request(unlimited, True), [100], False, set(), now=0.0)
    assert d.body["n_predict"] == Policy().default_max_tokens // 2, d.changes


# --- item 3: the request being decided is part of its own prediction ------------------------------------

def test_a_request_too_big_alone_is_capped_or_rejected():
    """max_tokens 120,000 alone is 120% of a 100,000-token budget: it used to be admitted at 0% (and every
    other client then got 503 while it ran). Now it is capped (half: 60%), and a request that does not fit even
    capped and with one sample is rejected, saying why."""
    cost = lambda body, replica: body.get("max_tokens", 0) / 100_000  # noqa: E731
    d = decide({"max_tokens": 120_000}, [Replica(url="a")], Policy(), now=0.0, cost=cost)
    assert (d.action, d.level, d.body["max_tokens"]) == ("forward", 1, 60_000)
    assert d.pressure == 0.0 and d.total == pytest.approx(0.6)
    d = decide({"max_tokens": 400_000}, [Replica(url="a")], Policy(), now=0.0, cost=cost)
    assert d.action == "reject" and "even with its output capped" in d.reason and d.total >= 0.95
    # a request of two samples that fits only as one is forced to one (level 2) rather than rejected
    cost2 = lambda body, replica: body.get("n", 1) * 0.30  # noqa: E731
    d = decide({"max_tokens": 10, "n": 2}, [Replica(url="a", predicted=0.40)], Policy(), now=0.0, cost=cost2)
    assert (d.action, d.level, d.body["n"]) == ("forward", 2, 1)


def test_a_huge_request_through_the_proxy_leaves_room_for_others(fake_engine, serve):
    log = io.StringIO()
    fake_engine.usage = 0.0
    budget = 131_072 * 10_000  # 10,000 tokens
    guard, _ = build_guard([fake_engine.url], "vllm", model="llama-3.1-8b", kv_memory=budget, poll_interval=0.05,
                           decision_log=log, max_model_len=100_000)
    with serve(guard.app()) as g:
        c = openai.OpenAI(base_url=f"{g.url}/v1", api_key="x", max_retries=0, timeout=20)
        with pytest.raises(openai.APIStatusError) as err:  # 300% of the budget; capped and single still 150%
            c.chat.completions.create(model="m", messages=MSGS, max_tokens=30_000)
        assert err.value.status_code == 503 and "even with its output capped" in err.value.message
        r = c.chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=12_000)
        assert r.headers["x-kvbudget-level"] == "1" and fake_engine.bodies[-1]["max_tokens"] == 6_000
        c.chat.completions.create(model="m", messages=MSGS, max_tokens=100)  # others are still served
    decisions = [json.loads(line) for line in log.getvalue().splitlines() if '"decision"' in line]
    assert [d["action"] for d in decisions] == ["reject", "forward", "forward"]
    assert decisions[1]["with_request"] == pytest.approx(0.6, abs=0.01)


# --- item 5: malformed fields are a 400 naming the field, and the connection survives --------------------

BAD = [
    ({"messages": MSGS, "max_tokens": "abc"}, "max_tokens"),
    ({"messages": MSGS, "max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"messages": MSGS, "n": "x"}, "n"),
    ({"messages": MSGS, "n": 0}, "n"),
    ({"messages": MSGS, "best_of": True}, "best_of"),
    ({"messages": MSGS, "max_tokens": -5}, "max_tokens"),
    ({"messages": MSGS, "stream": "yes"}, "stream"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages"),
    ({"messages": []}, "messages"),
]


@pytest.mark.parametrize("body, field", BAD)
def test_malformed_fields_are_named(body, field):
    with pytest.raises(BadRequest) as err:
        read_request(body, chat=True)
    assert err.value.param == field and field in str(err.value)


def test_nan_and_bad_prompts_are_refused():
    with pytest.raises(BadRequest, match="NaN"):
        parse_json(b'{"messages": [], "max_tokens": NaN}')
    with pytest.raises(BadRequest, match="Infinity"):
        parse_json(b'{"temperature": Infinity}')
    for prompt in ([1, "a"], [], [[1], "a"], [-1], {"a": 1}, None, [[True]]):
        with pytest.raises(BadRequest) as err:
            read_request({"prompt": prompt}, chat=False)
        assert err.value.param == "prompt"


def _http(sock: socket.socket, body: bytes) -> tuple[int, dict]:
    """One keep-alive request on an open socket; (status, JSON body)."""
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split()[1]), json.loads(rest[:length])


def test_bad_fields_get_400_and_keep_the_connection(fake_engine, serve):
    """`max_tokens: "abc"`, NaN, `n: "x"` used to raise inside the guard: a plain-text 500 with a traceback,
    and the keep-alive connection reset. Now each is an OpenAI-style 400 naming the field, on every level, and
    the next request on the same connection is served."""
    guard, _ = build_guard([fake_engine.url], "vllm", model="llama-3.1-8b", kv_memory=BUDGET, poll_interval=0.05,
                           decision_log=io.StringIO())
    fake_engine.usage = 0.9  # level 2: the bodies are rewritten, where the old guard compared "abc" > cap
    with serve(guard.app()) as g:
        host, port = g.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            for raw, field in ((b'{"messages": [], "max_tokens": "abc"}', "max_tokens"),
                               (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}', None),
                               (b'{"messages": [{"role": "user", "content": "x"}], "n": "x"}', "n")):
                status, answer = _http(sock, raw)
                assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
                if field:
                    assert answer["error"]["param"] in (field, "messages"), answer
            status, answer = _http(sock, json.dumps({"messages": MSGS, "max_tokens": 10}).encode())
            assert status == 200 and answer["object"] == "chat.completion"


# --- item 6: one slow replica's metrics do not blind the guard to the others ----------------------------

def test_a_trickling_replica_goes_stale_alone(fake_engine, fake_engine_class, serve):
    """Replica A's /metrics sends a byte every 0.2 s (20 s in all): a per-read timeout never fires, and the
    guard used to poll replicas one after another, so it read nothing from B while A trickled. Each replica is
    now scraped on its own, each scrape bounded in all: B's rise is seen at once, A's scrapes fail and its
    metrics age grows."""
    slow = fake_engine_class(usage=0.1)
    slow.trickle_metrics = 0.2
    with serve(slow.app()) as a:
        slow.url = a.url
        guard, _ = build_guard([a.url, fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO(),
                               config={"connect_timeout": 1.0})
        with serve(guard.app()) as g:
            fake_engine.usage = 0.97
            time.sleep(0.6)
            assert guard.replicas[1].observed == 0.97  # within 0.6 s (A's trickle lasts 20 s)
            time.sleep(1.5)
            text = httpx.get(f"{g.url}/metrics").text
            failures = [line for line in text.splitlines()
                        if line.startswith("kvbudget_guard_scrape_failures_total") and a.url in line]
            assert failures and float(failures[0].rsplit(" ", 1)[1]) >= 1, text


# --- items 1 and 2: connections that never finish a request, and unbounded headers ----------------------

def serve_guard(serve, guard):
    """The guard as `kvbudget guard` serves it: its own HTTP protocol with the connection limits."""
    from kvbudget.guard.server import server_config

    return serve(None, config=lambda port: server_config(guard, "127.0.0.1", port))


def guard_with_limits(fake_engine, log, **limits):
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=log, config=limits)
    return guard


def test_idle_connections_are_capped_and_timed_out(fake_engine, serve):
    """Idle sockets used to be held for ever and uncapped: ~1,100 of them and nobody got an answer, /healthz
    included. Now the connection past the cap is answered 503 at once, idle ones are closed with 408 when their
    request line and headers are late, and the guard answers again."""
    log = io.StringIO()
    guard = guard_with_limits(fake_engine, log, max_connections=20, header_timeout=1.0)
    with serve_guard(serve, guard) as g:
        idle = [socket.create_connection(("127.0.0.1", g.port), timeout=5) for _ in range(20)]
        extra = socket.create_connection(("127.0.0.1", g.port), timeout=5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")  # answered at once, not left hanging
        started = time.monotonic()
        for sock in idle:
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408") and sock.recv(4096) == b""  # then closed
        assert time.monotonic() - started < 3
        assert httpx.get(f"{g.url}/healthz").status_code == 200
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_connections_refused_total{reason="too_many_connections"} 1.0' in text
        assert 'kvbudget_guard_connections_refused_total{reason="header_timeout"} 20.0' in text
        for sock in [*idle, extra]:
            sock.close()
    assert log.getvalue().count('"event": "connection_refused"') == 21


def test_slow_headers_and_slow_bodies_are_cut(fake_engine, serve):
    guard = guard_with_limits(fake_engine, io.StringIO(), header_timeout=0.5, body_timeout=0.5)
    with serve_guard(serve, guard) as g:
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the rest of the headers never comes
            time.sleep(0.1)
            sock.sendall(b"X-Slow: 1\r\n")  # a byte now and then used to keep it open for ever
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            answer = b"".join(iter(lambda: sock.recv(4096), b""))  # to the close the answer announces
            assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer
        # a keep-alive connection is given the same time for its next request's headers
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            first = b""
            while not first.endswith(b'{"status":"ok"}'):
                first += sock.recv(4096)
            assert first.startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_connections_refused_total{reason="body_timeout"} 1.0' in text
        assert 'kvbudget_guard_connections_refused_total{reason="header_timeout"} 2.0' in text


def test_the_deadlines_do_not_cut_a_busy_connection_or_a_slow_answer(fake_engine, serve):
    """The headers' and body's deadlines share one timer per connection that moves with each request: a
    keep-alive connection busy for longer than both, and an answer slower than both, are not cut."""
    guard = guard_with_limits(fake_engine, io.StringIO(), header_timeout=0.3, body_timeout=0.3)
    with serve_guard(serve, guard) as g, httpx.Client(base_url=g.url) as client:
        started = time.monotonic()
        while time.monotonic() - started < 1.2:  # four times either deadline, one connection
            assert client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4}).status_code == 200
            time.sleep(0.05)
        fake_engine.slow_answer = 0.8
        assert client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4}).status_code == 200
        fake_engine.slow_answer = 0.0
        assert client.get("/healthz").status_code == 200  # still the same connection
        text = client.get("/metrics").text
        assert "kvbudget_guard_connections_refused_total{" not in text


def test_oversized_headers_are_refused_before_they_are_read(fake_engine, serve):
    """A 64 MiB header used to take 14 s, stall /healthz and be forwarded upstream; four at once took 599 MB."""
    guard = guard_with_limits(fake_engine, io.StringIO(), max_header_bytes=16_384)
    with serve_guard(serve, guard) as g:
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
            try:
                for _ in range(64):  # up to 4 MiB: the guard answers and closes long before
                    sock.sendall(b"a" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = b""
            try:
                answer = sock.recv(4096)
            except ConnectionResetError:
                pass
            assert answer.startswith(b"HTTP/1.1 431") or answer == b""
        assert httpx.get(f"{g.url}/healthz").status_code == 200
        assert not fake_engine.bodies  # nothing reached the upstream
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_connections_refused_total{reason="headers_too_large"} 1.0' in text
        ok = httpx.get(f"{g.url}/healthz", headers={"X-Fine": "b" * 8000})
        assert ok.status_code == 200  # headers under the limit pass


def test_connection_limits_are_checked_in_the_config():
    for bad in ({"max_connections": 0}, {"header_timeout": "fast"}, {"max_header_bytes": 1.5},
                {"body_timeout": True}):
        with pytest.raises(KVBudgetError) as err:
            build_guard(["http://127.0.0.1:9"], "vllm", config=bad)
        assert next(iter(bad)) in str(err.value)


# --- item 7: the lesser holes ----------------------------------------------------------------------------

def test_impossible_gauges_are_failed_scrapes_and_readyz_never_500s(fake_engine, serve):
    """An infinite gauge made /readyz answer 500 (JSON cannot hold it); a negative one was taken as usage."""
    for value in (float("inf"), -0.5, float("nan")):
        fake_engine.usage = value
        guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO())
        with serve(guard.app()) as g:
            time.sleep(0.2)
            r = httpx.get(f"{g.url}/readyz")
            assert r.status_code == 503 and r.json()["replicas"][0]["observed"] is None, (value, r.text)
            assert 'kvbudget_guard_scrape_failures_total{replica="' in httpx.get(f"{g.url}/metrics").text


def test_readyz_is_not_ready_while_everything_is_rejected(fake_engine, serve):
    fake_engine.usage = 0.5
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO())
    with serve(guard.app()) as g:
        time.sleep(0.2)
        assert httpx.get(f"{g.url}/readyz").status_code == 200
        fake_engine.usage = 0.97  # level 3: every new request is rejected
        time.sleep(0.3)
        assert httpx.get(f"{g.url}/readyz").status_code == 503


def test_bearer_scheme_connection_headers_and_no_redirects(fake_engine, serve):
    guard, _ = build_guard([fake_engine.url], "vllm", api_keys=["k1"], poll_interval=0.05,
                           decision_log=io.StringIO())
    body = {"messages": MSGS, "max_tokens": 4}
    with serve(guard.app()) as g:
        url = f"{g.url}/v1/chat/completions"
        assert httpx.post(url, json=body, headers={"Authorization": "bearer k1"}).status_code == 200  # any case
        assert httpx.post(url, json=body, headers={"Authorization": "Basic k1"}).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": "Bearerk1"}).status_code == 401
        # a header the client names in Connection is hop-by-hop: not forwarded
        httpx.post(url, json=body, headers={"Authorization": "Bearer k1", "Connection": "keep-alive, X-Secret",
                                            "X-Secret": "s", "X-Kept": "1"})
        assert "x-secret" not in fake_engine.headers[-1] and fake_engine.headers[-1]["x-kept"] == "1"
        # a trailing slash used to redirect to a Location built from the client's Host header
        r = httpx.post(url + "/", json=body, headers={"Authorization": "Bearer k1", "Host": "evil.example"})
        assert r.status_code == 404 and "location" not in r.headers
        assert r.json()["error"]["type"] == "not_found_error"


def test_a_route_asked_with_another_method_is_405_and_get_routes_answer_head(fake_engine, serve):
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO())
    with serve(guard.app()) as g:
        r = httpx.get(f"{g.url}/v1/chat/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["message"] == "/v1/chat/completions takes POST"
        r = httpx.post(f"{g.url}/healthz")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        r = httpx.head(f"{g.url}/healthz")
        assert r.status_code == 200 and r.content == b""


def test_unreachable_upstreams_and_upstream_failures_are_counted_as_such(fake_engine, serve, free_port):
    dead = f"http://127.0.0.1:{free_port()}"
    guard, _ = build_guard([dead], "vllm", poll_interval=0.05, decision_log=io.StringIO())
    with serve(guard.app()) as g:
        assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}).status_code == 503
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kvbudget_guard_decisions_total{action="unavailable",level="none"} 1.0' in text
        assert 'level="3"' not in text  # not a full cache
    fake_engine.status = 500
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO())
    with serve(guard.app()) as g:
        assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}).status_code == 500
        text = httpx.get(f"{g.url}/metrics").text
        assert 'kind="status_500"' in text


def test_alert_rules_read_the_old_gauge_name_too():
    from kvbudget.guard.alerts import alert_rules

    assert "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc" in alert_rules("vllm")


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1:99999", "port from 1 to 65535"),
    ("127.0.0.1:0", "port from 1 to 65535"),
    ("::1:8080", "brackets"),
    ("localhost", "HOST:PORT"),
])
def test_listen_addresses_are_checked(text, message, capsys):
    from kvbudget.cli import main

    assert main(["guard", "--upstream", "http://127.0.0.1:9", "--listen", text]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_listen_on_ipv6_and_a_taken_port(free_port):
    from kvbudget.guard.server import bind
    from kvbudget.validate import listen_address

    assert listen_address("[::1]:8080") == ("::1", 8080) and listen_address(":8080") == ("0.0.0.0", 8080)
    try:
        sock = bind("::1", free_port())
    except KVBudgetError as exc:  # a machine without IPv6 loopback says so in one line
        assert "::1" in str(exc)
    else:
        assert sock.family == socket.AF_INET6
        with pytest.raises(KVBudgetError, match="cannot listen on ::1"):
            bind("::1", sock.getsockname()[1])
        sock.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(KVBudgetError, match="another program may hold the port"):
            bind("127.0.0.1", taken.getsockname()[1])


def test_with_keys_operational_endpoints_are_closed_and_priority_belongs_to_a_key(fake_engine, serve):
    """With --api-key, /metrics, /readyz (which names the upstreams) and /v1/models were open to anyone, and
    anyone could send the priority header."""
    fake_engine.usage = 0.97  # level 3: only priority is served
    guard, _ = build_guard([fake_engine.url], "vllm", api_keys=["plain"], priority_keys=["vip"],
                           poll_interval=0.05, decision_log=io.StringIO())
    with serve(guard.app()) as g:
        time.sleep(0.2)
        assert httpx.get(f"{g.url}/metrics").status_code == 401
        assert httpx.get(f"{g.url}/v1/models").status_code == 401
        assert httpx.get(f"{g.url}/readyz").json() == {"ready": False}  # readiness, not the upstream URLs
        assert "replicas" in httpx.get(f"{g.url}/readyz", headers={"Authorization": "Bearer plain"}).json()
        assert httpx.get(f"{g.url}/healthz").status_code == 200  # liveness stays open
        url, body = f"{g.url}/v1/chat/completions", {"messages": MSGS, "max_tokens": 4}
        header = {"Authorization": "Bearer plain", "x-kvbudget-priority": "high"}
        assert httpx.post(url, json=body, headers=header).status_code == 503  # the header alone: not priority
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer vip"}).status_code == 200


def test_oversized_upstream_answers_and_metrics_are_not_buffered(fake_engine, serve):
    """A 300 MiB upstream answer used to be held whole (651 MB RSS); now the guard stops at its limit."""
    fake_engine.answer_padding = 3 * 2**20
    guard, _ = build_guard([fake_engine.url], "vllm", poll_interval=0.05, decision_log=io.StringIO(),
                           config={"max_response_bytes": 2**20})
    with serve(guard.app()) as g:
        r = httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4})
        assert r.status_code == 502 and "over 1048576 bytes" in r.json()["error"]["message"]
        fake_engine.answer_padding = 0
        assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}).status_code == 200
        fake_engine.metrics_padding = 17 * 2**20  # over the 16 MiB a scrape may hold
        time.sleep(0.5)
        assert guard.replicas[0].observed_at < time.monotonic() - 0.3  # no scrape completed since


def test_a_client_leaving_a_non_streamed_request_cancels_it_upstream(fake_engine, serve):
    """An abandoned non-streaming request used to run to its end upstream, holding its KV cache."""
    fake_engine.slow_answer = 3.0
    guard, _ = build_guard([fake_engine.url], "vllm", model="llama-3.1-8b", kv_memory=BUDGET, poll_interval=0.05,
                           decision_log=io.StringIO())
    with serve_guard(serve, guard) as g:  # its HTTP protocol tells the app the client left
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4}, timeout=0.3)
        deadline = time.monotonic() + 2
        while fake_engine.abandoned == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake_engine.abandoned == 1  # the upstream saw the guard leave, long before its 3 s answer
        assert guard.replicas[0].predicted == 0.0 and guard.replicas[0].in_flight == 0  # released
        fake_engine.slow_answer = 0.0
        assert httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS}).status_code == 200


def test_streams_longer_than_the_shutdown_grace_end_with_an_error_event(fake_engine, tmp_path, guard_process):
    """A stream still running when SIGTERM's grace runs out used to be cut with no error event and no [DONE]."""
    import signal

    fake_engine.slow_stream = 0.6  # 5 chunks: 3 s, longer than the 1.5 s grace
    config = tmp_path / "guard.yaml"
    config.write_text("shutdown_grace: 1.5\n")
    with guard_process("--upstream", fake_engine.url, "--config", str(config)) as (proc, url):
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=20,
                          json={"messages": MSGS, "stream": True}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line)
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert first.startswith("data: {") and rest[-1] == "data: [DONE]"
        assert "server_shutting_down" in rest[-2], rest
        proc.wait(15)


def test_a_full_fresh_replica_does_not_refuse_what_a_stale_one_could_take():
    """A replica whose metrics hang goes stale; requests were then all judged on the fresh one and refused at
    97% although the other was nearly empty. Fail-open, the stale replica takes them on its prediction."""
    fresh_full = Replica(url="full", observed=0.97, observed_at=1000.0)
    stale = Replica(url="stale", observed=0.10, observed_at=0.0, predicted=0.05)
    d = decide({"max_tokens": 10}, [fresh_full, stale], Policy(), now=1000.0)
    assert (d.action, d.replica) == ("forward", "stale") and "fail-open" in d.reason
    d = decide({"max_tokens": 10}, [fresh_full, stale], Policy(fail_open=False), now=1000.0)
    assert d.action == "reject" and d.replica == "full"


def test_a_taken_port_is_a_one_line_error_from_the_cli(capsys):
    """It used to exit 3 with uvicorn's own message."""
    from kvbudget.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["guard", "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "another program may hold the port" in err[-1] and not any("Traceback" in line for line in err)


def test_no_reachable_upstream_is_a_counted_502(fake_engine, serve, free_port):
    guard, _ = build_guard([f"http://127.0.0.1:{free_port()}"], "vllm", poll_interval=60, staleness=120,
                           decision_log=io.StringIO())
    with serve(guard.app()) as g:
        deadline = time.monotonic() + 10
        while guard.replicas[0].healthy and time.monotonic() < deadline:  # the first scrape fails (then none for 60 s)
            time.sleep(0.01)
        guard.replicas[0].healthy = True  # as if it had answered its last scrape
        r = httpx.post(f"{g.url}/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 502
        assert 'kvbudget_guard_upstream_errors_total{kind="unreachable",replica="all"} 1.0' in httpx.get(
            f"{g.url}/metrics").text


def test_the_header_limit_counts_headers_only(fake_engine, serve):
    """A large header ending in the same read as the blank line is refused too; a body in the same read as
    headers under the limit is not counted against it."""
    guard = guard_with_limits(fake_engine, io.StringIO(), max_header_bytes=16_384)
    with serve_guard(serve, guard) as g:
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 431")
        body = json.dumps({"messages": [{"role": "user", "content": "x" * 60_000}], "max_tokens": 4}).encode()
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")


def test_the_body_deadline_is_exact_when_it_is_shorter_than_the_headers(fake_engine, serve):
    """`body_timeout: 5` under the default `header_timeout: 10` acted at 10 s: the connection's one timer, set for
    the headers' deadline, was not brought forward for the body's earlier one."""
    guard = guard_with_limits(fake_engine, io.StringIO(), header_timeout=3.0, body_timeout=0.3)
    with serve_guard(serve, guard) as g, socket.create_connection(("127.0.0.1", g.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        answer = b"".join(iter(lambda: sock.recv(4096), b""))
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.3 s" in answer
        assert 0.25 < took < 0.8, took  # was 3 s: the headers' deadline
