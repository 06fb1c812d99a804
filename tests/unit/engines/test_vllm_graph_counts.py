"""How many CUDA graphs vLLM >= 0.20 captures, and so profiles before it sizes the KV cache (engines/vllm/memory.py
capture_sizes / graph_counts).

Each expected count is worked out by hand below from the rule as the wheels of 0.20.0, 0.24.0, 0.28.0 and 0.32.0
write it (config/vllm.py _set_cudagraph_sizes; v1/cudagraph_dispatcher.py initialize_cudagraph_keys): the sizes
run 1, 2, 4, then every 8 below 256, then every 16, up to min(2 x max_num_seqs x q, 512, max_num_batched_tokens);
one PIECEWISE graph per size, one FULL graph per size from q to q x max_num_seqs (q = 1 + the speculative
tokens). Where a public start-up log prints the count for known settings, its address is given."""

from __future__ import annotations

import pytest

from kvbudget import load_model, plan
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm.memory import GraphCounts, capture_sizes, graph_counts
from kvbudget.engines.vllm.memorylog import _graph_count_rows
from kvbudget.engines.vllm.releases import Release


def test_a_1024_sequence_server_on_an_h100_captures_51_graphs_of_each_mode():
    """min(2 x 1024, 512) = 512: 3 sizes (1, 2, 4) + 31 (8 to 248) + 17 (256 to 512) = 51, all of them decode
    sizes (<= 1024). llm-d-planner's vLLM 0.19 start-up of granite-3.1-8b on one H100 (server defaults: 1,024
    sequences, 8,192 tokens) captured 51 PIECEWISE graphs from 512 tokens down and 51 FULL graphs from 512
    (github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/
    v0.19.0/logs/granite-3-1-8b--h100-80gb--tp1pp1dp1--8192.log: 'Capturing CUDA graphs (mixed prefill-decode,
    PIECEWISE): 51/51', '(decode, FULL): 51/51', the first FULL capture num_tokens=512)."""
    assert graph_counts(Release((0, 20)), 1024, 8192) == GraphCounts(51, 51, 512, 512)


@pytest.mark.parametrize(("seqs", "expected"), [
    (256, GraphCounts(51, 35, 512, 256)),  # FULL: 3 + 31 (8-248) + 256 = 35
    (128, GraphCounts(35, 19, 256, 128)),  # PIECEWISE to 256: 3 + 31 + 1; FULL: 3 + 16 (8-128)
    (64, GraphCounts(19, 11, 128, 64)),  # 3 + 16; 3 + 8
    (32, GraphCounts(11, 7, 64, 32)),  # 3 + 8; 3 + 4
    (1, GraphCounts(2, 1, 2, 1)),  # sizes 1 and 2; FULL size 1
])
def test_fewer_sequences_capture_fewer_graphs(seqs, expected):
    """The counts public logs print as 'Profiling CUDA graph memory: PIECEWISE=35 (largest=256), FULL=19
    (largest=128)' and so on follow from max_num_seqs alone at 8,192 tokens."""
    assert graph_counts(Release((0, 20)), seqs, 8192) == expected


def test_max_num_batched_tokens_caps_the_sizes_and_is_captured_itself_from_0_24():
    """256 sequences, 300 tokens: sizes to 300 are 3 + 31 + 3 (256, 272, 288) = 37; 0.24 adds 300 itself, 0.20
    does not. FULL stays at the 35 sizes up to 256."""
    assert graph_counts(Release((0, 20)), 256, 300) == GraphCounts(37, 35, 288, 256)
    assert graph_counts(Release((0, 24)), 256, 300) == GraphCounts(38, 35, 300, 256)


def test_speculative_tokens_widen_the_sizes_and_round_them_to_the_query_length():
    """q = 4 (three draft tokens), 42 sequences: min(2 x 42 x 4, 512) = 336: the sizes 1, 2, 4, 8-248 (31) and
    256-336 (6) are rounded up to multiples of 4 (compilation.py adjust_cudagraph_sizes_for_spec_decode), so 1 and
    2 become 4: 38 sizes; FULL from 4 to 4 x 42 = 168: 4 and 8-168 (21) = 22. From 0.28 a model on Model Runner V2
    keeps the 40 unrounded sizes."""
    assert graph_counts(Release((0, 24)), 42, 8192, spec_tokens=3) == GraphCounts(38, 22, 336, 168)
    assert graph_counts(Release((0, 28)), 42, 8192, spec_tokens=3, v2_runner=True).piecewise == 40
    assert graph_counts(Release((0, 24)), 42, 8192, spec_tokens=3, v2_runner=True).piecewise == 38
    # q = 3, 64 sequences: 43 sizes to 384, of which 1 and 2 both round to 3: 42; FULL 3-192: 3, 6 (from 4) and
    # the 24 multiples of 8 to 192, rounded to 9, 18, 24, 33, ...: 26
    assert graph_counts(Release((0, 24)), 64, 8192, spec_tokens=2) == GraphCounts(42, 26, 384, 192)


def test_0_32_captures_the_decode_batch_sizes_off_the_stride():
    """0.32 adds max_num_seqs (100, not a multiple of 8) to the sizes up to 200: 3 + 25 (8-200) + 1 = 29, FULL
    3 + 12 (8-96) + 100 = 16; 0.28 has neither."""
    assert graph_counts(Release((0, 32)), 100, 8192) == GraphCounts(29, 16, 200, 100)
    assert graph_counts(Release((0, 28)), 100, 8192) == GraphCounts(28, 15, 200, 96)


def test_data_center_blackwell_captures_up_to_1024_from_0_28():
    """is_device_capability_family(100): a ceiling of 1,024 (in 0.28, not 0.24): 3 + 31 + 49 (256-1024) = 83."""
    assert graph_counts(Release((0, 28)), 1024, 8192, wide=True) == GraphCounts(83, 83, 1024, 1024)
    assert graph_counts(Release((0, 24)), 1024, 8192, wide=True).piecewise == 51
    assert capture_sizes(Release((0, 28)), 1024, 8192, wide=True)[-2:] == (1008, 1024)


def test_the_plan_names_the_graphs_it_takes_memory_for():
    """B200 (compute capability 10.0) on 0.28 against H100 on 0.24, both with vLLM's server defaults there (an
    unquantized MoE model: on the V1 runner, which profiles its graphs, until 0.29)."""
    model = load_model("qwen3-30b-a3b")
    for gpu, version, counts in (("H100-80GB", (0, 24), "PIECEWISE=51 (largest=512), FULL=51 (largest=512)"),
                                 ("B200", (0, 28), "PIECEWISE=83 (largest=1024)")):
        p = plan(model, engine="vllm", gpu=gpu, max_model_len=8192, recommend=False,
                 options=EngineOptions(engine_version=version))
        note = next(t.note for t in p.stack if t.key == "overhead")
        assert counts in note, note


def test_check_log_shows_the_logged_count_beside_the_plan():
    line = ("(EngineCore pid=1073) INFO 09-03 03:39:27 [gpu_model_runner.py:6279] Profiling CUDA graph memory: "
            "PIECEWISE=35 (largest=256), FULL=19 (largest=128)")
    [row] = _graph_count_rows(line, graph_counts(Release((0, 24)), 128, 8192))
    assert row.logged == row.predicted == "PIECEWISE=35 (largest=256), FULL=19 (largest=128)"
    assert row.matches is None
    assert _graph_count_rows("no such line", graph_counts(Release((0, 24)), 128, 8192)) == []


def test_vllm_s_own_estimate_does_not_follow_the_count():
    """Why the plan's graph bytes stay one estimate rather than a figure per graph: per graph, vLLM's own estimate
    in public start-ups (kept in tests/data/logs/unseen, sources in its index.json: noonghunna/club-3090#104,
    vllm-project/vllm pull request 39559 and issue 46462) and in llm-d-planner's granite-3.1-8b log (the address in
    the first test: 51 + 51 graphs, 'CUDA graph pool memory: 0.98 GiB (actual), 0.74 GiB (estimated)') spans more
    than ten times: the first capture, set by the model and its kernels, dominates."""
    import re
    from pathlib import Path

    logs = Path(__file__).parents[2] / "data" / "logs" / "unseen"
    per_graph = {"granite": 0.74 / 102}
    for name in ("vllm-club3090-104-qwen3.6-27b-tp2-workers.log", "vllm-pr-39559-qwen3.5-gguf-blocks-override.log",
                 "vllm-issue-46462-dflash-qwen3.6-35b-budget.log"):
        text = (logs / name).read_text()
        graphs = sum(int(n) for n in re.findall(r"(?:PIECEWISE|FULL)=(\d+)",
                                                 re.search(r"Profiling CUDA graph memory: .*", text).group(0)))
        per_graph[name] = float(re.search(r"Estimated CUDA graph memory: ([\d.]+) GiB", text).group(1)) / graphs
    assert per_graph["vllm-club3090-104-qwen3.6-27b-tp2-workers.log"] == pytest.approx(0.13 / 5)
    assert max(per_graph.values()) > 10 * min(per_graph.values())
