"""The names of the cache formats `kvbudget quality` compares, and how a `--kv-dtype` value is read, without
loading torch: a bad value is refused before any model loads. formats.py holds what each format does."""

from __future__ import annotations

from kvbudget.errors import KVBudgetError

FLOAT_FORMATS = ("f32", "f16", "bf16")
BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's (ggml.TYPES)
SCALED_FORMATS = ("fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head")  # vLLM's (scaled.TYPES)
PER_LAYER_SCALED = ("fp8", "fp8_e4m3", "fp8_e5m2")  # one scale per layer (the others: per token and head)
CACHE_FORMATS = ("quanto_int4", "quanto_int2", "hqq_int4", "hqq_int2")  # transformers' whole caches (hf_cache.TYPES)
NAMES = (*FLOAT_FORMATS, *BLOCK_FORMATS, *SCALED_FORMATS, *CACHE_FORMATS)


def check_scales(kv_dtypes: tuple[str, ...] | list[str], kv_scales: str) -> None:
    """`kv_scales`: "1" or "dynamic", which needs a format with one scale per layer among `kv_dtypes`."""
    if kv_scales not in ("1", "dynamic"):
        raise KVBudgetError(f"kv_scales {kv_scales!r}: choose 1 (uncalibrated) or dynamic", param="kv_scales")
    if kv_scales == "dynamic" and not any(f in PER_LAYER_SCALED for text in kv_dtypes for f in split(text)):
        raise KVBudgetError("kv_scales dynamic: none of the formats has a per-layer scale; it applies to vLLM's "
                            "fp8, fp8_e4m3 and fp8_e5m2", param="kv_scales")


def split(text: str) -> tuple[str, str]:
    """(K's format, V's format) of 'q8_0' (both) or 'k=q8_0,v=q4_0'."""
    text = text.strip()
    if "=" not in text:
        if text not in NAMES:
            if "," in text and all(part.strip() in NAMES for part in text.split(",")):
                formats = " ".join(part.strip() for part in text.split(","))
                raise KVBudgetError(f"kv_dtype {text!r}: one format per value; separate formats with spaces "
                                    f"({formats}), or give K and V apart as k=FORMAT,v=FORMAT", param="kv_dtype")
            raise KVBudgetError(f"kv_dtype {text!r}: choose from {', '.join(NAMES)}, or k=...,v=...",
                                param="kv_dtype")
        return text, text
    parts: dict[str, str] = {}
    for piece in text.split(","):
        half, _, value = piece.rpartition("=")
        parts[half.strip()] = value.strip()
    if set(parts) != {"k", "v"}:
        raise KVBudgetError(f"kv_dtype {text!r}: give both halves as k=FORMAT,v=FORMAT", param="kv_dtype")
    for half in parts.values():
        if half not in NAMES:
            raise KVBudgetError(f"kv_dtype {text!r}: {half!r} is not a format; choose from {', '.join(NAMES)}",
                                param="kv_dtype")
        if half in CACHE_FORMATS and parts["k"] != parts["v"]:
            raise KVBudgetError(f"kv_dtype {text!r}: {half} is transformers' whole cache; it stores K and V "
                                "alike", param="kv_dtype")
    return parts["k"], parts["v"]
