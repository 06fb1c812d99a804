"""`vllm serve` for 0.34's extensible KV cache (engines/vllm/launch.py): engine/arg_utils.py of the 0.34.0 wheel
defines --enable-extensible-kv-cache from a `bool | None` field (so its --no- form), absent from 0.33.0's; the
launcher writes the --no- form where the pool was planned without it, on 0.34 only."""

from __future__ import annotations

from kvbudget import load_model, plan
from kvbudget.deployment import Deployment, PoolPlan
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.vllm.launch import flag_data
from kvbudget.simulation.run import setup_for

OFF = "--no-enable-extensible-kv-cache"


def _argv(release: str, extensible: bool) -> tuple[str, ...]:
    pool = PoolPlan(gpu="H100-80GB", max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=8192,
                    gpu_memory_utilization=0.92 if not extensible else 1.0, extensible_kv_cache=extensible)
    deployment = Deployment(model="meta-llama/Llama-3.1-8B-Instruct", engine="vllm", release=release, pools=(pool,))
    return get_engine("vllm").command(pool, deployment).argv


def test_the_flag_is_0_34s():
    releases = flag_data()["releases"]
    assert "--enable-extensible-kv-cache" in releases["0.34.0"]["negatable"]
    assert "--enable-extensible-kv-cache" not in releases["0.33.0"]["flags"]


def test_written_on_0_34_where_the_plan_turned_it_off():
    assert OFF in _argv("0.34.0", extensible=False)
    assert OFF not in _argv("0.34.0", extensible=True)
    assert OFF not in _argv("0.33.0", extensible=False)  # 0.33 sizes the cache that way and has no such flag


def test_the_simulated_setup_takes_the_budget_the_plan_takes():
    """setup_for (what a deployment's pool is simulated with) passes the switch to the planner."""
    model = load_model("llama-3.1-8b")
    budgets = []
    for on in (True, False):
        setup = setup_for(model, "vllm@0.34", gpu="H100-80GB", max_model_len=8192, extensible_kv_cache=on)
        planned = plan(model, engine="vllm", gpu="H100-80GB", max_model_len=8192, recommend=False,
                       options=EngineOptions(engine_version=(0, 34), extensible_kv_cache=on,
                                             max_num_seqs=setup.max_num_seqs,
                                             max_num_batched_tokens=setup.max_num_batched_tokens))
        assert setup.kv_memory_bytes == planned.kv_memory_bytes
        budgets.append(setup.kv_memory_bytes)
    assert budgets[0] != budgets[1]
