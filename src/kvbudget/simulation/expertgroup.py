"""Expert-parallel groups: an MoE model served by D data-parallel ranks that share its routed experts (vLLM
`--data-parallel-size D --enable-expert-parallel`), as vLLM runs them.

    >>> setup = setup_for(model, "vllm", gpu="H100-80GB", expert_parallel=8)
    >>> group = simulate_expert_group(model, read_trace("azure-conv-2023"), setup)
    >>> group.ttft.p99, [r.routed for r in group.replicas]

Every rank has its own scheduler and KV cache (a rank is `_Run`'s clock loop, stepped from here), and every rank
steps together: the MoE layers gather every rank's tokens, so a step lasts as long as the slowest rank's, and a
rank with nothing to run runs a dummy batch while any other has work (vllm/v1/engine/core.py, DPEngineCoreProc).
Under CUDA graphs every rank's batch is padded to the group's largest (vllm/v1/worker/dp_utils.py,
coordinate_batch_across_dp); what each step adds for the group's all-gathers is `ExpertGroup`'s (setups.py). The
requests are spread by vLLM's own balancer: the rank with the lowest 4 x waiting + running, the first of equals,
from the counts its coordinator publishes every 100 ms, each choice counted as waiting on the chosen rank until the
next counts (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from kvbudget.engines.scheduling.setup import Setup
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.fleet import FleetSimulation, _of, _result
from kvbudget.simulation.routing import Pool, Replica, _sent
from kvbudget.simulation.run import CHECK_EVERY, SAMPLE_INTERVAL_S, _Run

COUNTS_EVERY_S = 0.1  # vLLM's DP coordinator publishes the ranks' request counts this often (coordinator.py)
WAITING_WEIGHT = 4  # a waiting request weighs four running ones in the balancer's score
ROUTER = "vllm-dp"  # the name the result gives the balancer


class Balancer:
    """vLLM's data-parallel load balancer over `ranks` ranks, from the counts last published."""

    def __init__(self, ranks: int) -> None:
        self.counts = [[0, 0] for _ in range(ranks)]  # [waiting, running] per rank, as the front end holds them
        self.next = 0.0  # when the coordinator next publishes

    def publish(self, now: float, runs: list[_Run]) -> None:
        """The counts the coordinator publishes at the first step's end at or past its next instant."""
        if now >= self.next:
            self.counts = [[len(r.sched.waiting), len(r.sched.running)] for r in runs]
            self.next = (math.floor(now / COUNTS_EVERY_S) + 1) * COUNTS_EVERY_S

    def choose(self) -> int:
        """The rank with the lowest score, the first of equals; counted as waiting there until the next counts."""
        best = min(range(len(self.counts)), key=lambda i: WAITING_WEIGHT * self.counts[i][0] + self.counts[i][1])
        self.counts[best][0] += 1
        return best


def check_group(setup: Setup) -> None:
    """One line naming what an expert-parallel group cannot be run with, before the run starts."""
    if setup.expert_group is None:
        raise KVBudgetError("expert_parallel: the setup is of one replica alone; give expert_parallel (the "
                            "data-parallel ranks) to setup_for", param="expert_parallel")
    for what, given in (("a KV offload tier", setup.host_tier is not None),
                        ("disaggregated prefill and decode", setup.disagg is not None)):
        if given:
            raise KVBudgetError(f"expert_parallel: not with {what} yet", param="expert_parallel")


def simulate_expert_group(model: Any, workload: Iterable[Request], setup: Setup, *,
                          sample_interval: float = SAMPLE_INTERVAL_S,
                          progress: Callable[[int], None] | None = None, check: Callable[[], None] | None = None,
                          on_route: Callable[[Request, int], None] | None = None,
                          on_step: Callable[..., None] | None = None,
                          on_finish: Callable[..., None] | None = None) -> FleetSimulation:
    """Run `workload` through the expert-parallel group `setup` is one rank of (`setup_for(..., expert_parallel=D)`):
    a FleetSimulation whose replicas are the ranks, behind vLLM's balancer. The hooks as `simulate_fleet`'s, with
    the rank's index first. `model` as simulate_fleet's (unused: the ranks start together)."""
    check_group(setup)
    group = setup.expert_group
    assert group is not None
    pool = Pool(name="main", setup=setup, replicas=group.ranks)
    runs = [_Run(setup, setup.simulator.scheduler(setup), None, False, sample_interval, _of(i, on_step), None,
                 on_finish=_of(i, on_finish), check=check) for i in range(group.ranks)]
    ranks = [Replica(i, pool, run) for i, run in enumerate(runs)]
    balancer = Balancer(group.ranks)
    arrivals = iter(workload)
    pending = next(arrivals, None)
    t, arrived, turns = 0.0, 0, CHECK_EVERY
    while True:
        while pending is not None and pending.arrival <= t:
            rank = _sent(ranks[balancer.choose()], pending, on_route)
            rank.run.offer(pending)
            rank.run.t = t  # (the group's clock: a request that came during a step is taken after it)
            arrived += 1
            if progress is not None and arrived % 1000 == 0:
                progress(arrived)
            pending = next(arrivals, None)
        if not any(r.sched.has_work() for r in runs):
            if pending is None:
                break
            t = pending.arrival
            for r in runs:
                r.t = t
            continue
        turns -= 1
        if not turns and check is not None:
            check()
            turns = CHECK_EVERY
        t += _step(runs, group.graph_tokens, group.gather_latency, group.gather_per_token)
        balancer.publish(t, runs)
    sims = [r.result() for r in runs]
    end = max((s.duration_s for s in sims), default=0.0)
    return _result(ROUTER, (pool,), ranks, sims, arrived, [(0.0, 0.0, None, end)] * len(runs),
                   group.ranks * pool.gpus * end / 3600, None, None)


def _step(runs: list[_Run], graph_tokens: int, gather_latency: float, gather_per_token: float) -> float:
    """One step of every rank together: each rank's own step (or a dummy batch), as long as the slowest rank's;
    its seconds."""
    for r in runs:
        r.sched.clock = r.t
    steps = [r.scheduled(math.inf) if r.sched.has_work() else None for r in runs]
    tokens = [s.tokens if s is not None else 1 for s in steps]  # (a dummy batch: one token)
    largest = max(tokens)
    padded = 0 < largest <= graph_tokens
    gathered = largest * len(runs) if padded else sum(tokens)
    seconds = 0.0
    for run, step, own in zip(runs, steps, tokens, strict=True):
        runs_as = largest if padded else own
        alone = run.seconds(step, runs_as) if step is not None else run.tm.step_seconds(runs_as, 0, 0, 0)
        seconds = max(seconds, alone + gather_latency + gather_per_token * (gathered - runs_as))
    for run, step in zip(runs, steps, strict=True):
        if step is not None:
            run.account(step, seconds)
        else:
            run.t += seconds
    return seconds
