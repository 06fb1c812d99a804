"""Hostile input against `kvbudget web` and `kvbudget guard`, as real processes on loopback: every probe is sent,
what came back is checked against what a safe server answers, and the outcomes are counted per class.

Classes (web): query values on every option of every command, hostile uploads, server paths in answers, slow
headers, idle connections past the file-descriptor limit, concurrent heavy requests, a simulation left by its
client, SIGTERM during a simulation. (guard): settings in its YAML and flags, API keys, request bodies, the body
deadline, the sidecar's /metrics, /readyz while the engine fails.

A safe answer is: a 2xx, or a 4xx (503 with Retry-After when busy) whose JSON error is one line naming the field,
the connection kept open, no server path, in bounded time and memory; a refused setting is one line on stderr and
exit status 2, in seconds. Exit status 1 when any probe fails.

    python benchmarks/probe.py [--bounds small|full] [--only web|guard]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
HOSTILE = ["", "-1", "0", "nan", "inf", "-inf", "1e400", "9" * 400, "abc", "1,2", "ü", "x" * 2000]
SMALL = ["", "-1", "nan", "inf", "1e400", "9" * 400, "abc"]
Outcome = tuple[str, str, bool, str]  # (class, case, held, what came back)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}


def start(args: list[str], fds: int | None = None, stderr: Any = subprocess.DEVNULL) -> subprocess.Popen:
    def limit() -> None:
        if fds:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))
    return subprocess.Popen([sys.executable, *args], env=env(), stdout=subprocess.DEVNULL, stderr=stderr,
                            preexec_fn=limit, start_new_session=True)


def wait_up(port: int, path: str = "/", seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            c.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing answered on port {port} within {seconds:g} s")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Conn:
    """One keep-alive connection; `ask` answers (status, headers, body, seconds) and whether the connection is
    still open afterwards (the server did not say `Connection: close`)."""

    def __init__(self, port: int, timeout: float = 90):
        self.port, self.timeout = port, timeout
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def ask(self, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, float, bool]:
        began = time.monotonic()
        try:
            self.c.request(method, path, body=body, headers=headers or {})
            r = self.c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as exc:
            self.c.close()
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            return 0, {}, repr(exc).encode(), time.monotonic() - began, False
        kept = (r.getheader("connection") or "").lower() != "close"
        if not kept or r.status >= 500:  # a server may drop the connection after an error without saying so
            self.c.close()
            self.c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data, time.monotonic() - began, kept


def safe_answer(status: int, headers: dict[str, str], body: bytes, kept: bool, secret: str = "",
                field: bool = True) -> str:
    """'' when the answer is what a safe server gives, else what is wrong with it."""
    text = body.decode("utf-8", "replace")
    if status == 0:
        return f"no answer ({text[:80]})"
    if status >= 500 and not (status == 503 and "retry-after" in headers):
        return f"{status}: {text[:120]}"
    if secret and secret in text:
        return f"shows the server's path {secret}"
    if "Traceback" in text:
        return "a traceback in the answer"
    if status >= 400 and headers.get("content-type", "").startswith("application/json"):
        try:
            doc = json.loads(text)
        except ValueError:
            return "an error that is not JSON"
        message = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(message, dict):  # OpenAI's shape: {"error": {"message": ...}}
            message = message.get("message")
        if not isinstance(message, str) or "\n" in message or not message:
            return f"an error without a one-line message: {text[:120]}"
        if field and status == 400 and isinstance(doc, dict) and "field" in doc and doc["field"] is None \
                and "unknown parameter" not in message:
            return f"a 400 that names no field: {message[:120]}"
    if not kept and status < 500:
        return f"{status} closed the connection"
    return ""


# --- web -------------------------------------------------------------------------------------------------------

def gguf_claiming(entries: int) -> bytes:
    """A GGUF header (version 3) whose one metadata array says it holds `entries` strings: 84 bytes."""
    key = b"tokenizer.ggml.tokens"
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    out += struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)  # ARRAY
    out += struct.pack("<IQ", 8, entries)  # of STRING, `entries` of them
    return out + struct.pack("<Q", 2**40) + b"ab"


def config(**fields: Any) -> bytes:
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16"}
    return json.dumps({**base, **fields}).encode()


UPLOADS: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "gguf array of 2^40 entries": ("model.gguf", gguf_claiming(2**40), {"x-file-size": "100000"}),
    "gguf string of 2^60 bytes": ("model.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60),
                                  {"x-file-size": "1000"}),
    "gguf tensor count 2^62": ("model.gguf", b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0), {"x-file-size": "1000"}),
    "config of 10^7 layers": ("config.json", config(num_hidden_layers=10_000_000), {}),
    "config of 10^12 layers": ("config.json", config(num_hidden_layers=10**12), {}),
    "config of a 400-digit size": ("config.json", config(hidden_size=int("9" * 400)), {}),
    "config head_dim -128": ("config.json", config(head_dim=-128), {}),
    "config 64 KV heads of 32": ("config.json", config(num_key_value_heads=64), {}),
    "config context -5": ("config.json", config(max_position_embeddings=-5), {}),
    "config nested 100,000 deep": ("config.json", b"[" * 100_000 + b"]" * 100_000, {}),
    "config binary": ("config.json", bytes(range(256)) * 16, {}),
    "config not UTF-8": ("config.json", b'{"model_type": "\xff\xfe"}', {}),
    "trace header only": ("t.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n", {}),
    "trace of NaN lengths": ("t.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n0,nan,nan\n", {}),
    "trace of 400-digit lengths": ("t.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n0," + b"9" * 400 + b",5\n",
                                   {}),
    "trace nested jsonl": ("t.jsonl", b"[" * 100_000 + b"\n", {}),
    "report nested": ("r.json", b"[" * 100_000, {}),
}


def upload_path(kind: str, name: str) -> str:
    return f"/api/upload?kind={kind}&name={name}"


def kind_of(name: str) -> str:
    return {"gguf": "model", "json": "model", "csv": "trace", "jsonl": "trace"}[name.rsplit(".", 1)[1]] \
        if not name.startswith("r.") else "report"


def web_probes(bounds: str) -> Iterator[Outcome]:
    port = free_port()
    server = start(["-m", "kvbudget", "web", "--listen", f"127.0.0.1:{port}"], fds=1024)
    try:
        wait_up(port)
        yield from web_queries(port, bounds)
        yield from web_uploads(port, server.pid)
        yield from web_slow_headers(port)
        yield from web_connections(port, server.pid, 1100)
        yield from web_concurrency(port, server.pid)
        yield from web_left_simulation(port)
        yield from web_sigterm(server, port)
    finally:
        stop(server)


def web_queries(port: int, bounds: str) -> Iterator[Outcome]:
    sys.path.insert(0, str(SRC))
    from kvbudget.web import api

    values = HOSTILE if bounds == "full" else SMALL
    conn = Conn(port)
    base = {"estimate": [("model", "llama-3.1-8b")], "plan": [("model", "llama-3.1-8b"), ("gpu", "H100")],
            "compare": [("model", "llama-3.1-8b"), ("model", "mistral-7b"), ("gpu", "H100")],
            "simulate": [("model", "llama-3.1-8b"), ("gpu", "H100"), ("rate", "5"), ("requests", "20")],
            "recommend": [("model", "llama-3.1-8b"), ("rate", "2"), ("requests", "20"), ("slo", "ttft_p99=2s"),
                          ("gpus", "H100-80GB"), ("gpu_price", "1"), ("max_gpus", "1"), ("tp", "1"),
                          ("kv_dtype", "auto")]}  # (a search of one candidate: each hostile value alone)
    from urllib.parse import urlencode

    for command, options in api.OPTIONS.items():
        for name in options:
            for value in values:
                query = urlencode([(k, v) for k, v in base[command] if k != name] + [(name, value)])
                status, headers, body, seconds, kept = conn.ask("GET", f"/api/{command}?{query}")
                wrong = safe_answer(status, headers, body, kept, "/tmp/")
                if not wrong and seconds > 75:
                    wrong = f"took {seconds:.0f} s"
                yield "web query values", f"{command} {name}={value[:12]!r}", not wrong, wrong


def web_uploads(port: int, pid: int) -> Iterator[Outcome]:
    conn = Conn(port, timeout=60)
    before = rss_mib(pid)
    for case, (name, data, headers) in UPLOADS.items():
        status, got, body, seconds, kept = conn.ask("POST", upload_path(kind_of(name), name), data, headers)
        wrong = safe_answer(status, got, body, kept, "/tmp/")
        grown = rss_mib(pid) - before
        if not wrong and status == 200 and kind_of(name) == "model":
            ref = json.loads(body)["id"]  # accepted: an estimate on it must answer in bounded time
            status, got, body, seconds, kept = conn.ask("GET", f"/api/estimate?model={ref}")
            wrong = safe_answer(status, got, body, kept, "/tmp/")
            if not wrong and status == 200 and "-" in body.decode():
                doc = json.loads(body)
                if any(isinstance(v, int | float) and v < 0 for v in doc.values()):
                    wrong = "a negative figure in the answer"
        if not wrong and seconds > 10:
            wrong = f"took {seconds:.0f} s"
        if not wrong and grown > 300:
            wrong = f"the server grew {grown:.0f} MiB"
        yield "web uploads", case, not wrong, wrong
    status, got, body, _, kept = conn.ask("POST", upload_path("model", "config.json"), b"{")
    text = body.decode()
    yield "web paths", "a bad upload's error", "/tmp" not in text and status == 400, text[:120]


def web_slow_headers(port: int) -> Iterator[Outcome]:
    """A connection that sends half a request line and then nothing is closed by the server."""
    socks = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /api/choices HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    began = time.monotonic()
    closed = 0
    for s in socks:
        s.settimeout(max(0.1, 40 - (time.monotonic() - began)))
        try:
            closed += s.recv(1024) is not None
        except OSError:
            pass
        s.close()
    took = time.monotonic() - began
    yield "web slow headers", "half a header, then silence", closed == 3 and took < 40, \
        f"{closed} of 3 closed in {took:.0f} s"


def web_connections(port: int, pid: int, count: int) -> Iterator[Outcome]:
    """More idle connections than the server's 1,024 file descriptors: it stays up and answers once they go."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 200)), hard))
    socks: list[socket.socket] = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    began = time.monotonic()
    answered, last = False, ""
    while time.monotonic() - began < 45 and not answered:
        status, _, body, _, _ = Conn(port, timeout=5).ask("GET", "/api/choices")
        answered, last = status == 200, f"{status} {body[:60]!r}"
        if not answered:
            time.sleep(1)
    took = time.monotonic() - began
    for s in socks:
        s.close()
    yield "web connections", f"{len(socks)} idle connections held", answered, f"answered after {took:.0f} s" \
        if answered else f"no answer in 45 s ({last})"
    alive = Path(f"/proc/{pid}").exists()
    yield "web connections", "the server is still up", alive, ""


def web_concurrency(port: int, pid: int) -> Iterator[Outcome]:
    """Eight heavy queries at once: light requests are still answered quickly and memory stays bounded."""
    heavy = "/api/compare?" + "&".join(f"model={m}" for m in ("llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3",
                                                               "mistral-7b", "llama-3.1-8b")) + "&gpu=H100"
    before = rss_mib(pid)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(Conn(port).ask("GET", heavy)[0])) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    _, _, _, light, _ = Conn(port).ask("GET", "/api/choices")
    peak = rss_mib(pid)
    for t in threads:
        t.join()
    yield "web concurrency", "a light request beside eight heavy ones", light < 2.0, f"{light:.1f} s"
    yield "web concurrency", "memory beside eight heavy ones", peak - before < 800, f"+{peak - before:.0f} MiB"
    bad = [s for s in results if s >= 500 and s != 503]
    yield "web concurrency", "eight heavy ones answered or refused (503)", not bad, f"statuses {sorted(results)}"


LONG_SIMULATION = ("/api/simulate?model=llama-3.1-70b&gpu=H100&tp=4&rate=50&requests=50000"
                   "&prompt_tokens=2000&output_tokens=2000")


def web_left_simulation(port: int) -> Iterator[Outcome]:
    """Clients that leave long simulations: the server stops the work, so the slots are free again soon."""
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {LONG_SIMULATION} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        time.sleep(0.5)
        s.close()
    time.sleep(3)
    status, headers, body, seconds, kept = Conn(port).ask("GET", "/api/simulate?model=llama-3.1-8b&gpu=H100"
                                                          "&rate=5&requests=20")
    yield "web simulation limits", "a slot free 3 s after its client left", status == 200, \
        f"{status} after {seconds:.1f} s: {body[:100]!r}"


def web_sigterm(server: subprocess.Popen, port: int) -> Iterator[Outcome]:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {LONG_SIMULATION} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    time.sleep(1)
    os.kill(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=10)
        stopped = True
    except subprocess.TimeoutExpired:
        stopped = False
    s.close()
    yield "web simulation limits", "SIGTERM during a simulation stops the server", stopped, \
        "" if stopped else "still running 10 s after SIGTERM"


# --- guard -----------------------------------------------------------------------------------------------------

SETTINGS: dict[str, str] = {  # each a guard.yaml the guard must refuse at start
    "header_timeout .nan": "header_timeout: .nan", "header_timeout .inf": "header_timeout: .inf",
    "header_timeout -1": "header_timeout: -1", "body_timeout 0": "body_timeout: 0",
    "staleness_s 0": "staleness_s: 0", "staleness_s -1": "staleness_s: -1",
    "fail_open false, staleness 0": "fail_open: false\nstaleness_s: 0",
    "api_keys a string": "api_keys: secret", "api_keys 5": "api_keys: 5", "api_keys [5]": "api_keys: [5]",
    "priority_keys a string": "priority_keys: secret", "upstreams [5]": "upstreams: [5]",
    "kv_budget_bytes abc": "kv_budget_bytes: abc", "kv_budget_bytes 1e400": "kv_budget_bytes: 1e400",
    "hysteresis abc": "hysteresis: abc", "max_tokens_fraction abc": "max_tokens_fraction: abc",
    "retry_after_s abc": "retry_after_s: abc", "default_max_tokens -5": "default_max_tokens: -5",
    "max_connections 0": "max_connections: 0", "levels a string": "levels: high",
    "nested 10,000 deep": "a: " + "[" * 10_000 + "]" * 10_000,
    "billion laughs": "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]"
                      "\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e]",
    "binary": "\x00\x01\x02\xff",
}
FLAGS: dict[str, list[str]] = {
    "--poll-interval 0": ["--poll-interval", "0"], "--poll-interval nan": ["--poll-interval", "nan"],
    "--staleness 0": ["--staleness", "0"], "--staleness inf": ["--staleness", "inf"],
    "--fail-closed --staleness 0": ["--fail-closed", "--staleness", "0"],
    "--kv-memory 1e400": ["--kv-memory", "1e400"], "--kv-memory 24": ["--kv-memory", "24"],
    "--max-waiting -1": ["--max-waiting", "-1"], "--max-tokens-cap abc": ["--max-tokens-cap", "abc"],
    "--listen :0": ["--listen", ":0"],
}


def refused(args: list[str], folder: Path) -> str:
    """'' when the guard refuses these arguments as it should (one line on stderr, exit 2, within 20 s)."""
    try:
        done = subprocess.run([sys.executable, "-m", "kvbudget", "guard", *args], env=env(), cwd=folder,
                              capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "started (or hung) instead of refusing"
    lines = done.stderr.strip().splitlines()
    if done.returncode != 2:
        return f"exit {done.returncode}: {done.stderr.strip()[-160:]}"
    if len(lines) != 1 or "Traceback" in done.stderr:
        return f"{len(lines)} lines on stderr: {done.stderr.strip()[:160]}"
    return ""


def guard_settings(folder: Path) -> Iterator[Outcome]:
    upstream = ["--upstream", "http://127.0.0.1:9", "--model", "llama-3.1-8b"]
    for case, text in SETTINGS.items():
        path = folder / "guard.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape") if case != "binary" else b"\x00\x01\x02\xff")
        wrong = refused(["--config", str(path), *upstream], folder)
        yield "guard settings", case, not wrong, wrong
    for case, flags in FLAGS.items():
        wrong = refused([*upstream, *flags], folder)
        yield "guard settings", case, not wrong, wrong


def guard_server(folder: Path, config: str, *flags: str) -> tuple[subprocess.Popen, subprocess.Popen, int, int]:
    up_port, port = free_port(), free_port()
    upstream = start([str(HERE / "upstream_stub.py"), str(up_port)])
    path = folder / f"g{port}.yaml"
    path.write_text(config)
    guard = start(["-m", "kvbudget", "guard", "--upstream", f"http://127.0.0.1:{up_port}", "--listen",
                   f"127.0.0.1:{port}", "--model", "llama-3.1-8b", "--config", str(path), *flags])
    wait_up(up_port, "/metrics")
    wait_up(port, "/healthz")
    return upstream, guard, up_port, port


BODIES: dict[str, Any] = {
    "a message part's text is 5": {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    "max_tokens 10^400": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 400 + b"}",
    "max_tokens -1": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
    "max_tokens 1.5": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5},
    "max_tokens NaN": b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}',
    "max_tokens a string": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"},
    "max_completion_tokens 10^30": {"messages": [{"role": "user", "content": "hi"}],
                                    "max_completion_tokens": 10**30},
    "n -3": {"messages": [{"role": "user", "content": "hi"}], "n": -3},
    "n 10^9": {"messages": [{"role": "user", "content": "hi"}], "n": 10**9},
    "messages a string": {"messages": "hi"},
    "messages [5]": {"messages": [5]},
    "content a number": {"messages": [{"role": "user", "content": 5}]},
    "content parts of numbers": {"messages": [{"role": "user", "content": [5, 6]}]},
    "no messages": {"max_tokens": 5},
    "a list body": [1, 2, 3],
    "a string body": "hello",
    "null body": None,
    "nested 100,000 deep": b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not UTF-8": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "not JSON": b"{{{",
    "stream a string": {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
    "a huge prompt": {"messages": [{"role": "user", "content": "x" * 3_000_000}]},
}

ADMISSIBLE = {"a huge prompt", "max_tokens 10^400", "max_completion_tokens 10^30", "n 10^9"}  # the engine's to refuse


def guard_probes(bounds: str) -> Iterator[Outcome]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        yield from guard_settings(folder)
        upstream, guard, up_port, port = guard_server(folder, "api_keys: [secret]\nbody_timeout: 2\n")
        try:
            conn = Conn(port)
            auth = {"content-type": "application/json"}
            for token, want in (("s", 401), ("secre", 401), ("secrets", 401), ("secret", 200)):
                status, *_ = conn.ask("POST", "/v1/chat/completions", json.dumps(
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
                    {**auth, "authorization": f"Bearer {token}"})
                yield "guard keys", f"Bearer {token!r}", status == want, f"{status}, want {want}"
            for case, body in BODIES.items():
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                status, headers, answer, _, kept = conn.ask("POST", "/v1/chat/completions", data,
                                                            {**auth, "authorization": "Bearer secret"})
                wrong = safe_answer(status, headers, answer, kept, field=False)
                if not wrong and status == 200 and case not in ADMISSIBLE:
                    wrong = "admitted"
                yield "guard bodies", case, not wrong, wrong
            yield from guard_body_deadline(port, 2.0)
        finally:
            stop(guard)
            stop(upstream)
        yield from guard_sidecar(folder)
        yield from guard_readyz(folder)


def guard_body_deadline(port: int, timeout: float) -> Iterator[Outcome]:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
              b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess")
    began = time.monotonic()
    s.settimeout(timeout * 5 + 5)
    with contextlib.suppress(OSError):
        s.recv(4096)
    took = time.monotonic() - began
    s.close()
    yield "guard body deadline", f"body_timeout {timeout:g} s", timeout - 0.2 <= took <= timeout + 1.0, \
        f"acted at {took:.1f} s"


def scrapes(up_port: int) -> int | None:
    status, _, body, _, _ = Conn(up_port).ask("GET", "/stub/scrapes")
    return int(body) if status == 200 else None


def guard_sidecar(folder: Path) -> Iterator[Outcome]:
    upstream, guard, up_port, port = guard_server(folder, "", "--sidecar", "--poll-interval", "1")
    try:
        before = scrapes(up_port)
        conn = Conn(port)
        for _ in range(50):
            conn.ask("GET", "/metrics")
        after = scrapes(up_port)
        ok = before is not None and after is not None and after - before <= 5
        yield "guard sidecar", "50 GETs of /metrics in well under 5 s", ok, f"the engine was scraped " \
            f"{(after or 0) - (before or 0)} times"
    finally:
        stop(guard)
        stop(upstream)


def guard_readyz(folder: Path) -> Iterator[Outcome]:
    upstream, guard, up_port, port = guard_server(folder, "")
    try:
        conn = Conn(port)
        ready_before = conn.ask("GET", "/readyz")[0]
        Conn(up_port).ask("POST", "/stub/fault", b"500")
        for _ in range(20):
            conn.ask("POST", "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
                {"content-type": "application/json"})
        time.sleep(2)
        ready_after = conn.ask("GET", "/readyz")[0]
        yield "guard readyz", "ready while the engine answers", ready_before == 200, f"{ready_before}"
        yield "guard readyz", "not ready while every completion fails", ready_after == 503, f"{ready_after}"
    finally:
        stop(guard)
        stop(upstream)


# --- report ----------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bounds", choices=("small", "full"), default="small")
    ap.add_argument("--only", choices=("web", "guard"))
    args = ap.parse_args()
    began = time.monotonic()
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    failures: list[str] = []
    suites: list[Callable[[str], Iterator[Outcome]]] = [s for name, s in (("web", web_probes),
                                                                           ("guard", guard_probes))
                                                         if args.only in (None, name)]
    for suite in suites:
        for cls, case, held, detail in suite(args.bounds):
            counts[cls][0 if held else 1] += 1
            if not held:
                failures.append(f"  {cls}: {case}: {detail}")
                print(f"FAILED {cls}: {case}: {detail}", file=sys.stderr, flush=True)
    width = max(len(c) for c in counts)
    print(f"{'class':<{width}}  held  failed")
    for cls, (held, failed) in counts.items():
        print(f"{cls:<{width}}  {held:>4}  {failed:>6}")
    total_failed = sum(f for _, f in counts.values())
    print(f"{sum(h for h, _ in counts.values())} probes held, {total_failed} failed, in "
          f"{time.monotonic() - began:.0f} s ({args.bounds} bounds)")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
