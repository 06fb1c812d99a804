"""check-log on figures a paste garbled ('1.2.3', a 0 where an engine never prints one): one line saying what the
log reads, never a traceback (found by mutating the unseen logs' figures)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from kvbudget.cli import main

BUDGET = "INFO 01-01 00:00:00 [gpu_worker.py:1] Available KV cache memory: {} GiB\n"
CASES = [
    (BUDGET.format("1.2.3"), "llama-3.1-8b", "KV budget reads '1.2.3'"),
    (BUDGET.format("1.2.3"), None, "KV budget reads '1.2.3'"),
    ("INFO GPU KV cache size: 100 tokens\nINFO Maximum concurrency for 0 tokens per request: 2.00x\n", None, None),
    ("INFO Maximum concurrency for 4,096 tokens per request: 1.2.3x\nINFO GPU KV cache size: 100 tokens\n", None,
     "concurrency reads '1.2.3'"),
    (BUDGET.format("10.00") + "INFO non-default args: {'max_model_len': 0}\n", "llama-3.1-8b", "max_model_len reads 0"),
    (BUDGET.format("10.00") + "INFO Model loading took 0.0 GiB\nmax_model_len=4096\n", "llama-3.1-8b", None),
    ("INFO worker.py:1] Memory profiling results: total_gpu_memory (1.2.3GiB) x gpu_memory_utilization (0.90) = "
     "71.29GiB\n" + BUDGET.format("10.00"), None, "memory figure reads '1.2.3'"),
    ("[TP0] KV Cache is allocated. #tokens: 100, K size: 1.2.3 GB, V size: 1.00 GB\n", "llama-3.1-8b",
     "buffer size reads '1.2.3'"),
    ("llama_kv_cache: size = 1.2.3 MiB (  4096 cells,  32 layers,  1/1 seqs), K (f16):  256.00 MiB, V (f16):  "
     "256.00 MiB\n", None, "size reads '1.2.3'"),
]


@pytest.mark.parametrize("text, model, said", CASES)
def test_garbled_figures_are_one_line(text, model, said, tmp_path: Path):
    path = tmp_path / "pasted.log"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["check-log", str(path), *(["--model", model] if model else [])])
    assert status in (0, 1, 2)
    lines = [x for x in err.getvalue().splitlines() if "warning" not in x]
    assert len(lines) <= 1, err.getvalue()
    if said:
        assert status == 2 and said in err.getvalue()
