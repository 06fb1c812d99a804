"""Property tests: KV bytes are linear in batch, monotone in context, and caps only ever lower them."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kvbudget
from kvbudget import KVBudgetError, estimate, parse_config

ALL_KINDS = ["full_attention", "sliding_attention", "chunked_attention"]


@st.composite
def configs(draw, kinds=ALL_KINDS):
    layer_kind = st.sampled_from(kinds)
    layers = draw(st.integers(1, 12))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    cfg = {
        "model_type": "custom_decoder",
        "num_hidden_layers": layers,
        "num_attention_heads": kv_heads * draw(st.sampled_from([1, 2, 4])),
        "num_key_value_heads": kv_heads,
        "head_dim": draw(st.sampled_from([32, 64, 80, 128, 256])),
        "layer_types": draw(st.lists(layer_kind, min_size=layers, max_size=layers)),
        "sliding_window": draw(st.integers(2, 5000)),
        "attention_chunk_size": draw(st.integers(2, 5000)),
        "torch_dtype": draw(st.sampled_from(["float16", "bfloat16", "float32"])),
    }
    return cfg


# Each engine with KV dtypes it accepts.
ENGINE_DTYPES = [("hf", "auto"), ("hf", "fp8"), ("hf", "q8_0"), ("hf-static", "q4_0"), ("hf-static", "fp32"),
                 ("vllm", "auto"), ("vllm", "fp8"), ("sglang", "auto"), ("tgi", "fp8"), ("llamacpp", "auto"),
                 ("llamacpp", "fp32")]
engine_dtype = st.sampled_from(ENGINE_DTYPES)


def run(cfg, engine, dtype, **kw):
    """An estimate, or nothing where the engine rightly refuses the random model (hypothesis skips it)."""
    try:
        return estimate(parse_config(cfg), engine=engine, kv_dtype=dtype, **kw)
    except KVBudgetError:
        assume(False)


@settings(max_examples=150, deadline=None)
@given(configs(), engine_dtype, st.integers(1, 64), st.integers(1, 8), st.integers(1, 200_000))
def test_linear_in_batch_and_beams(cfg, engine_and_dtype, batch, beams, context):
    engine, dtype = engine_and_dtype
    one = run(cfg, engine, dtype, batch=[1], context=[context]).points[0]
    many = run(cfg, engine, dtype, batch=[batch], beams=beams, context=[context]).points[0]
    assert many.kv_bytes == batch * beams * one.kv_bytes
    assert many.uncapped_kv_bytes == batch * beams * one.uncapped_kv_bytes


@settings(max_examples=200, deadline=None)
@given(configs(), engine_dtype, st.integers(1, 100_000), st.integers(1, 100_000))
def test_monotone_in_context_and_caps_only_lower(cfg, engine_and_dtype, t1, t2):
    engine, dtype = engine_and_dtype
    short, long = sorted((t1, t2))
    result = run(cfg, engine, dtype, context=[short, long])
    a, b = result.points
    block = max(g.block_size for g in result.allocation.groups)
    assert a.kv_bytes <= b.kv_bytes
    assert b.kv_bytes - a.kv_bytes <= (long - short + block) * result.bytes_per_token
    assert a.kv_bytes <= a.uncapped_kv_bytes and b.kv_bytes <= b.uncapped_kv_bytes
    # Without caps the cache is the token tax times the context, in whole blocks.
    tax = long * result.bytes_per_token + result.fixed_bytes_per_sequence
    assert tax <= b.uncapped_kv_bytes < tax + block * result.bytes_per_token + 1
    if block == 1:
        assert b.uncapped_kv_bytes == tax
    if all(kind == "full_attention" for kind in cfg["layer_types"]):
        assert b.kv_bytes == b.uncapped_kv_bytes


@settings(max_examples=100, deadline=None)
@given(configs(kinds=["sliding_attention", "chunked_attention"]), engine_dtype, st.integers(1, 10_000))
def test_windowed_models_stop_growing_past_their_span(cfg, engine_and_dtype, context):
    """A model whose every layer keeps a window or chunk holds the same bytes at any two contexts past the
    largest span (plus the engine's reservation, under 20,000 tokens for every engine here), wherever the engine
    honours windows; where it caches them in full, it grows like the uncapped figure."""
    engine, dtype = engine_and_dtype
    model = parse_config(cfg)
    start = max(s.token_span or 0 for s in model.layers) + 20_000
    result = run(cfg, engine, dtype, context=[start + context, start + 2 * context])
    a, b = result.points
    if kvbudget.get_engine(engine).honours_windows(model):
        assert a.kv_bytes == b.kv_bytes
    else:  # sglang, tgi, and llama.cpp for architectures it caches in full
        assert b.kv_bytes - a.kv_bytes >= context * result.bytes_per_token - 256 * result.bytes_per_token


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32]), st.sampled_from([1, 2, 4, 8, 16]))
def test_tensor_parallel_shards_kv_heads(kv_heads, tp):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 32,
           "num_key_value_heads": kv_heads, "head_dim": 128, "torch_dtype": "bfloat16"}
    model = parse_config(cfg)
    per_gpu = estimate(model, tp=tp).bytes_per_token
    assert per_gpu == 4 * 2 * max(1, kv_heads // tp) * 128 * 2
