"""Setups for the deployments the writers' tests write: each pool planned as `simulate` would run it, on
llama-3.1-8b from the bundled catalog whatever the deployment names (the writers read only the KV figures)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest

import kvbudget
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines.scheduling.setup import Role, Setup
from kvbudget.simulation.run import setup_for


@cache
def _setup(p: PoolPlan) -> Setup:
    return setup_for(kvbudget.load_model("llama-3.1-8b"), "vllm", gpu=p.gpu, tp=p.tp, pp=p.pp,
                     max_model_len=p.max_model_len, max_num_seqs=p.max_num_seqs,
                     max_num_batched_tokens=p.max_num_batched_tokens, utilization=p.gpu_memory_utilization)


@pytest.fixture
def setups() -> Callable[[Deployment], dict[Role, Setup]]:
    return lambda deployment: {p.role: _setup(p) for p in deployment.pools}
