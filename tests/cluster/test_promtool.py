"""The alert rules of `kvbudget alerts`, checked and tested by Prometheus's own promtool (Debian's prometheus
package): series that cross each level, go stale, lose scrapes and flap, written and expected by hand; and the
promtool test file `kvbudget simulate --prometheus-series` writes for a replayed trace."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvbudget.levels import LEVELS
from kvbudget.traces import find as bundled_trace

pytestmark = pytest.mark.cluster
TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool comes with Debian's prometheus package (apt-get install prometheus)"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def kvbudget(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvbudget", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llamacpp"])
def test_promtool_accepts_the_rules(tmp_path, engine):
    assert kvbudget("alerts", "--engine", engine, "--out", ".", cwd=tmp_path).returncode == 0
    checked = promtool("check", "rules", "kvbudget-alerts.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout


def firing(alert: str, instance: str, percent: str) -> dict:
    level = next(lv for lv in LEVELS if lv.alert == alert)
    return {"exp_labels": {"severity": level.severity, "instance": instance},
            "exp_annotations": {"summary": f"KV cache at {percent} on {instance}",
                                "description": f"vllm KV usage is at or above {level.threshold:.0%}: {level.meaning}."}}


def check(alert: str, at: str, *alerts: dict) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": list(alerts)}


def series(name: str, values: str) -> dict:
    return {"series": name, "values": values}


def test_promtool_runs_the_rules_on_series_that_cross_stale_and_flap(tmp_path):
    assert kvbudget("alerts", "--out", ".", cwd=tmp_path).returncode == 0
    climbing = {  # one scrape a minute, climbing through the levels and back down
        "interval": "1m",
        "input_series": [series('vllm:kv_cache_usage_perc{instance="a",model_name="m"}',
                                "0.5 0.75 0.75 0.75 0.9 0.9 0.9 0.97 0.97 0.97 0.5 0.5")],
        "alert_rule_test": [
            check("KVCacheWarn", "1m"),  # pending: above 70% for less than 1m
            check("KVCacheWarn", "2m", firing("KVCacheWarn", "a", "75%")),
            check("KVCacheSingleSample", "4m30s"),
            check("KVCacheSingleSample", "5m", firing("KVCacheSingleSample", "a", "90%")),
            check("KVCacheWarn", "5m", firing("KVCacheWarn", "a", "90%")),
            check("KVCacheReject", "7m30s"),
            check("KVCacheReject", "8m", firing("KVCacheReject", "a", "97%")),
            check("KVCacheReject", "10m"), check("KVCacheWarn", "10m"),  # below again: resolved at once
        ]}
    stale = {  # a replica that goes away (stale marker) stops alerting at once; one whose scrapes are lost keeps
        # its last value for Prometheus's 5-minute lookback (the old gauge name is read too)
        "interval": "1m",
        "input_series": [series('vllm:kv_cache_usage_perc{instance="gone"}', "0.97 0.97 0.97 stale"),
                         series('vllm:gpu_cache_usage_perc{instance="silent"}', "0.97 0.97 0.97 _ _ _ _ _ _ _ _")],
        "alert_rule_test": [
            check("KVCacheReject", "2m", firing("KVCacheReject", "gone", "97%"),
                  firing("KVCacheReject", "silent", "97%")),
            check("KVCacheReject", "3m", firing("KVCacheReject", "silent", "97%")),
            check("KVCacheReject", "6m", firing("KVCacheReject", "silent", "97%")),
            check("KVCacheReject", "8m"),
        ]}
    flapping = {  # above and below every level every 30 s: never holds 1m, never fires
        "interval": "30s",
        "input_series": [series('vllm:kv_cache_usage_perc{instance="flap"}', " ".join(["0.97 0.5"] * 10) + " 0.97")],
        "alert_rule_test": [check(a, "10m") for a in ("KVCacheWarn", "KVCacheSingleSample", "KVCacheReject")]}
    tests = {"rule_files": ["kvbudget-alerts.yaml"], "evaluation_interval": "30s",
             "tests": [climbing, stale, flapping]}
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = promtool("test", "rules", "hand.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # one expectation moved a scrape early must fail: the test can fail
    climbing["alert_rule_test"][6]["eval_time"] = "7m30s"
    (tmp_path / "early.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    assert promtool("test", "rules", "early.yaml", cwd=tmp_path).returncode != 0


@pytest.mark.parametrize("guard", [False, True])
def test_a_replayed_trace_fires_what_kvbudget_says(tmp_path, guard):
    """A slice of the Azure conversation trace at twice its rate on an L4: the file's alert tests (when each alert
    starts and stops, computed by kvbudget) pass under promtool; with a guard YAML, its thresholds are the rules'."""
    extra = []
    if guard:
        (tmp_path / "guard.yaml").write_text("levels:\n  - {name: warn, threshold: 0.5}\n"
                                             "  - {name: single-beam, threshold: 0.6}\n"
                                             "  - {name: reject, threshold: 0.99}\n")
        extra = ["--guard-config", "guard.yaml"]
    assert kvbudget("alerts", "--out", ".", *extra, cwd=tmp_path).returncode == 0
    done = kvbudget("simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--trace",
                    str(TRACES / "AzureLLMInferenceTrace_conv.csv"), "--slice", "0:1500", "--rate-scale", "2",
                    "--prometheus-series", "replay.yaml", "--prometheus-interval", "30", "--json", *extra, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "replay.yaml").read_text()
    assert "'vllm:num_requests_waiting{instance=\"simulated\"}'" in text
    assert text.count("exp_labels:") >= 2  # alerts do fire in this run
    tested = promtool("test", "rules", "replay.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every expected firing moved one scrape early breaks the file: promtool really checks the times
    replay = yaml.safe_load(text)
    for case in replay["tests"][0]["alert_rule_test"]:
        if case["exp_alerts"]:
            case["eval_time"] = f"{float(case['eval_time'].removesuffix('s')) - 30:g}s"
    (tmp_path / "shifted.yaml").write_text(yaml.safe_dump(replay))
    assert promtool("test", "rules", "shifted.yaml", cwd=tmp_path).returncode != 0


def test_the_guides_prometheus_config_passes_promtool(tmp_path):
    """The cluster guide's prometheus.yml, beside the rules `kvbudget alerts` writes, as `promtool check config`
    reads it."""
    import re

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "cluster.md").read_text()
    config = next(b for b in re.findall(r"```yaml\n(.*?)```", guide, re.S) if "scrape_configs" in b)
    (tmp_path / "rules").mkdir()
    assert kvbudget("alerts", "--out", "rules", cwd=tmp_path).returncode == 0
    (tmp_path / "prometheus.yml").write_text(config)
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
