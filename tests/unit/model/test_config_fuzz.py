"""The config parser under random input (issue 50): real configs with fields replaced or removed, and configs made up
of the fields kvbudget reads, give a clear KVBudgetError or a ModelSpec within the limits (which estimates), never
another exception, in bounded time and memory."""

from __future__ import annotations

import json
import time
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget import catalog, estimate
from kvbudget.errors import KVBudgetError
from kvbudget.model.config import FAMILY_DEFAULTS, parse_config
from kvbudget.model.limits import FIELD_LIMITS, MAX_HEAD_DIM, MAX_LAYERS
from kvbudget.model.spec import Attention

CONFIGS = {entry.name: json.loads(entry.path.read_text()) for entry in catalog.entries()}

JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=4), st.none()), max_size=6),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=3),
)
FIELDS = sorted({*FIELD_LIMITS, "layer_types", "model_type", "text_config", "per_layer_config", "linear_attn_config",
                 "compress_ratios", "compress_rates", "no_rope_layers", "layers_block_type", "hybrid_override_pattern",
                 "use_sliding_window", "torch_dtype", "new_decoder_architecture", "multi_query", "mamba_d_head",
                 "attention_k_eq_v", "multi_query_attention"})


def _parses_or_refuses(config: dict) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        spec = parse_config(config, source="fuzz.json")
    except KVBudgetError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.json")
        return
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert time.perf_counter() - start < 2 and peak < 16 << 20
    assert 1 <= spec.num_layers <= MAX_LAYERS
    for layer in spec.layers:
        if isinstance(layer, Attention):
            assert 1 <= layer.kv_heads and 1 <= layer.k_dim <= MAX_HEAD_DIM
    try:
        assert estimate(spec).bytes_per_token >= 0
    except KVBudgetError:
        pass  # the engine's own rules (a tensor-parallel size, an unsupported layer kind)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)),
       changes=st.lists(st.tuples(st.sampled_from(FIELDS), st.one_of(st.just(KeyError), JSON_VALUES)),
                        min_size=1, max_size=3))
def test_real_configs_with_fields_changed(name, changes):
    config = json.loads(json.dumps(CONFIGS[name]))
    target = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    for field, value in changes:
        if value is KeyError:
            target.pop(field, None)
        else:
            target[field] = value
    _parses_or_refuses(config)


@settings(max_examples=200, deadline=None)
@given(model_type=st.sampled_from(sorted(FAMILY_DEFAULTS)),
       fields=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=12))
def test_made_up_configs(model_type, fields):
    _parses_or_refuses({**fields, "model_type": model_type})
