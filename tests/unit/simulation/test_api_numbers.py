"""The Python API's numbers: `setup_for`, `simulate` and the workload builders refuse a value out of range, of the
wrong type or not finite in one line naming the parameter, whoever calls them (the command line's readers are
one caller; a script is another), before any planning or simulation."""

from __future__ import annotations

import math

import pytest

import kvbudget
from kvbudget.errors import KVBudgetError
from kvbudget.simulation import exponential_lengths, read_trace, rescale, setup_for, synthetic

BASE = {"gpu": "H100-80GB", "max_model_len": 8192}
HOSTILE = [math.nan, math.inf, -1, 10**400, True, "5"]
SETUP_NUMBERS = ["num_blocks", "max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold", "cache_ram",
                 "disk_read", "block_size", "gpu_memory", "kv_memory", "weights", "utilization", "offload_memory",
                 "offload_disk", "tp", "pp", "max_model_len"]


@pytest.fixture(scope="module")
def model():
    return kvbudget.load_model("llama-3.1-8b")


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
@pytest.mark.parametrize("param", SETUP_NUMBERS)
def test_setup_for_refuses_each_hostile_number(model, param, value):
    with pytest.raises(KVBudgetError) as refused:
        setup_for(model, **{**BASE, param: value})
    assert refused.value.param == param and str(refused.value).startswith(f"{param}: ")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("param, value", [("max_num_seqs", 0), ("max_model_len", 0), ("num_blocks", 0),
                                          ("max_num_batched_tokens", 0), ("block_size", 0), ("utilization", 1.5)])
def test_a_zero_is_not_taken_as_not_given(model, param, value):
    """0 blocks, sequences or tokens is refused, not read as "the engine's default"."""
    with pytest.raises(KVBudgetError) as refused:
        setup_for(model, **{**BASE, param: value})
    assert refused.value.param == param


@pytest.mark.parametrize("lora, param", [((0, 16), "max_loras"), ((1, math.nan), "max_lora_rank")])
def test_lora_numbers(model, lora, param):
    with pytest.raises(KVBudgetError) as refused:
        setup_for(model, **BASE, lora=lora)
    assert refused.value.param == param


def test_good_numbers_pass_through(model):
    s = setup_for(model, gpu="H100-80GB", max_model_len=8192, num_blocks=1000, max_num_seqs=64,
                  max_num_batched_tokens=4096, long_prefill_token_threshold=0)
    assert (s.num_blocks, s.max_num_seqs, s.max_num_batched_tokens) == (1000, 64, 4096)


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
@pytest.mark.parametrize("param", ["sample_interval", "guard_poll_interval"])
def test_simulate_refuses_hostile_intervals_before_it_runs(model, param, value):
    with pytest.raises(KVBudgetError) as refused:
        kvbudget.simulate(model, iter(()), **BASE, **{param: value})
    assert refused.value.param == param


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
@pytest.mark.parametrize("param", ["rate", "count", "seed", "cv"])
def test_synthetic_arrivals_refuse_hostile_numbers_when_called(param, value):
    given = {"rate": 1.0, "count": 10, "seed": 0, "cv": 1.0, param: value}
    with pytest.raises(KVBudgetError) as refused:
        synthetic(given["rate"], given["count"], exponential_lengths(100, 10), seed=given["seed"], cv=given["cv"])
    assert refused.value.param == param


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: repr(v)[:12])
@pytest.mark.parametrize("param", ["rate_scale", "start", "count"])
def test_rescale_refuses_hostile_numbers_when_called(param, value):
    with pytest.raises(KVBudgetError) as refused:
        rescale(read_trace("azure-conv-2023"), **{param: value})
    assert refused.value.param == param


def test_a_seed_and_a_variation_in_range_still_give_arrivals():
    requests = list(synthetic(2.0, 5, exponential_lengths(100, 10), seed=2**64 - 1, cv=100.0))
    assert len(requests) == 5 and requests[0].arrival == 0.0
    assert [r.id for r in rescale(iter(requests), 2.0, start=1, count=2)] == ["1", "2"]
