"""`write_all`: every file of a deployment written whole into a folder, or none, and bad input refused in one line
before any planning."""

from __future__ import annotations

import os

import pytest

from kvbudget.deploy import write_all
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError


def pool(role: Role = Role.BOTH) -> PoolPlan:
    return PoolPlan(role=role, replicas=2, gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=8192,
                    max_model_len=8192, gpu_memory_utilization=0.9)


CO_LOCATED = Deployment(model="llama-3.1-8b", engine="vllm", pools=(pool(),),
                        notes=("TTFT p99 from the simulation: check it on your own traffic",))
DISAGG = Deployment(model="llama-3.1-8b", engine="vllm", pools=(pool(Role.PREFILL), pool(Role.DECODE)),
                    kv_link="infiniband")


def test_the_files_of_a_co_located_deployment(tmp_path, setups):
    paths = write_all(CO_LOCATED, str(tmp_path), setup_for_pool=lambda p: setups(CO_LOCATED)[p.role])
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(["serve.sh", "guard.yaml", "alerts.yaml", "llm-d-values.yaml",
                            "kserve-llminferenceservice.yaml", "README.md"])
    assert sorted(os.listdir(tmp_path)) == names  # nothing else left behind (no temporary files)
    readme = (tmp_path / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names if name != "README.md")
    assert "TTFT p99 from the simulation: check it on your own traffic" in readme
    assert (tmp_path / "serve.sh").read_text().startswith("#!/bin/sh\n")


def test_a_disaggregated_deployment_gets_a_command_and_a_guard_per_side(tmp_path, setups):
    paths = write_all(DISAGG, str(tmp_path), setup_for_pool=lambda p: setups(DISAGG)[p.role])
    names = {os.path.basename(p) for p in paths}
    assert {"serve-prefill.sh", "serve-decode.sh", "guard-prefill.yaml", "guard-decode.yaml"} <= names
    assert "infiniband" in (tmp_path / "README.md").read_text()


def test_without_setups_each_pool_is_planned_from_its_settings(tmp_path):
    write_all(CO_LOCATED, str(tmp_path))
    assert "kv_budget_bytes:" in (tmp_path / "guard.yaml").read_text()
    # Llama-3.1-8B: 8.03 B parameters in bf16 (16.06 GB, 14.96 GiB) and a tenth more: 16.45 GiB, so 17Gi
    assert 'size: "17Gi"' in (tmp_path / "llm-d-values.yaml").read_text()


def test_a_checkpoint_size_out_of_range_is_one_line(tmp_path, setups):
    with pytest.raises(KVBudgetError) as exc:
        write_all(CO_LOCATED, str(tmp_path), setup_for_pool=lambda p: setups(CO_LOCATED)[p.role], model_bytes=0)
    assert exc.value.param == "model_bytes" and os.listdir(tmp_path) == []


def test_existing_files_are_kept_unless_forced(tmp_path, setups):
    def given(p):
        return setups(CO_LOCATED)[p.role]

    (tmp_path / "alerts.yaml").write_text("mine\n")
    with pytest.raises(KVBudgetError) as exc:
        write_all(CO_LOCATED, str(tmp_path), setup_for_pool=given, param="out")
    assert exc.value.param == "out" and "\n" not in str(exc.value)
    assert os.listdir(tmp_path) == ["alerts.yaml"] and (tmp_path / "alerts.yaml").read_text() == "mine\n"
    write_all(CO_LOCATED, str(tmp_path), setup_for_pool=given, force=True)
    assert (tmp_path / "alerts.yaml").read_text() != "mine\n" and len(os.listdir(tmp_path)) == 6


def test_bad_input_is_one_line_before_any_planning(tmp_path):
    def never(p):
        raise AssertionError("planned")

    with pytest.raises(KVBudgetError) as exc:
        write_all(CO_LOCATED, str(tmp_path / "missing"), setup_for_pool=never)
    assert exc.value.param == "directory" and "missing" in str(exc.value)
    tgi = Deployment(model="llama-3.1-8b", engine="tgi", pools=(pool(),))
    with pytest.raises(KVBudgetError) as exc:
        write_all(tgi, str(tmp_path), setup_for_pool=never)
    assert exc.value.param == "engine" and "vllm" in str(exc.value) and "\n" not in str(exc.value)
    assert os.listdir(tmp_path) == []


def test_a_model_that_cannot_be_loaded_names_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = Deployment(model="no-such-org/no-such-model", engine="vllm", pools=(pool(),))
    with pytest.raises(KVBudgetError) as exc:
        write_all(missing, str(tmp_path))
    assert exc.value.param == "model" and "no-such-org/no-such-model" in str(exc.value)
    assert "\n" not in str(exc.value) and os.listdir(tmp_path) == []


def test_a_setting_the_engine_cannot_take_is_refused_before_planning(tmp_path):
    def never(p):
        raise AssertionError("planned")

    llama = Deployment(model="llama-3.1-8b", engine="llamacpp", pools=(PoolPlan(**{**pool().__dict__, "tp": 2}),))
    with pytest.raises(KVBudgetError) as exc:
        write_all(llama, str(tmp_path), setup_for_pool=never)
    assert exc.value.param == "tp" and os.listdir(tmp_path) == []


def test_a_release_no_dynamo_runtime_bundles_gets_the_other_files_and_a_note(tmp_path, setups):
    # vLLM 0.10 has the NIXL connector (0.9) but no Dynamo runtime ships it (the oldest known bundles 0.11.0)
    old = Deployment(**{**DISAGG.__dict__, "release": "0.10.2"})
    names = {os.path.basename(p) for p in write_all(old, str(tmp_path), setup_for_pool=lambda p: setups(DISAGG)[p.role],
                                                    model_bytes=2**30)}
    assert "dynamo-graphdeployment.yaml" not in names and "serve-decode.sh" in names
    assert "no DynamoGraphDeployment: release: vLLM 0.10.2" in (tmp_path / "README.md").read_text()
