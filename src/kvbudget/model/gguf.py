"""A GGUF file as a model source: its metadata as the config.json transformers would read (architecture, layers,
heads, head dims, window, context, experts) and its weights as the bytes of its tensors, exactly. Read with the
`gguf` package (gguf-py, llama.cpp's own reader); nothing but the header and tensor table is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbudget.errors import ConfigError

# GGUF general.architecture -> transformers model_type, for the families whose cache kvbudget reads from those keys
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
                 "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text", "phi3": "phi3", "command-r": "cohere",
                 "gpt-oss": "gpt_oss", "deepseek2": "deepseek_v3"}

# config.json field <- GGUF key under the architecture's prefix
_FIELDS = (("num_hidden_layers", "block_count"), ("hidden_size", "embedding_length"),
           ("intermediate_size", "feed_forward_length"), ("max_position_embeddings", "context_length"),
           ("num_attention_heads", "attention.head_count"), ("num_key_value_heads", "attention.head_count_kv"),
           ("head_dim", "attention.key_length"), ("sliding_window", "attention.sliding_window"),
           ("vocab_size", "vocab_size"), ("num_experts", "expert_count"), ("num_local_experts", "expert_count"),
           ("num_experts_per_tok", "expert_used_count"), ("moe_intermediate_size", "expert_feed_forward_length"),
           ("shared_expert_intermediate_size", "expert_shared_feed_forward_length"))
# general.file_type (llama_ftype) of unquantized files -> the activation dtype it implies
_FILE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def _reader(path: Path) -> Any:
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"{path}: reading a GGUF file needs the gguf package: pip install 'kvbudget[gguf]'") from None
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ConfigError(f"{path}: not a GGUF file kvbudget can read ({exc})".splitlines()[0]) from None


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(config.json-like dict, tensor bytes by GGUF type) of a GGUF file."""
    reader = _reader(path)
    arch = _value(reader, "general.architecture")
    model_type = ARCHITECTURES.get(str(arch))
    if model_type is None:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ConfigError(f"{path}: GGUF architecture {arch!r} is not one kvbudget maps to a config yet ({known}); "
                          "pass the model's config.json instead")
    config: dict[str, Any] = {"model_type": model_type, "architectures": [f"gguf:{arch}"]}
    for name, key in _FIELDS:
        value = _value(reader, f"{arch}.{key}")
        if value is None:
            continue
        if isinstance(value, list):  # per-layer values: kvbudget reads one per model
            if len(set(value)) != 1:
                raise ConfigError(f"{path}: {arch}.{key} differs by layer ({sorted(set(value))}); kvbudget reads "
                                  "these GGUF files from a config.json only")
            value = value[0]
        config[name] = value
    pattern = _value(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer (newer converters): true where the layer is windowed
        config["layer_types"] = ["sliding_attention" if bool(x) else "full_attention" for x in pattern]
    elif pattern is not None:  # every n-th layer global (gemma3's 6)
        config["sliding_window_pattern"] = int(pattern)
    value_length = _value(reader, f"{arch}.attention.value_length")
    if arch == "deepseek2":  # MLA: the latent and the rope key are what is cached
        _mla_fields(reader, config, value_length, path)
    elif value_length is not None and config.get("head_dim") not in (None, value_length):
        raise ConfigError(f"{path}: K and V head sizes differ ({config['head_dim']} and {value_length}); pass the "
                          "model's config.json")
    if "vocab_size" not in config and (tokens := reader.fields.get("tokenizer.ggml.tokens")) is not None:
        config["vocab_size"] = len(tokens.data)
    dtype = _FILE_DTYPES.get(_value(reader, "general.file_type"))
    if dtype:
        config["torch_dtype"] = dtype
    names = {tensor.name for tensor in reader.tensors}
    config["tie_word_embeddings"] = "output.weight" not in names  # llama.cpp reuses token_embd without one
    by_type: dict[str, int] = {}
    for tensor in reader.tensors:
        by_type[tensor.tensor_type.name] = by_type.get(tensor.tensor_type.name, 0) + int(tensor.n_bytes)
    return config, by_type


def gguf_layer_bytes(path: Path, num_layers: int) -> tuple[list[int], int, int]:
    """(bytes of each decoder layer's tensors `blk.N.*`, the token embeddings', the output's: its head and norm, or
    with tied embeddings the copy of `token_embd` llama.cpp makes for it) of a GGUF file, as llama.cpp loads them."""
    layers = [0] * num_layers
    input_side = output_side = 0
    tensors = _reader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    for tensor in tensors:
        name, size = tensor.name, int(tensor.n_bytes)
        if name.startswith("blk."):
            index = int(name.split(".")[1])
            if index < num_layers:  # MTP blocks past the decoder are not loaded for serving
                layers[index] += size
        elif name.startswith("token_embd"):
            input_side += size
            if tied and name == "token_embd.weight":  # llama.cpp duplicates it onto the output's device
                output_side += size
        else:
            output_side += size
    return layers, input_side, output_side


def _mla_fields(reader: Any, config: dict[str, Any], value_length: int | None, path: Path) -> None:
    """DeepSeek's MLA dims: llama.cpp's converter writes key_length = nope + rope per head, or, since MLA is cached
    as the latent (2025), key_length_mla / value_length_mla for the per-head dims and key_length = latent + rope."""
    rope = _value(reader, "deepseek2.rope.dimension_count")
    latent = _value(reader, "deepseek2.attention.kv_lora_rank")
    if rope is None or latent is None:
        raise ConfigError(f"{path}: a deepseek2 GGUF without rope.dimension_count or attention.kv_lora_rank; pass the "
                          "model's config.json")
    key = _value(reader, "deepseek2.attention.key_length_mla") or config.pop("head_dim", None)
    value = _value(reader, "deepseek2.attention.value_length_mla") or value_length
    config.pop("head_dim", None)
    if key is None or value is None:
        raise ConfigError(f"{path}: a deepseek2 GGUF without its per-head key and value lengths")
    config.update(kv_lora_rank=latent, qk_rope_head_dim=rope, qk_nope_head_dim=key - rope, v_head_dim=value,
                  q_lora_rank=_value(reader, "deepseek2.attention.q_lora_rank"))
    dense = _value(reader, "deepseek2.leading_dense_block_count")
    if dense is not None:
        config["first_k_dense_replace"] = dense
    if (experts := config.pop("num_local_experts", None)) is not None:
        config["n_routed_experts"] = experts
        config.pop("num_experts", None)
    shared = _value(reader, "deepseek2.expert_shared_count")
    if shared is not None:
        config["n_shared_experts"] = shared
