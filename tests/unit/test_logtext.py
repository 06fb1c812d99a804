"""A pasted log made plain (kvbudget.logtext), and check-log reading what users paste: prefixes, colours, folded
lines and Ray's deduplicated ranks, in bounded time whatever the input."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget import load_model
from kvbudget.checklog import check_log
from kvbudget.errors import KVBudgetError
from kvbudget.logtext import MAX_LINE_CHARS, MAX_REPEATS, clean

BUDGET = "INFO 12-05 10:00:01 [gpu_worker.py:460] Available KV cache memory: 10.55 GiB"


@pytest.mark.parametrize("pasted", [
    f"Dec 05 10:00:01 gpu-host vllm[123]: {BUDGET}",  # journald
    f"2026-12-05T10:00:01+0000 gpu-host vllm[123]: {BUDGET}",  # journald, ISO
    f"vllm-1  | {BUDGET}",  # docker compose
    f"2026-12-05T10:00:01.077546507+08:00 stdout F {BUDGET}",  # Kubernetes (CRI)
    f"(RayWorkerWrapper pid=123, ip=10.0.0.2) {BUDGET}",
    f"(EngineCore_DP0 pid=42) {BUDGET}", f"(VllmWorker rank=1 pid=42) {BUDGET}", f"(Worker_TP1 pid=7) {BUDGET}",
    f"\x1b[1;36m(VllmWorker TP0 pid=9)\x1b[0;0m {BUDGET}",  # colour codes
    f"[1;36m(VllmWorker TP0 pid=9)[0;0m {BUDGET}",  # colour codes whose escape bytes the paste lost
    f"`{BUDGET}`", f"> {BUDGET}", f"        {BUDGET}",  # Markdown backticks, a quote, indentation
    f"vllm-1  | (EngineCore_DP0 pid=42) {BUDGET}",  # a compose prefix before a Ray one
    f"2026-05-01 18:52:08.646 | (EngineCore pid=256) {BUDGET}",  # a log viewer's time column before a Ray one
    f"2025-12-05T12:00:00.123456789Z {BUDGET}",  # docker logs -t
    f"[pod/vllm-0/vllm] {BUDGET}",  # kubectl logs --prefix
])
def test_prefixes_and_colours_come_off(pasted):
    assert clean(pasted) == BUDGET + "\n"


def test_llama_cpp_timestamps_come_off():
    line = "llama_kv_cache: size =  182.75 MiB (  4352 cells,  43 layers,  1/1 seqs), K (bf16): 91.38 MiB"
    assert clean(f"[53871] 0.09.036.833 I {line}\n\x1b[34m1.14.609.487\x1b[0m \x1b[32mI \x1b[0m{line}") == \
        f"{line}\n{line}\n"


def test_a_folded_line_is_joined_back_and_records_are_not():
    """A tracker cut the refusal at 120 columns mid-word: the tail (no prefix, inside a word) joins its line; a
    record of its own after a long line (llama.cpp's `name: value`, a capital, a comment) does not."""
    head = ("(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), "
            "(4.26 GiB KV cach")
    text = clean(f"{head}\ne is needed, which is larger than the available KV cache memory (4.25 GiB).\n")
    assert "(4.26 GiB KV cache is needed, which is larger" in text and text.count("\n") == 1
    long = "x" * 70
    for record in ("llama_context: n_ctx = 4096", "INFO ready", "# [2025-07-09] note", "time=2025 level=INFO"):
        assert clean(f"{long}\n{record}") == f"{long}\n{record}\n"


@pytest.mark.parametrize("stamp", ["2025-12-05T12:00:00.123456789Z ", "2025-12-05 12:00:00,123 - vllm - INFO - ",
                                   "12:00:00 ", "05/12/2025 12:00:00 "])
def test_a_timestamped_line_is_never_the_folded_tail_of_the_line_before(stamp):
    """A line that starts with a date or a time (docker logs -t, Python's default logging format) is a record of its
    own, however long the line before and however it ends: two ranks' budget lines stay two."""
    blocks = "INFO 12-05 10:00:01 [gpu_executor.py:121] # GPU blocks: 7823, # CPU blocks: 512"
    for line in (f"{stamp}(Worker_TP0 pid=1) {BUDGET}", f"{stamp}{blocks}"):
        assert len(clean(f"{line}\n{line}").splitlines()) == 2  # before: one line, '... 512' + '2025-...'


def test_what_a_web_page_puts_in_a_log_is_made_plain():
    """No-break spaces, curly quotes and HTML entities, as a log copied from a web page or its source has them."""
    assert clean(BUDGET.replace(" 10.55", "\xa010.55")) == BUDGET + "\n"
    assert clean("the model\u2019s max seq len (4096)") == "the model's max seq len (4096)\n"
    assert clean("args: {&#39;model&#39;: &#39;/models/x&#39;}") == "args: {'model': '/models/x'}\n"


def test_ray_repeated_lines_count_as_the_ranks_they_stand_for():
    """Ray prints a line once and then '[repeated Nx across cluster]' for N more processes: a 4-rank budget log is
    4 ranks, and the smallest of the 4 is the budget (vLLM sizes every rank to the smallest)."""
    text = "\n".join([
        "INFO 12-05 10:00:01 [worker.py:267] Available KV cache memory: 8.11 GiB",
        "(RayWorkerWrapper pid=2, ip=10.0.0.2) INFO 12-05 10:00:01 [worker.py:267] Available KV cache memory: 8.02 GiB",
        "(RayWorkerWrapper pid=3, ip=10.0.0.3) INFO 12-05 10:00:01 [worker.py:267] Available KV cache memory: 8.02 GiB"
        " [repeated 2x across cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log "
        "deduplication.)",
        "INFO 12-05 10:00:02 [kv_cache_utils.py:524] GPU KV cache size: 175,120 tokens",
    ])
    assert clean(text).count("Available KV cache memory") == 4
    check = check_log(text, load_model("qwen3-235b-a22b"), {"tp": 4, "max_model_len": 40960})
    budget = check.rows[0]
    assert budget.logged == "8.02 GiB" and "smallest of 4 ranks" in budget.note


def test_a_ray_line_standing_for_too_many_ranks_is_refused():
    with pytest.raises(KVBudgetError, match=f"at most {MAX_REPEATS} ranks"):
        clean(f"{BUDGET} [repeated {MAX_REPEATS + 1}x across cluster]")


def test_lines_are_read_to_their_bound():
    assert len(clean("a" * (3 * MAX_LINE_CHARS))) == MAX_LINE_CHARS + 1


def test_a_megabyte_line_without_an_end_does_not_hang_check_log(tmp_path):
    """1 MB of one line that the readers' patterns half-match (a 'KV self size' line, then llama.cpp's init line
    without its types, Ray's opening parenthesis and a refusal's start over and over): check-log answers in one
    line, in seconds (before lines were bounded, a lazy pattern took minutes to hours on it)."""
    log = tmp_path / "one-line.log"
    log.write_text(("llama_new_context_with_model: KV self size  = 1.00 MiB, K (f16): 0.50 MiB, V (f16): 0.50 MiB "
                    + "llama_kv_cache_init: kv_size = 1, (pid=1 max seq len (1), (" * 20000)[:1_000_000])
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "kvbudget", "check-log", str(log), "--model", "llama-3.1-8b"],
                         capture_output=True, text=True, timeout=30)
    assert time.monotonic() - start < 20
    # a verdict (the cells the K part holds, 8 for Llama 3.1 8B, no whole 32-cell pad: exit 1) or the one line
    assert run.returncode in (1, 2) and run.stderr.count("\n") <= 1 and "Traceback" not in run.stderr


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=200), st.sampled_from([
    BUDGET, f"vllm-1  | {BUDGET}", "\x1b[31m", "[repeated 3x across cluster]", "e is needed", "x" * 80, "`",
    "(pid=1) "])), max_size=30))
def test_any_text_is_made_plain_within_its_bounds(parts):
    """Whatever is pasted, clean answers (or refuses a Ray line of too many ranks in one line), no line over its
    bound and no more lines than the input's, Ray's repeats apart."""
    text = "\n".join(parts)
    try:
        plain = clean(text)
    except KVBudgetError:
        return
    lines = plain.splitlines()
    assert all(len(line) <= MAX_LINE_CHARS for line in lines)
    assert len(lines) <= len(text.splitlines()) + 3 * text.count("[repeated 3x")


def test_a_time_column_is_no_folded_tail():
    """A log viewer's 'YYYY-MM-DD hh:mm:ss.fff | ' column starts each line with digits: the line is its own, not the
    tail of the 60-character banner line before it (the 0.20.0 MTP log of tests/data/logs/speculative)."""
    banner = "2026-05-01 18:50:31.934 | (APIServer pid=1) INFO 05-01 16:50:31 [utils.py:299]  version 0.20.0"
    args = "2026-05-01 18:50:31.937 | (APIServer pid=1) INFO 05-01 16:50:31 [utils.py:233] non-default args: {}"
    assert clean(f"{banner}\n{args}").splitlines() == [
        "INFO 05-01 16:50:31 [utils.py:299]  version 0.20.0", "INFO 05-01 16:50:31 [utils.py:233] non-default args: {}"]


def test_a_hard_wrapped_logfmt_record_is_joined_back():
    """Ollama logs through Go's log/slog TextHandler (`time=... level=INFO ... msg=offload k=v ...`); pasted hard-
    wrapped, each further line is an indented run of its pairs, joined back to the record. An indented line after
    a line that is no logfmt record stays its own."""
    text = ('time=2025-05-23T17:16:43.377Z level=INFO source=server.go:168 msg=offload layers.model=49\n'
            ' memory.required.kv="2.0 GiB" memory.required.partial="11.4 GiB"\n'
            '  key=value after a plain line\n')
    assert clean(text).splitlines() == [
        'time=2025-05-23T17:16:43.377Z level=INFO source=server.go:168 msg=offload layers.model=49 '
        'memory.required.kv="2.0 GiB" memory.required.partial="11.4 GiB" key=value after a plain line']
    assert clean("INFO plain line\n  key=value\n").splitlines() == ["INFO plain line", "key=value"]


def test_a_log_panes_box_is_taken_off_both_sides():
    """k9s and other terminal panes draw '│' on both sides of each line, padded to the pane's width (TGI#653)."""
    text = ("│ 2023-07-19T21:00:08.123161Z  INFO text_generation_launcher: Args { max_total_tokens: 2048, │\n"
            "│                                                                                      │\n")
    assert clean(text).splitlines() == ["INFO text_generation_launcher: Args { max_total_tokens: 2048,", ""]


def test_a_record_wrapped_at_a_comma_a_unit_or_a_colon_is_joined_back():
    """A tracker's hard wrap may fall after a comma (the tail starting with a capital: SGLang's 'K size: ...,' /
    ' V size: ...'), between a figure and its unit ('27.79' / 'GB, ...'), or after the colon before a figure
    ('Available KV cache memory:' / '20.50 GiB'); a header's colon before a line of its own stays apart."""
    pool = "[2025-06-01 10:00:00 TP0] KV Cache is allocated. #tokens: 485672, K size: 27.79 GB, V size: 27.79 GB"
    assert clean(pool.replace(" V size", "\n V size")).splitlines() == [pool]
    assert clean(pool.replace(" GB, V", "\nGB, V")).splitlines() == [pool]
    assert clean(f"{BUDGET[:-10]}\n10.55 GiB\n").splitlines() == [BUDGET]
    traceback = "ERROR 12-05 10:00:01 [core.py:700] EngineCore failed to start. Traceback (most recent call last):"
    assert clean(f"{traceback}\n  File \"core.py\", line 5, in run\n").splitlines() == [
        traceback, 'File "core.py", line 5, in run']


def test_a_logfmt_record_wrapped_without_indent_is_joined_back_and_a_new_record_is_not():
    text = ('time=2025-05-23T17:16:43.377Z level=INFO source=server.go:168 msg=offload layers.model=49\n'
            'memory.required.kv="2.0 GiB" memory.required.partial="11.4 GiB"\n'
            'time=2025-05-23T17:16:44.000Z level=INFO source=server.go:400 msg="starting llama server"\n')
    assert clean(text).splitlines() == [
        'time=2025-05-23T17:16:43.377Z level=INFO source=server.go:168 msg=offload layers.model=49 '
        'memory.required.kv="2.0 GiB" memory.required.partial="11.4 GiB"',
        'time=2025-05-23T17:16:44.000Z level=INFO source=server.go:400 msg="starting llama server"']


def test_a_line_cut_inside_its_parentheses_is_joined_back_and_a_closed_one_is_not():
    cut = "llama_kv_cache: size =  448.00 MiB (  8192 cells,  28 layers,  1/1 seqs), K (f16\n):  224.00 MiB\n"
    assert clean(cut) == cut.replace("\n)", ")")
    closed = "llama_kv_cache: size =  448.00 MiB (  8192 cells,  28 layers,  1/1 seqs), K (f16) is full\n) next\n"
    assert clean(closed) == closed


def test_torchruns_rank_prefix_comes_off():
    assert clean(f"[rank0]: {BUDGET}\n[default3]:{BUDGET}\n").splitlines() == [BUDGET, BUDGET]


@pytest.mark.parametrize("month", ["дек 05", "déc. 05", "12月 05", "Dez 05", "Dec  5"])
def test_journald_months_in_any_locale_come_off(month):
    assert clean(f"{month} 10:00:01 gpu-host vllm[123]: {BUDGET}") == BUDGET + "\n"
