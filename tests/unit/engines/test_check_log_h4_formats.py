"""check-log on the formats of the fourth held-out batch's logs not read when it was measured (tests/data/logs/
unseen/h4-*, looked at since: dev material now), each read as its engine's source prints it. Expected figures are
worked out here from the lines themselves and the engines' sources named beside each test."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from kvbudget.cli import main

UNSEEN = Path(__file__).parents[2] / "data" / "logs" / "unseen"


def run(name_or_text: str, *args: str, tmp_path: Path | None = None) -> tuple[int, dict, str]:
    """check-log --json on an unseen log by name (or on text written to tmp_path): exit status, JSON, stderr."""
    path = UNSEEN / name_or_text
    if tmp_path is not None:
        path = tmp_path / "pasted.log"
        path.write_text(name_or_text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["check-log", str(path), "--json", *args])
    return status, json.loads(out.getvalue()) if out.getvalue().startswith("{") else {}, err.getvalue().strip()


def rows(result: dict) -> dict[str, tuple[str, str, bool | None]]:
    return {r["quantity"]: (r["logged"], r["predicted"], r["matches"]) for r in result["rows"]}


def partial(name: str) -> dict[str, tuple[str, str, bool | None]]:
    """The rows of a log read without its model (a partial check naming the --model to pass)."""
    status, result, err = run(name)
    assert status == 2 and result["partial"] and "--model" in err and err.count("\n") == 0, err
    return rows(result)


# llama.cpp's context lines alone, the log cut before any cache size line (src/llama-context.cpp)

def test_llamacpp_n_ctx_per_seq_under_journald_is_n_ctx_over_the_sequences():
    # b5000-b6800: n_ctx_per_seq = n_ctx / n_seq_max; the log: n_seq_max 4, n_ctx 8192, n_ctx_per_seq 2048
    found = partial("h4-ollama-issue-7323-journal-n-seq-max-4-ctx.log")
    assert found["n_ctx, n_seq_max"][0] == "8,192, 4"
    assert found["n_ctx_per_seq"] == ("2,048", f"{8192 // 4:,}", True)


def test_llamacpp_n_ctx_seq_with_pid_prefix_is_the_unified_context():
    # #16812 on: kv_unified gives n_ctx_seq = n_ctx; else pad(262144 / 6, 256) = 43,776: the log's 262,144 is unified
    found = partial("h4-llamacpp-pr-22493-pid-prefix-n-seq-max-6-cut.log")
    logged, ours, ok = found["n_ctx_seq"]
    assert logged == "262,144" and "43,776" in ours and ok


def test_llamacpp_n_ctx_seq_that_neither_rule_gives_is_flagged(tmp_path):
    text = ("llama_context: n_seq_max     = 4\nllama_context: n_ctx         = 8192\n"
            "llama_context: n_ctx_seq     = 4096\nllama_context: kv_unified    = false\n")
    status, result, _ = run(text, tmp_path=tmp_path)
    found = rows(result)
    assert status == 1 and found["n_ctx_seq"] == ("4,096", "2,048", False)  # pad(8192 / 4, 256): a mismatch fails
    assert found["n_ctx = n_ctx_seq x n_seq_max"] == ("8,192", "16,384", False)


def test_llamacpp_old_n_ctx_alone_is_shown_and_checked_against_the_models_context():
    found = partial("h4-iklamacpp-pr-237-mla-n-ctx-163840-layers-cut.log")
    assert found["n_ctx (cells of the one cache)"][0] == "163,840"
    status, result, _ = run("h4-llamacpp-issue-10188-llama-3.2-3b-n-ctx-131072-cut.log", "--model", "llama-3.2-3b")
    assert status == 0  # Llama 3.2 3B's max_position_embeddings: 131,072 (its config.json)
    assert rows(result)["n_ctx within the model's context"] == ("131,072", "<= 131,072", True)


def test_llamacpp_n_ctx_past_the_models_context_fails(tmp_path):
    text = "llama_new_context_with_model: n_ctx      = 262144\nllama_new_context_with_model: n_batch    = 2048\n"
    status, result, _ = run(text, "--model", "llama-3.2-3b", tmp_path=tmp_path)
    assert status == 1 and rows(result)["n_ctx within the model's context"][2] is False


# llama.cpp 2025 (b4500-b5400): llama_init_from_model's 'KV self size' under the elapsed-time prefix

def test_llamacpp_init_from_model_kv_self_size_with_elapsed_time_prefix():
    found = partial("h4-llamacpp-gpustack-1231-timestamped-kv-self-4-slots.log")
    assert found["KV self size"] == ("2048.00 MiB", "2048.00 MiB", True)  # K 1024 + V 1024


def test_llamacpp_kv_self_size_without_n_ctx_is_checked_by_the_cells_its_k_part_holds():
    # Qwen2.5-7B: 28 layers x 4 KV heads x 128 = 512 values a layer, f16: K of 512 cells = 28 x 512 x 2 x 512 bytes
    status, result, _ = run("h4-llamacpp-python-1943-qwen2.5-coder-7b-kv-self.log", "--model", "qwen2.5-7b")
    found = rows(result)
    assert status == 0 and 28 * 512 * 2 * 512 == 14 * 2**20
    assert found["cells (from the K part)"] == ("-", "512", True)
    assert found["n_embd_k_gqa / n_embd_v_gqa"] == ("512/512", "512/512", True)
    assert found["KV self size (f16)"] == ("28.00 MiB", "28.00 MiB", True)
    assert "n_ctx" in result["assumed"] and "n_ctx" not in result["settings"]
    # Llama 3.2 3B's layers are 8 KV heads x 128 wide: the widths differ, the check fails
    status, result, _ = run("h4-llamacpp-python-1943-qwen2.5-coder-7b-kv-self.log", "--model", "llama-3.2-3b")
    assert status == 1 and rows(result)["n_embd_k_gqa / n_embd_v_gqa"] == ("512/512", "1024/1024", False)


def test_llamacpp_kv_self_size_that_no_padded_cell_count_gives_fails(tmp_path):
    # 14.05 MiB / (28 x 512 x 2 bytes a cell) = 513.8: 514 cells, not a whole number of 32-cell pads
    text = "llama_init_from_model: KV self size  =   28.10 MiB, K (f16):   14.05 MiB, V (f16):   14.05 MiB\n"
    status, result, _ = run(text, "--model", "qwen2.5-7b", tmp_path=tmp_path)
    assert status == 1 and rows(result)["cells (from the K part)"] == ("-", "514", False)
    text = text.replace("14.05 MiB", "0.01 MiB").replace("28.10", "0.02")  # under one cell: none to derive
    status, result, err = run(text, "--model", "qwen2.5-7b", tmp_path=tmp_path)
    assert status == 2 and result["partial"] and "n_ctx =" in err and err.count("\n") == 0


# Ollama's offload line (llm/server.go, slog.Info("offload", ...)) hard-wrapped with indented continuations

def test_ollama_offload_line_hard_wrapped_is_read():
    found = partial("h4-ollama-issue-8430-offload-line-wrapped.log")
    assert found["Ollama: memory.required.kv"][0] == "2.0 GiB"
    assert found["Ollama: GPU allocations added"] == ("11.4 GiB", "11.4 GiB", True)  # [11.4 GiB 0 B]


# vLLM V0 (vllm/worker/worker.py 0.6.4-0.7, determine_num_available_blocks): the profiling results' share line,
# one line each under a worker's '(VllmWorkerProcess pid=...)' prefix, cut before the KV figure

def test_vllm_worker_profiling_share_line_cut_before_the_budget_is_read():
    found = partial("h4-vllm-issue-11550-v0-worker-profiling-cut.log")
    logged, ours, ok = found["memory: the engine's share"]
    assert logged == "21.19 GiB" and ours == f"{23.55 * 0.90:,.2f}" and ok  # 21.195: vLLM rounds to 21.19


# vLLM 0.2-0.6 (vllm/engine/llm_engine.py): the engine's config line alone, the blocks line cut ('# GPU bloc') after
# a terminal's arrow-key debris ('^[[B')

def test_vllm_engine_config_line_alone_checks_its_settings_against_a_model():
    status, _, err = run("h4-vllm-xinference-1115-internlm-20b-blocks-cut-arrow-keys.log")
    assert status == 2 and "internlm-chat-20b" in err and "--model" in err and err.count("\n") == 0
    status, result, _ = run("h4-vllm-xinference-1115-internlm-20b-blocks-cut-arrow-keys.log", "--model",
                            "llama-2-13b")  # a model of 4,096 positions and 40 heads: the line's 4096 and tp 1 fit
    found = rows(result)
    assert status == 0 and found["max_model_len within the model's context"] == ("4,096", "<= 4,096", True)
    assert found["tensor parallel size fits the heads"][2] is True


# vLLM V1 (v1/core/kv_cache_utils.py): 'Maximum concurrency for N tokens per request: Cx' quoted alone in prose

def test_vllm_concurrency_line_alone_shows_the_pool_it_implies():
    found = partial("h4-vllm-miaai-122-concurrency-line-quoted-in-prose.log")
    logged, ours, ok = found["max concurrency at 262,144 tokens"]
    assert logged == "1.36x" and ours == f"about {round(1.36 * 262144):,} tokens" and ok is None  # 356,516


# SGLang (python/sglang/srt/managers/scheduler.py): 'max_total_num_tokens=N, chunked_prefill_size=...' quoted as a
# fragment in Markdown bullets, three runs' values in one paste

def test_sglang_max_total_num_tokens_fragments_are_read_and_say_there_are_several():
    found = partial("h4-sglang-pr-28620-dsv4-flash-l20-token-pool-prose.log")
    assert found["max_total_num_tokens"][0] == "73,472"
    status, result, _ = run("h4-sglang-pr-28620-dsv4-flash-l20-token-pool-prose.log")
    note = result["rows"][0]["note"]
    assert "3 values" in note and "120,576" in note and "2,413,824" in note


# SGLang (model_runner.py load_model): 'Load weight end. ... avail mem=X GB' on each rank, cut before the pool line

def test_sglang_log_cut_before_its_pool_says_to_pass_the_log_up_to_the_pool_line():
    for args in ((), ("--model", "llama-3.1-8b")):  # a model checks nothing more here: the same one line
        status, _, err = run("h4-sglang-issue-40558-sm120-kv-budget-reserve-cut.log", *args)
        assert status == 2 and "stops before the pool" in err and "KV Cache is allocated" in err
        assert err.count("\n") == 0 and "found no KV cache lines" not in err


# llama.cpp's recurrent state refused (src/llama-memory-recurrent.cpp: "failed to allocate buffer for rs cache"),
# as LM Studio shows it: no size, no n_seq_max

def test_rs_cache_refusal_alone_says_what_to_pass():
    for args in ((), ("--model", "llama-3.1-8b")):
        status, _, err = run("h4-lmstudio-2321-rs-cache-alloc-refusal.log", *args)
        assert status == 2 and "recurrent state" in err and "n_seq_max" in err and "-np" in err
        assert err.count("\n") == 0 and "found no KV cache lines" not in err


# TGI (launcher/src/main.rs, 1.0): the Args line boxed by k9s's pane and cut at its width before any limit

def test_tgi_boxed_args_cut_before_its_limits_says_what_to_pass():
    status, _, err = run("h4-tgi-issue-653-k9s-box-args-cut.log", "--model", "llama-2-7b")
    assert status == 2 and "nothing to check" in err and "--max-total-tokens" in err and err.count("\n") == 0


def test_llamacpp_context_values_no_build_prints_are_one_line_errors(tmp_path):
    # llama.cpp holds n_ctx, n_seq_max and the cells in uint32_t and clamps n_seq_max to at least 1
    for text in ("llama_context: n_seq_max     = 0\nllama_context: n_ctx         = 4096\n",
                 "llama_context: n_seq_max     = 1\nllama_context: n_ctx         = 99999999999\n",
                 "llama_init_from_model: KV self size  = 99999999999999999999.00 MiB, K (f16): "
                 "49999999999999999999.00 MiB, V (f16): 49999999999999999999.00 MiB\n"):
        status, _, err = run(text, "--model", "qwen2.5-7b", tmp_path=tmp_path)
        assert status == 2 and "out of range" in err and "4,294,967,295" in err and err.count("\n") == 0
