"""What any real model has: the bounds of every config field and of every layer size built from one, checked once
where a config becomes a ModelSpec (`parse_config`), so that every source (a config.json, the catalog, a Hub id, a
GGUF file's metadata) is held to them before anything is built."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvbudget.errors import ConfigError, KVBudgetError
from kvbudget.model.spec import (
    Attention,
    Compressed,
    IndexerKeys,
    LatentAttention,
    LayerSpec,
    RecurrentState,
)

# What any real model has, with a wide margin, so that a config typed wrong (or written to hurt: 10,000,000 layers
# take minutes and gigabytes to lay out) is refused in one line before anything is built. The largest of the 61
# catalog configs and the published configs in tests/data, by kind: 126 layers (Llama-3.1-405B), 128 heads
# (DeepSeek-V3), head dims of 512 (DeepSeek-V4, Gemma 4's global layers), widths of 53,248 (Llama-3.1-405B's MLP),
# a vocabulary of 262,400 (Gemma-3n), 10,485,760 positions (Llama-4-Scout), 512 experts (Qwen3-Next).
MAX_LAYERS = 1_000  # 8x the largest (126)
MAX_HEADS = 1_024  # 8x the largest (128)
MAX_HEAD_DIM = 4_096  # 8x the largest (512)
MAX_WIDTH = 1 << 20  # 1,048,576: 20x the largest hidden or MLP width (53,248)
MAX_VOCAB = 1 << 24  # 16,777,216: 64x the largest (262,400)
MAX_CONTEXT = 1 << 24  # 16,777,216 tokens: 1.6x the longest (10,485,760); also the bound of windows and chunks
MAX_EXPERTS = 1 << 16  # 65,536: 128x the most (512)
MAX_STATE = 1 << 16  # an SSM state or conv kernel dimension: 256x the largest (256)


def _limit(low: int, high: int, largest: str) -> tuple[int, int, str]:
    return low, high, largest


# config field -> (least, most, the largest real value): checked wherever the field is set (null means unset)
FIELD_LIMITS: dict[str, tuple[int, int, str]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), _limit(1, MAX_LAYERS, "126")),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "n_head_kv",
                     "multi_query_group_num", "num_global_key_value_heads", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_num_heads", "mamba_n_heads", "mamba_num_heads",
                     "index_n_heads"), _limit(1, MAX_HEADS, "128")),
    **dict.fromkeys(("head_dim", "global_head_dim", "kv_channels", "qk_rope_head_dim", "qk_nope_head_dim",
                     "v_head_dim", "index_head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim",
                     "mamba_head_dim", "attention_head_dim"), _limit(1, MAX_HEAD_DIM, "512")),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "kv_lora_rank", "mamba_d_ssm"),
                    _limit(1, MAX_WIDTH, "53,248")),
    # 0: no such MLP (Qwen3-Coder-480B's shared expert)
    **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"),
                    _limit(0, MAX_WIDTH, "53,248")),
    "q_lora_rank": _limit(0, MAX_WIDTH, "1,536"),  # 0: no query compression (DeepSeek-V2-Lite's inference args)
    "vocab_size": _limit(1, MAX_VOCAB, "262,400"),
    **dict.fromkeys(("max_position_embeddings", "seq_length", "n_positions", "sliding_window", "sliding_window_size",
                     "attention_chunk_size"), _limit(1, MAX_CONTEXT, "10,485,760")),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                     "n_shared_experts"), _limit(0, MAX_EXPERTS, "512")),
    **dict.fromkeys(("sliding_window_pattern", "full_attention_interval", "attn_layer_period",
                     "no_rope_layer_interval"), _limit(1, MAX_LAYERS, "8")),
    **dict.fromkeys(("attn_layer_offset", "num_kv_shared_layers", "first_k_dense_replace", "max_window_layers",
                     "mtp_num_hidden_layers", "num_nextn_predict_layers"), _limit(0, MAX_LAYERS, "126")),
    **dict.fromkeys(("mamba_d_state", "ssm_state_size", "mamba_d_conv", "conv_kernel", "linear_conv_kernel_dim",
                     "mamba_expand", "n_groups", "mamba_n_groups"), _limit(1, MAX_STATE, "256")),
}

# Fields a config may give once per layer (Gemma 3n's published configs list intermediate_size for each layer).
PER_LAYER = frozenset({"intermediate_size"})


def _check_field(name: str, value: Any, where: str) -> None:
    """A whole number within FIELD_LIMITS[name], or a ConfigError naming the field, the range and the largest real
    value."""
    low, high, largest = FIELD_LIMITS[name]
    if name in PER_LAYER and isinstance(value, list) and 0 < len(value) <= MAX_LAYERS:
        for item in value:
            _check_field(name, item, where)
        return
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value) if len(repr(value)) <= 40 else f"a {type(value).__name__}"
        raise ConfigError(f"{where}: {name} is {shown}; it must be a whole number from {low:,} to {high:,}",
                          param="model")
    if not low <= value <= high:
        shown = f"{value:,}" if len(str(value)) <= 30 else f"a number of {len(str(abs(value)))} digits"
        raise ConfigError(f"{where}: {name} is {shown}; kvbudget takes {low:,} to {high:,} (the largest real model "
                          f"has {largest})", param="model")


def check_fields(cfg: dict[str, Any], where: str) -> None:
    """Every field of FIELD_LIMITS the config sets (not null), checked before anything is built from it."""
    for name in FIELD_LIMITS.keys() & cfg.keys():
        if cfg[name] is not None:
            _check_field(name, cfg[name], where)


def _dims_of(spec: LayerSpec) -> tuple[tuple[str, int, int, int], ...]:
    """(what, value, least, most) of each size a built layer holds."""
    if isinstance(spec, Attention):
        span = ((("window", spec.token_span, 1, MAX_CONTEXT),) if spec.token_span is not None else ())
        return (("KV heads", spec.kv_heads, 1, MAX_HEADS), ("key head dim", spec.k_dim, 1, MAX_HEAD_DIM),
                ("value head dim", spec.v_dim, 0, MAX_HEAD_DIM), *span)
    if isinstance(spec, LatentAttention):
        return (("latent dim", spec.latent_dim, 1, MAX_WIDTH), ("rope dim", spec.rope_dim, 1, MAX_HEAD_DIM),
                ("heads", spec.heads, 1, MAX_HEADS), ("nope dim", spec.qk_nope_dim, 1, MAX_HEAD_DIM),
                ("value head dim", spec.v_dim, 1, MAX_HEAD_DIM))
    if isinstance(spec, RecurrentState):
        return (("conv channels", spec.conv_channels, 1, MAX_WIDTH), ("conv kernel", spec.conv_kernel, 1, MAX_STATE),
                ("recurrent heads", spec.heads, 1, MAX_WIDTH),
                *(("state dim", size, 1, MAX_WIDTH) for size in spec.state_shape))
    if isinstance(spec, IndexerKeys):
        return (("indexer key dim", spec.dim, 1, MAX_HEAD_DIM),)
    if isinstance(spec, Compressed):
        return (("compression rate", spec.rate, 1, MAX_CONTEXT), ("compressed dim", spec.dim, 1, MAX_HEAD_DIM))
    return ()


def check_layers(layers: list[LayerSpec], where: str) -> None:
    """The sizes the builders derived (head_dim from hidden_size // num_attention_heads, per-layer overrides,
    linear_attn_config) within the limits above, and at most MAX_LAYERS layers."""
    count = len({spec.layer for spec in layers})
    if count > MAX_LAYERS:
        raise ConfigError(f"{where}: the config lays out {count:,} layers; kvbudget takes 1 to {MAX_LAYERS:,} (the "
                          "largest real model has 126)", param="model")
    for spec in layers:
        for what, value, low, high in _dims_of(spec):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{where}: layer {spec.layer}'s {what} comes out as {value!r}; it must be a whole "
                                  f"number from {low:,} to {high:,} (check the config's dimensions)", param="model")


def grouped(where: str, heads: int, kv_heads: int, field: str = "num_key_value_heads") -> int:
    """`kv_heads`, which must divide the query heads evenly (each KV head serves a group of them)."""
    if heads % kv_heads:
        raise ConfigError(f"{where}: {field} is {kv_heads}, which does not divide num_attention_heads ({heads}); "
                          "each KV head serves an equal group of query heads, so it must be a divisor of "
                          f"{heads}", param="model")
    return kv_heads


@contextmanager
def building(cfg: dict[str, Any], where: str, model_type: str) -> Iterator[None]:
    """Building the layers of `cfg`: its fields checked first (check_fields), then a field of a shape those checks
    do not know (a list where a number goes, a dict for a list) one line naming the config, never a traceback."""
    check_fields(cfg, where)
    try:
        yield
    except KVBudgetError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        detail = f"{type(exc).__name__}: {str(exc)[:120]}".splitlines()[0]
        raise ConfigError(f"{where}: a field of this {model_type} config has the wrong type or shape ({detail}); "
                          "compare it with the model's published config.json", param="model") from None
