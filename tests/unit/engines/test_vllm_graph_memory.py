"""vLLM's CUDA-graph estimate (engines/vllm/graphmemory.py): the source's arithmetic, and the fitted figures
coming from tests/data/memory/graphs.json's fit cases alone."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm import graphmemory, memory
from kvbudget.engines.vllm.releases import Release
from kvbudget.units import GIB, KIB, MIB

DOC = json.loads((Path(__file__).resolve().parents[2] / "data" / "memory" / "graphs.json").read_text())
CASES = DOC["cases"]


def _extrapolated(case: dict) -> int:
    """(graphs - 1) per mode, times the layers on one rank."""
    return sum(n - 1 for n in (case["piecewise"], case["full"]) if n) * case["layers"] // case["pp"]


def _pool(case: dict) -> int:
    """The forward pass at the largest graph's size: 4 hidden-wide and 2 MLP-wide values a token, 2 bytes each."""
    return case["largest"] * (4 * case["hidden"] + 2 * case["mlp"]) * 2


def test_the_estimate_is_the_sources_arithmetic():
    """profile_cudagraph_memory: max(first captures) + per mode max(second capture, 1 MiB) x (graphs - 1)."""
    first, per_layer, pool = graphmemory.GRAPH_FIRST, graphmemory.GRAPH_PER_LAYER, 7 * MIB
    # the first capture: the warm-up's activations (torch's cache was emptied) and the captured graph's pool
    assert graphmemory.estimate(51, 51, 32, pool) == first + 2 * pool + per_layer * 32 * 50 + per_layer * 32 * 50
    assert graphmemory.estimate(16, 0, 28, pool) == first + 2 * pool + per_layer * 28 * 15  # PIECEWISE only
    assert graphmemory.estimate(5, 4, 2, pool) == first + 2 * pool + MIB * (4 + 3)  # the 1 MiB floor per graph
    assert graphmemory.estimate(1, 1, 32, pool) == first + 2 * pool  # one graph a mode: the first capture alone
    assert graphmemory.estimate(0, 0, 32, pool) == 0  # nothing captured, nothing profiled


def test_the_fitted_figures_come_from_the_fit_logs_alone():
    """The least-squares line of (the logged estimate - twice the pool) over (graphs - 1) x layers on the fit logs,
    rounded up: the slope to the KiB, the intercept to 0.01 GiB."""
    fit = [c for c in CASES if c["role"] == "fit"]
    assert len(fit) >= 10 and any(c["role"] == "check" for c in CASES)
    slope, intercept = statistics.linear_regression([_extrapolated(c) for c in fit],
                                                    [c["logged_gib"] * GIB - 2 * _pool(c) for c in fit])
    assert graphmemory.GRAPH_PER_LAYER == math.ceil(slope / KIB) * KIB
    assert graphmemory.GRAPH_FIRST == int(math.ceil(intercept / GIB * 100) / 100 * GIB)


def test_the_roles_follow_the_rule():
    """A log of a vllm.json case keeps that case's role; any other log takes wide.json's hash rule."""
    corpus = {c["id"]: c["role"] for c in json.loads(
        (Path(__file__).resolve().parents[2] / "data" / "memory" / "vllm.json").read_text())["cases"]}
    for case in CASES:
        assert case["source"].startswith("https://") and case["licence"], case["id"]
        if case["role_from"].startswith("the role of vllm.json's "):
            assert corpus[case["role_from"].split("'s ")[1].split(" ")[0]] == case["role"], case["id"]
        else:
            digest = int(hashlib.sha256(case["source"].encode()).hexdigest(), 16)
            assert case["role"] == ("fit" if digest % 3 == 0 else "check"), case["id"]


def test_the_check_logs_are_within_what_the_fit_says():
    """On the check logs (never fitted on) the estimate's median |error| is within 0.2 GiB and every one within
    0.9 GiB (granite-3.1-2b logs 1.60 GiB for 40 small layers; the fit's spread, see graphmemory.py)."""
    errors = sorted(abs(graphmemory.estimate(c["piecewise"], c["full"], c["layers"] // c["pp"], _pool(c)) / GIB
                        - c["logged_gib"]) for c in CASES if c["role"] == "check")
    assert statistics.median(errors) <= 0.2 and errors[-1] <= 0.9, errors


def test_the_plan_subtracts_the_estimate_for_the_graphs_it_captures():
    """Mistral-7B (32 layers) on an L4 with vLLM 0.30 at max_num_seqs 8 and max_num_batched_tokens 2048: capture
    sizes up to min(8 x 2, 512, 2048) = 16: 1, 2, 4, 8, 16 (PIECEWISE, 5) and the decode sizes 1 to 8 (FULL, 4); the
    estimate 0.44 GiB + twice the forward pass at 16 tokens (hidden 4,096, MLP 14,336) + 102 KiB x 32 x (4 + 3),
    not a flat 1 GiB."""
    options = EngineOptions(engine_version=(0, 30), max_num_seqs=8, max_num_batched_tokens=2048)
    model = kvbudget.load_model("mistral-7b-v0.3")
    graphs = memory.start_up_graphs(Release((0, 30)), model, options, "L4")
    assert graphs.bytes == int(0.44 * GIB) + 2 * 16 * (4 * 4096 + 2 * 14336) * 2 + 102 * 1024 * 32 * (4 + 3)
    assert graphs.counts is not None and (graphs.counts.piecewise, graphs.counts.full) == (5, 4)
    assert "each further graph at the second's cost" in graphs.why
    eager = memory.start_up_graphs(Release((0, 30)), model, EngineOptions(engine_version=(0, 30), enforce_eager=True,
                                   max_num_seqs=8, max_num_batched_tokens=2048), "L4")
    assert eager.bytes == 0


def test_flashinfers_workspace_where_an_fp8_cache_runs_it():
    """flashinfer.py _get_workspace_buffer (0.27.0, 0.30.0, 0.33.0): max(394 MiB, max_num_batched_tokens x query
    heads x head size x 16 bytes); FlashAttention takes an fp8 cache only on 9.x (FA3) and 10.x (FA4), so on 8.x
    FlashInfer runs it; bf16 runs FlashAttention and makes none."""
    work = graphmemory.flashinfer_workspace
    assert work((0, 30), "8.6", "fp8", 2048, 28, 128) == 394 * MIB  # 2,048 x 28 x 128 x 16 = 112 MiB, below
    assert work((0, 30), "8.9", "fp8_e4m3", 8192, 28, 128) == 8192 * 28 * 128 * 16  # 448 MiB, above
    assert work((0, 30), "8.6", "auto", 2048, 28, 128) == 0  # FlashAttention 2
    assert work((0, 30), "9.0", "fp8", 2048, 28, 128) == 0  # FlashAttention 3 takes fp8
    assert work((0, 26), "8.6", "fp8", 2048, 28, 128) == 0  # a release not read
    # the first FULL capture makes it: PIECEWISE graphs alone run attention outside the graph, and make none
    assert graphmemory.estimate(5, 4, 28, 0, 394 * MIB) - graphmemory.estimate(5, 4, 28, 0) == 394 * MIB
    assert graphmemory.estimate(5, 0, 28, 0, 394 * MIB) == graphmemory.estimate(5, 0, 28, 0)


def test_an_fp8_cache_on_an_a10g_plans_flashinfers_workspace():
    """Qwen2.5-7B on an A10G (8.6) with vLLM 0.30's defaults (2,048 tokens, 256 sequences): with an fp8 cache the
    planned budget is 394 MiB smaller than the bf16 cache's (Tensward's two runs: 0.33 GiB)."""
    model = kvbudget.load_model("qwen2.5-7b")
    budgets = {}
    for dtype in ("auto", "fp8"):
        p = kvbudget.plan(model, gpu="A10G", max_model_len=8192, kv_dtype=dtype,
                          options=EngineOptions(engine_version=(0, 30)), recommend=False)
        budgets[dtype] = p.kv_memory_bytes
    assert budgets["auto"] - budgets["fp8"] == 394 * MIB
    p = kvbudget.plan(model, gpu="A10G", max_model_len=8192, kv_dtype="fp8",
                      options=EngineOptions(engine_version=(0, 30)), recommend=False)
    assert "FlashInfer's workspace (394 MiB" in {t.key: t.note for t in p.stack}["overhead"]


def test_the_0_30_profile_at_eight_sequences():
    """vLLM 0.30's profile_run at max_num_seqs 8, max_num_batched_tokens 2048 (Mistral-7B on an L4): _dummy_run
    splits 2,048 tokens over min(2048, 8) = 8 requests and samples their 8 last tokens; the forward pass (2,048 x
    (4 x 4,096 + 2 x 14,336) x 2 bytes) outweighs the sampler (8 x 32,768 x 16 bytes), so the plan's activation is
    the forward pass."""
    p = kvbudget.plan(kvbudget.load_model("mistral-7b-v0.3"), gpu="L4", max_model_len=8192, utilization=0.85,
                      options=EngineOptions(engine_version=(0, 30), max_num_seqs=8, max_num_batched_tokens=2048),
                      recommend=False)
    assert {t.key: t.bytes for t in p.stack}["activation"] == 2048 * (4 * 4096 + 2 * 14336) * 2
    assert 8 * 32768 * 16 < 2048 * (4 * 4096 + 2 * 14336) * 2
