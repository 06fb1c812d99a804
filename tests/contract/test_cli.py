"""The command line: JSON contract, tables, and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def estimate_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "estimate", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_contract(capsys):
    data = estimate_json(capsys, "llama-3.1-8b", "--batch", "1,4", "--context", "1024,4096")
    assert data["bytes_per_token"] == 131_072
    assert data["fixed_bytes_per_sequence"] == 0
    assert [(p["batch"], p["context"]) for p in data["points"]] == [(1, 1024), (1, 4096), (4, 1024), (4, 4096)]
    assert data["points"][3]["kv_bytes"] == 4 * 4096 * 131_072
    assert data["token_tax"] == [{"batch": 1, "sequences": 1, "bytes_per_token": 131_072},
                                 {"batch": 4, "sequences": 4, "bytes_per_token": 4 * 131_072}]


def test_beams_multiply_the_batch(capsys):
    one = estimate_json(capsys, "qwen3-8b", "--batch", "2", "--context", "2048")
    beams = estimate_json(capsys, "qwen3-8b", "--batch", "2", "--beams", "4", "--context", "2048")
    assert beams["points"][0]["kv_bytes"] == 4 * one["points"][0]["kv_bytes"]
    assert beams["points"][0]["sequences"] == 8


def test_tp_divides_kv_heads_and_replicates_mla(capsys):
    full = estimate_json(capsys, "llama-3.1-70b", "--context", "1000")
    tp8 = estimate_json(capsys, "llama-3.1-70b", "--context", "1000", "--tp", "8")
    assert tp8["bytes_per_token"] * 8 == full["bytes_per_token"]
    tp16 = estimate_json(capsys, "llama-3.1-70b", "--context", "1000", "--tp", "16")
    assert tp16["bytes_per_token"] == tp8["bytes_per_token"]  # one KV head per rank, replicated
    mla = estimate_json(capsys, "deepseek-v3", "--tp", "8")
    assert mla["bytes_per_token"] == 70_272


def test_default_contexts_include_the_models_maximum(capsys):
    data = estimate_json(capsys, "mistral-7b")
    assert [p["context"] for p in data["points"]] == [1024, 4096, 8192, 16384, 32768]


def test_windowed_points_report_caps_and_uncapped(capsys):
    data = estimate_json(capsys, "gemma-2-9b", "--context", "8192")
    point = data["points"][0]
    assert point["kv_bytes"] < point["uncapped_kv_bytes"]
    assert point["uncapped_kv_bytes"] == 8192 * data["bytes_per_token"]


def test_table_output(capsys):
    code, out, err = run(capsys, "estimate", "gemma-2-9b", "--layers", "--batch", "1,8")
    assert code == 0
    assert "Token tax" in out and "no window cap" in out and "sliding window" in out
    assert "powers of 1024" in out


def test_quantized_dtype_is_labelled_an_estimate(capsys):
    data = estimate_json(capsys, "llama-3.1-8b", "--engine", "hf", "--kv-dtype", "q8_0")
    assert data["exact"] is False
    assert data["bytes_per_token"] == 2 * 32 * (8 * 128 // 32) * 34
    assert any("estimate" in n for n in data["notes"])
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--engine", "hf", "--kv-dtype", "q8_0")
    assert "ESTIMATE" in out


def test_capacity_json_contract(capsys):
    data = estimate_json(capsys, "llama-3.1-8b", "--engine", "vllm", "--kv-memory", "3.81GiB",
                         "--max-model-len", "8192", "--context", "8192")
    cap = data["capacity"]
    assert set(cap) >= {"kv_memory_bytes", "num_blocks", "kv_cache_tokens", "max_model_len", "max_concurrency",
                        "fits", "estimated_max_model_len"}
    assert cap["kv_memory_bytes"] == int(3.81 * 2**30)
    assert cap["num_blocks"] == cap["kv_memory_bytes"] // (16 * 131_072)
    assert cap["max_model_len"] == 8192 and cap["fits"] is True and cap["estimated_max_model_len"] is None
    no_budget = estimate_json(capsys, "llama-3.1-8b", "--engine", "vllm", "--context", "8192")
    assert no_budget["capacity"] is None


def test_capacity_table_says_when_it_does_not_fit(capsys):
    code, out, _ = run(capsys, "estimate", "llama-3.1-8b", "--engine", "vllm", "--kv-memory", "10GiB",
                       "--max-model-len", "131072", "--context", "1024")
    assert code == 0 and "does not fit" in out and "81,904" in out


def test_models_lists_the_catalog(capsys):
    code, out, _ = run(capsys, "models", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) >= 35
    assert {"mistral-7b", "qwen3-32b", "deepseek-v3", "gpt-oss-20b", "gemma-2-9b", "qwen3-next-80b-a3b",
            "llama-3.1-8b"} <= {r["name"] for r in rows}
    code, out, _ = run(capsys, "models")
    assert code == 0 and "mistral-7b" in out


def test_config_file_and_folder(tmp_path, capsys):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_size": 256, "torch_dtype": "float16", "max_position_embeddings": 512}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_file = estimate_json(capsys, str(tmp_path / "config.json"))
    by_folder = estimate_json(capsys, str(tmp_path))
    assert by_file["bytes_per_token"] == by_folder["bytes_per_token"] == 2 * 2 * 2 * 64 * 2


def test_unknown_model_type_with_standard_fields_warns(tmp_path, capsys):
    cfg = {"model_type": "brand_new", "num_hidden_layers": 3, "num_attention_heads": 8,
           "num_key_value_heads": 2, "head_dim": 64, "torch_dtype": "bfloat16"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    code, out, err = run(capsys, "estimate", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["bytes_per_token"] == 3 * 2 * 2 * 64 * 2
    assert any("brand_new" in n for n in data["notes"])
    assert err.startswith("kvbudget: warning:") and "brand_new" in err


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


BAD = {
    "missing file": (lambda t: ["estimate", str(t / "nope.json")], "no such file"),
    "not utf-8": (lambda t: ["estimate", _write(t, "bin.json", b"\xff\xfe\x00")], "UTF-8"),
    "invalid json": (lambda t: ["estimate", _write(t, "bad.json", "{\"model_type\": ")], "invalid JSON at line 1"),
    "not an object": (lambda t: ["estimate", _write(t, "list.json", "[1, 2]")], "JSON object"),
    "folder without config": (lambda t: ["estimate", str(t)], "no config.json"),
    "no model_type": (lambda t: ["estimate", _write(t, "nt.json", "{\"num_hidden_layers\": 2}")], "model_type"),
    "missing field": (lambda t: ["estimate", _write(t, "nf.json", json.dumps(
        {"model_type": "brand_new", "num_attention_heads": 8}))], "'num_hidden_layers'"),
    "bad field": (lambda t: ["estimate", _write(t, "bf.json", json.dumps(
        {"model_type": "llama", "num_hidden_layers": -2}))], "num_hidden_layers is -2; kvbudget takes 1 to 1,000"),
    "unknown layer type": (lambda t: ["estimate", _write(t, "lt.json", json.dumps(
        {"model_type": "x", "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8,
         "layer_types": ["weird"]}))], "'weird'"),
    "unknown model": (lambda t: ["estimate", "no-such-model"], "not a file, a folder, a catalog model"),
    "unknown engine": (lambda t: ["estimate", "llama-3.1-8b", "--engine", "tensorrt"], "unknown engine"),
    "unknown dtype": (lambda t: ["estimate", "llama-3.1-8b", "--kv-dtype", "fp6"], "--kv-dtype: invalid choice: 'fp6'"),
    "zero batch": (lambda t: ["estimate", "llama-3.1-8b", "--batch", "0"], "--batch"),
    "negative context": (lambda t: ["estimate", "llama-3.1-8b", "--context", "-5"], "--context"),
    "text context": (lambda t: ["estimate", "llama-3.1-8b", "--context", "long"], "--context"),
    "zero beams": (lambda t: ["estimate", "llama-3.1-8b", "--beams", "0"], "--beams"),
    "zero tp": (lambda t: ["estimate", "llama-3.1-8b", "--tp", "0"], "--tp"),
    "tp the engine rejects": (lambda t: ["estimate", "llama-3.1-8b", "--tp", "3"], "tensor parallel size 3"),
    "tp splitting state": (lambda t: ["estimate", "jamba-1.5-mini", "--tp", "3"], "tensor parallel size 3"),
    "unknown flag": (lambda t: ["estimate", "llama-3.1-8b", "--frobnicate"], "unrecognized arguments"),
    "zero kv memory": (lambda t: ["estimate", "llama-3.1-8b", "--kv-memory", "0"], "--kv-memory"),
    "unreadable kv memory": (lambda t: ["estimate", "llama-3.1-8b", "--kv-memory", "lots"], "--kv-memory"),
    "budget below one block": (lambda t: ["estimate", "llama-3.1-8b", "--engine", "vllm", "--kv-memory", "1MiB"],
                               "block"),
    "block size vllm rejects": (lambda t: ["estimate", "llama-3.1-8b", "--engine", "vllm", "--block-size", "24"],
                                "--block-size 24"),
    "zero max model len": (lambda t: ["estimate", "llama-3.1-8b", "--kv-memory", "1GiB", "--max-model-len", "0"],
                           "--max-model-len"),
    "tgi with mamba": (lambda t: ["estimate", "jamba-1.5-mini", "--engine", "tgi"], "recurrent"),
    "llamacpp dtype": (lambda t: ["estimate", "llama-3.1-8b", "--engine", "llamacpp", "--kv-dtype", "fp8"],
                       "llama.cpp cache types"),
    "vllm block dtype": (lambda t: ["estimate", "llama-3.1-8b", "--engine", "vllm", "--kv-dtype", "q4_0"],
                         "vLLM's KV cache dtypes"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, capsys):
    make_argv, expected = BAD[case]
    code = main(make_argv(tmp_path))
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("kvbudget: error: "), err
    assert expected in err
    assert "Traceback" not in err


def test_console_script_end_to_end():
    """The installed `kvbudget` entry point, as users run it (python -m for the same code)."""
    ok = subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "mistral-7b", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["bytes_per_token"] == 131_072
    bad = subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "mistral-7b", "--batch", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def _hub_cache(root: Path, repo: str, config: dict) -> None:
    """Lay out a Hugging Face hub cache entry the way huggingface_hub writes one."""
    base = root / ("models--" + repo.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(rev)
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))


def test_hub_id_from_the_cache_offline(tmp_path):
    cfg = {"model_type": "qwen3", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 32, "hidden_size": 64, "torch_dtype": "bfloat16"}
    _hub_cache(tmp_path, "acme/tiny-qwen", cfg)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    ok = subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "acme/tiny-qwen", "--json"],
                        capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["bytes_per_token"] == 2 * 2 * 1 * 32 * 2
    missing = subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "acme/not-cached"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "not in the local Hugging Face cache" in missing.stderr


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "usage: kvbudget" in out
    for command in ("estimate", "plan", "compare", "check-log", "tokens", "guard", "alerts", "models", "gpus"):
        assert command in out
