"""The hf engine against real transformers caches, byte for byte.

For every family: build a tiny random-weight model from a scaled-down config that keeps the cache
structure, run a forward pass and generate() at contexts below, at and above the window, sum the
bytes of every tensor the returned cache holds, and compare with the hf engine.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="test extra: pip install -e '.[test]'")
transformers = pytest.importorskip("transformers")

from tiny_configs import CHATGLM, CHATGLM_AS_GLM, TINY, TRANSFORMERS_TYPE, WINDOW  # noqa: E402

import kvbudget  # noqa: E402
import kvbudget.cli  # noqa: E402

# Tensors a cache layer may hold; anything else makes the test fail so that nothing goes uncounted.
CACHE_TENSORS = {"keys", "values", "conv_states", "recurrent_states", "indexer_keys",
                 # DeepSeek-V4's compressors: entries, the open window's projections, the last window's overlap
                 "compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate"}
BATCH = 2
CONTEXTS = (WINDOW - 3, WINDOW - 1, WINDOW, WINDOW + 5, 3 * WINDOW + 1)


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        seen: set[int] = set()  # one tensor under two names (DeepSeek-V4's values are its keys) counts once
        for name, value in vars(layer).items():
            tensors = list(value.values()) if isinstance(value, dict) else [value]
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.dim() > 0 and id(t) not in seen:
                    seen.add(id(t))
                    assert name in CACHE_TENSORS, f"uncounted cache tensor {type(layer).__name__}.{name}"
                    total += t.numel() * t.element_size()
    return total


_MODELS: dict = {}


def build(name: str, cfg: dict):
    if name not in _MODELS:
        mt = TRANSFORMERS_TYPE.get(name, cfg["model_type"])
        kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")}
        config = transformers.CONFIG_MAPPING[mt](**kwargs)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        _MODELS[name] = model
    return _MODELS[name]


def forward_cache(model, context: int, batch: int = BATCH):
    ids = torch.randint(3, 120, (batch, context), generator=torch.Generator().manual_seed(context))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    return getattr(out, "cache", None) or out.past_key_values


# the release installed: the engine models what it caches (Falcon's new architecture changed in 5.25)
INSTALLED = tuple(int(p) for p in transformers.__version__.split(".")[:2])


def ours(cfg: dict, context: int, batch: int = BATCH, engine: str = "hf") -> int:
    model = kvbudget.parse_config(cfg)
    options = kvbudget.EngineOptions(engine_version=INSTALLED)
    return kvbudget.estimate(model, engine=engine, batch=[batch], context=[context], options=options).points[0].kv_bytes


def test_falcon_new_architecture_by_transformers_release(capsys):
    """Up to 5.24 the cache holds K/V repeated to the 4 query heads; from 5.25 the 2 KV heads (the test above
    checks whichever release is installed against its real cache)."""
    model = kvbudget.parse_config(TINY["falcon_new_arch"])

    def per_token(release: tuple[int, int] | None) -> int:
        return kvbudget.estimate(model, engine="hf", options=kvbudget.EngineOptions(engine_version=release)
                                 ).bytes_per_token
    assert per_token((5, 24)) == 2 * per_token((5, 25)) == 2 * per_token(None)
    assert kvbudget.cli.main(["estimate", "falcon-7b-instruct", "--engine", "hf@5.24", "--json"]) == 0
    assert kvbudget.cli.main(["estimate", "falcon-7b-instruct", "--engine", "hf@4.57"]) == 2
    assert "kvbudget models transformers 5.19 and newer" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(TINY))
def test_forward_matches_transformers(name):
    cfg = TINY[name]
    model = build(name, cfg)
    for context in CONTEXTS:
        measured = cache_bytes(forward_cache(model, context))
        assert measured > 0
        assert ours(cfg, context) == measured, f"{name} at {context} tokens"


@pytest.mark.parametrize("name", sorted(TINY))
def test_generate_matches_transformers(name):
    """Decode steps: the cache after generate() holds prompt + new - 1 tokens."""
    cfg = TINY[name]
    model = build(name, cfg)
    prompt, new = WINDOW - 2, WINDOW + 3  # crosses the window during decoding
    ids = torch.randint(3, 120, (BATCH, prompt), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             return_dict_in_generate=True, pad_token_id=0)
    cache = getattr(out, "cache", None) or out.past_key_values
    assert ours(cfg, prompt + new - 1) == cache_bytes(cache)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss", "deepseek_v3"])
def test_static_cache_matches_transformers(name):
    """hf-static: StaticCache preallocates max_cache_len; sliding layers keep min(window, max_cache_len)."""
    cfg = TINY[name]
    model = build(name, cfg)
    for context in (WINDOW - 3, WINDOW + 5):
        cache = transformers.StaticCache(config=model.config, max_cache_len=context)
        ids = torch.randint(3, 120, (BATCH, context))
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        assert ours(cfg, context, engine="hf-static") == cache_bytes(cache), f"{name} at {context}"


def test_chatglm_reads_like_transformers_glm():
    """ChatGLM field names (multi_query_group_num, kv_channels, num_layers) mean what glm caches."""
    model = build("glm", CHATGLM_AS_GLM)
    for context in (5, 21):
        assert ours(CHATGLM, context) == cache_bytes(forward_cache(model, context))


def test_float32_model_dtype():
    cfg = dict(TINY["qwen3_next"], torch_dtype="float32")
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype")}
    config = transformers.CONFIG_MAPPING["qwen3_next"](**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assert ours(cfg, 11) == cache_bytes(forward_cache(model, 11))


def _stored_bytes(obj, seen: set) -> int:
    """Bytes of every plain tensor reachable from a quantized cache's attributes (quanto's packed tensors are
    tensor subclasses holding plain ones; HQQ keeps a tensor and a dict of metadata)."""
    if isinstance(obj, torch.Tensor) and type(obj) is torch.Tensor:
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_stored_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(_stored_bytes(x, seen) for x in obj.values())
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(_stored_bytes(x, seen) for x in vars(obj).values())
    return 0


@pytest.mark.parametrize("backend, nbits, name", [("quanto", 4, "quanto_int4"), ("quanto", 2, "quanto_int2"),
                                                 ("hqq", 4, "hqq_int4")])
def test_quantized_cache_matches_transformers(backend, nbits, name):
    """transformers' QuantizedCache (the real quanto / HQQ packages) on a bf16 llama: after a 300-token prompt it
    holds exactly our bytes per token x 300 (codes, scale and zero point per 64 values); after 127 more tokens
    decoded one at a time (the largest residual before it folds them in) exactly our estimate at 427 tokens, whose
    fixed part is that residual in bf16."""
    from transformers.cache_utils import QuantizedCache

    cfg = dict(TINY["llama"], head_dim=64, torch_dtype="bfloat16")
    model = build("llama-64", cfg)
    spec = kvbudget.parse_config(cfg)
    per_token = kvbudget.estimate(spec, engine="hf", kv_dtype=name).bytes_per_token
    cache = QuantizedCache(backend, model.config, nbits=nbits)
    ids = torch.randint(3, 120, (1, 427), generator=torch.Generator().manual_seed(1))

    def stored() -> int:
        seen: set = set()
        return sum(_stored_bytes(layer._quantized_keys, seen) + _stored_bytes(layer._quantized_values, seen)
                   + _stored_bytes(layer.keys, seen) + _stored_bytes(layer.values, seen) for layer in cache.layers)

    with torch.no_grad():
        model(input_ids=ids[:, :300], past_key_values=cache, use_cache=True)
        assert stored() == per_token * 300
        for i in range(300, 427):
            model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
    assert stored() == kvbudget.estimate(spec, engine="hf", kv_dtype=name, context=[427]).points[0].kv_bytes
