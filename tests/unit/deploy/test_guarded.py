"""The guard's configuration and the alerts written for a deployment, and the engine's queue limits taken from
the same levels: the figures checked against `kvbudget plan`'s own degradation table for the same pool."""

from __future__ import annotations

import pytest
import yaml

import kvbudget
from kvbudget.deploy import files, planned_setup
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines import EngineOptions
from kvbudget.engines.scheduling.setup import Role
from kvbudget.guard.config import parse
from kvbudget.levels import LEVELS

POOL = PoolPlan(gpu="H100-80GB", replicas=2, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=32768,
                gpu_memory_utilization=0.9)
DEPLOYMENT = Deployment(model="llama-3.1-8b", engine="vllm", pools=(POOL,))


@pytest.fixture(scope="module")
def written():
    return {f.name: f.text for f in files(DEPLOYMENT, {Role.BOTH: planned_setup(DEPLOYMENT, POOL)}, 16 * 2**30)}


@pytest.fixture(scope="module")
def planned():
    """`kvbudget plan` for the same pool: its levels are what `plan --guard-config` writes."""
    return kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", max_model_len=32768,
                         utilization=0.9, options=EngineOptions(max_num_seqs=256, max_num_batched_tokens=8192))


def test_the_guard_config_is_the_plans_levels_and_reads_back(written, planned):
    config = parse(yaml.safe_load(written["guard.yaml"]), "guard.yaml")
    assert config.model == "llama-3.1-8b" and config.gpu == "H100-80GB" and config.max_model_len == 32768
    # the cache the replica holds: the plan's budget in whole blocks of 16 tokens (under one block left over),
    # less vLLM's null block (0.29+)
    block = 16 * planned.estimate.bytes_per_token
    assert 0 <= planned.kv_memory_bytes - config.kv_budget_bytes < 2 * block
    # the simulated setup counts vLLM's slots after its null block: one block of 16 below the plan's
    for ours, theirs in zip(config.levels, planned.levels, strict=True):
        assert (ours.name, ours.threshold, ours.requests) == (theirs.name, theirs.fraction, theirs.requests)
        assert 0 <= theirs.tokens - ours.tokens <= 16


def test_the_engines_queue_limits_are_the_guards_reject_level(written, planned):
    reject = planned.levels[-1]
    argv = written["serve.sh"].split("exec ", 1)[1].split()
    reqs = int(argv[argv.index("--max-num-queued-reqs") + 1])
    tokens = int(argv[argv.index("--max-num-queued-tokens") + 1])
    assert reqs == 256 + reject.requests  # what runs at once, and a queue of one more full cache at the level
    assert 0 <= reject.tokens - tokens <= 16
    assert f"max_num_queued_reqs {reqs}, max_num_queued_tokens {tokens}" in written["guard.yaml"]


def test_plan_guard_config_says_the_same_flags_as_the_deployment(written, planned):
    """`plan --guard-config` for the same pool writes the flags serve.sh runs with (one function for both; the
    simulated setup's slots are one block of 16 below the plan's, after vLLM's null block)."""
    from kvbudget.guard.config import guard_config_yaml

    argv = written["serve.sh"].split("exec ", 1)[1].split()
    said = guard_config_yaml(planned).splitlines()[-1].split()
    for flag, most in (("--max-num-queued-reqs", 0), ("--max-num-queued-tokens", 16)):
        assert 0 <= int(said[said.index(flag) + 1]) - int(argv[argv.index(flag) + 1]) <= most, (said, argv)


def test_limits_a_pool_states_are_kept():
    p = PoolPlan(**{**POOL.__dict__, "max_num_queued_reqs": 7, "max_num_queued_tokens": 9000})
    d = Deployment(model="llama-3.1-8b", engine="vllm", pools=(p,))
    text = {f.name: f.text for f in files(d, {Role.BOTH: planned_setup(d, p)}, 16 * 2**30)}["serve.sh"]
    assert "--max-num-queued-reqs 7 --max-num-queued-tokens 9000" in text


def test_the_alerts_fire_at_the_guards_levels(written):
    rules = yaml.safe_load(written["alerts.yaml"])["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [lv.alert for lv in LEVELS]
    for rule, level in zip(rules, LEVELS, strict=True):
        assert rule["expr"].endswith(f">= {level.threshold}") and "vllm:" in rule["expr"]
        assert rule["labels"]["severity"] == level.severity


def test_llama_servers_guard_counts_the_cells_it_allocates_not_the_free_memory():
    # llama-server -np 4 -c 4 x 8192 allocates 32,768 cells whatever the L4 has free: 4 requests of 8,192 at most
    p = PoolPlan(gpu="L4", max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=8192,
                 gpu_memory_utilization=0.9, kv_dtype="q8_0")
    d = Deployment(model="llama-3.1-8b", engine="llamacpp", pools=(p,))
    text = {f.name: f.text for f in files(d, {Role.BOTH: planned_setup(d, p)}, 16 * 2**30)}["guard.yaml"]
    config = parse(yaml.safe_load(text), "guard.yaml")
    assert config.kv_cache_tokens == 32768
    assert config.kv_budget_bytes == 32768 * config.bytes_per_token
    assert [lv.requests for lv in config.levels] == [int(4 * lv.threshold) for lv in LEVELS]  # 2, 3, 3
