"""check-log on the format of the eleventh held-out batch's one log not read when it was measured (tests/data/logs/
unseen/h11-*, looked at since: dev material now), read as its engine's source prints it, with variants written
here. Expected figures are worked out from the lines themselves and the source named beside each test."""

from __future__ import annotations

from pathlib import Path

from tests.unit.engines.test_check_log_h4_formats import partial, rows, run

# HabanaAI's vllm-fork (vllm/worker/hpu_worker.py, determine_num_available_blocks): "Free device memory: %s, %s usable
# (gpu_memory_utilization=%s), %s reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=%s), %s reserved for KV cache",
# each size by format_bytes (four significant figures); the KV cache is the usable share less the graphs' reserve.
_GAUDI = ("INFO 11-03 21:23:14 hpu_worker.py:170] Free device memory: {free} GiB, {usable} GiB usable "
          "(gpu_memory_utilization=0.9), {graphs} GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.1), "
          "{kv} GiB reserved for KV cache\n")


def test_gaudi_fork_budget_line_is_the_kv_budget():
    # the tutorial notebook's grep of a Gaudi 2 server log: 74.25 free x 0.9 = 66.83 usable, 0.4 of it for the graphs
    status, result, err = run("h11-vllm-gaudi-tutorials-understanding-vllm-llama-3.1-8b-grep-free-device-memory.log",
                              "--model", "llama-3.1-8b")
    assert status == 0, err
    assert rows(result)["KV budget"][0] == "40.1 GiB"
    assert partial("h11-vllm-gaudi-tutorials-understanding-vllm-llama-3.1-8b-grep-free-device-memory.log")[
        "KV budget"][0] == "40.1 GiB"


def test_gaudi_fork_budget_of_another_run(tmp_path: Path):
    # 90 GiB free x 0.9 = 81 usable; a tenth of it (8.1) for the graphs leaves 72.9 for the cache
    text = _GAUDI.format(free="90", usable="81", graphs="8.1", kv="72.9")
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 0, err
    assert rows(result)["KV budget"][0] == "72.9 GiB"


def test_a_free_memory_line_without_the_graph_reserve_is_not_a_budget(tmp_path: Path):
    # the same words without the fork's HPU-graph clause: no engine's line, so no budget read
    text = "Free device memory: 74.25 GiB, 40.1 GiB reserved for KV cache\n"
    status, result, err = run(text, "--model", "llama-3.1-8b", tmp_path=tmp_path)
    assert status == 2 and "found no KV cache lines" in err
