"""Hugging Face `config.json` -> ModelSpec.

Each family fills in what its config leaves out as transformers' configuration class does (transformers 5.x is
the oracle the tests compare against), and says which layers are full, sliding, chunked, latent, recurrent or none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kvbudget.errors import ConfigError, UnsupportedArchitectureError
from kvbudget.model.limits import building, check_layers, grouped
from kvbudget.model.mtp import mtp_layer_count
from kvbudget.model.spec import (
    Attention,
    ChunkedLocal,
    Compressed,
    FullAttention,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    ModelSpec,
    NoCache,
    RecurrentState,
    SharedKV,
    SlidingWindow,
)

# Defaults of transformers' configuration classes, for the fields the cache depends on.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"num_attention_heads": 32, "hidden_size": 4096,
              "max_position_embeddings": 2048},
    "mistral": {"num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "max_position_embeddings": 131072, "sliding_window": 4096},
    "mixtral": {"num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "max_position_embeddings": 131072},
    "qwen2": {"num_attention_heads": 32, "hidden_size": 4096,
              "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen2_moe": {"num_attention_heads": 16, "hidden_size": 2048,
                  "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"num_attention_heads": 32, "head_dim": 128, "hidden_size": 4096,
              "max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3_moe": {"num_attention_heads": 32, "num_key_value_heads": 4,
                  "hidden_size": 2048, "max_position_embeddings": 32768, "sliding_window": 4096},
    "qwen3_next": {"num_attention_heads": 16, "num_key_value_heads": 2,
                   "head_dim": 256, "hidden_size": 2048, "max_position_embeddings": 32768,
                   "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                   "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128},
    "gemma": {"num_attention_heads": 16, "num_key_value_heads": 16,
              "head_dim": 256, "hidden_size": 3072, "max_position_embeddings": 8192},
    "gemma2": {"num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "hidden_size": 2304, "max_position_embeddings": 8192, "sliding_window": 4096},
    "gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "hidden_size": 2304, "max_position_embeddings": 131072,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "vocab_size": 262208,
                    "intermediate_size": 9216, "rope_local_base_freq": 10000.0},
    "phi3": {"num_attention_heads": 32, "hidden_size": 3072,
             "max_position_embeddings": 4096},
    "deepseek_v2": {"num_attention_heads": 32, "hidden_size": 4096,
                    "max_position_embeddings": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128},
    "deepseek_v3": {"num_attention_heads": 128, "hidden_size": 7168,
                    "max_position_embeddings": 4096, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128},
    "gpt_oss": {"num_attention_heads": 64, "num_key_value_heads": 8,
                "head_dim": 64, "hidden_size": 2880, "max_position_embeddings": 131072, "sliding_window": 128},
    "llama4_text": {"num_attention_heads": 40, "num_key_value_heads": 8,
                    "head_dim": 128, "hidden_size": 5120, "max_position_embeddings": 131072,
                    "attention_chunk_size": 8192, "no_rope_layer_interval": 4},
    "falcon": {"num_attention_heads": 71, "hidden_size": 4544,
               "max_position_embeddings": 2048, "multi_query": True, "new_decoder_architecture": False},
    "falcon_h1": {"num_attention_heads": 32, "num_key_value_heads": 8,
                  "hidden_size": 4096, "max_position_embeddings": 8192, "mamba_d_conv": 4,
                  "mamba_d_state": 256, "mamba_expand": 2, "mamba_n_heads": 128, "mamba_n_groups": 1,
                  "mamba_d_ssm": 1024},
    "jamba": {"num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "max_position_embeddings": 262144, "mamba_d_conv": 4,
              "mamba_d_state": 16, "mamba_expand": 2, "attn_layer_period": 8, "attn_layer_offset": 4},
    "opt": {"num_attention_heads": 12, "hidden_size": 768,
            "max_position_embeddings": 2048},
    "cohere": {"num_attention_heads": 64, "hidden_size": 8192,
               "max_position_embeddings": 8192},
    "chatglm": {},
    # 2025-2026 families (transformers 5.24's configuration classes)
    "qwen3_5_text": {"num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                     "hidden_size": 4096, "max_position_embeddings": 32768, "full_attention_interval": 4,
                     "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
                     "linear_num_value_heads": 32, "linear_value_head_dim": 128},
    "qwen3_5_moe_text": {"num_attention_heads": 16, "num_key_value_heads": 2,
                         "head_dim": 256, "hidden_size": 2048, "max_position_embeddings": 32768,
                         "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                         "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128},
    "deepseek_v32": {"num_attention_heads": 128, "hidden_size": 7168,
                     "max_position_embeddings": 163840, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                     "qk_nope_head_dim": 128, "v_head_dim": 128, "index_head_dim": 128},
    "kimi_linear": {"num_attention_heads": 32, "hidden_size": 2304,
                    "max_position_embeddings": 1048576, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128, "linear_conv_kernel_dim": 4, "linear_num_heads": 32,
                    "linear_head_dim": 128},
    "glm4_moe": {"num_attention_heads": 96, "num_key_value_heads": 8, "hidden_size": 4096,
                 "max_position_embeddings": 131072},
    "minimax_m2": {"num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
                   "hidden_size": 3072, "max_position_embeddings": 196608},
    "gemma3n_text": {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                     "hidden_size": 2048, "max_position_embeddings": 32768, "sliding_window": 512,
                     "num_kv_shared_layers": 15},
    "gemma4_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
                    "hidden_size": 2304, "max_position_embeddings": 131072, "sliding_window": 512,
                    "num_kv_shared_layers": 0, "attention_k_eq_v": False},
    "nemotron_h": {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "hidden_size": 4096, "max_position_embeddings": 4096, "mamba_num_heads": 128,
                   "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
                   "mamba_ssm_cache_dtype": "float32", "hybrid_override_pattern": "ME*-"},
    "granitemoehybrid": {"num_attention_heads": 32, "num_key_value_heads": 32,
                         "hidden_size": 4096, "max_position_embeddings": 2048, "mamba_n_heads": 128,
                         "mamba_d_head": 64, "mamba_d_state": 256, "mamba_n_groups": 1, "mamba_d_conv": 4,
                         "mamba_expand": 2},
}
FAMILY_DEFAULTS["kimi_k2"] = FAMILY_DEFAULTS["deepseek_v3"]

FAMILY_DEFAULTS["deepseek_v4"] = {  # DeepseekV4Config (transformers 5.24)
    "num_attention_heads": 64, "hidden_size": 4096, "max_position_embeddings": 1048576, "head_dim": 512,
    "sliding_window": 128, "index_head_dim": 128}

# The dimensions every real config states: a config without one is an error naming it, never the default of the
# family's configuration class (a Qwen2.5-32B config without its 40 heads would take LlamaConfig's 32 and give
# head_dim 160 instead of 128). Other defaults are the configuration classes' own, and the estimate notes each.
NEVER_DEFAULTED = frozenset({"num_attention_heads", "hidden_size"})
# ... except where published checkpoints leave one to their class: google/gemma-3-4b-it's text_config states no
# num_attention_heads and runs with Gemma3TextConfig's 8.
RELIED_ON = frozenset({("gemma3_text", "num_attention_heads")})

# Families transformers knows whose cache kvbudget does not model yet: an error that says so, never a guess.
NOT_MODELLED = {
    "minimax": "MiniMax-M1 / Text-01's lightning (linear) attention layers",
    "glm_moe_dsa": "GLM's DeepSeek-style sparse attention with an indexer",
}

# Multimodal wrappers whose language model sits under `text_config`.
_TEXT_MODEL_TYPE = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
                    "qwen3_5_moe": "qwen3_5_moe_text", "gemma3n": "gemma3n_text", "gemma4": "gemma4_text"}
_DTYPE_NAMES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16",
                "float": "float32"}


class Fields:
    """Reads fields from a config, then the family's defaults (each one taken is remembered, so that the estimate
    can say so); names the field when one is missing. The layer count never comes from a default."""

    def __init__(self, cfg: dict[str, Any], model_type: str, where: str):
        self.cfg, self.model_type, self.where = cfg, model_type, where
        self.defaults = FAMILY_DEFAULTS.get(model_type, {})
        self.defaulted: dict[str, Any] = {}

    def get(self, *names: str, default: Any = None) -> Any:
        """The first of `names` the config sets (an explicit null counts), else the family default."""
        for name in names:
            if name in self.cfg:
                return self.cfg[name]
        for name in names:
            if self.defaults.get(name) is not None and (name not in NEVER_DEFAULTED
                                                        or (self.model_type, name) in RELIED_ON):
                self.defaulted[name] = self.defaults[name]
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
    kv_heads = heads if f.model_type == "opt" else grouped(f.where, heads, f.int("num_key_value_heads", default=heads))
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
        if not isinstance(given, list) or len(given) != layers or not all(isinstance(t, str) for t in given):
            raise ConfigError(f"{f.where}: 'layer_types' must list {layers} names, one per layer", param="model")
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
    if mt == "gemma3n_text":
        return ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(layers)]
    if mt == "gemma4_text":  # Gemma4TextConfig: five sliding layers to one global, and the last layer is global
        return ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
                for i in range(layers)]
    if mt == "gemma3_text":
        pattern = f.int("sliding_window_pattern")
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if mt == "llama4_text":
        rope = f.cfg.get("no_rope_layers") or [
            int((i + 1) % f.int("no_rope_layer_interval") != 0) for i in range(layers)]
        chunked = f.get("attention_chunk_size") is not None
        return ["chunked_attention" if r and chunked else "full_attention" for r in rope]
    if mt in ("gemma", "llama", "cohere", "opt", "falcon", "chatglm", "deepseek_v2", "deepseek_v3", "kimi_k2",
              "glm4_moe", "minimax_m2"):
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
        kv_heads = grouped(f.where, heads, f.int("num_kv_heads", "n_head_kv", default=heads), "num_kv_heads")
    elif f.get("multi_query"):
        kv_heads = 1
    else:
        kv_heads = heads
    return [FullAttention(i, kv_heads, head_dim, head_dim) for i in range(layers)]


def _chatglm(mt: str, f: Fields) -> list[LayerSpec]:
    layers = f.int("num_layers", "num_hidden_layers")
    heads = f.int("num_attention_heads")
    kv_heads = (grouped(f.where, heads, f.int("multi_query_group_num"), "multi_query_group_num")
                if f.get("multi_query_attention") else heads)
    head_dim = f.int("kv_channels", default=f.int("hidden_size") // heads)
    return [FullAttention(i, kv_heads, head_dim, head_dim) for i in range(layers)]


def _latent_layer(i: int, f: Fields) -> LatentAttention:
    return LatentAttention(i, latent_dim=f.int("kv_lora_rank"), rope_dim=f.int("qk_rope_head_dim"),
                           heads=f.int("num_attention_heads"), qk_nope_dim=f.int("qk_nope_head_dim"),
                           v_dim=f.int("v_head_dim"))


def _latent(mt: str, f: Fields) -> list[LayerSpec]:
    specs: list[LayerSpec] = []
    for i in range(f.int("num_hidden_layers")):
        specs.append(_latent_layer(i, f))
        if mt == "deepseek_v32":  # the lightning indexer keeps one key per token beside the latent
            specs.append(IndexerKeys(i, f.int("index_head_dim")))
    return specs


def _state_dtype(f: Fields, *names: str) -> str | None:
    raw = f.get(*names)
    if raw is None:
        return None
    name = _DTYPE_NAMES.get(str(raw).replace("torch.", "").lower())
    if name is None:
        raise ConfigError(f"{f.where}: {names[0]!r} is {raw!r}; it must be float32, float16 or bfloat16")
    return name


def _gated_delta_net(i: int, f: Fields) -> RecurrentState:
    hk, dk = f.int("linear_num_key_heads"), f.int("linear_key_head_dim")
    hv, dv = f.int("linear_num_value_heads"), f.int("linear_value_head_dim")
    return RecurrentState(layer=i, mixer="gated_delta_net", conv_channels=2 * hk * dk + hv * dv,
                          conv_kernel=f.int("linear_conv_kernel_dim"), state_shape=(hv, dk, dv), heads=hv,
                          state_dtype=_state_dtype(f, "mamba_ssm_dtype"))


def _kimi_linear(mt: str, f: Fields) -> list[LayerSpec]:
    """Kimi-Linear: MLA layers between Kimi delta attention (KDA) layers, listed 1-based in linear_attn_config."""
    layers = f.int("num_hidden_layers")
    lin = f.cfg.get("linear_attn_config") or {}
    if not isinstance(lin, dict):
        raise ConfigError(f"{f.where}: 'linear_attn_config' must be an object")
    heads, dim = int(lin.get("num_heads") or f.int("linear_num_heads")), int(lin.get("head_dim") or
                                                                              f.int("linear_head_dim"))
    kernel = int(lin.get("short_conv_kernel_size") or f.int("linear_conv_kernel_dim"))
    if "full_attn_layers" in lin:  # 1-based; kda_layers lists the rest
        full = {int(n) - 1 for n in lin["full_attn_layers"]}
    else:  # transformers' rule without the lists: every fourth layer after the first is MLA
        full = {i for i in range(layers) if i and i % 4 == 0}
    return [_latent_layer(i, f) if i in full else
            RecurrentState(layer=i, mixer="kda", conv_channels=3 * heads * dim, conv_kernel=kernel,
                           state_shape=(heads, dim, dim),
                           heads=heads) for i in range(layers)]


def _gemma3n(mt: str, f: Fields) -> list[LayerSpec]:
    """Gemma-3n: the last num_kv_shared_layers read the K/V of the last earlier layer of their own type."""
    return _shared_tail(_attention_family(mt, f), f.get("num_kv_shared_layers", default=0) or 0)


def _shared_tail(layers: list[LayerSpec], shared: int) -> list[LayerSpec]:
    """The last `shared` layers read the K/V of the last earlier layer of their own type (Gemma-3n, Gemma 4)."""
    first_shared = len(layers) - int(shared)
    out: list[LayerSpec] = list(layers[:first_shared])
    for spec in layers[first_shared:]:
        source = max(s.layer for s in layers[:first_shared] if type(s) is type(spec))
        out.append(SharedKV(spec.layer, source))
    return out


def _gemma4(mt: str, f: Fields) -> list[LayerSpec]:
    """Gemma 4: sliding layers of num_key_value_heads x head_dim; global layers of global_head_dim, with
    num_global_key_value_heads when attention_k_eq_v (V is then a normalised copy of K, still cached as a tensor of
    its own in transformers and vLLM); per_layer_config overrides either; the last num_kv_shared_layers share."""
    layers = f.int("num_hidden_layers")
    kv_heads, head_dim = f.int("num_key_value_heads"), f.int("head_dim")
    global_kv = kv_heads
    if f.get("attention_k_eq_v", default=True) and f.get("num_global_key_value_heads") is not None:
        global_kv = f.int("num_global_key_value_heads")
    overrides = f.cfg.get("per_layer_config")
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(f"{f.where}: 'per_layer_config' must be an object of layer index -> fields")
    specs: list[LayerSpec] = []
    for i, layer_type in enumerate(_layer_types(mt, f, layers)):
        is_global = _LAYER_TYPES.get(layer_type) is FullAttention
        heads, dim = (global_kv, f.int("global_head_dim")) if is_global and overrides is None else (kv_heads, head_dim)
        if overrides is not None:
            layer = overrides.get(str(i), overrides.get(i)) or {}
            heads, dim = int(layer.get("num_key_value_heads", kv_heads)), int(layer.get("head_dim", head_dim))
        specs.append(_attention(i, layer_type, f, heads, dim))
    return _shared_tail(specs, f.get("num_kv_shared_layers", default=0) or 0)


# DeepSeek-V4's layer types and their compress_ratios numbers (0: the sliding window only)
_V4_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
_V4_RATE_DEFAULTS = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def _deepseek_v4(mt: str, f: Fields) -> list[LayerSpec]:
    """DeepSeek-V4: every layer attends to a sliding window of one shared K=V vector (head_dim) per token; CSA layers
    add one compressed entry per 4 tokens (overlapping windows) and the lightning indexer's compressed keys, HCA layers
    one entry per 128 tokens. The per-layer plan is `layer_types` with `compress_rates` (transformers' names) or
    `compress_ratios` (DeepSeek's: one number per layer, the MTP layers after the model's own)."""
    layers, dim, window = f.int("num_hidden_layers"), f.int("head_dim"), f.int("sliding_window")
    types = f.cfg.get("layer_types")
    if types is None:
        ratios = f.cfg.get("compress_ratios")
        if ratios is None:  # transformers' default plan: two HCA layers, then CSA and HCA in turn
            types = ["heavily_compressed_attention"] * min(layers, 2) + [
                "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(layers - 2)]
        else:
            if not isinstance(ratios, list) or len(ratios) < layers or any(r not in _V4_TYPES for r in ratios):
                raise ConfigError(f"{f.where}: 'compress_ratios' must list 0, 4 or 128 for each of the {layers} "
                                  "layers")
            types = [_V4_TYPES[r] for r in ratios]
    if not isinstance(types, list) or len(types) < layers:
        raise ConfigError(f"{f.where}: 'layer_types' must list the attention type of each of the {layers} layers")
    rates = dict(_V4_RATE_DEFAULTS, **(f.cfg.get("compress_rates") or {}))
    specs: list[LayerSpec] = []
    for i, kind in enumerate(types[:layers]):
        if kind == "sliding_attention":
            specs.append(SlidingWindow(i, 1, dim, 0, window))
            continue
        if kind not in rates:
            raise UnsupportedArchitectureError(f"{f.where}: layer {i} has layer type {kind!r}, which kvbudget does "
                                               "not know for deepseek_v4")
        rate, overlap = int(rates[kind]), kind == "compressed_sparse_attention"
        specs += [SlidingWindow(i, 1, dim, 0, window), Compressed(i, rate, dim, overlap)]
        if overlap:  # CSA: the indexer compresses its own keys at the same rate, with the same overlap
            specs.append(Compressed(i, rate, f.int("index_head_dim"), overlap, role="indexer"))
    return specs


# Block kinds of the Mamba-2 hybrids: Nemotron-H's hybrid_override_pattern letters and the names of the lists
# (layers_block_type / layer_types) of Nemotron-H and Granite-4.
_HYBRID_BLOCKS = {"M": "mamba", "*": "attention", "-": "none", "E": "none", "mamba": "mamba",
                  "linear_attention": "mamba", "attention": "attention", "full_attention": "attention",
                  "mlp": "none", "moe": "none"}


def _mamba2_hybrid(mt: str, f: Fields) -> list[LayerSpec]:
    """Nemotron-H and Granite-4 (granitemoehybrid): each layer is a Mamba-2 mixer, attention or an MLP."""
    if mt == "nemotron_h":
        blocks = f.cfg.get("layers_block_type") or list(str(f.get("hybrid_override_pattern")))
        heads, d_head = f.int("mamba_num_heads"), f.int("mamba_head_dim")
        d_state, groups, d_conv = f.int("ssm_state_size"), f.int("n_groups"), f.int("conv_kernel")
        state_dtype = _state_dtype(f, "mamba_ssm_cache_dtype")
    else:
        blocks = f.cfg.get("layer_types") or f.cfg.get("layers_block_type") or ["mamba"] * f.int("num_hidden_layers")
        heads, d_head = f.int("mamba_n_heads"), f.int("mamba_d_head")
        d_state, groups, d_conv = f.int("mamba_d_state"), f.int("mamba_n_groups"), f.int("mamba_d_conv")
        state_dtype = None
    layers = f.int("num_hidden_layers")
    if len(blocks) != layers:
        raise ConfigError(f"{f.where}: the layer pattern has {len(blocks)} entries for {layers} layers")
    heads_attn = f.int("num_attention_heads")
    kv_heads = grouped(f.where, heads_attn, f.int("num_key_value_heads", default=heads_attn))
    head_dim = f.get("head_dim", "attention_head_dim") or f.int("hidden_size") // heads_attn
    specs: list[LayerSpec] = []
    for i, block in enumerate(blocks):
        kind = _HYBRID_BLOCKS.get(str(block))
        if kind is None:
            raise UnsupportedArchitectureError(f"{f.where}: layer {i} is a {block!r} block, which kvbudget does not "
                                               "know")
        if kind == "mamba":
            specs.append(RecurrentState(layer=i, mixer="mamba2", conv_channels=heads * d_head + 2 * groups * d_state,
                                        conv_kernel=d_conv, state_shape=(heads, d_head, d_state), heads=heads,
                                        groups=groups, state_dtype=state_dtype))
        elif kind == "attention":
            specs.append(FullAttention(i, kv_heads, head_dim, head_dim))
        else:
            specs.append(NoCache(i))
    return specs


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
            specs.append(RecurrentState(layer=i, mixer="mamba", conv_channels=d_inner, conv_kernel=d_conv,
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
        specs.append(RecurrentState(layer=i, mixer="mamba2", conv_channels=d_ssm + 2 * groups * d_state,
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
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "deepseek_v32": _latent,
    "kimi_linear": _kimi_linear,
    "deepseek_v4": _deepseek_v4,
    "gemma3n_text": _gemma3n,
    "gemma4_text": _gemma4,
    "nemotron_h": _mamba2_hybrid,
    "granitemoehybrid": _mamba2_hybrid,
    "jamba": _jamba,
    "falcon_h1": _falcon_h1,
}


def _draft_layers(mt: str, f: Fields, first: int) -> tuple[LayerSpec, ...]:
    """The MTP layers a config declares (model/mtp.py), numbered from `first`, each a decoder layer of the model's
    own attention: DeepSeek's latent attention (V3.2: and indexer keys), GLM's and Qwen's full attention."""
    layers: list[LayerSpec] = []
    for i in range(first, first + mtp_layer_count(mt, f.cfg)):
        if mt in ("deepseek_v3", "deepseek_v32"):
            layers.append(_latent_layer(i, f))
            if mt == "deepseek_v32":
                layers.append(IndexerKeys(i, f.int("index_head_dim")))
        else:
            _, kv_heads, head_dim = _standard_dims(f)
            layers.append(FullAttention(i, kv_heads, head_dim, head_dim))
    return tuple(layers)


def _model_dtype(cfg: dict, outer: dict, where: str) -> tuple[str, list[str]]:
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or outer.get("torch_dtype") or outer.get("dtype")
    if raw is None:
        return "float16", [f"{where}: config names no torch_dtype; assuming float16 (choose the KV dtype to override)"]
    name = _DTYPE_NAMES.get(str(raw).replace("torch.", "").lower())
    if name is None:
        raise ConfigError(f"{where}: torch_dtype {raw!r} is not float32, float16 or bfloat16")
    return name, []


# Config fields of caches a standard decoder does not keep, by what they describe. An unknown model_type that
# has any of them is refused rather than read as a plain decoder.
_UNMODELLED_FIELDS = (  # patterns as text: re compiles and caches them on first use, not at import
    ("MLA", r"^(kv_lora_rank|q_lora_rank|qk_rope_head_dim|qk_nope_head_dim)$"),
    ("indexer", r"^index_(head_dim|n_heads|topk)$|indexer"),
    ("compression", r"compress"),
    ("linear attention", r"^linear_(num_|key_|value_|conv_|attn_|head_dim)|^full_attention_interval$"),
    ("Mamba", r"mamba|^ssm_|_ssm_|^d_state$|^conv_kernel$|^hybrid_override_pattern$|^layers_block_type$|"
              r"^attn_layer_(period|offset)$"),
    ("KV sharing", r"kv_shar|shared_kv|^num_kv_shared"),
)


def unmodelled_fields(cfg: dict) -> list[str]:
    """'field (what it is)' for each config field that describes a cache beyond standard K/V attention."""
    out = []
    for name in cfg:
        for what, pattern in _UNMODELLED_FIELDS:
            if re.search(pattern, str(name)):
                out.append(f"{name} ({what})")
                break
    return out


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
    if mt in NOT_MODELLED:
        raise UnsupportedArchitectureError(f"{where}: model_type {mt!r} uses {NOT_MODELLED[mt]}, whose cache kvbudget "
                                           "does not model yet; no estimate rather than a wrong one")
    notes = []
    if mt not in FAMILY_DEFAULTS:
        special = unmodelled_fields(cfg)
        if special:
            raise UnsupportedArchitectureError(
                f"{where}: model_type {mt!r} is not one kvbudget knows, and its config has fields of a cache a "
                f"standard decoder does not keep ({', '.join(special)}); kvbudget will not guess its size")
        notes.append(f"{where}: model_type {mt!r} is not one kvbudget knows; "
                     "reading it as a standard decoder (num_hidden_layers, num_key_value_heads, head_dim, "
                     "sliding_window, layer_types)")
    f = Fields(cfg, mt, where)
    with building(cfg, where, mt):
        layers = _BUILDERS.get(mt, _attention_family)(mt, f)
        draft = _draft_layers(mt, f, max(spec.layer for spec in layers) + 1)
    check_layers(layers + list(draft), where)
    if f.defaulted:
        notes.append(f"{where}: not set in the config, so transformers' {mt} defaults are used: "
                     + ", ".join(f"{k}={v}" for k, v in f.defaulted.items()))
    dtype, dtype_notes = _model_dtype(cfg, config, where)
    max_len = f.get("max_position_embeddings", "seq_length", "n_positions")  # checked by check_fields
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
        draft_layers=draft,
    )
