"""Config parsing checked against transformers' own configuration classes.

For every bundled config whose model_type transformers knows, and for every family's bare defaults,
our ModelSpec must say what transformers says: the layer types DynamicCache builds (its own
`get_layer_types_and_kwargs`), the window or chunk per layer, KV heads, head dims, MLA dims.
"""

from __future__ import annotations

import json
import warnings

import pytest

transformers = pytest.importorskip("transformers", reason="test extra: pip install -e '.[test]'")
from transformers.cache_utils import get_layer_types_and_kwargs  # noqa: E402

from kvbudget import catalog, load_model, parse_config  # noqa: E402
from kvbudget.errors import ConfigError  # noqa: E402
from kvbudget.model.config import FAMILY_DEFAULTS, RELIED_ON  # noqa: E402

# kimi_k2 is run by transformers as deepseek_v3; chatglm is remote code with no class to compare.
AS_TYPE = {"kimi_k2": "deepseek_v3"}
_KIND = {"full_attention": "full_attention", "sliding_attention": "sliding_window",
         "chunked_attention": "chunked_local", "linear_attention": "recurrent_state", "dummy": "no_cache"}


def transformers_config(raw: dict):
    outer_type = raw["model_type"]
    mt = AS_TYPE.get(outer_type, outer_type)
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.CONFIG_MAPPING[mt](**kwargs)
    return config.get_text_config(decoder=True)


def expected_layers(tc) -> list[tuple]:
    """(layer, kind, kv_heads, k_dim, span) per cache, as transformers' modeling code sizes them."""
    types, kwargs = get_layer_types_and_kwargs(tc)
    heads = tc.num_attention_heads
    # Gemma 4: head dims and KV heads that vary by layer (transformers' per-layer configs)
    per_layer = tc.per_layer_config if tc.model_type == "gemma4_text" else None
    if per_layer is not None:
        tc.allow_global_per_layer_attribute_access = True
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    if tc.model_type == "falcon":
        kv = tc.num_kv_heads if (tc.new_decoder_architecture or not tc.multi_query) else 1
    else:
        kv = getattr(tc, "num_key_value_heads", None) or heads
    out = []
    for i, (kind, kw) in enumerate(zip(types, kwargs)):
        if kind == "hybrid":  # Falcon-H1: attention and a Mamba-2 mixer in one layer
            out += [(i, "full_attention", kv, head_dim, None), (i, "recurrent_state", None, None, None)]
        elif _KIND.get(kind) in ("recurrent_state", "no_cache"):  # dummy: nothing cached (KV shared, or an MLP)
            out.append((i, _KIND[kind], None, None, None))
        elif kind == "indexed_attention":  # DeepSeek-V3.2: the MLA latent and the indexer's keys
            out += [(i, "latent_attention", tc.kv_lora_rank, tc.qk_rope_head_dim, None),
                    (i, "indexer_keys", tc.index_head_dim, None, None)]
        elif kind in ("compressed_sparse_attention", "heavily_compressed_attention"):  # DeepSeek-V4
            rate = tc.compress_rates[kind]
            out += [(i, "sliding_window", 1, head_dim, tc.sliding_window),
                    (i, "compressed", rate, head_dim, "attention")]
            if kind == "compressed_sparse_attention":  # DeepseekV4CSACache: the indexer's own compressor
                out.append((i, "compressed", rate, tc.index_head_dim, "indexer"))
        elif hasattr(tc, "kv_lora_rank"):
            out.append((i, "latent_attention", tc.kv_lora_rank, tc.qk_rope_head_dim, None))
        elif per_layer is not None:
            layer = per_layer[i]
            out.append((i, _KIND[kind], layer.num_key_value_heads, layer.head_dim, kw.get("sliding_window")))
        else:
            out.append((i, _KIND[kind], kv, head_dim, kw.get("sliding_window")))
    return out


def our_layers(spec) -> list[tuple]:
    out = []
    for s in spec.layers:
        if s.kind in ("recurrent_state", "no_cache", "shared_kv"):
            out.append((s.layer, "no_cache" if s.kind == "shared_kv" else s.kind, None, None, None))
        elif s.kind == "indexer_keys":
            out.append((s.layer, s.kind, s.dim, None, None))
        elif s.kind == "compressed":
            out.append((s.layer, s.kind, s.rate, s.dim, s.role))
        elif s.kind == "latent_attention":
            out.append((s.layer, s.kind, s.latent_dim, s.rope_dim, None))
        else:
            out.append((s.layer, s.kind, s.kv_heads, s.k_dim, getattr(s, "window", None) or getattr(s, "chunk", None)))
    return out


BUNDLED = [e for e in catalog.entries()
           if AS_TYPE.get(json.loads(e.path.read_text())["model_type"],
                          json.loads(e.path.read_text())["model_type"]) in transformers.CONFIG_MAPPING]


def test_most_of_the_catalog_has_an_oracle():
    assert len(BUNDLED) >= len(catalog.entries()) - 1  # all but ChatGLM


@pytest.mark.parametrize("entry", BUNDLED, ids=lambda e: e.name)
def test_bundled_config_matches_transformers(entry):
    raw = json.loads(entry.path.read_text())
    tc = transformers_config(raw)
    spec = load_model(entry.name)
    assert our_layers(spec) == expected_layers(tc)
    assert spec.max_position_embeddings == tc.max_position_embeddings


FAMILIES = sorted(mt for mt in FAMILY_DEFAULTS if AS_TYPE.get(mt, mt) in transformers.CONFIG_MAPPING)


def test_every_supported_family_is_checked():
    assert set(FAMILY_DEFAULTS) - set(FAMILIES) == {"chatglm"}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_defaults_match_transformers(model_type):
    """A config that names its model_type, layer count and the two dimensions every real config states gets the
    defaults transformers gives it for the rest; without those two it is an error naming the field."""
    bare = transformers_config({"model_type": model_type})
    layers = bare.num_hidden_layers
    raw = {"model_type": model_type, "num_hidden_layers": layers, "torch_dtype": "bfloat16"}
    try:  # families whose cache needs them refuse to guess (gemma4 and deepseek_v4 state head_dim instead)
        parse_config(raw)
    except ConfigError as exc:
        assert (model_type, "num_attention_heads") not in RELIED_ON
        assert "'num_attention_heads'" in str(exc) or "'hidden_size'" in str(exc)
    for name in ("num_attention_heads", "hidden_size"):
        if getattr(bare, name, None) is not None:
            raw[name] = getattr(bare, name)
    tc = transformers_config(raw)
    spec = parse_config(raw)
    assert our_layers(spec) == expected_layers(tc)
    assert spec.max_position_embeddings == tc.max_position_embeddings


def test_gemma3_nested_text_config_takes_gemma3_text_defaults():
    raw = json.loads(catalog.find("gemma-3-4b").path.read_text())
    tc = transformers_config(raw)
    assert (tc.num_key_value_heads, tc.head_dim) == (4, 256)
    spec = load_model("gemma-3-4b")
    assert {s.kv_heads for s in spec.layers} == {4}
    assert sum(s.kind == "full_attention" for s in spec.layers) == 34 // 6
