"""A new user's first answers (issue 15): output that fits 80 columns with every number whole, numbers coloured as
one token, tensor parallel sizes that the model can take, context lengths as people write them."""

from __future__ import annotations

import json
import re

import pytest

from kvbudget.cli import main

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run80(monkeypatch, capsys, argv: list[str]) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["compare", "llama-3.1-8b", "gemma-2-9b", "qwen3-next-80b-a3b", "--context", "32k", "--gpu", "H100-80GB"],
    ["plan", "qwen3-8b", "--gpu", "RTX-4090"],
    ["plan", "deepseek-v3", "--gpu", "H200", "--tp", "8"],
    ["estimate", "gemma-2-9b", "--engine", "vllm", "--context", "1k,8k", "--batch", "1,64"],
    ["models"],
    ["gpus"],
])
def test_every_line_fits_80_columns_and_no_number_is_cut(monkeypatch, capsys, argv):
    out = run80(monkeypatch, capsys, argv)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # nothing cut with an ellipsis
    # every number that the JSON answer holds as a table figure appears whole: no '131,07' + '2' on the next line
    for broken in re.findall(r"\d[\d,]*\.?\d*\s*\n\s*\d", out):
        assert "," not in broken.split("\n")[0][-2:], broken


def test_compare_keeps_its_figures_whole_at_80_columns(monkeypatch, capsys):
    out = run80(monkeypatch, capsys, ["compare", "llama-3.1-8b", "gemma-2-9b", "--context", "32k", "--gpu",
                                      "H100-80GB"])
    for figure in ("128.00 KiB", "336.00 KiB", "4.00 GiB", "54.80 GiB", "13.70x", "131,072", "8,192"):
        assert figure in out, figure
    assert "gemma-2-9b is trained for 8,192 tokens" in out


def test_compare_takes_the_tensor_parallel_size_it_suggests(capsys):
    assert main(["compare", "llama-3.1-8b", "qwen3-8b", "--tp", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["bytes_per_token"] == 32 * 2 * 4 * 128 * 2  # 8 KV heads over 2 ranks


def test_numbers_are_not_highlighted_digit_group_by_digit_group(monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["estimate", "llama-3.1-8b", "--context", "128k"]) == 0
    raw = capsys.readouterr().out
    assert "131,072" in raw and "1\x1b" not in raw.split("131,072")[0][-3:]
    assert "131,072 bytes" in ANSI.sub("", raw)


@pytest.mark.parametrize(("argv", "expected"), [
    (["estimate", "llama-3.1-8b", "--engine", "hf", "--tp", "1000"], "does not divide llama-3.1-8b's 32 attention"),
    (["plan", "llama-3.1-8b", "--gpu", "L4", "--tp", "3"], "nearest that does: 2"),
])
def test_tensor_parallel_sizes_the_model_cannot_take_are_refused(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err


def test_a_million_token_context_as_written(capsys):
    assert main(["estimate", "llama-3.1-8b", "--context", "1M,1.5k", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["context"] for p in data["points"]} == {1_048_576, 1536}


def test_files_are_written_readable_and_said(tmp_path, capsys):
    """Prometheus reads alert rules as another user: files get 0666 less the umask (0644 under umask 022), never
    mkstemp's 0600, and each one written is named on stderr."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        guard_yaml = tmp_path / "guard.yaml"
        assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--guard-config", str(guard_yaml)]) == 0
        assert main(["alerts", "--out", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    err = capsys.readouterr().err
    assert f"wrote {guard_yaml}" in err
    written = [p for p in tmp_path.iterdir()]
    assert len(written) >= 3
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_gpu_data_says_what_software_sees(monkeypatch, capsys):
    """T4 and V100 have fp16 tensor cores but no bf16; an MI250X is two GCDs of 64 GB that ROCm shows as two GPUs."""
    from kvbudget.gpus import find_gpu

    t4, v100, gcd = find_gpu("T4"), find_gpu("V100-32GB"), find_gpu("mi250x")
    assert (t4.bf16_tflops, t4.half_tflops, v100.bf16_tflops, v100.half_tflops) == (None, 65, None, 125)
    assert gcd.name == "MI250X-GCD" and gcd.memory_bytes == 64 * 2**30
    out = run80(monkeypatch, capsys, ["gpus"])
    assert "65†" in out and "† fp16 (no bf16 on this GPU)" in out and "MI250X-GCD" in out


def test_a_bad_line_in_a_request_log_is_counted_and_skipped(tmp_path, capsys):
    log = tmp_path / "requests.jsonl"
    log.write_text('{"messages":[{"role":"user","content":"hello there"}],"max_tokens":5}\nnot json\n{"foo":1}\n'
                   '{"messages":[{"role":"user","content":"second one"}]}\n')
    assert main(["tokens", "--approximate", "x", str(log), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 2 and stats["skipped_lines"] == 2
    assert [s["line"] for s in stats["skipped"]] == [2, 3] and "invalid JSON" in stats["skipped"][0]["why"]
    assert main(["tokens", "--approximate", "x", str(log)]) == 0
    assert "skipped 2 line(s)" in capsys.readouterr().out


def test_loading_a_tokenizer_is_announced_on_a_terminal(offline, capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    main(["tokens", "meta-llama/Llama-3.1-8B-Instruct", "/usr/share/common-licenses/Apache-2.0"])
    assert "loading the tokenizer of meta-llama/Llama-3.1-8B-Instruct" in capsys.readouterr().err



def test_huge_inputs_are_refused_or_printed_readably(capsys):
    from kvbudget.units import format_bytes

    assert format_bytes(3 * 2**60) == "3.00 EiB" and format_bytes(5 * 2**50) == "5.00 PiB"
    assert main(["estimate", "llama-3.1-8b", "--context", "2048M"]) == 2
    assert "beyond any deployment" in capsys.readouterr().err
    assert main(["estimate", "llama-3.1-405b", "--batch", "16000000", "--context", "1M"]) == 0
    out = capsys.readouterr().out
    assert "16,000,000" in out and "7.51 EiB" in out
    assert not re.search(r"\d{1,3}(,\d{3}){2,}\.\d\d [KMGTPE]iB", out)  # no 119,209,289,550.78 TiB


def test_transformers_plans_offer_no_tensor_parallelism_and_report_slots(monkeypatch, capsys):
    """kvbudget runs transformers on one device: no --tp advice, and no 'KV cache size as hf reports it'
    (transformers reports nothing): the physical token slots."""
    assert main(["plan", "qwen3-8b", "--engine", "hf", "--gpu", "L4", "--json"]) == 0
    recs = json.loads(capsys.readouterr().out)["recommendations"]
    assert not [r for r in recs if "tp" in r["parameters"]]
    out = run80(monkeypatch, capsys, ["plan", "qwen3-8b", "--engine", "hf", "--gpu", "L4"])
    assert "physical token slots" in out and "as hf reports it" not in out


def test_llamacpp_capacity_counts_whole_slots(capsys):
    """llama-server allocates -np whole slots up front: 1.99 slots' worth of memory serves 1 (issue 15: 1.43x
    with -np 1, and a slot that 'fills this budget' while using 5.6 of 8.05 GiB). By hand: the RTX 4090's 23.55 GiB
    as torch reports it, less 14.96 GiB of weights, 0.14 of compute buffer and 0.50 of overhead, leaves 7.95 GiB;
    a slot of 32,768 cells at 128 KiB a cell is 4 GiB."""
    assert main(["plan", "llama-3.1-8b", "--engine", "llamacpp", "--gpu", "RTX-4090", "--max-model-len", "32k",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    cap = plan["capacity"]
    assert cap["max_concurrency"] == int(cap["max_concurrency"]) == 1
    assert any("-np 1 -c 32768" in n and "takes 4.00 GiB of this 7.95 GiB" in n for n in plan["notes"])


def test_the_window_note_only_where_there_are_windows(capsys):
    assert main(["estimate", "llama-3.1-8b", "--engine", "vllm", "--json"]) == 0
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "sliding" in n]
    assert main(["estimate", "gemma-2-9b", "--engine", "vllm", "--json"]) == 0
    assert [n for n in json.loads(capsys.readouterr().out)["notes"] if "sliding" in n]


def test_check_log_fits_80_columns(monkeypatch, capsys):
    from pathlib import Path

    log = Path(__file__).parents[1] / "data" / "logs" / "vllm-0.24-aws-samples-qwen3-coder-30b-tp4-l40s.log"
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["check-log", str(log), "--model", "qwen3-30b-a3b", "--engine-version", "0.24"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out and "1,037,152" in out
