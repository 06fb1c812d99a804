"""A GGUF file as a model source: its metadata as the config.json transformers would read (architecture, layers,
heads, head dims, window, context, experts) and its weights as the bytes of its tensors, exactly. The config comes
from kvbudget's own walk of the header (a fraction of a second), the tensors' bytes from the `gguf` package
(gguf-py, llama.cpp's own reader); nothing but the header and tensor table is read."""

from __future__ import annotations

import mmap
import os
import struct
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


# GGUF value types (gguf-py's GGUFValueType) -> bytes of one value; 8 (string) and 9 (array) have lengths of their own
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # struct's
# Arrays of numbers up to this long are kept as values (per-layer settings: a few hundred layers at most); longer ones
# (a vocabulary's scores) are skipped, as are arrays of strings (the tokenizer's), of which only the length is kept.
MAX_KEPT_ITEMS = 4096
# Array items in all the metadata: gguf-py keeps every item as objects of its own (some hundred bytes each), so a file
# of many tiny items would take gigabytes. A tokenizer writes about four arrays of its vocabulary (the largest 262,400
# tokens) and its merges: about 1.3 million items at most; this is 3x that.
MAX_GGUF_ITEMS = 1 << 22
MAX_GGUF_DIMS = 4  # GGML_MAX_DIMS: llama.cpp's tensors have at most four dimensions


class _Header:
    """A walk over a GGUF file's header that checks every length it reads against the bytes left in the file before
    anything is allocated or looped over (gguf-py trusts them: an 84-byte file whose array claims 2^40 entries
    grows it past 4 GiB)."""

    def __init__(self, data: bytes | mmap.mmap, path: Path):
        self.data, self.path, self.at, self.items = data, path, 0, 0
        self.order = "<"
        self.values: dict[str, Any] = {}  # metadata key -> its value (a skipped array: None)
        self.lengths: dict[str, int] = {}  # metadata key of an array -> its number of items
        self.tensors: list[str] = []  # the tensors' names

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.path}: not a GGUF file kvbudget can read ({what} at byte {self.at:,} of "
                           f"{len(self.data):,})", param="model")

    def take(self, size: int) -> int:
        """Skip `size` bytes, which must be in the file; the offset they start at."""
        if size < 0 or size > len(self.data) - self.at:
            raise self.fail(f"{size:,} bytes claimed, {len(self.data) - self.at:,} left")
        start, self.at = self.at, self.at + size
        return start

    def uint(self, size: int) -> int:
        return int.from_bytes(self.data[self.take(size):self.at], "little" if self.order == "<" else "big")

    def count(self, least_bytes: int, what: str, most: int | None = None) -> int:
        """A u64 count of items of at least `least_bytes` each: no more than the bytes left can hold."""
        n = self.uint(8)
        if n * least_bytes > len(self.data) - self.at or (most is not None and n > most):
            raise self.fail(f"{what} claims {n:,} entries")
        return n

    def string(self, keep: bool = True) -> str | None:
        start = self.take(self.count(1, "a string"))
        return bytes(self.data[start:self.at]).decode("utf-8", "replace") if keep else None

    def value(self, kind: int, depth: int = 0) -> Any:
        """The value of type `kind` at the offset: a number, a string, a list of numbers (a short array at the top
        level); None for what is skipped (nested values, long arrays, arrays of strings)."""
        if kind in _SCALAR_BYTES:
            start = self.take(_SCALAR_BYTES[kind])
            return struct.unpack(self.order + _FORMATS[kind], self.data[start:self.at])[0] if depth == 0 else None
        if kind == _STRING:
            return self.string(keep=depth == 0)
        if kind == _ARRAY and depth < 2:
            item = self.uint(4)
            least = _SCALAR_BYTES.get(item, 8 if item == _STRING else 12)  # a string's length; an array's type, count
            n = self.count(least, "an array")
            self.length = n
            self.items += n
            if self.items > MAX_GGUF_ITEMS:
                raise self.fail(f"{self.items:,} array items in all, where kvbudget reads up to {MAX_GGUF_ITEMS:,}")
            if item in _SCALAR_BYTES:  # fixed-size items: read or skipped at once
                start = self.take(n * least)
                if depth > 0 or n > MAX_KEPT_ITEMS:
                    return None
                return list(struct.unpack(f"{self.order}{n}{_FORMATS[item]}", self.data[start:self.at]))
            for _ in range(n):
                self.value(item, depth + 1)
            return None
        raise self.fail(f"value type {kind}")

    def walk(self) -> None:
        if bytes(self.data[self.take(4):self.at]) != b"GGUF":
            raise self.fail("no GGUF magic")
        version = self.uint(4)
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.order, version = ">", int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise self.fail(f"GGUF version {version}, where kvbudget reads 2 and 3")
        tensors, kvs = self.uint(8), self.count(13, "the metadata")  # a key's length, its type, one byte of value
        for _ in range(kvs):
            key = self.string()
            assert key is not None
            self.length = -1
            self.values[key] = self.value(self.uint(4))
            if self.length >= 0:
                self.lengths[key] = self.length
        if tensors * 24 > len(self.data) - self.at:  # a name's length, dims, type, offset
            raise self.fail(f"the tensor table claims {tensors:,} tensors")
        for _ in range(tensors):
            self.tensors.append(self.string() or "")
            dims = self.uint(4)
            if not 1 <= dims <= MAX_GGUF_DIMS:
                raise self.fail(f"a tensor of {dims} dimensions")
            elements = 1
            for _ in range(dims):
                elements *= self.uint(8)
            if elements >= 1 << 62:
                raise self.fail(f"a tensor of {elements:,} elements")
            self.take(12)  # type, offset


def check_header(path: Path) -> _Header:
    """Every length in the header of the GGUF file at `path` within the file (see _Header); the header read."""
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                raise ConfigError(f"{path}: not a GGUF file kvbudget can read (it is empty)", param="model")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                header = _Header(data, path)
                header.walk()  # slices of an mmap are bytes: nothing holds it open
                header.data = b""
                return header
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})", param="model") from None


def _reader(path: Path) -> Any:
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"{path}: reading a GGUF file needs the gguf package: pip install 'kvbudget[gguf]'") from None
    check_header(path)
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ConfigError(f"{path}: not a GGUF file kvbudget can read ({exc})".splitlines()[0]) from None


def gguf_config(path: Path) -> dict[str, Any]:
    """The config.json-like dict of a GGUF file, from its header alone (kvbudget's own walk: no tensor is read)."""
    header = check_header(path)
    values = header.values
    arch = values.get("general.architecture")
    model_type = ARCHITECTURES.get(str(arch))
    if model_type is None:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ConfigError(f"{path}: GGUF architecture {arch!r} is not one kvbudget maps to a config yet ({known}); "
                          "pass the model's config.json instead")
    config: dict[str, Any] = {"model_type": model_type, "architectures": [f"gguf:{arch}"]}
    for name, key in _FIELDS:
        value = values.get(f"{arch}.{key}")
        if value is None:
            continue
        if isinstance(value, list):  # per-layer values: kvbudget reads one per model
            if len(set(value)) != 1:
                raise ConfigError(f"{path}: {arch}.{key} differs by layer ({sorted(set(value))}); kvbudget reads "
                                  "these GGUF files from a config.json only")
            value = value[0]
        config[name] = value
    pattern = values.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):  # one flag per layer (newer converters): true where the layer is windowed
        config["layer_types"] = ["sliding_attention" if bool(x) else "full_attention" for x in pattern]
    elif pattern is not None:  # every n-th layer global (gemma3's 6)
        config["sliding_window_pattern"] = int(pattern)
    value_length = values.get(f"{arch}.attention.value_length")
    if arch == "deepseek2":  # MLA: the latent and the rope key are what is cached
        _mla_fields(values, config, value_length, path)
    elif value_length is not None and config.get("head_dim") not in (None, value_length):
        raise ConfigError(f"{path}: K and V head sizes differ ({config['head_dim']} and {value_length}); pass the "
                          "model's config.json")
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in header.lengths:
        config["vocab_size"] = header.lengths["tokenizer.ggml.tokens"]
    dtype = _FILE_DTYPES.get(values.get("general.file_type"))  # type: ignore[arg-type]
    if dtype:
        config["torch_dtype"] = dtype
    config["tie_word_embeddings"] = "output.weight" not in header.tensors  # llama.cpp reuses token_embd without one
    return config


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(config.json-like dict, tensor bytes by GGUF type) of a GGUF file."""
    config = gguf_config(path)
    by_type: dict[str, int] = {}
    for tensor in _reader(path).tensors:
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


def _mla_fields(values: dict[str, Any], config: dict[str, Any], value_length: int | None, path: Path) -> None:
    """DeepSeek's MLA dims: llama.cpp's converter writes key_length = nope + rope per head, or, since MLA is cached
    as the latent (2025), key_length_mla / value_length_mla for the per-head dims and key_length = latent + rope."""
    rope = values.get("deepseek2.rope.dimension_count")
    latent = values.get("deepseek2.attention.kv_lora_rank")
    if rope is None or latent is None:
        raise ConfigError(f"{path}: a deepseek2 GGUF without rope.dimension_count or attention.kv_lora_rank; pass the "
                          "model's config.json")
    key = values.get("deepseek2.attention.key_length_mla") or config.pop("head_dim", None)
    value = values.get("deepseek2.attention.value_length_mla") or value_length
    config.pop("head_dim", None)
    if key is None or value is None:
        raise ConfigError(f"{path}: a deepseek2 GGUF without its per-head key and value lengths")
    config.update(kv_lora_rank=latent, qk_rope_head_dim=rope, qk_nope_head_dim=key - rope, v_head_dim=value,
                  q_lora_rank=values.get("deepseek2.attention.q_lora_rank"))
    dense = values.get("deepseek2.leading_dense_block_count")
    if dense is not None:
        config["first_k_dense_replace"] = dense
    if (experts := config.pop("num_local_experts", None)) is not None:
        config["n_routed_experts"] = experts
        config.pop("num_experts", None)
    shared = values.get("deepseek2.expert_shared_count")
    if shared is not None:
        config["n_shared_experts"] = shared
