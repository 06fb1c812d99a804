"""`kvbudget simulate --sweep --backend ray[=ADDRESS]` on a real Ray: a cluster started with `ray start --head`
(reached by its address) and a local Ray the command starts itself. The answer must be the single-process one,
byte for byte."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

SWEEP = ["simulate", "llama-3.1-8b", "--gpu", "L4", "--rate", "2", "--requests", "120", "--max-model-len", "8192",
         "--sweep", "kv-dtype=auto,fp8", "max-num-seqs=8,64", "--json"]


# The test cluster runs on this machine only, without Ray's token authentication: with it on, Ray 2.60 joins by
# `address="auto"` but not by an explicit address from a fresh process (a cluster of its own keeps its token).
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def kvbudget(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvbudget", *args], capture_output=True, text=True, timeout=600,
                          env=env or ENV)


@pytest.fixture(scope="module")
def serial() -> list:
    done = kvbudget(*SWEEP, "--backend", "serial")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert len(rows) == 4
    # every point sized on its own: fp8 holds more blocks than auto at each max_num_seqs, and more sequences capture
    # more CUDA graphs (vLLM's estimate of their memory comes out of the budget), leaving fewer blocks
    blocks = {(r["settings"]["kv_dtype"], r["settings"]["max_num_seqs"]): r["result"]["setup"]["num_blocks"]
              for r in rows}
    assert blocks["fp8", 8] > blocks["auto", 8] and blocks["fp8", 64] > blocks["auto", 64]
    assert blocks["auto", 64] < blocks["auto", 8] and blocks["fp8", 64] < blocks["fp8", 8]
    return rows


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A one-node Ray cluster, as `ray start --head` makes one; its address."""
    ray = Path(sys.executable).with_name("ray")
    assert ray.exists(), "the ray command comes with pip install 'kvbudget[ray]'"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tmp_path_factory.mktemp("ray")
    start = subprocess.run([str(ray), "start", "--head", "--port", str(port),
                            "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
                            "--temp-dir", str(temp)], capture_output=True, text=True, timeout=180, env=ENV)
    assert start.returncode == 0, start.stdout + start.stderr
    # the address workers join with, as `ray start` prints it (this machine's address, not loopback)
    found = re.search(r"ray start --address='([^']+)'", start.stdout + start.stderr)
    assert found, start.stdout + start.stderr
    try:
        yield found.group(1)
    finally:
        subprocess.run([str(ray), "stop", "--force"], capture_output=True, timeout=120, env=ENV)
        shutil.rmtree(temp, ignore_errors=True)


def test_sweep_on_a_running_ray_cluster_equals_one_process(serial, ray_head):
    done = kvbudget(*SWEEP, "--backend", f"ray={ray_head}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == serial


def test_sweep_on_a_local_ray_equals_one_process(serial):
    env = {**ENV, "RAY_ADDRESS": ""}  # no cluster to join: the command starts (and stops) its own
    done = kvbudget(*SWEEP, "--backend", "ray", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == serial
