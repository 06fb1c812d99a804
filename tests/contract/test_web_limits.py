"""`kvbudget web` under load and abuse: a few answers worked out at once and the rest told to retry, simulations
that stop when their client leaves or the server stops, the guard's connection limits, no server path and no
traceback in any answer, a taken port refused in one line."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kvbudget.cli import main
from kvbudget.web import api, app
from kvbudget.web.app import create_app

LONG_SIMULATION = "/api/simulate?model=llama-3.1-8b&gpu=L4&rate=50&requests=50000&max_model_len=4096"


def _blocking(monkeypatch, gate: threading.Event, started: threading.Event) -> None:
    """`estimate` answers only once `gate` is set."""
    def held(params, uploads):
        started.set()
        gate.wait(10)
        return {"held": True}
    monkeypatch.setattr(api, "estimate", held)


def test_answers_past_the_work_limit_are_refused_at_once_with_retry_after(tmp_path, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    _blocking(monkeypatch, gate, started)
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(heavy_at_once=1, queued_at_most=0)))
    first: list = []
    t = threading.Thread(target=lambda: first.append(client.get("/api/estimate?model=x")))
    t.start()
    assert started.wait(5)
    begun = time.monotonic()
    for path in ("/api/plan?model=llama-3.1-8b&gpu=L4", "/api/compare?model=qwen3-8b&model=mistral-7b",
                 "/api/guard.yaml?model=llama-3.1-8b&gpu=L4", LONG_SIMULATION):
        r = client.get(path)  # every kind of answer shares the slots
        assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.text)
        assert "try again" in r.json()["error"]
    r = client.post("/api/upload?kind=model&name=c.json", content=b'{"model_type": "llama"}')
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert time.monotonic() - begun < 2
    assert client.get("/api/choices").status_code == 200  # the page's own data takes no slot
    gate.set()
    t.join(5)
    assert first[0].status_code == 200 and first[0].json() == {"held": True}
    assert client.get("/api/plan?model=llama-3.1-8b&gpu=L4").status_code == 200  # the slot came back


def test_a_few_over_the_limit_wait_their_turn(tmp_path, monkeypatch):
    """The page asks up to ten answers at once: those wait (up to queue_seconds) rather than fail."""
    gate, started = threading.Event(), threading.Event()
    _blocking(monkeypatch, gate, started)
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(heavy_at_once=1, queued_at_most=1,
                                                                          queue_seconds=0.3)))
    got: list = []
    first = threading.Thread(target=lambda: got.append(client.get("/api/estimate?model=x")))
    first.start()
    assert started.wait(5)
    r = client.get("/api/plan?model=llama-3.1-8b&gpu=L4")  # waited 0.3 s, then refused
    assert r.status_code == 503 and "busy for 0.3 s" in r.json()["error"]
    second = threading.Thread(target=lambda: got.append(client.get("/api/plan?model=llama-3.1-8b&gpu=L4")))
    second.start()
    time.sleep(0.1)
    gate.set()  # the first ends; the waiting one takes its slot
    first.join(5)
    second.join(5)
    assert sorted(r.status_code for r in got) == [200, 200]


def test_an_unexpected_failure_is_a_500_that_names_nothing_of_the_server(tmp_path, monkeypatch, caplog):
    def broken(params, uploads):
        raise RuntimeError(f"{tmp_path}/secret.json: boom")
    monkeypatch.setattr(api, "plan", broken)
    client = TestClient(create_app(upload_dir=tmp_path / "u"))
    r = client.get("/api/plan?model=llama-3.1-8b")
    assert r.status_code == 500 and r.json() == {"error": app.INTERNAL, "field": None}
    assert "boom" in caplog.text and "RuntimeError" in caplog.text  # the operator sees it
    assert client.get("/api/estimate?model=llama-3.1-8b").status_code == 200


def test_no_answer_shows_where_the_server_keeps_files(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    uploads = api.Uploads(tmp_path / "link", api.Limits())
    for message, shown in [
        (f"{real}/model-ab.json: invalid JSON", "upload:model-ab.json: invalid JSON"),
        (f"{tmp_path}/link/guard-12.yaml: bad", "upload:guard-12.yaml: bad"),  # not resolved: still mapped
        ("'/usr/lib/python3/site-packages/kvbudget/data/traces/x.csv':3: no header", "'x.csv':3: no header"),
        ("cannot open /home/someone/.cache/kvbudget/m/config.json (denied)", "cannot open config.json (denied)"),
        ("see https://huggingface.co/org/name for org/name", "see https://huggingface.co/org/name for org/name"),
    ]:
        assert api.scrubbed(message, uploads) == shown
    client = TestClient(create_app(upload_dir=tmp_path / "link"))
    r = client.post("/api/upload?kind=trace&name=t.csv", content=b"a,b\n1,2\n")
    assert r.status_code == 400 and r.json()["field"] == "trace" and str(tmp_path) not in r.text


@pytest.mark.parametrize("name, data, size", [
    ("deep.json", b"[" * 100_000, None),  # nesting deeper than the parser goes
    ("junk.gguf", b"GGUF" + b"\xff" * 60, "1000"),
    ("bad.json", b"\xff\xfe binary", None),
])
def test_an_upload_that_cannot_be_parsed_is_a_400_next_to_its_kind(client_factory, name, data, size):
    client, folder = client_factory()
    r = client.post(f"/api/upload?kind=model&name={name}", content=data,
                    headers={"X-File-Size": size} if size else {})
    assert r.status_code == 400 and r.json()["field"] == "model" and r.json()["error"].startswith(name)
    assert str(folder) not in r.text


@pytest.fixture
def client_factory(tmp_path):
    def make(**limits):
        folder = tmp_path / "uploads"
        return TestClient(create_app(upload_dir=folder, limits=api.Limits(**limits)),
                          raise_server_exceptions=False), folder
    return make


def test_simulations_stop_by_the_clock_not_by_requests(tmp_path):
    """Few requests, each very long: the old check (every 1,000 requests) never ran; now the limit holds."""
    client = TestClient(create_app(upload_dir=tmp_path, limits=api.Limits(simulate_seconds=0.2)))
    begun = time.monotonic()
    r = client.get("/api/simulate?model=llama-3.1-8b&gpu=H100-80GB&rate=1000&requests=900&prompt_tokens=100"
                   "&output_tokens=30000&max_model_len=32k")
    assert r.status_code == 400 and r.json()["field"] == "slice" and "0.2 s limit" in r.json()["error"]
    assert time.monotonic() - begun < 3


def test_a_stopping_server_ends_its_simulations_and_refuses_new_work(tmp_path):
    made = create_app(upload_dir=tmp_path)
    client = TestClient(made)
    got: list = []
    t = threading.Thread(target=lambda: got.append(client.get(LONG_SIMULATION)))
    t.start()
    time.sleep(0.5)
    made.state.work.stop()
    t.join(3)
    assert not t.is_alive() and got[0].status_code == 503 and "stopping" in got[0].json()["error"]
    r = client.get("/api/estimate?model=llama-3.1-8b")
    assert r.status_code == 503 and r.headers["retry-after"]


@pytest.fixture
def served(tmp_path):
    """A real server (uvicorn on httptools, with the guard's connection limits) in a thread."""
    limits = api.Limits(header_timeout=0.3, max_connections=4, simulations_at_once=1, shutdown_grace_s=1)
    running, sock = app.server("127.0.0.1", 0, limits=limits)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not running.started:
        time.sleep(0.01)
    yield running, sock.getsockname()[1], thread
    running.handle_exit(signal.SIGTERM, None)
    thread.join(5)


def _get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]


def test_a_client_that_leaves_frees_its_simulation_slot(served):
    _, port, _ = served
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {LONG_SIMULATION} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    time.sleep(0.5)
    status, _ = _get(port, LONG_SIMULATION.replace("50000", "60"))
    assert status == 503  # the one simulation slot is taken
    s.close()  # the client leaves: its run stops within milliseconds
    time.sleep(0.3)
    status, body = _get(port, LONG_SIMULATION.replace("50000", "60"))
    assert status == 200, body


def test_slow_and_idle_connections_are_closed_and_capped(served):
    _, port, _ = served
    slow = socket.create_connection(("127.0.0.1", port), timeout=3)
    slow.sendall(b"GET /api/choices HTTP/1.1\r\n")  # never finishes its headers
    begun = time.monotonic()
    assert slow.recv(4096).startswith(b"HTTP/1.1 408")
    assert time.monotonic() - begun < 1.5
    idle = [socket.create_connection(("127.0.0.1", port), timeout=3) for _ in range(4)]
    extra = socket.create_connection(("127.0.0.1", port), timeout=3)
    assert extra.recv(4096).startswith(b"HTTP/1.1 503")  # one over the cap: told at once, closed
    for s in (slow, extra, *idle):
        s.close()
    time.sleep(0.1)
    assert _get(port, "/api/choices")[0] == 200


def test_stopping_the_server_ends_a_running_simulation_promptly(served):
    running, port, thread = served
    got: list = []
    t = threading.Thread(target=lambda: got.append(_get(port, LONG_SIMULATION)))
    t.start()
    time.sleep(0.5)
    begun = time.monotonic()
    running.handle_exit(signal.SIGTERM, None)
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - begun < 2
    t.join(2)
    assert got and got[0][0] == 503 and b"stopping" in got[0][1]


def test_a_taken_port_is_one_line_before_any_address_is_shown(capsys):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        assert main(["web", "--listen", f"127.0.0.1:{holder.getsockname()[1]}"]) == 2
    finally:
        holder.close()
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kvbudget: error: --listen: cannot listen on 127.0.0.1:")
    assert err.count("\n") == 1


def test_error_bodies_are_json_lines(tmp_path):
    """Every refusal is one JSON line with its field (the page shows it next to that control)."""
    client = TestClient(create_app(upload_dir=tmp_path))
    body = client.get("/api/compare?model=llama-3.1-8b").json()
    assert body["field"] == "model" and "\n" not in json.dumps(body["error"])
    assert Path(tmp_path).exists()
