"""GGUF files bounded by their own size (issue 50): every length a GGUF header states is checked against the bytes
left in the file before anything is allocated or looped over, so that an 84-byte file whose array claims 2^40
entries is one line, not 4 GiB; and its metadata meets the same config limits as a config.json."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbudget import load_model
from kvbudget.cli import main
from kvbudget.errors import KVBudgetError
from kvbudget.model.gguf import check_header

gguf = pytest.importorskip("gguf")  # a test dependency: always installed by .ci/run

from test_gguf import write_gguf  # noqa: E402  (after the skip: it needs gguf)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(tensors: int = 0, body: bytes = b"", kvs: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, kvs) + body


def _bounded(call, path, peak_bytes=8 << 20, seconds=2.0):
    """`call(path)` raises a KVBudgetError (or returns) within `seconds` and `peak_bytes` of Python allocations."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        call(path)
    except KVBudgetError as exc:
        assert "\n" not in str(exc)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - start < seconds and peak < peak_bytes


@pytest.mark.parametrize(("body", "tensors", "words"), [
    (_string(b"a") + struct.pack("<IIQ", 9, 8, 1 << 40), 0, "an array claims 1,099,511,627,776 entries"),
    (_string(b"a") + struct.pack("<IIQ", 9, 0, 1 << 40), 0, "an array claims 1,099,511,627,776 entries"),
    (_string(b"a") + struct.pack("<IQ", 8, 1 << 62), 0, "a string claims"),
    (struct.pack("<Q", 1 << 50) + b"key", 0, "a string claims"),
    (_string(b"a") + struct.pack("<IB", 0, 1), 1 << 60, "the tensor table claims 1,152,921,504,606,846,976 tensors"),
    (_string(b"a") + struct.pack("<II", 99, 0), 0, "value type 99"),
])
def test_lengths_past_the_end_of_the_file_are_refused_before_allocating(tmp_path, body, tensors, words):
    path = tmp_path / "x.gguf"
    path.write_bytes(_header(tensors, body).ljust(84, b"\0"))
    with pytest.raises(KVBudgetError, match=f"x.gguf: not a GGUF file kvbudget can read \\(.*{words}"):
        check_header(path)
    _bounded(load_model, str(path))


def test_the_84_byte_file_of_the_report_is_one_line_from_the_cli(tmp_path, capsys):
    path = tmp_path / "evil.gguf"
    path.write_bytes((_header(0, _string(b"general.architecture") + struct.pack("<IIQ", 9, 8, 1 << 40)))
                     .ljust(84, b"\0"))
    assert len(path.read_bytes()) == 84
    assert main(["estimate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "evil.gguf: not a GGUF file kvbudget can read" in err


def test_gguf_metadata_meets_the_config_limits(tmp_path):
    path = write_gguf(tmp_path / "deep.gguf", layers=10_000_000)
    with pytest.raises(KVBudgetError, match="num_hidden_layers is 10,000,000; kvbudget takes 1 to 1,000"):
        load_model(str(path))


def test_an_empty_file_is_one_line(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(KVBudgetError, match="it is empty"):
        load_model(str(path))


@pytest.fixture(scope="module")
def real_header(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_headers_give_a_clear_error_or_a_model(tmp_path, real_header, data):
    """Bytes of a real GGUF overwritten, cut short or run on: a KVBudgetError or a model, in bounded time and
    memory, never another exception."""
    raw = bytearray(real_header)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, min(len(raw), 600) - 8))
        raw[at:at + 8] = data.draw(st.binary(min_size=8, max_size=8))
    raw = raw[:data.draw(st.integers(0, len(raw)))]
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(raw))
    _bounded(load_model, str(path), peak_bytes=32 << 20)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=200), tensors=st.integers(0, 2**64 - 1), kvs=st.integers(0, 2**64 - 1))
def test_random_headers_give_a_clear_error(tmp_path, body, tensors, kvs):
    path = tmp_path / "r.gguf"
    path.write_bytes(_header(tensors, body, kvs))
    _bounded(load_model, str(path))


def test_more_array_items_than_any_tokenizer_writes_are_refused(tmp_path):
    """gguf-py keeps each item as objects of its own: 4 MiB of one-byte items would take gigabytes."""
    from kvbudget.model.gguf import MAX_GGUF_ITEMS

    path = tmp_path / "many.gguf"
    path.write_bytes(_header(0, _string(b"a") + struct.pack("<IIQ", 9, 0, MAX_GGUF_ITEMS + 1) +
                             bytes(MAX_GGUF_ITEMS + 1)))
    with pytest.raises(KVBudgetError, match="4,194,305 array items in all, where kvbudget reads up to 4,194,304"):
        check_header(path)
