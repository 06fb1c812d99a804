"""The alerts kvbudget.deploy writes beside a deployment, checked by Prometheus's own promtool (Debian's prometheus
package)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kvbudget.deploy import write_all
from kvbudget.deployment import Deployment, PoolPlan

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_promtool_accepts_the_alerts_written_for_a_deployment(tmp_path, engine):
    tool = shutil.which("promtool")
    assert tool, "promtool comes with Debian's prometheus package (apt-get install prometheus)"
    pool = PoolPlan(gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=8192,
                    gpu_memory_utilization=0.85)
    write_all(Deployment(model="llama-3.1-8b", engine=engine, pools=(pool,)), str(tmp_path))
    checked = subprocess.run([tool, "check", "rules", "alerts.yaml"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
