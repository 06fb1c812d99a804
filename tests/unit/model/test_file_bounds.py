"""Files read whole are bounded before parsing (issue 50): a deeply nested JSON or YAML document, a binary file or
one past MAX_DOCUMENT_BYTES is one line naming the file, never a RecursionError or a whole gigabyte read; and trace
rows that no request has are refused, as is a trace with no rows."""

from __future__ import annotations

import json
import os
import re
import struct

import pytest

from kvbudget.cli import main
from kvbudget.engines.scheduling.workload import read_trace
from kvbudget.errors import KVBudgetError
from kvbudget.files import MAX_DOCUMENT_BYTES, read_json, read_yaml


@pytest.mark.parametrize(("text", "words"), [
    ("[" * 100_000, r"nests \[ and \{ more than 64 levels deep"),
    ('{"a": ' * 65 + "1" + "}" * 65, r"nests \[ and \{ more than 64 levels deep"),
])
def test_deep_json_is_refused_before_parsing(tmp_path, text, words):
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(KVBudgetError, match=words):
        read_json(path, "model")


def test_nesting_inside_strings_and_shallow_documents_are_read(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"s": "[" * 1000, "a": [[[[1]]]]}))
    assert read_json(path, "model")["a"] == [[[[1]]]]


def test_a_deep_config_is_one_line_from_the_cli(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000)
    assert main(["estimate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json: nests [ and { more than 64 levels" in err


def test_deep_yaml_in_flow_or_block_style_is_refused(tmp_path):
    flow, block = tmp_path / "flow.yaml", tmp_path / "block.yaml"
    flow.write_text("a: " + "[" * 100_000)
    block.write_text("".join(" " * i + "a:\n" for i in range(3000)))
    for path in (flow, block):
        with pytest.raises(KVBudgetError, match="nests"):
            read_yaml(path, "config")


def test_binary_files_are_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(KVBudgetError, match="x.json: not UTF-8 text"):
        read_json(path, "calibrate")


def test_a_file_past_the_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:  # sparse: no disk used
        fh.truncate(MAX_DOCUMENT_BYTES + 1)
    assert os.path.getsize(path) > MAX_DOCUMENT_BYTES
    with pytest.raises(KVBudgetError, match="16,777,217 bytes; kvbudget reads JSON files of up to 16,777,216"):
        read_json(path, "model")


def test_a_binary_calibration_and_guard_yaml_are_one_line(tmp_path, capsys):
    binary = tmp_path / "cal.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    assert main(["simulate", "llama-3.2-1b", "--gpu", "L4", "--calibrate", str(binary), "--rate", "1",
                 "--requests", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8 text" in err
    from kvbudget.guard.config import read_yaml as guard_yaml

    with pytest.raises(KVBudgetError, match="not UTF-8 text"):
        guard_yaml(str(binary), "config")


def test_a_trace_with_only_a_header_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(KVBudgetError, match="no requests in the trace"):
        list(read_trace(str(path)))


@pytest.mark.parametrize(("row", "words"), [
    ({"arrival": 0, "prompt_tokens": 10**400, "output_tokens": 5}, "prompt_tokens <1329-bit int> is not a number"),
    ({"arrival": 0, "prompt_tokens": 2**30, "output_tokens": 5}, "must be a whole number from 1 to 16,777,216"),
    ({"arrival": 0, "prompt_tokens": True, "output_tokens": 5}, "prompt_tokens True must be a whole number"),
    ({"arrival": 10**400, "prompt_tokens": 5, "output_tokens": 5}, "arrival"),
    ({"arrival": 0, "prompt_tokens": 5}, "missing 'output_tokens'"),
])
def test_hostile_trace_rows_are_refused(tmp_path, row, words):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(KVBudgetError, match=words):
        list(read_trace(str(path)))


def test_a_deep_trace_line_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": ' + "[" * 100_000 + "\n")
    with pytest.raises(KVBudgetError, match="t.jsonl:1:"):
        list(read_trace(str(path)))


def test_integers_past_pythons_digit_limit_are_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(KVBudgetError, match="c.json: invalid JSON"):
        read_json(path, "model")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival": 0, "prompt_tokens": ' + "9" * 5000 + ', "output_tokens": 1}\n')
    with pytest.raises(KVBudgetError, match="t.jsonl:1:"):
        list(read_trace(str(trace)))


@pytest.mark.parametrize("header, words", [
    (struct.pack("<Q", 1 << 62), "its header claims 4,611,686,018,427,387,904 bytes"),
    (struct.pack("<Q", 100) + b"{}", "its header is cut short"),
    (struct.pack("<Q", 5) + b"[1,2]", "not a JSON object"),
    (struct.pack("<Q", 70) + b"[" * 70, "its header: nests [ and { more than 64 levels"),
    (struct.pack("<Q", 5010) + b'{"a": ' + b"9" * 5000 + b"}   ", "a number of over 4,300 digits"),
    (struct.pack("<Q", 13) + b'{"w": [1, 2]}', "tensor 'w' has no dtype and data_offsets"),
    (struct.pack("<Q", 47) + b'{"w": {"dtype": "F16", "data_offsets": [9, 1]}}', "tensor 'w' has no dtype"),
])
def test_a_hostile_safetensors_header_is_one_line(tmp_path, header, words):
    """A safetensors header is read within the document bounds: a length of 2^62 (read to the file's end before),
    a header that is not an object or whose tensors lack offsets (an AttributeError, KeyError or TypeError before),
    too deep or with a 5,000-digit number."""
    from kvbudget.model.weights import safetensors_bytes

    (tmp_path / "model.safetensors").write_bytes(header)
    with pytest.raises(KVBudgetError, match=re.escape(words)) as e:
        safetensors_bytes(tmp_path)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(tmp_path / "model.safetensors"))


def test_a_safetensors_header_is_summed_by_dtype(tmp_path):
    from kvbudget.model.weights import safetensors_bytes

    text = json.dumps({"__metadata__": {"format": "pt"},
                       "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                       "b": {"dtype": "BF16", "shape": [4], "data_offsets": [12, 20]},
                       "c": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]}}).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(24))
    assert safetensors_bytes(tmp_path) == {"BF16": 20, "F32": 4}


@pytest.mark.parametrize("argv", [
    ["tokens", "llama-3.1-8b", "--approximate", "{big}"],  # a document
    ["tokens", "llama-3.1-8b", "--approximate", "{big}.json"],  # a chat request
    ["tokens", "llama-3.1-8b", "--approximate", "--system", "@{big}", "{small}"],  # a system prompt
    ["plan", "llama-3.1-8b", "--gpu", "H100", "--prompt-file", "{big}", "--approximate"],
])
def test_a_text_past_64_mib_is_refused_before_it_is_read(tmp_path, capsys, argv):
    """A prompt or document is read whole, so its size is checked first: a sparse file of 65 MiB (no data on the
    disk) is refused in one line, without 65 MiB read into memory."""
    import tracemalloc

    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    for path in (big, tmp_path / "big.txt.json"):
        with path.open("wb") as fh:
            fh.truncate(65 << 20)
    small.write_text("hello")
    tracemalloc.start()
    code = main([a.format(big=big, small=small) for a in argv])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "over 67,108,864 bytes" in err, err
    assert peak < 16 << 20, peak
