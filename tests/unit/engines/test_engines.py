"""The serving engines' arithmetic on the bundled models: figures from the engines' own definitions.

Real-engine agreement is in tests/engines/ (pytest -m engines); these tests pin the rules that hold
for every model and the published figures quoted in the issue and the engines' logs.
"""

from __future__ import annotations

import pytest

import kvbudget
from kvbudget import KVBudgetError, estimate, load_model
from kvbudget.engines import ENGINES, EngineOptions, get_engine
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.vllm import VLLM
from kvbudget.units import GIB


def cap(name, engine="vllm", kv=20 * GIB, max_len=None, **opts):
    model = load_model(name)
    return get_engine(engine).capacity(model, kv, max_len or model.max_position_embeddings,
                                       options=EngineOptions(**opts))


def test_every_engine_estimates_the_catalog_or_says_why():
    for entry in kvbudget.catalog.entries():
        model = load_model(entry.name)
        for name in ENGINES:
            try:
                result = estimate(model, engine=name, context=[4096])
            except KVBudgetError as exc:  # the limits each engine module states: TGI has no recurrent state,
                # neither llama.cpp nor TGI is modelled with DeepSeek-V3.2's indexer cache
                known = {("tgi", "recurrent"), ("tgi", "indexer"), ("llamacpp", "indexer"), ("llamacpp", "Gemma 4"),
                         ("sglang", "Gemma 4"), ("tgi", "Gemma 4")}
                # DeepSeek-V4's compressed caches: only transformers' dynamic cache is modelled
                known |= {(e, "compressed cache") for e in ("vllm", "sglang", "llamacpp", "tgi")}
                known.add(("hf-static", "compressor's state"))
                assert any(name == e and word in str(exc) for e, word in known), (entry.name, name, exc)
                continue
            assert result.points[0].kv_bytes > 0, (entry.name, name)


def test_deepseek_v3_latent_vs_expanded():
    # vLLM caches the 576-wide latent (70,272 bytes/token, the same on every TP rank); TGI expands it.
    assert estimate(load_model("deepseek-v3"), engine="vllm", tp=8).bytes_per_token == 70_272
    assert estimate(load_model("deepseek-v3"), engine="tgi").bytes_per_token == 5_996_544
    assert estimate(load_model("deepseek-v3"), engine="sglang").bytes_per_token == 70_272


def test_vllm_uniform_model_blocks_and_concurrency():
    c = cap("llama-3.1-8b", kv=20 * GIB, max_len=131072)
    page = 16 * 8 * 256 * 2  # block 16, 8 KV heads, K+V 128 each, bf16
    assert c.block_size == 16 and c.num_blocks == 20 * GIB // (32 * page)
    assert c.max_concurrency == c.num_blocks / (131072 // 16)
    assert c.kv_cache_tokens == int(c.max_concurrency * 131072)
    assert c.fits


def test_vllm_per_token_head_caches_store_scales_beside_each_head():
    """vLLM 0.32's Triton backend (customize_spec): per token and KV head, K's and V's codes (one byte each, half
    a byte for int4) and two float32 scales. Llama-3.1-8B: 32 layers x 8 heads x (128 + 128 + 8) = 67,584 bytes
    per token for int8 and fp8, 32 x 8 x (64 + 64 + 8) = 34,816 for int4; Qwen3-Next keeps its linear-attention
    state as before. MLA models, the CPU backend and other engines refuse them."""
    model = load_model("llama-3.1-8b")
    for name, per_head in (("int8_per_token_head", 264), ("fp8_per_token_head", 264), ("int4_per_token_head", 136)):
        assert estimate(model, engine="vllm", kv_dtype=name).bytes_per_token == 32 * 8 * per_head
        assert estimate(model, engine="vllm", kv_dtype=name, tp=2).bytes_per_token == 32 * 4 * per_head
    hybrid = load_model("qwen3-next-80b-a3b")
    auto = estimate(hybrid, engine="vllm", kv_dtype="fp8").points[0]
    head = estimate(hybrid, engine="vllm", kv_dtype="int8_per_token_head").points[0]
    assert head.kv_bytes > auto.kv_bytes
    for kw, message in (({"model": load_model("deepseek-v3")}, "latent"), ({"options": EngineOptions(device="cpu")},
                        "CPU attention backend"), ({"engine": "sglang"}, "SGLang"), ({"engine": "hf"}, "vLLM cache")):
        args = {"model": model, "engine": "vllm", "kv_dtype": "int8_per_token_head", **kw}
        with pytest.raises(KVBudgetError, match=message):
            estimate(args.pop("model"), **args)


def test_vllm_max_len_that_does_not_fit_gives_the_estimated_length():
    c = cap("llama-3.1-8b", kv=10 * GIB, max_len=131072)
    assert not c.fits
    # One block is the null block; the rest hold the longest request, in whole blocks.
    assert c.estimated_max_model_len == (c.num_blocks - 1) * 16
    assert "estimated maximum model length is" in c.notes[0]


def test_vllm_qwen3_next_raises_the_block_to_cover_the_state():
    plan, _ = VLLM.layout(load_model("qwen3-next-80b-a3b"), "auto", 1, EngineOptions())
    assert plan.block_size == 544  # 16 x cdiv(1,097,728 state bytes, 16 x 2,048 bytes per token)
    assert plan.page == 544 * 2048
    assert plan.group_size == 12 and plan.num_groups == 4  # 36 linear -> 3 groups, 12 full -> 1


def test_vllm_prefix_caching_keeps_two_state_blocks():
    on = cap("qwen3-next-80b-a3b", max_len=32768)
    off = cap("qwen3-next-80b-a3b", max_len=32768, prefix_caching=False)
    assert off.max_concurrency > on.max_concurrency
    per_on = on.num_blocks / on.max_concurrency
    per_off = off.num_blocks / off.max_concurrency
    assert round(per_on - per_off) == 3  # one fewer block in each of the 3 linear-attention groups


def test_vllm_sliding_window_reservation_grows_with_batched_tokens():
    small = cap("gpt-oss-20b", max_len=131072, max_num_batched_tokens=2048)
    large = cap("gpt-oss-20b", max_len=131072, max_num_batched_tokens=8192)
    assert large.max_concurrency < small.max_concurrency


def test_vllm_kv_cache_tokens_exceeds_physical_slots_for_windowed_models():
    c = cap("gemma-2-9b", max_len=8192)
    assert c.kv_cache_tokens > c.physical_token_slots


def test_vllm_gemma3_pads_the_short_group():
    plan, _ = VLLM.layout(load_model("gemma-3-1b"), "auto", 1, EngineOptions())
    # 26 layers: 22 sliding, 4 full... group size 4: 6 sliding groups (24 slots, 2 padding) + 1 full group.
    buckets = {type(spec): (layers, groups) for spec, layers, groups in plan.buckets}
    assert plan.group_size == min(layers for layers, _ in buckets.values())
    padded = sum(groups * plan.group_size - layers for layers, groups in buckets.values())
    assert padded > 0


@pytest.mark.parametrize("kwargs, param", [({"batch": [1, 2**24 + 1]}, "batch"), ({"context": [2**30 + 1]}, "context"),
                                           ({"beams": 0}, "beams"), ({"tp": True}, "tp"), ({"beams": 2.0}, "beams"),
                                           ({"kv_memory": -1}, "kv_memory"), ({"max_model_len": "4096",
                                                                               "kv_memory": GIB}, "max_model_len")])
def test_out_of_range_arguments_name_their_parameter(kwargs, param):
    with pytest.raises(KVBudgetError) as exc:
        estimate(load_model("mistral-7b"), "vllm", **kwargs)
    assert exc.value.param == param and str(exc.value).startswith(param)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_budget_below_one_block_is_refused(engine):
    with pytest.raises(kvbudget.BudgetError, match="^kv_memory") as exc:
        cap("llama-3.1-8b", engine=engine, kv=1000, max_len=4096)
    assert exc.value.param == "kv_memory"  # the library names its parameter; the CLI shows it as --kv-memory


def test_block_sizes_the_engines_do_not_allow():
    with pytest.raises(KVBudgetError, match="multiples of 16"):
        cap("llama-3.1-8b", block_size=24)
    with pytest.raises(KVBudgetError, match="TGI uses"):
        cap("llama-3.1-8b", engine="tgi", block_size=32)
    with pytest.raises(KVBudgetError, match="no KV blocks"):
        cap("llama-3.1-8b", engine="llamacpp", block_size=16)
    with pytest.raises(KVBudgetError, match="has no blocks"):
        cap("llama-3.1-8b", engine="hf", block_size=16)


def test_tensor_parallel_sizes_the_engines_reject():
    with pytest.raises(KVBudgetError, match="one must divide the other"):
        estimate(load_model("qwen2.5-7b"), engine="vllm", tp=7)  # 28 query heads split, 4 KV heads do not
    with pytest.raises(KVBudgetError, match="attention heads"):
        estimate(load_model("falcon-7b-instruct"), engine="vllm", tp=2)  # 71 query heads
    with pytest.raises(KVBudgetError, match="llama.cpp splits layers"):
        estimate(load_model("llama-3.1-8b"), engine="llamacpp", tp=2)


def test_llamacpp_caches_mistral_window_in_full_and_honours_gemma2():
    mistral = LLAMACPP.server_buffers(load_model("mistral-7b"), 32768)
    assert [b.name for b in mistral] == ["kv"] and mistral[0].cells == 32768
    gemma = LLAMACPP.server_buffers(load_model("gemma-2-9b"), 8192, 1)
    assert [(b.name, b.cells) for b in gemma] == [("kv", 8192), ("kv_swa", 4608)]


def test_llamacpp_q8_0_row_sizes():
    # q8_0 stores 32 values in 34 bytes: Llama-3.1-8B's 1,024-wide K and V rows take 1,088 bytes each.
    result = estimate(load_model("llama-3.1-8b"), engine="llamacpp", kv_dtype="q8_0", context=[256])
    assert result.bytes_per_token == 32 * 2 * 1088
    assert result.allocation.exact


def test_llamacpp_pads_cells_to_256():
    result = estimate(load_model("llama-3.1-8b"), engine="llamacpp", context=[1000, 1024, 1025])
    per_cell = 32 * 2 * 1024 * 2
    assert [p.kv_bytes for p in result.points] == [1024 * per_cell, 1024 * per_cell, 1280 * per_cell]


def test_tgi_counts_blocks_and_reserves_block_zero():
    c = cap("llama-3.1-8b", engine="tgi", kv=8 * GIB, max_len=8192)
    assert c.num_blocks == 8 * GIB // 131_072 and c.block_size == 1
    assert c.physical_token_slots == c.num_blocks - 1


def test_sglang_token_pool():
    c = cap("qwen3-32b", engine="sglang", kv=30 * GIB, max_len=32768)
    assert c.kv_cache_tokens == 30 * GIB // (64 * 8 * 256 * 2)


@pytest.mark.parametrize("layers, pp, sizes", [(80, 4, [20, 20, 20, 20]), (10, 4, [2, 3, 3, 2]),
                                               (61, 2, [31, 30]), (80, 3, [27, 27, 26])])
def test_pipeline_stages_follow_get_pp_indices(layers, pp, sizes):
    for engine in ("vllm", "sglang"):
        assert [len(r) for r in get_engine(engine).pipeline_stages(layers, pp)] == sizes


def test_pipeline_parallel_reports_the_most_loaded_stage():
    full = estimate(load_model("deepseek-v3"), engine="vllm", context=[4096])
    staged = estimate(load_model("deepseek-v3"), engine="vllm", context=[4096], pp=2)
    assert staged.bytes_per_token * 61 == full.bytes_per_token * 31
    with pytest.raises(kvbudget.EngineRuleError, match="^pp: .*not tgi"):
        estimate(load_model("deepseek-v3"), engine="tgi", pp=2)
    with pytest.raises(KVBudgetError, match="only 61 layers"):
        estimate(load_model("deepseek-v3"), engine="vllm", pp=64)


def test_vllm_state_blocks_per_request_by_mixer():
    # With prefix caching vLLM keeps 2 state blocks per request, and Mamba-2 mixers a third checkpoint block.
    for name, blocks in (("qwen3-next-80b-a3b", 2), ("jamba-1.5-mini", 2), ("falcon-h1-7b", 3)):
        plan, _ = VLLM.layout(load_model(name), "auto", 1, EngineOptions())
        (spec,) = [s for s, _, _ in plan.buckets if s.keeps_state]
        assert spec.blocks_needed(plan, 0) == blocks, name
        plan, _ = VLLM.layout(load_model(name), "auto", 1, EngineOptions(prefix_caching=False))
        assert spec.blocks_needed(plan, 0) == 1


def test_cached_allocations_never_answer_for_other_inputs():
    """estimate() remembers allocations and capacities by input: each changed input must still change the answer,
    and every answer must equal the engine's own, computed afresh."""
    import kvbudget
    from kvbudget.engines import EngineOptions, get_engine

    model = kvbudget.load_model("gemma-2-27b")
    seen = set()
    same = EngineOptions()  # one object, as a sweep passes it: only the other inputs tell the calls apart
    for engine, dtype, tp, options in [("vllm", "auto", 1, same), ("vllm", "fp8", 1, same), ("vllm", "auto", 2, same),
                                       ("vllm", "auto", 1, EngineOptions(block_size=32)), ("sglang", "auto", 1, same),
                                       ("vllm", "auto", 1, EngineOptions())]:
        for _ in range(2):  # the second call is a cache hit
            got = kvbudget.estimate(model, engine, dtype, batch=[3], context=[1000, 70000], tp=tp, options=options,
                                    kv_memory=20 * 2**30, max_model_len=32768)
            fresh = get_engine(engine).allocate(model, kv_dtype=dtype, tp=tp, options=options)
            assert got.allocation == fresh
            assert [p.kv_bytes for p in got.points] == [3 * sum(g.sequence_bytes(t) for g in fresh.groups)
                                                        for t in (1000, 70000)]
            assert got.capacity == get_engine(engine).capacity(model, 20 * 2**30, 32768, kv_dtype=dtype, tp=tp,
                                                               options=options)
        a = got.allocation
        seen.add((a.engine, a.kv_dtype.name, a.tp, got.points[1].kv_bytes, got.capacity.kv_cache_tokens))
    assert len(seen) == 5  # the repeated first configuration adds nothing; every other one is its own
    for memory, length in ((20 * 2**30, 8192), (10 * 2**30, 8192)):  # the budget and length are inputs too
        got = kvbudget.estimate(model, "vllm", options=same, kv_memory=memory, max_model_len=length).capacity
        assert got == get_engine("vllm").capacity(model, memory, length, options=same)
    other = kvbudget.load_model("gemma-2-27b")  # an equal model in another object
    assert kvbudget.estimate(other, "vllm", batch=[3], context=[1000, 70000]).points == \
        kvbudget.estimate(model, "vllm", batch=[3], context=[1000, 70000]).points


def test_the_estimates_own_init_takes_every_field_in_order():
    import dataclasses
    import inspect

    from kvbudget.estimator import Estimate

    fields = [f.name for f in dataclasses.fields(Estimate)]
    assert list(inspect.signature(Estimate.__init__).parameters)[1:] == fields
    result = estimate(load_model("mistral-7b"), "vllm", context=[4096])
    assert dataclasses.replace(result, notes=("x",)).notes == ("x",)
    assert result == estimate(load_model("mistral-7b"), "vllm", context=[4096])
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.beams = 2  # type: ignore[misc]
