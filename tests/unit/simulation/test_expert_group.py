"""Expert-parallel groups (vLLM --data-parallel-size N --enable-expert-parallel): every rank its own scheduler and
KV cache, stepping together, behind vLLM's own balancer; the routed experts and the all-gathers in the step time."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace
from importlib import resources

import pytest
from simkit import AZURE, close

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, read_trace
from kvbudget.gpus import find_gpu
from kvbudget.planner import plan
from kvbudget.simulation.expertgroup import Balancer, simulate_expert_group
from kvbudget.simulation.run import setup_for, simulate

MOE = kvbudget.load_model("qwen3-30b-a3b")  # 48 layers, every one with 128 routed experts (8 a token), hidden 2048
LEN = 8192


def group(ranks: int, **kw: object) -> kvbudget.simulation.run.Setup:  # type: ignore[name-defined]
    return setup_for(MOE, "vllm", gpu="H100-80GB", max_model_len=LEN, expert_parallel=ranks, **kw)  # type: ignore


def test_memory_is_the_plans_for_ranks_sharing_the_experts():
    """Each rank's KV cache is what `plan --gpus N --expert-parallel` finds: more than one GPU holding every expert."""
    s = group(4)
    p = plan(MOE, gpu="H100-80GB", gpus=4, expert_parallel=True, max_model_len=LEN, recommend=False)
    alone = setup_for(MOE, "vllm", gpu="H100-80GB", max_model_len=LEN)
    assert s.kv_memory_bytes == p.kv_memory_bytes
    assert s.num_blocks > 3 * alone.num_blocks  # the experts are ~95% of its 61 GB of weights


def test_step_time_reads_a_rank_of_the_experts_and_adds_the_gathers():
    """By hand: the expert read divided over the ranks, the share a token routes to raised to the group's tokens;
    two collectives per MoE layer, each moving the other ranks' 16-bit hidden vectors at the link's bus rate."""
    alone = setup_for(MOE, "vllm", gpu="H100-80GB", max_model_len=LEN).time_model
    s = group(4)
    tm, g = s.time_model, s.expert_group
    assert g is not None and g.ranks == 4
    assert tm.experts == pytest.approx(alone.experts / 4)
    assert 1 - tm.expert_share == pytest.approx((1 - 8 / 128) ** 4)
    links = json.loads((resources.files("kvbudget") / "data" / "interconnects.json").read_text())["links"]
    card = find_gpu("H100-80GB")
    assert card.nvlink_bytes_per_s is not None
    bus = links["nvlink"]["bus_share"] * card.nvlink_bytes_per_s / 2
    assert g.gather_per_token == pytest.approx(2 * 48 * 2 * 2048 / bus)
    assert g.gather_latency == pytest.approx(2 * 48 * links["nvlink"]["latency_us"] * 1e-6)
    assert g.graph_tokens == min(s.max_num_seqs * 2, 512, s.max_num_batched_tokens)
    assert "over 4 ranks" in tm.basis and "estimate" in tm.basis


def _without_gathers(s):
    assert s.expert_group is not None
    return replace(s, expert_group=replace(s.expert_group, gather_latency=0.0, gather_per_token=0.0))


def test_one_request_in_an_idle_group_runs_as_on_its_rank_alone():
    """The other ranks run dummy batches, which are never the slowest: without the gathers' time the request's
    latencies are those of the same rank alone; with a fixed gather time per step, each step that much longer."""
    s = _without_gathers(group(2))
    r = [Request(arrival=0.0, prompt_tokens=300, output_tokens=40)]
    g = simulate_expert_group(MOE, r, s)
    alone = simulate(MOE, r, setup=s, fast=False)
    assert [x.routed for x in g.replicas] == [1, 0]
    assert g.e2e.max == pytest.approx(alone.e2e.max, rel=1e-12)
    assert g.ttft.max == pytest.approx(alone.ttft.max, rel=1e-12)
    late = replace(s, expert_group=replace(s.expert_group, gather_latency=0.001))
    slower = simulate_expert_group(MOE, r, late)
    assert slower.e2e.max == pytest.approx(alone.e2e.max + 0.001 * alone.steps, rel=1e-9)


def test_a_long_prefill_on_one_rank_stalls_the_others_decodes():
    """Lockstep: a rank decoding alone waits for the step in which another rank computes a long prompt."""
    s = _without_gathers(group(2))
    first = Request(arrival=0.0, prompt_tokens=50, output_tokens=200)
    long = Request(arrival=0.05, prompt_tokens=7000, output_tokens=2)
    both = simulate_expert_group(MOE, [first, long], s)
    assert [x.routed for x in both.replicas] == [1, 1]  # (rank 0 counted one waiting: the second goes to rank 1)
    alone = simulate_expert_group(MOE, [first], s)
    prefill = simulate_expert_group(MOE, [replace(long, arrival=0.0)], s).ttft.max  # the long prompt's step
    decoder = both.replicas[0].simulation
    assert prefill > 20 * alone.tpot.max
    # its token in the prefill's step took about the prefill's time (ranks apart, it would be delayed by nothing)
    assert decoder.e2e.max - alone.e2e.max > 0.8 * prefill


def test_the_balancer_is_vllms():
    """Lowest 4 x waiting + running, first of equals, each choice counted as waiting until the next counts."""
    b = Balancer(3)
    b.counts = [[2, 1], [1, 5], [0, 0]]
    # scores 9 9 0 -> 9 9 4 -> 9 9 8 -> 9 9 12: rank 2 three times, then the first of the equal 9s
    assert [b.choose() for _ in range(5)] == [2, 2, 2, 0, 1]
    assert b.counts == [[3, 1], [2, 5], [3, 0]]


def test_simultaneous_arrivals_spread_one_a_rank():
    s = group(4)
    sent: list[int] = []
    reqs = [Request(arrival=0.0, prompt_tokens=100, output_tokens=5) for _ in range(8)]
    simulate_expert_group(MOE, reqs, s, on_route=lambda r, i: sent.append(i))
    assert sent == [0, 1, 2, 3, 0, 1, 2, 3]


def test_every_request_completes_and_the_ranks_share_a_clock():
    reqs = list(itertools.islice(read_trace(AZURE), 300))
    g = simulate_expert_group(MOE, reqs, group(4))
    assert g.completed == 300 == sum(r.routed for r in g.replicas)
    ends = {round(r.simulation.duration_s, 9) for r in g.replicas if r.simulation.steps}
    assert len(ends) == 1  # every rank that stepped stepped until the group's end
    close(g.duration_s, max(r.simulation.duration_s for r in g.replicas))


def test_refusals_name_the_setting():
    dense = kvbudget.load_model("llama-3.1-8b")
    with pytest.raises(KVBudgetError, match="no routed experts"):
        setup_for(dense, "vllm", gpu="H100-80GB", max_model_len=LEN, expert_parallel=2)
    with pytest.raises(KVBudgetError, match="expert_parallel: simulate follows vLLM"):
        setup_for(MOE, "llamacpp", gpu="H100-80GB", max_model_len=LEN, expert_parallel=2)
    alone = setup_for(MOE, "vllm", gpu="H100-80GB", max_model_len=LEN)
    with pytest.raises(KVBudgetError, match="calibrated time model"):
        setup_for(MOE, "vllm", gpu="H100-80GB", max_model_len=LEN, expert_parallel=2, time_model=alone.time_model)
    with pytest.raises(KVBudgetError, match="expert_parallel"):
        simulate_expert_group(MOE, [], alone)


@pytest.mark.parametrize("args, needle", [
    (["--expert-parallel"], "--expert-parallel: the ranks are the replicas; give --replicas N"),
    (["--expert-parallel", "--replicas", "1"], "of 2 or more"),
    (["--expert-parallel", "--replicas", "2", "--router", "least-requests"], "--router: not with --expert-parallel"),
])
def test_cli_refuses_in_one_line(args, needle):
    out = subprocess.run([sys.executable, "-m", "kvbudget", "simulate", "qwen3-30b-a3b", "--gpu", "H100-80GB",
                          "--max-model-len", "8192", "--trace", "azure-conv-2023", *args], capture_output=True,
                         text=True)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_recommend_lists_expert_parallel_groups_for_an_moe_model_only():
    from kvbudget.engines import get_engine
    from kvbudget.engines.scheduling.setup import SimulationAsk
    from kvbudget.simulation.recommend import Space, candidates, searches_expert_groups

    space = Space(gpus=("H100-80GB",), max_gpus=4, tp=(1, 2), kv_dtypes=("auto",), disaggregated=False)
    moe = SimulationAsk(model=MOE, engine=get_engine("vllm"))
    dense = SimulationAsk(model=kvbudget.load_model("llama-3.1-8b"), engine=get_engine("vllm"))
    assert searches_expert_groups(moe) and not searches_expert_groups(dense)
    assert not searches_expert_groups(replace(moe, engine=get_engine("llamacpp")))
    groups = [(c.tp, c.replicas) for c in candidates(space, True) if c.expert_parallel]
    assert groups == [(1, 2), (1, 3), (1, 4), (2, 2)]  # 2 or more ranks of tp GPUs each, within max_gpus
    assert not any(c.expert_parallel for c in candidates(space, False))
    assert not any(c.expert_parallel for c in candidates(replace(space, expert_parallel=False), True))


def test_recommend_simulates_a_group_and_writes_its_flags(tmp_path):
    """A search whose only candidate is a group: simulated as one (its GPU-hours the group's), and the deployment
    written as one vLLM server with --data-parallel-size and --enable-expert-parallel."""
    from kvbudget.engines import get_engine
    from kvbudget.engines.scheduling.setup import SimulationAsk
    from kvbudget.simulation.recommend import Space, recommend
    from kvbudget.simulation.search import parse_slo

    reqs = list(itertools.islice(read_trace(AZURE), 200))
    space = Space(gpus=("H100-80GB",), max_gpus=2, tp=(1,), kv_dtypes=("auto",), disaggregated=False)
    ask = SimulationAsk(model=MOE, engine=get_engine("vllm"), max_model_len=LEN)
    found = recommend(ask, reqs, parse_slo("ttft_p99=10s"), space, {None: 2.0}, backend="serial")
    group_run = [t for t in found.tried if t.candidate.expert_parallel]
    assert len(group_run) == 1 and group_run[0].measured.completed == 200
    alone = simulate_expert_group(MOE, reqs, group(2))
    assert group_run[0].measured.duration_s == pytest.approx(alone.duration_s, rel=1e-12)
    assert group_run[0].measured.gpu_hours == pytest.approx(2 * alone.duration_s / 3600, rel=1e-9)
    assert group_run[0].met
    pool = replace(found, best=group_run[0]).deployment().pools[0]  # the group as the choice
    assert pool.expert_ranks == 2 and pool.replicas == 1 and pool.gpus == 2 and pool.tp == 1
