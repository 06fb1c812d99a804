from __future__ import annotations

import pytest

from kvbudget.dtypes import get_dtype, resolve_kv_dtype
from kvbudget.errors import KVBudgetError
from kvbudget.units import GIB, format_bytes, parse_positive_ints, parse_size


@pytest.mark.parametrize("name, values, size", [
    ("q8_0", 32, 34), ("q4_0", 32, 18), ("q4_1", 32, 20), ("q5_0", 32, 22), ("q5_1", 32, 24),
    ("iq4_nl", 32, 18), ("fp8", 1, 1), ("fp8_e5m2", 1, 1), ("int8", 1, 1), ("fp16", 1, 2), ("bf16", 1, 2),
    ("fp32", 1, 4),
])
def test_block_sizes(name, values, size):
    # llama.cpp ggml-common.h: block_q8_0 = fp16 scale + 32 int8; q4_0 = fp16 + 16 bytes; q4_1 adds an
    # fp16 min; q5_0 = fp16 + 4 bytes of high bits + 16; q5_1 adds a min; iq4_nl = fp16 + 16.
    d = get_dtype(name)
    assert (d.block_values, d.block_bytes) == (values, size)


def test_row_sizes_round_up_to_whole_blocks():
    assert get_dtype("q8_0").bytes_for(1024) == 1024 // 32 * 34
    assert get_dtype("q4_0").bytes_for(33) == 2 * 18


def test_auto_is_the_models_dtype():
    assert resolve_kv_dtype("auto", "bfloat16").name == "bfloat16"
    assert resolve_kv_dtype("AUTO", "float32").block_bytes == 4


def test_unknown_dtype():
    with pytest.raises(KVBudgetError, match="unknown KV dtype"):
        get_dtype("fp4")


@pytest.mark.parametrize("text, expected", [
    ("3.81GiB", int(3.81 * GIB)), ("24GB", 24 * 10**9), ("24G", 24 * GIB), ("1048576", 1048576),
    ("512 MiB", 512 * 2**20),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1GB", "0", "12 parsecs", "GB"])
def test_parse_size_rejects(text):
    with pytest.raises(KVBudgetError):
        parse_size(text)


def test_format_bytes_is_binary():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(512 * 2**20) == "512.00 MiB"
    assert format_bytes(100) == "100 B"


def test_parse_positive_ints():
    assert parse_positive_ints("1,4, 8", "--batch") == (1, 4, 8)
    assert parse_positive_ints("4k,32K", "--context") == (4096, 32768)
    with pytest.raises(KVBudgetError, match="--batch"):
        parse_positive_ints("1,,2", "--batch")


def test_context_lengths_as_people_write_them():
    """1M and 1.5k are context lengths users type (issue 15): powers of 1024, whole numbers only."""
    assert parse_positive_ints("1M,1.5k,0.5k,2m", "--context") == (1_048_576, 1536, 512, 2_097_152)
    with pytest.raises(KVBudgetError, match="1.3k.* not a whole number"):
        parse_positive_ints("1.3k", "--context")
    with pytest.raises(KVBudgetError, match="1.5k or 1M"):
        parse_positive_ints("1.5G", "--context")
