"""Element types a KV cache can be stored in, with their real storage sizes.

Block types are llama.cpp's (ggml-common.h): a block of 32 values plus its scale(s).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.choices import Choice
from kvbudget.errors import KVBudgetError
from kvbudget.units import cdiv


class Family(Choice):
    """How a storage type is kept, which decides which engines offer it."""

    FLOAT = "float"  # a torch float dtype
    FP8 = "fp8"
    INT8 = "int8"
    BLOCK = "block"  # llama.cpp's block types
    PER_TOKEN_HEAD = "per_token_head"  # vLLM's per-token-head scaled caches
    HF_QUANTIZED = "hf_quantized"  # transformers' QuantizedCache


@dataclass(frozen=True)
class KVDtype:
    """One storage type: `block_bytes` bytes hold `block_values` values."""

    name: str
    block_values: int
    block_bytes: int
    family: Family
    head_scale_bytes: int = 0  # per token and KV head: the scales stored beside K's and V's codes

    def bytes_for(self, n_values: int) -> int:
        """Bytes to store n_values values (whole blocks)."""
        return cdiv(n_values, self.block_values) * self.block_bytes

    @property
    def bits_per_value(self) -> float:
        return 8 * self.block_bytes / self.block_values


_TYPES = {
    t.name: t
    for t in (
        KVDtype("float32", 1, 4, Family.FLOAT),
        KVDtype("float16", 1, 2, Family.FLOAT),
        KVDtype("bfloat16", 1, 2, Family.FLOAT),
        KVDtype("fp8_e4m3", 1, 1, Family.FP8),
        KVDtype("fp8_e5m2", 1, 1, Family.FP8),
        KVDtype("int8", 1, 1, Family.INT8),
        KVDtype("q8_0", 32, 34, Family.BLOCK),    # 32 int8 + fp16 scale
        KVDtype("q4_0", 32, 18, Family.BLOCK),    # 16 bytes of nibbles + fp16 scale
        KVDtype("q4_1", 32, 20, Family.BLOCK),    # + fp16 min
        KVDtype("q5_0", 32, 22, Family.BLOCK),    # + 4 bytes of high bits
        KVDtype("q5_1", 32, 24, Family.BLOCK),
        KVDtype("iq4_nl", 32, 18, Family.BLOCK),
        # vLLM 0.32 (v1/attention/backends/triton_attn.py, customize_spec): one float32 scale for K and one for V
        # per token and head, inline after the head's codes; int4 packs two codes a byte
        KVDtype("int8_per_token_head", 1, 1, Family.PER_TOKEN_HEAD, 8),
        KVDtype("fp8_per_token_head", 1, 1, Family.PER_TOKEN_HEAD, 8),
        KVDtype("int4_per_token_head", 2, 1, Family.PER_TOKEN_HEAD, 8),
        # transformers' QuantizedCache (quanto / HQQ): packed codes; the hf engine adds a scale and a zero point
        # in the model's dtype per group of 64 values and the full-precision residual
        KVDtype("quanto_int4", 2, 1, Family.HF_QUANTIZED),
        KVDtype("quanto_int2", 4, 1, Family.HF_QUANTIZED),
        KVDtype("hqq_int4", 2, 1, Family.HF_QUANTIZED),
        KVDtype("hqq_int2", 4, 1, Family.HF_QUANTIZED),
    )
}
_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
}



class KVDtypeNames(tuple[str, ...]):
    """The names a KV dtype is offered by (they are listed), holding every name `get_dtype` takes besides: each
    storage type's own name and its aliases, in any case (a request's choices, checked by the command line and
    the web page alike)."""

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = name.strip().lower()
        return key == "auto" or _ALIASES.get(key, key) in _TYPES


KV_DTYPE_CHOICES = KVDtypeNames(("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8",
                                 "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "int8_per_token_head",
                                 "fp8_per_token_head", "int4_per_token_head", "quanto_int4", "quanto_int2", "hqq_int4",
                                 "hqq_int2"))


def get_dtype(name: str) -> KVDtype:
    """Look up a storage type by name or alias (case-insensitive)."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _TYPES:
        raise KVBudgetError(f"kv_dtype: unknown KV dtype {name!r}; choose one of: {', '.join(KV_DTYPE_CHOICES)}",
                            param="kv_dtype")
    return _TYPES[key]


def resolve_kv_dtype(name: str, model_dtype: str) -> KVDtype:
    """'auto' means the model's own dtype; anything else is looked up."""
    return get_dtype(model_dtype if str(name).strip().lower() == "auto" else name)
