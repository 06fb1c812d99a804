"""Hugging Face `config.json` -> ModelSpec.

Each family fills in what its config leaves out the way transformers' configuration class does
(transformers 5.x is the oracle the tests compare against), and says which layers are full, sliding,
chunked, latent, recurrent or cache-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvbudget.errors import ConfigError, UnsupportedArchitectureError
from kvbudget.model.spec import (
    Attention,
    ChunkedLocal,
    FullAttention,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    RecurrentState,
    SlidingWindow,
)

# Defaults of transformers' configuration classes, for the fields the cache depends on.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
              "max_position_embeddings": 2048},
    "mistral": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "max_position_embeddings": 131072, "sliding_window": 4096},
    "mixtral": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "max_position_embeddings": 131072},
    "qwen2": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
              "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen2_moe": {"num_hidden_layers": 24, "num_attention_heads": 16, "hidden_size": 2048,
                  "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128, "hidden_size": 4096,
              "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3_moe": {"num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "hidden_size": 2048, "max_position_embeddings": 32768, "sliding_window": 4096},
    "qwen3_next": {"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "head_dim": 256, "hidden_size": 2048, "max_position_embeddings": 32768,
                   "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                   "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128},
    "gemma": {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
              "head_dim": 256, "hidden_size": 3072, "max_position_embeddings": 8192},
    "gemma2": {"num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "hidden_size": 2304, "max_position_embeddings": 8192, "sliding_window": 4096},
    "gemma3_text": {"num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "hidden_size": 2304, "max_position_embeddings": 131072,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "vocab_size": 262208,
                    "intermediate_size": 9216},
    "phi3": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 3072,
             "max_position_embeddings": 4096},
    "deepseek_v2": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
                    "max_position_embeddings": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128},
    "deepseek_v3": {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
                    "max_position_embeddings": 4096, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128},
    "gpt_oss": {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
                "head_dim": 64, "hidden_size": 2880, "max_position_embeddings": 131072, "sliding_window": 128},
    "llama4_text": {"num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
                    "head_dim": 128, "hidden_size": 5120, "max_position_embeddings": 131072,
                    "attention_chunk_size": 8192, "no_rope_layer_interval": 4},
    "falcon": {"num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544,
               "max_position_embeddings": 2048, "multi_query": True, "new_decoder_architecture": False},
    "falcon_h1": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "hidden_size": 4096, "max_position_embeddings": 8192, "mamba_d_conv": 4,
                  "mamba_d_state": 256, "mamba_expand": 2, "mamba_n_heads": 128, "mamba_n_groups": 1,
                  "mamba_d_ssm": 1024},
    "jamba": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "max_position_embeddings": 262144, "mamba_d_conv": 4,
              "mamba_d_state": 16, "mamba_expand": 2, "attn_layer_period": 8, "attn_layer_offset": 4},
    "opt": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
            "max_position_embeddings": 2048},
    "cohere": {"num_hidden_layers": 40, "num_attention_heads": 64, "hidden_size": 8192,
               "max_position_embeddings": 8192},
    "chatglm": {},
}
FAMILY_DEFAULTS["kimi_k2"] = FAMILY_DEFAULTS["deepseek_v3"]

# Multimodal wrappers whose language model sits under `text_config`.
_TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_DTYPE_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16",
                "float": "float32"}


class Fields:
    """Reads fields from a config, then the family's defaults; names the field when one is missing."""

    def __init__(self, cfg: dict[str, Any], model_type: str, where: str):
        self.cfg, self.model_type, self.where = cfg, model_type, where
        self.defaults = FAMILY_DEFAULTS.get(model_type, {})

    def get(self, *names: str, default: Any = None) -> Any:
        """The first of `names` the config sets (an explicit null counts), else the family default."""
        for name in names:
            if name in self.cfg:
                return self.cfg[name]
        for name in names:
            if self.defaults.get(name) is not None:
                return self.defaults[name]
        return default

    def int(self, *names: str, default: int | None = None) -> int:
        value = self.get(*names, default=default)
        if value is None:
            raise ConfigError(
                f"{self.where}: config has no value for {names[0]!r}"
                + (f" (nor {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else "")
                + "; the KV estimate needs it, so add it to the config"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{self.where}: {names[0]!r} is {value!r}; it must be a positive integer")
        return value


# The `layer_types` values of configs (transformers' vocabulary and older synonyms) and the kind each becomes.
_LAYER_TYPES: dict[str, type[Attention]] = {
    "full_attention": FullAttention, "attention": FullAttention, "global": FullAttention,
    "sliding_attention": SlidingWindow, "local": SlidingWindow, "sliding": SlidingWindow,
    "chunked_attention": ChunkedLocal,
}


def _attention(i: int, layer_type: str, f: Fields, kv_heads: int, head_dim: int) -> LayerSpec:
    kind = _LAYER_TYPES.get(layer_type)
    if kind is FullAttention:
        return FullAttention(i, kv_heads, head_dim, head_dim)
    if kind is SlidingWindow:
        return SlidingWindow(i, kv_heads, head_dim, head_dim, f.int("sliding_window", "sliding_window_size"))
    if kind is ChunkedLocal:
        return ChunkedLocal(i, kv_heads, head_dim, head_dim, f.int("attention_chunk_size"))
    raise UnsupportedArchitectureError(f"{f.where}: layer {i} has layer type {layer_type!r}, which kvbudget does not "
                                       "know")


def _standard_dims(f: Fields) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) for the llama-style field names."""
    layers = f.int("num_hidden_layers", "n_layer", "num_layers")
    heads = f.int("num_attention_heads", "n_head")
    # OPT has no grouped-query attention: transformers ignores a num_key_value_heads there.
    kv_heads = heads if f.model_type == "opt" else f.int("num_key_value_heads", default=heads)
    head_dim = f.get("head_dim")
    if head_dim is None:
        head_dim = f.int("hidden_size", "n_embd", "d_model") // heads
    return layers, kv_heads, head_dim


def _generic_types(f: Fields, layers: int) -> list[str]:
    """transformers' rule when a config has no layer_types: a window or a chunk applies to every layer."""
    if f.get("sliding_window") is not None:
        return ["sliding_attention"] * layers
    if f.get("attention_chunk_size") is not None:
        return ["chunked_attention"] * layers
    return ["full_attention"] * layers


def _layer_types(mt: str, f: Fields, layers: int) -> list[str]:
    given = f.cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != layers:
            raise ConfigError(f"{f.where}: 'layer_types' must be a list of {layers} entries, one per layer")
        return list(given)
    if mt in ("qwen2", "qwen3"):
        if not f.get("use_sliding_window", default=False):
            return ["full_attention"] * layers
        mwl = f.get("max_window_layers", default=0)
        return ["sliding_attention" if i >= mwl else "full_attention" for i in range(layers)]
    if mt == "qwen2_moe":
        if not f.get("use_sliding_window", default=False):
            return ["full_attention"] * layers
        mwl = f.get("max_window_layers", default=0)
        return ["sliding_attention" if (i + 1) % 2 and i < mwl else "full_attention" for i in range(layers)]
    if mt == "qwen3_moe":
        return ["sliding_attention" if f.get("use_sliding_window", default=False) else "full_attention"] * layers
    if mt in ("gemma2", "gpt_oss"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if mt == "gemma3_text":
        pattern = f.int("sliding_window_pattern")
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if mt == "llama4_text":
        rope = f.cfg.get("no_rope_layers") or [
            int((i + 1) % f.int("no_rope_layer_interval") != 0) for i in range(layers)]
        chunked = f.get("attention_chunk_size") is not None
        return ["chunked_attention" if r and chunked else "full_attention" for r in rope]
    if mt in ("gemma", "llama", "cohere", "opt", "falcon", "chatglm", "deepseek_v2", "deepseek_v3", "kimi_k2"):
        return ["full_attention"] * layers
    return _generic_types(f, layers)


def _attention_family(mt: str, f: Fields) -> list[LayerSpec]:
    layers, kv_heads, head_dim = _standard_dims(f)
    return [_attention(i, kind, f, kv_heads, head_dim) for i, kind in enumerate(_layer_types(mt, f, layers))]


def _falcon(mt: str, f: Fields) -> list[LayerSpec]:
    layers = f.int("num_hidden_layers", "n_layer")
    heads = f.int("num_attention_heads", "n_head")
    head_dim = f.int("hidden_size") // heads
    if f.get("new_decoder_architecture"):
        kv_heads = f.int("num_kv_heads", "n_head_kv", default=heads)
    elif f.get("multi_query"):
        kv_heads = 1
    else:
        kv_heads = heads
    return [FullAttention(i, kv_heads, head_dim, head_dim) for i in range(layers)]


def _chatglm(mt: str, f: Fields) -> list[LayerSpec]:
    layers = f.int("num_layers", "num_hidden_layers")
    heads = f.int("num_attention_heads")
    kv_heads = f.int("multi_query_group_num") if f.get("multi_query_attention") else heads
    head_dim = f.int("kv_channels", default=f.int("hidden_size") // heads)
    return [FullAttention(i, kv_heads, head_dim, head_dim) for i in range(layers)]


def _latent(mt: str, f: Fields) -> list[LayerSpec]:
    layers = f.int("num_hidden_layers")
    heads = f.int("num_attention_heads")
    dims = dict(latent_dim=f.int("kv_lora_rank"), rope_dim=f.int("qk_rope_head_dim"), heads=heads,
                qk_nope_dim=f.int("qk_nope_head_dim"), v_dim=f.int("v_head_dim"))
    return [LatentAttention(layer=i, **dims) for i in range(layers)]


def _gated_delta_net(i: int, f: Fields) -> RecurrentState:
    hk, dk = f.int("linear_num_key_heads"), f.int("linear_key_head_dim")
    hv, dv = f.int("linear_num_value_heads"), f.int("linear_value_head_dim")
    return RecurrentState(i, "gated_delta_net", conv_channels=2 * hk * dk + hv * dv,
                          conv_kernel=f.int("linear_conv_kernel_dim"), state_shape=(hv, dk, dv), heads=hv)


def _qwen3_next(mt: str, f: Fields) -> list[LayerSpec]:
    layers, kv_heads, head_dim = _standard_dims(f)
    types = f.cfg.get("layer_types") or [
        "linear_attention" if (i + 1) % f.int("full_attention_interval") else "full_attention"
        for i in range(layers)]
    return [_gated_delta_net(i, f) if kind == "linear_attention" else _attention(i, kind, f, kv_heads, head_dim)
            for i, kind in enumerate(types)]


def _jamba(mt: str, f: Fields) -> list[LayerSpec]:
    layers, kv_heads, head_dim = _standard_dims(f)
    period, offset = f.int("attn_layer_period"), f.get("attn_layer_offset", default=0)
    d_inner = f.int("mamba_expand") * f.int("hidden_size")
    d_state, d_conv = f.int("mamba_d_state"), f.int("mamba_d_conv")
    specs: list[LayerSpec] = []
    for i in range(layers):
        if i % period == offset:
            specs.append(FullAttention(i, kv_heads, head_dim, head_dim))
        else:
            specs.append(RecurrentState(i, "mamba", conv_channels=d_inner, conv_kernel=d_conv,
                                        state_shape=(d_inner, d_state), heads=d_inner))
    return specs


def _falcon_h1(mt: str, f: Fields) -> list[LayerSpec]:
    layers, kv_heads, head_dim = _standard_dims(f)
    d_ssm = f.get("mamba_d_ssm") or f.int("mamba_expand") * f.int("hidden_size")
    n_heads, groups, d_state = f.int("mamba_n_heads"), f.int("mamba_n_groups"), f.int("mamba_d_state")
    d_head = f.get("mamba_d_head")
    if d_head in (None, "auto"):
        d_head = d_ssm // n_heads
    specs: list[LayerSpec] = []
    for i in range(layers):
        specs.append(FullAttention(i, kv_heads, head_dim, head_dim))
        specs.append(RecurrentState(i, "mamba2", conv_channels=d_ssm + 2 * groups * d_state,
                                    conv_kernel=f.int("mamba_d_conv"), state_shape=(n_heads, d_head, d_state),
                                    heads=n_heads, groups=groups))
    return specs


_BUILDERS: dict[str, Callable[[str, Fields], list[LayerSpec]]] = {
    "falcon": _falcon,
    "chatglm": _chatglm,
    "deepseek_v2": _latent,
    "deepseek_v3": _latent,
    "kimi_k2": _latent,
    "qwen3_next": _qwen3_next,
    "jamba": _jamba,
    "falcon_h1": _falcon_h1,
}


def _model_dtype(cfg: dict, outer: dict, where: str) -> tuple[str, list[str]]:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or outer.get("torch_dtype") or outer.get("dtype")
    if raw is None:
        return "float16", [f"{where}: config names no torch_dtype; assuming float16 (choose the KV dtype to override)"]
    name = _DTYPE_NAMES.get(str(raw).replace("torch.", "").lower())
    if name is None:
        raise ConfigError(f"{where}: torch_dtype {raw!r} is not float32, float16 or bfloat16")
    return name, []


def text_config_of(config: dict) -> dict:
    """The language model's part of a config (multimodal wrappers nest it under text_config)."""
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def model_type_of(config: dict) -> str | None:
    """The language model's model_type (gemma3 -> gemma3_text, llama4 -> llama4_text)."""
    outer_type = str(config.get("model_type") or "")
    mt = str(text_config_of(config).get("model_type") or _TEXT_MODEL_TYPE.get(outer_type, outer_type))
    return _TEXT_MODEL_TYPE.get(mt, mt) or None


def parse_config(config: dict, name: str = "model", source: str = "") -> ModelSpec:
    """Turn a Hugging Face config dict into an engine-independent ModelSpec."""
    where = source or name
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: a config must be a JSON object, got {type(config).__name__}")
    cfg = text_config_of(config)
    mt = model_type_of(config)
    if not mt:
        raise ConfigError(f"{where}: config has no 'model_type'; add it (for example \"llama\")")
    notes = []
    if mt not in FAMILY_DEFAULTS:
        notes.append(f"{where}: model_type {mt!r} is not one kvbudget knows; "
                     "reading it as a standard decoder (num_hidden_layers, num_key_value_heads, head_dim, "
                     "sliding_window, layer_types)")
    f = Fields(cfg, mt, where)
    layers = _BUILDERS.get(mt, _attention_family)(mt, f)
    dtype, dtype_notes = _model_dtype(cfg, config, where)
    max_len = f.get("max_position_embeddings", "seq_length", "n_positions")
    heads = f.get("num_attention_heads", "n_head")
    return ModelSpec(
        name=name,
        model_type=mt,
        num_layers=max(spec.layer for spec in layers) + 1,
        dtype=dtype,
        max_position_embeddings=int(max_len) if max_len else None,
        layers=tuple(layers),
        attention_heads=int(heads) if heads else None,
        source=source,
        warnings=tuple(notes + dtype_notes),
        config=config,
    )
