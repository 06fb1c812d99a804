"""What a new user meets in the first hour: tables that keep names and numbers whole, options anywhere, errors
before heavy work, one default engine, advice cheapest first, exit codes for CI, bundled traces by name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget import catalog
from kvbudget.cli import main
from kvbudget.gpus import gpus
from kvbudget.traces import bundled

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], capsys, columns: int = 80) -> tuple[int, str, str]:
    os.environ["COLUMNS"] = str(columns)
    try:
        code = main(args)
    finally:
        del os.environ["COLUMNS"]
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("columns", [60, 70, 80, 100])
def test_models_table_never_cuts_a_name_or_a_number(columns, capsys):
    code, out, _ = run_cli(["models"], capsys, columns)
    assert code == 0
    cells = {word for line in out.splitlines() for word in line.split()}
    for entry in catalog.entries():
        assert entry.name in cells, (columns, entry.name)
    assert all(len(line) <= columns for line in out.splitlines())
    assert "…" not in out


@pytest.mark.parametrize("columns", [60, 70, 80])
def test_gpus_table_never_cuts_a_number(columns, capsys):
    code, out, _ = run_cli(["gpus"], capsys, columns)
    assert code == 0
    cells = {word.rstrip("*†") for line in out.splitlines() for word in line.split()}
    for g in gpus():
        assert g.name in cells
        assert f"{g.bandwidth_bytes_per_s / 1e9:,.0f}" in cells if g.bandwidth_bytes_per_s else True
        if g.fp8_tflops:
            assert f"{g.fp8_tflops:g}" in cells, (columns, g.name)
    assert "…" not in out


def test_options_may_come_among_positional_files(tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("Every layer caches K and V for every token.\n")
    before = run_cli(["tokens", "llama-3.1-8b", "--approximate", "--json", str(doc)], capsys)
    after = run_cli(["tokens", "llama-3.1-8b", str(doc), "--approximate", "--json"], capsys)
    assert before[0] == after[0] == 0 and json.loads(before[1]) == json.loads(after[1])


def test_tokens_takes_the_bundled_test_model_by_the_name_quality_takes():
    from kvbudget.tokens import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    assert tok("Hello world")["input_ids"]  # SmolLM2's own tokenizer, from the GGUF


def cli_error(command: str, args: list[str]) -> tuple[int, str, list[str]]:
    """`kvbudget COMMAND ARGS` in a fresh interpreter: exit status, stderr, and which heavy modules it loaded."""
    code = ("import sys\nfrom kvbudget.cli import main\ncode = main(sys.argv[1:])\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, command, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr.strip(), json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


def quality_error(args: list[str]) -> tuple[int, str, list[str]]:
    return cli_error("quality", args)


def test_tokens_refuses_a_missing_file_before_the_tokenizer_loads(tmp_path):
    for args in (["smollm2-135m-instruct", str(tmp_path / "none.txt")],
                 ["smollm2-135m-instruct", str(tmp_path), "--engine", "vlm"],
                 ["smollm2-135m-instruct", "--system", f"@{tmp_path / 'none.txt'}", str(tmp_path)]):
        code, err, loaded = cli_error("tokens", args)
        assert code == 2 and loaded == [] and err.startswith("kvbudget: error:") and err.count("\n") == 0, err
    code, err, loaded = cli_error("plan", ["llama-3.1-8b", "--gpu", "L4", "--prompt-file", str(tmp_path / "p.txt")])
    assert code == 2 and loaded == [] and "p.txt: cannot read it" in err
    log = str(tmp_path / "r.jsonl")
    code, err, loaded = cli_error("simulate", ["llama-3.1-8b", "--gpu", "L4", "--request-log", log])
    assert code == 2 and loaded == [] and "r.jsonl: cannot read it" in err


def test_quality_refuses_bad_arguments_before_torch_loads(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("some text\n")
    code, err, loaded = quality_error(["smollm2-135m-instruct", "--data", str(data), "--kv-dtype", "q8_0,q4_0"])
    assert code == 2 and loaded == []
    assert err.count("\n") == 0 and "separate formats with spaces (q8_0 q4_0)" in err
    for args, says in ((["smollm2-135m-instruct", "--data", str(tmp_path / "none.txt")], "--data"),
                       (["smollm2-135m-instruct", "--data", str(data), "--kv-dtype", "q9_0"], "--kv-dtype 'q9_0'"),
                       (["smollm2-135m-instruct", "--data", str(data), "--engine", "vlm"], "vlm"),
                       (["smollm2-135m-instruct", "--data", str(data), "--gpu", "H1000"], "H1000"),
                       (["no/such-folder", "--data", str(data)], "no/such-folder"),
                       (["smollm2-135m-instruct", "--data", str(data), "--windows", "0"], "--windows")):
        code, err, loaded = quality_error(args)
        assert code == 2 and loaded == [] and says in err and err.startswith("kvbudget: error:"), (args, err)


def test_a_config_without_a_dimension_it_needs_is_an_error_naming_it(tmp_path, capsys):
    config = json.loads((REPO / "src/kvbudget/data/models" / catalog.find("qwen2.5-32b").file).read_text())
    del config["num_attention_heads"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run_cli(["estimate", str(path)], capsys)
    assert code == 2 and out == "" and "'num_attention_heads'" in err and err.count("\n") == 1


def test_a_checkpoint_that_relies_on_its_class_default_still_loads_and_says_so():
    from kvbudget.model.load import load_model

    spec = load_model("gemma-3-4b")  # Google's config states no num_attention_heads: Gemma3TextConfig's 8
    assert any("num_attention_heads=8" in w for w in spec.warnings)


def test_alerts_creates_its_folder_and_says_wrote_once_per_file(tmp_path, capsys):
    out_dir = tmp_path / "rules" / "kvbudget"
    code, out, err = run_cli(["alerts", "--engine", "vllm", "--out", str(out_dir)], capsys)
    assert code == 0 and sorted(p.name for p in out_dir.iterdir()) == ["kvbudget-alerts.yaml",
                                                                       "kvbudget-dashboard.json"]
    assert (out + err).count("wrote") == 2 and out == ""
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(["alerts", "--out", str(tmp_path / "file")], capsys)
    assert code == 2 and "a file, not a folder" in err


def test_every_command_defaults_to_vllm(capsys):
    from kvbudget.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    defaults = {name: p.get_default("engine") for name, p in sub.items() if p.get_default("engine") is not None}
    assert set(defaults) >= {"estimate", "plan", "compare", "simulate", "tokens"}
    assert set(defaults.values()) == {"vllm"}, defaults
    code, out, _ = run_cli(["estimate", "mistral-7b", "--json"], capsys)
    assert json.loads(out)["engine"] == "vllm"
    code, out, _ = run_cli(["estimate", "mistral-7b", "--engine", "hf", "--json"], capsys)
    assert json.loads(out)["engine"] == "hf"


def test_plan_advice_when_it_fits_puts_free_settings_before_hardware():
    from kvbudget.model.load import load_model
    from kvbudget.planner import plan

    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB")
    assert p.fits
    recs = p.recommendations
    first_hardware = next(i for i, r in enumerate(recs) if r.more_gpus or "gpu" in r.parameters)
    assert recs[0].parameters == {"kv_dtype": "fp8"} and recs[0].cost == "no new hardware"
    assert all(r.cost == "no new hardware" for r in recs[:first_hardware])
    tps = [r for r in recs if "tp" in r.parameters]
    assert [r.more_gpus for r in tps] == [1, 3] and [r.cost for r in tps] == ["1 more GPU", "3 more GPUs"]
    assert recs.index(tps[0]) < recs.index(tps[1])


def test_plan_check_exits_1_when_it_does_not_fit(capsys):
    assert run_cli(["plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--check"], capsys)[0] == 0
    assert run_cli(["plan", "qwen3-8b", "--gpu", "RTX-4090", "--check"], capsys)[0] == 1  # vLLM would refuse it
    assert run_cli(["plan", "llama-3.1-70b", "--gpu", "L4", "--check"], capsys)[0] == 1  # no KV budget at all
    assert run_cli(["plan", "llama-3.1-70b", "--gpu", "L4"], capsys)[0] == 0  # without --check: an answer


def test_degradation_plan_counts_whole_requests(capsys):
    from kvbudget.model.load import load_model
    from kvbudget.planner import plan

    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB")
    assert [lv.requests for lv in p.levels] == [int(p.capacity.max_concurrency * f) for f in (0.7, 0.85, 0.95)]
    assert all(isinstance(lv.requests, int) for lv in p.levels)
    _, out, _ = run_cli(["plan", "llama-3.1-8b", "--gpu", "H100-80GB"], capsys, 120)
    table = out[out.index("Degradation plan"):]
    assert not re.search(r"\b\d+\.\d\d\s+(log|force|reject)", table)


def test_a_hub_id_read_from_the_catalog_says_so_on_stderr(capsys):
    code, out, err = run_cli(["estimate", "meta-llama/Llama-3.1-8B", "--json"], capsys)
    assert code == 0 and json.loads(out)["model"] == "llama-3.1-8b"
    assert err.count("bundled catalog copy") == 1
    run_cli(["estimate", "llama-3.1-8b", "--json"], capsys)
    assert "bundled catalog copy" not in capsys.readouterr().err


def test_bundled_traces_by_name_with_their_credit(capsys):
    code, out, _ = run_cli(["traces", "--json"], capsys)
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["azure-conv-2023", "azure-code-2023", "mooncake-conv"]
    assert all(Path(r["path"]).is_file() and r["credit"] and r["licence"] for r in rows)
    code, out, _ = run_cli(["simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--trace", "mooncake-conv",
                            "--slice", "0:50", "--json"], capsys)
    assert code == 0 and json.loads(out)["requests"] == 50
    code, out, _ = run_cli(["simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--trace", "azure-code-2023",
                            "--slice", "0:20"], capsys, 120)
    assert code == 0 and "Azure LLM inference trace 2023, Microsoft Azure Public Dataset (CC-BY-4.0)" in out
    code, _, err = run_cli(["simulate", "llama-3.1-8b", "--trace", "azure-conv-2024"], capsys)
    assert code == 2 and "no bundled trace of that name (bundled: azure-conv-2023" in err


def test_nothing_in_the_repository_reads_outside_it():
    pattern = re.compile(r"""\.\./shared|parents\[\d\]\s*/\s*["']shared["']""")
    offenders = [f"{p.relative_to(REPO)}:{n}" for top in ("src", "tests", "benchmarks", "scripts", ".ci", "docs")
                 for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in (".py", ".sh", "", ".md", ".yml")
                 for n, line in enumerate(p.read_text(errors="ignore").splitlines(), 1)
                 if pattern.search(line) and p.name != "test_first_hour.py"]
    assert offenders == []
    assert len(bundled()) == 3
