"""Runs the real engines on tiny random-weight models and reads back what they allocated.

The engines come from scripts/setup_engines.sh (cached under $KVBUDGET_ENGINES, default
~/.cache/kvbudget-engines). Servers listen on 127.0.0.1 only and are always stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("KVBUDGET_ENGINES", Path.home() / ".cache" / "kvbudget-engines"))
VLLM_PYTHON = ROOT / "vllm-venv" / "bin" / "python"
LLAMA_SERVER = ROOT / "llama.cpp" / "bin" / "llama-server"
MODELS = ROOT / "models"


def require(path: Path) -> Path:
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run scripts/setup_engines.sh first")
    return path


def model_folder(name: str, cfg: dict) -> Path:
    """A tiny model folder for `cfg`, written once with the vLLM venv's transformers and cached."""
    key = f"{name}-{hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]}"
    out = MODELS / key
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f"{key}.part-{os.getpid()}")  # tests run in parallel workers: write, then rename
        subprocess.run([str(require(VLLM_PYTHON)), str(HERE / "make_model.py"), json.dumps(cfg), str(partial)],
                       check=True, capture_output=True, text=True, timeout=600)
        try:
            partial.rename(out)
        except OSError:  # another worker made it first
            shutil.rmtree(partial, ignore_errors=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Stop a server and everything it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class VLLMRun:
    ok: bool
    labels: dict  # vllm:cache_config_info labels
    log: str

    def log_tokens(self) -> int:
        m = re.search(r"KV cache size: ([\d,]+) tokens", self.log)
        return int(m.group(1).replace(",", ""))

    def log_concurrency(self) -> float:
        m = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", self.log)
        return float(m.group(2))

    def estimated_max_model_len(self) -> int | None:
        m = re.search(r"estimated maximum model length is (\d+)", self.log)
        return int(m.group(1)) if m else None


def _launch_vllm(model_dir: Path, kv_gib: int | None, max_model_len: int, extra: tuple):
    """Start vLLM's OpenAI server on a free loopback port; its log goes beside the model folder."""
    port = free_port()
    env = dict(os.environ, VLLM_LOGGING_LEVEL="INFO", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if kv_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
    cmd = [str(require(VLLM_PYTHON)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
           "--enforce-eager", *extra]  # no torch.compile: half of each start on CPU, and nothing a test measures
    log_path = model_dir.parent / f"vllm-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, port, log_path


@contextmanager
def vllm_server(model_dir: Path, kv_gib: int | None, max_model_len: int, *extra: str, timeout: float = 400):
    """A running vLLM OpenAI server on loopback: yields its base URL once /v1/models answers."""
    proc, port, log_path = _launch_vllm(model_dir, kv_gib, max_model_len, extra)
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", proc, timeout, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"server did not answer {url} within {timeout} s")


def chat(base_url: str, messages: list, max_tokens: int = 1) -> dict:
    """One chat completion over plain HTTP; returns the response object."""
    with urllib.request.urlopen(urllib.request.Request(
            f"{base_url}/v1/models", headers={"Content-Type": "application/json"}), timeout=30) as r:
        served = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({"model": served, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def run_vllm(model_dir: Path, kv_gib: int | None, max_model_len: int, *extra: str, timeout: float = 400) -> VLLMRun:
    """Start vLLM's OpenAI server, read its cache config from /metrics and its log, stop it.

    kv_gib sets VLLM_CPU_KVCACHE_SPACE (whole GiB only); None leaves the budget to `extra`
    (e.g. --kv-cache-memory-bytes)."""
    proc, port, log_path = _launch_vllm(model_dir, kv_gib, max_model_len, extra)
    labels: dict = {}
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                m = re.search(r"vllm:cache_config_info\{([^}]*)\}", text)
                if m:
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                    break
            except OSError:
                pass
            time.sleep(1)
    finally:
        stop(proc)
    return VLLMRun(bool(labels), labels, log_path.read_text(errors="replace"))


LLAMA_DIR = ROOT / "llama.cpp"
_KV_LINE = re.compile(
    r"(llama_kv_cache|llama_memory_recurrent): size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, "
    r"+(\d+)(?:/(\d+))? seqs[^)]*\), "
    r"(?:K|R) \((\w+)\): +([\d.]+) MiB, (?:V|S) \((\w+)\): +([\d.]+) MiB")


def gguf_file(name: str, cfg: dict) -> Path:
    """The tiny model of `cfg` converted to GGUF (f32 weights) with llama.cpp's converter, cached."""
    folder = model_folder(name, cfg)
    out = folder / "model.gguf"
    if not out.exists():
        done = subprocess.run([str(require(VLLM_PYTHON)), str(HERE / "convert_gguf.py"), str(require(LLAMA_DIR)),
                               str(folder), str(out)], capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"convert_hf_to_gguf failed for {name}: {done.stderr[-2000:]}")
    return out


@dataclass
class LlamaRun:
    ok: bool
    caches: list  # one dict per "size = ..." line, in the order the server logged them
    log: str


def log_folder() -> Path:
    """Where the servers' logs go: the system's temporary folder, never the user's model cache."""
    folder = Path(tempfile.gettempdir()) / "kvbudget-engine-logs"
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def llama_server(gguf: Path, *args: str, timeout: float = 120, env: dict | None = None, logs: Path | None = None):
    """A running llama-server on loopback: yields its base URL once /v1/models answers. `env`: variables added to
    the server's environment; `logs`: the folder for its log (default: log_folder())."""
    port = free_port()
    cmd = [str(require(LLAMA_SERVER)), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), *args]
    log_path = (logs or log_folder()) / f"llama-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", proc, timeout, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def run_llama_server(gguf: Path, *args: str, timeout: float = 120) -> LlamaRun:
    """Start llama-server with `args`, wait until its caches are logged and it listens, stop it."""
    port = free_port()
    cmd = [str(require(LLAMA_SERVER)), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-lv", "4", "--log-colors", "off", *args]
    log_path = log_folder() / f"llama-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            if "llama_server: listening on" in log_path.read_text(errors="replace"):
                break
            time.sleep(0.3)
    finally:
        stop(proc)
    text = log_path.read_text(errors="replace")
    caches = [
        {"kind": m[0], "mib": float(m[1]), "cells": int(m[2]), "layers": int(m[3]), "seqs": int(m[4]),
         "streams": int(m[5]) if m[5] else 1, "k_type": m[6], "k_mib": float(m[7]), "v_type": m[8],
         "v_mib": float(m[9])}
        for m in _KV_LINE.findall(text)
    ]
    return LlamaRun("llama_server: listening on" in text, caches, text)


def replay_on_vllm(model_dir: Path, max_model_len: int, requests: list, *extra: str,
                   timeout: float = 600) -> list[dict]:
    """Send `requests` — (seconds after the first, prompt token ids, max_tokens, n[, beam search]) — to a real vLLM
    server that records its scheduler's decisions (kvbudget.simulation.recorder), and return those records in
    order, then {"metrics": its /metrics text at the end}."""
    import threading

    import kvbudget

    log_path = model_dir.parent / f"schedule-{os.getpid()}-{time.time_ns()}.jsonl"
    # vLLM's environment imports kvbudget's recorder: this kvbudget alone goes on its path (a folder holding a
    # link to the package), not the rest of this environment's packages
    link_dir = model_dir.parent / f"kvbudget-path-{os.getpid()}"
    link_dir.mkdir(exist_ok=True)
    link = link_dir / "kvbudget"
    if not link.exists():
        link.symlink_to(Path(kvbudget.__file__).resolve().parent, target_is_directory=True)
    saved = {k: os.environ.get(k) for k in ("KVBUDGET_SCHEDULE_LOG", "PYTHONPATH")}
    os.environ["KVBUDGET_SCHEDULE_LOG"] = str(log_path)
    os.environ["PYTHONPATH"] = str(link_dir)
    try:
        with vllm_server(model_dir, None, max_model_len, "--scheduler-cls",
                         "kvbudget.simulation.recorder.RecordingScheduler", *extra) as url:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
                served = json.loads(r.read())["data"][0]["id"]
            errors: list = []

            def send(prompt: list, max_tokens: int, n: int, beams: bool = False) -> None:
                body = json.dumps({"model": served, "prompt": prompt, "max_tokens": max_tokens, "n": n,
                                   "ignore_eos": True, "temperature": 1.0 if n > 1 and not beams else 0,
                                   "use_beam_search": beams}).encode()
                req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=timeout) as r:
                        got = json.loads(r.read())["usage"]["completion_tokens"]
                    if got != max_tokens * n:
                        errors.append(f"asked for {n} x {max_tokens} tokens, got {got}")
                except OSError as e:
                    errors.append(repr(e))

            threads = []
            start = time.monotonic()
            for at, *request in requests:
                time.sleep(max(0.0, start + at - time.monotonic()))
                t = threading.Thread(target=send, args=tuple(request))
                t.start()
                threads.append(t)
            for t in threads:
                t.join(timeout)
            if errors:
                raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
                metrics = r.read().decode()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    log_path.unlink()  # (read once: the engines' cache keeps models, not a log per run)
    shutil.rmtree(link_dir, ignore_errors=True)
    return records + [{"metrics": metrics}]
