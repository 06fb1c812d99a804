"""The guard's configuration and the alerts for one deployment, and the engine's own admission limits from the
same numbers.

The guard's levels come from each pool's Setup (the exact memory plan it was simulated with): its KV budget, the
tokens it holds and the requests of max_model_len those make, at each level's fraction (`planner.levels`, the same
table `kvbudget plan` prints). vLLM's own admission (--max-num-queued-reqs / --max-num-queued-tokens, 503 past
them) is set from the guard's reject level (`levels.queue_limits`, which `plan --guard-config` prints too), so that
the engine refuses no earlier than the guard would. A pool that states its own limits keeps them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvbudget.guard.alerts import alert_rules
from kvbudget.guard.config import write_config
from kvbudget.levels import REJECT, queue_limits
from kvbudget.planner import Level, levels

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.scheduling.setup import Setup

def held_bytes(setup: Setup) -> int:
    """The KV cache a replica holds: its budget, or less where the engine allocates less than the budget (llama.cpp
    allocates the cells of its -c whatever memory is free)."""
    allocated = setup.token_slots * setup.bytes_per_token
    return allocated if setup.kv_memory_bytes is None else min(setup.kv_memory_bytes, allocated)


def pool_levels(setup: Setup) -> tuple[Level, ...]:
    """The guard's levels of one replica as simulated: its KV cache, token slots and whole requests of
    max_model_len (the cache over one such request's bytes)."""
    kv = held_bytes(setup)
    per_request = setup.allocation.sequence_bytes(setup.max_model_len) if setup.allocation is not None else 0
    concurrency = kv / per_request if per_request else setup.token_slots / setup.max_model_len
    return levels(kv, setup.token_slots, concurrency)


def with_queue_limits(pool: PoolPlan, setup: Setup) -> PoolPlan:
    """`pool` with the engine's own admission limits from the guard's reject level, where it states none."""
    reject = next(level for level in pool_levels(setup) if level.name == REJECT.name)
    reqs, tokens = queue_limits(pool.max_num_seqs, reject.requests, reject.tokens)
    return replace(pool,
                   max_num_queued_reqs=pool.max_num_queued_reqs if pool.max_num_queued_reqs is not None else reqs,
                   max_num_queued_tokens=pool.max_num_queued_tokens if pool.max_num_queued_tokens is not None
                   else tokens)


def guard_yaml(deployment: Deployment, pool: PoolPlan, setup: Setup) -> str:
    """The guard's configuration for one replica of `pool` (`kvbudget guard --config`), its levels from `setup`,
    and the engine's queue limits beside them as comments."""
    allocation = setup.allocation
    text = write_config(model=deployment.model, engine=deployment.engine, gpu=pool.gpu, tp=pool.tp,
                        kv_budget_bytes=held_bytes(setup),
                        kv_cache_tokens=setup.token_slots,
                        bytes_per_token=allocation.bytes_per_token if allocation else setup.bytes_per_token,
                        fixed_bytes_per_sequence=allocation.fixed_bytes_per_sequence if allocation else 0,
                        max_model_len=setup.max_model_len, levels=pool_levels(setup),
                        written_by="kvbudget.deploy")
    return text + (f"# the engine's own admission from the {REJECT.name} level: max_num_queued_reqs "
                   f"{pool.max_num_queued_reqs}, max_num_queued_tokens {pool.max_num_queued_tokens}\n")


def alerts_yaml(deployment: Deployment) -> str:
    """Prometheus alerting rules on the engine's KV usage at the guard's levels (`kvbudget alerts`' rules)."""
    return alert_rules(deployment.engine)
