"""vLLM releases: what each era allocated, reported and checked (engines/vllm/releases.py), and the per-rank
truth under pipeline parallelism (layer partitions, the smallest rank, the whole-model check of 0.14-0.16).

Expected figures are worked from the formulas in each release's source (cited in engines/vllm/releases.py), not from
kvbudget's output."""

from __future__ import annotations

import json

import pytest

from kvbudget import estimate, load_model, plan
from kvbudget.cli import main
from kvbudget.engines import ENGINES, EngineOptions
from kvbudget.engines.base import layer_stages
from kvbudget.engines.vllm.releases import Release, parse_release
from kvbudget.errors import EngineRuleError
from kvbudget.units import GIB, cdiv

VLLM = ENGINES["vllm"]


def opts(version: tuple[int, int] | None = None, **kw: object) -> EngineOptions:
    return EngineOptions(engine_version=version, **kw)  # type: ignore[arg-type]


def test_v0_before_mla_pads_deepseek_heads_to_256_and_has_no_null_block():
    """vLLM 0.6 (V0): a block is 16 tokens x 27 layers x (K + V) x 16 heads x 256 (192 padded) x bf16; GPU blocks
    = budget // block, CPU blocks = 4 GiB // block; it refuses when the blocks hold fewer than max_model_len."""
    lite = load_model("deepseek-v2-lite")
    block = 16 * 27 * 2 * 16 * 256 * 2
    budget = 10 * GIB
    cap = VLLM.capacity(lite, budget, 32768, options=opts((0, 6)))
    assert cap.block_size == 16 and cap.num_blocks == budget // block
    slots = budget // block * 16
    assert cap.physical_token_slots == cap.kv_cache_tokens == slots
    assert cap.max_concurrency == pytest.approx(slots / 32768)
    assert not cap.fits and cap.estimated_max_model_len == slots
    assert any(f"# CPU blocks: {4 * GIB // block}" in n for n in cap.notes)
    assert any(f"maximum number of tokens that can be stored in KV cache ({slots})" in n for n in cap.notes)
    # exactly enough blocks for one request fits in V0 (no null block) but not in V1
    exact = cdiv(4096, 16) * block
    assert VLLM.capacity(lite, exact, 4096, options=opts((0, 6))).fits


def test_v0_mla_aligns_the_latent_to_256_bytes():
    """vLLM 0.7 (V0 with MLA): one entry of 512 + 64 values x bf16 = 1,152 B, aligned to 1,280 B per token and
    layer (cache_engine.py align_to_256bytes)."""
    lite = load_model("deepseek-v2-lite")
    assert VLLM.allocate(lite, options=opts((0, 7))).bytes_per_token == 27 * 1280
    assert VLLM.allocate(lite).bytes_per_token == 27 * 1152  # V1: no alignment


@pytest.mark.parametrize(("version", "capability", "kv", "block"), [
    ((0, 7), "9.0", "auto", 16),  # before FlashMLA
    ((0, 8), "9.0", "auto", 64),  # FlashMLA on Hopper
    ((0, 8), "8.9", "auto", 16),  # Triton MLA on an L4
    ((0, 12), "10.0", "auto", 128),  # CUTLASS MLA on Blackwell
    ((0, 16), "10.0", "auto", 64),  # FlashInfer MLA (qk_nope_head_dim 128)
    ((0, 18), "9.0", "auto", 16),  # FlashAttention MLA's preferred 16
    ((0, 32), "9.0", "fp8", 64),  # FlashAttention MLA stores no fp8: FlashMLA
    ((0, 32), "10.0", "auto", 32),  # FlashInfer MLA's smallest
    ((0, 32), "12.0", "auto", 16),  # Triton MLA on an RTX 5090
])
def test_mla_block_size_follows_the_release_and_the_gpu(version, capability, kv, block):
    v3 = load_model("deepseek-v3")
    cap = VLLM.capacity(v3, 40 * GIB, 16384, kv_dtype=kv, options=opts(version, compute_capability=capability))
    assert cap.block_size == block
    entry = 576 * (1 if kv == "fp8" else 2)
    if version < (0, 8):  # V0 aligns each token's entry to 256 bytes
        entry = cdiv(entry, 256) * 256
    assert cap.num_blocks == 40 * GIB // (block * 61 * entry)


def test_an_mla_backend_given_wins_and_an_unknown_one_is_refused():
    v3 = load_model("deepseek-v3")
    assert VLLM.capacity(v3, GIB, 4096, options=opts(attention_backend="CUTLASS_MLA")).block_size == 128
    assert VLLM.capacity(v3, GIB, 4096, options=opts((0, 17), attention_backend="FLASHINFER_MLA")).block_size == 64
    with pytest.raises(EngineRuleError, match="FLASH_ATTN"):
        VLLM.capacity(v3, GIB, 4096, options=opts(attention_backend="FLASH_ATTN"))


def test_the_plan_takes_the_mla_block_size_from_the_gpu():
    v2 = load_model("deepseek-v2-lite")
    on_h100 = plan(v2, engine="vllm", gpu="H100-80GB", max_model_len=8192, options=opts((0, 8)))
    on_a100 = plan(v2, engine="vllm", gpu="A100-80GB", max_model_len=8192, options=opts((0, 8)))
    assert on_h100.capacity.block_size == 64
    assert on_a100.capacity.block_size == 16


def test_before_0_9_sliding_windows_are_sized_as_full():
    gemma = load_model("gemma-2-9b")
    old = VLLM.capacity(gemma, 8 * GIB, 8192, options=opts((0, 8)))
    new = VLLM.capacity(gemma, 8 * GIB, 8192, options=opts((0, 9)))
    per_token_all_layers = 42 * 2 * 8 * 256 * 2
    assert old.num_blocks == 8 * GIB // (16 * per_token_all_layers)
    assert new.max_concurrency > old.max_concurrency


def test_the_token_count_is_slots_up_to_0_19_and_concurrency_from_0_20():
    gpt = load_model("gpt-oss-20b")  # sliding + full groups: the two counts differ
    old = VLLM.capacity(gpt, 8 * GIB, 32768, options=opts((0, 19)))
    new = VLLM.capacity(gpt, 8 * GIB, 32768, options=opts((0, 20)))
    assert old.kv_cache_tokens == old.physical_token_slots
    assert new.kv_cache_tokens == int(new.max_concurrency * 32768) != new.physical_token_slots


def test_the_null_block_enters_the_start_up_check_from_0_29():
    llama = load_model("llama-3.1-8b")
    block = 16 * 32 * 2 * 8 * 128 * 2
    budget = cdiv(8192, 16) * block  # exactly one request's blocks
    assert VLLM.capacity(llama, budget, 8192, options=opts((0, 28))).fits
    assert not VLLM.capacity(llama, budget, 8192, options=opts((0, 29))).fits


def test_gpu_memory_utilization_default_by_release():
    llama = load_model("llama-3.1-8b")

    def share(p: object) -> str:
        return next(t.name for t in p.stack if t.key == "share")  # type: ignore[attr-defined]

    assert share(plan(llama, engine="vllm", gpu="L4", max_model_len=4096, options=opts((0, 19)))) == \
        "engine share (0.9)"
    assert share(plan(llama, engine="vllm", gpu="L4", max_model_len=4096, options=opts((0, 33)))) == \
        "engine share (0.92)"
    # 0.34: config/cache.py resolved_gpu_memory_utilization, 1.0 with the extensible KV cache, else 0.92
    assert share(plan(llama, engine="vllm", gpu="L4", max_model_len=4096, options=opts((0, 34)))) == \
        "engine share (1)"
    # the release planned by default is 0.32 (the newest checked against real runs)
    assert share(plan(llama, engine="vllm", gpu="L4", max_model_len=4096)) == "engine share (0.92)"
    assert share(plan(llama, engine="vllm", gpu="L4", max_model_len=4096,
                      options=opts((0, 34), extensible_kv_cache=False))) == "engine share (0.92)"


def test_layer_partitions_are_checked_as_vllm_checks_them():
    assert layer_stages(48, 2, (16, 32)) == [range(0, 16), range(16, 48)]
    assert layer_stages(10, 4) == [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    for bad in ((16, 31), (48,), (0, 48)):
        with pytest.raises(EngineRuleError, match="pp_layer_partition"):
            layer_stages(48, 2, bad)
    with pytest.raises(EngineRuleError, match="partition"):
        ENGINES["sglang"].pipeline_stages(48, 2, (16, 32))


def test_pipeline_capacity_is_the_most_loaded_rank_and_0_15_weighs_the_whole_model():
    """Qwen3-30B-A3B over two stages of 16 and 32 layers, 3.18 GiB per rank, 262,144 tokens: every rank gets the
    blocks of the 32-layer one; vLLM 0.15 checked all 48 layers against the budget (vllm issue #34076)."""
    model = load_model("qwen3-30b-a3b")
    budget, max_len = int(3.18 * GIB), 262144
    per_layer = 16 * 4 * 128 * 2 * 2  # a block's page per layer
    new = estimate(model, engine="vllm", pp=2, options=opts((0, 32), pp_layer_partition=(16, 32)), kv_memory=budget,
                   max_model_len=max_len)
    assert new.capacity.num_blocks == budget // (32 * per_layer)
    assert new.capacity.estimated_max_model_len == (budget - 32 * per_layer) // (32 * per_layer) * 16
    old = estimate(model, engine="vllm", pp=2, options=opts((0, 15), pp_layer_partition=(16, 32)),
                   kv_memory=budget, max_model_len=max_len)
    assert old.capacity.num_blocks == new.capacity.num_blocks
    assert old.capacity.estimated_max_model_len == budget // (48 * per_layer) * 16
    assert any("whole model" in n for n in old.notes)


def test_check_log_takes_the_smallest_rank_budget():
    text = ("(Worker_TP0 pid=1) INFO [gpu_worker.py:298] Available KV cache memory: 9.00 GiB\n"
            "(Worker_TP1 pid=2) INFO [gpu_worker.py:298] Available KV cache memory: 7.50 GiB\n"
            "INFO [kv_cache_utils.py:1319] GPU KV cache size: {tokens:,} tokens\n"
            "INFO [kv_cache_utils.py:1324] Maximum concurrency for 32,768 tokens per request: 1.00x\n")
    page = 16 * 48 * 4 * 128 * 2 * 2  # Qwen2.5-14B-like 48 x 8 KV heads over TP 2
    tokens = int(7.50 * GIB) // page * 16
    result = VLLM.check_log(text.replace("{tokens:,}", f"{tokens:,}"), load_model("qwen3-30b-a3b"),
                            {"tp": 1, "engine_version": "0.19"})
    budget_row = result.rows[0]
    assert budget_row.logged == "7.50 GiB" and "smallest of 2" in budget_row.note


def test_parse_release_and_the_cli_refuse_what_is_not_modelled(capsys):
    assert parse_release("v0.8.5") == (0, 8) and parse_release("0.15.2rc1.dev93") == (0, 15)
    with pytest.raises(EngineRuleError):
        parse_release("0.4.3")
    with pytest.raises(EngineRuleError):
        parse_release("latest")
    assert Release((0, 15)).whole_model_check and not Release((0, 17)).whole_model_check
    for argv in (["estimate", "llama-3.1-8b", "--engine", "llamacpp@b900"],
                 ["estimate", "llama-3.1-8b", "--engine", "llamacpp@latest"],
                 ["estimate", "llama-3.1-8b", "--engine", "vllm@0.3"],
                 ["estimate", "llama-3.1-8b", "--engine", "vllm", "--pp", "2", "--pp-layer-partition", "10,10"],
                 ["simulate", "llama-3.1-8b", "--engine", "vllm@0.8", "--rate", "1", "--kv-memory", "1GiB"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_estimate_cli_with_a_release(capsys):
    assert main(["estimate", "deepseek-v2-lite", "--engine", "vllm@0.6", "--kv-memory", "10GiB",
                 "--max-model-len", "32768", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    block = 16 * 27 * 2 * 16 * 256 * 2
    assert data["capacity"]["num_blocks"] == 10 * GIB // block
    assert data["bytes_per_token"] == 27 * 2 * 16 * 256 * 2


def test_the_batch_defaults_follow_the_release():
    """arg_utils.py: A100s keep the small tier from 0.9 (0.8 gave every GPU of 70 GiB the large one); the tier for
    160 GiB and more comes with 0.28."""
    from kvbudget.engines.vllm.releases import Release, batch_defaults
    from kvbudget.units import GIB

    a100 = 80 * GIB
    assert batch_defaults(a100, "A100-80GB", rel=Release((0, 8))) == (8192, 1024)
    assert batch_defaults(a100, "A100-80GB", rel=Release((0, 9))) == (2048, 256)
    assert batch_defaults(180 * GIB, "B200", rel=Release((0, 27))) == (8192, 1024)
    assert batch_defaults(180 * GIB, "B200", rel=Release((0, 28))) == (16384, 1024)


def _terms(options: EngineOptions, **kw: object) -> dict[str, int]:
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="H100-80GB", max_model_len=16000, options=options,
             recommend=False, **kw)  # type: ignore[arg-type]
    return {t.key: t.bytes for t in p.stack}


def test_max_num_seqs_sets_the_profiling_samplers_rows():
    """_dummy_sampler_run samples min(max_num_batched_tokens, max_num_seqs) rows of the vocabulary: on an H100 the
    default 1,024 rows, with --max-num-seqs 16 sixteen; each row is 128,256 logits at the era's bytes per logit
    (16 from 0.17). The forward pass over 8,192 tokens is the larger peak at 16 rows, so the peak is its."""
    default, few = _terms(opts((0, 32))), _terms(opts((0, 32), max_num_seqs=16))  # 0.34's margin moves with the peak
    sampler_default = 1024 * 128256 * 16
    assert default["activation"] == sampler_default  # the sampler is the peak at 1,024 rows
    assert few["activation"] < default["activation"] and few["activation"] != 16 * 128256 * 16
    # and the CUDA graphs vLLM captures (engines/vllm/graphmemory.py): 51 PIECEWISE and 51 FULL graphs up to 512
    # tokens at 1,024 sequences; 7 (1, 2, 4, 8, 16, 24, 32) and 5 (1 to 16) at 16. The first capture holds the forward
    # pass at the largest size twice (4 hidden- and 2 MLP-wide values a token, 2 bytes), each further graph 102 KiB
    # per layer (32 layers)
    forward = 4 * 4096 + 2 * 14336
    graphs_default = 2 * 512 * forward * 2 + 102 * 1024 * 32 * (50 + 50)
    graphs_few = 2 * 32 * forward * 2 + 102 * 1024 * 32 * (6 + 4)
    assert few["kv"] - default["kv"] == (default["activation"] - few["activation"]) + (graphs_default - graphs_few)


def test_max_num_seqs_above_the_step_is_refused_as_vllm_refuses_it():
    with pytest.raises(EngineRuleError, match="max_num_batched_tokens") as err:
        _terms(opts(max_num_seqs=8193))
    assert err.value.param == "max_num_seqs"
    _terms(opts(max_num_seqs=8193, max_num_batched_tokens=8193))  # raised together, vLLM takes it


# vLLM's estimate for Llama-3.1-8B's 51 + 51 graphs on an H100 (engines/vllm/graphmemory.py): 0.44 GiB, the forward
# pass at 512 tokens twice, and 100 further graphs at 102 KiB per layer
LLAMA_GRAPHS = int(0.44 * GIB) + 2 * 512 * (4 * 4096 + 2 * 14336) * 2 + 102 * 1024 * 32 * 100


@pytest.mark.parametrize(("version", "graphs"), [((0, 19), 0), ((0, 20), LLAMA_GRAPHS), (None, LLAMA_GRAPHS)])
def test_enforce_eager_leaves_the_cuda_graphs_out_from_0_20(version, graphs):
    """gpu_worker.py: from 0.20 the profiled CUDA-graph memory is subtracted unless cudagraph_mode is NONE (what
    --enforce-eager sets); before, graphs were never in the budget, so --enforce-eager changes nothing."""
    with_graphs, eager = _terms(opts(version)), _terms(opts(version, enforce_eager=True))
    assert with_graphs["overhead"] - eager["overhead"] == graphs
    assert eager["kv"] - with_graphs["kv"] == graphs


def test_other_engines_refuse_the_vllm_profiling_knobs(capsys):
    for flag in (["--max-num-seqs", "16"], ["--enforce-eager"]):
        assert main(["plan", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100-80GB", *flag]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag[0] in err and "sglang" in err


def test_a_multimodal_models_encoder_profile_is_planned():
    """vLLM V1 profiles the vision encoder on dummy images before the text pass (gpu_model_runner.profile_run,
    0.19's encoder_budget.py): Gemma-3-4B on an H100 (8,192 tokens per step) gets 8192 // 256 = 32 images of
    64 x 64 patches through SigLIP (hidden 1,152, MLP 4,304), their 256 embeddings of 2,560 each held through the
    text pass; a tower whose image size its config does not fix (Qwen3.5's) says it is not modelled."""
    from kvbudget.budget import activation_estimate
    from kvbudget.engines.vllm.memory import encoder_profile

    def activation(name: str) -> tuple[int, str]:
        p = plan(load_model(name), engine="vllm", gpu="H100-80GB", max_model_len=8192, recommend=False)
        return next((t.bytes, t.note) for t in p.stack if t.key == "activation")

    model = load_model("gemma-3-4b")
    images, peak, held, _ = encoder_profile(model, 8192, 1024, 8192, 1)
    assert (images, peak, held) == (32, 32 * 4096 * (2 * 1152 + 2 * 4304) * 2, 32 * 256 * 2560 * 2)
    size, note = activation("gemma-3-4b")
    assert size == activation_estimate(model, 8192, 1024, 16, True, held) > peak  # the text pass stays the peak
    assert "32 dummy images of 256 tokens" in note
    assert "not modelled for this tower" in activation("qwen3.5-27b")[1]
    assert "vision encoder" not in activation("llama-3.1-8b")[1]
    assert encoder_profile(model, 8192, 1024, 8192, 2)[1] < peak  # the MLP split under tensor parallelism


def test_the_llm_class_takes_more_tokens_per_step():
    """arg_utils.py's tables (0.8.5 to 0.32): the Python LLM class steps over 16,384 tokens on GPUs of 70 GiB and
    more (A100s aside from 0.9) and 8,192 on others, where the OpenAI server takes 8,192 and 2,048; both keep
    the same max_num_seqs; from 0.28 GPUs of 160 GiB give both 16,384."""
    from kvbudget.engines.vllm.releases import batch_defaults

    h100, l4 = 80 * GIB, 24 * GIB
    assert batch_defaults(h100, "H100-80GB", entry_point="llm") == (16384, 1024)
    assert batch_defaults(h100, "H100-80GB", entry_point="server") == (8192, 1024)
    assert batch_defaults(l4, "L4", entry_point="llm") == (8192, 256)
    assert batch_defaults(80 * GIB, "A100-80GB", rel=Release((0, 9)), entry_point="llm") == (8192, 256)
    assert batch_defaults(180 * GIB, "B200", rel=Release((0, 28)), entry_point="server") == (16384, 1024)
    with pytest.raises(EngineRuleError) as err:
        batch_defaults(h100, "H100-80GB", entry_point="python")
    assert err.value.param == "entry_point"


def test_the_plan_follows_the_entry_point():
    """On an L4 the forward pass over max_num_batched_tokens is the profiling peak: 8,192 tokens from the LLM class
    take more than the server's 2,048, and the KV budget is smaller by the difference."""
    def terms(entry: str) -> dict[str, int]:
        p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="L4", max_model_len=8000,
                 options=opts(entry_point=entry), recommend=False)
        return {t.key: t.bytes for t in p.stack} | {"mnbt": p.options.max_num_batched_tokens}

    server, llm = terms("server"), terms("llm")
    assert (server["mnbt"], llm["mnbt"]) == (2048, 8192)
    assert llm["activation"] > server["activation"]
    assert server["kv"] - llm["kv"] == llm["activation"] - server["activation"]


def test_the_fused_moe_workspace_is_held_through_the_sampler():
    """From 0.13 an unquantized MoE's fused-MoE workspace (TritonExperts.workspace_shapes, kept by the workspace
    manager) stays allocated when the sampler runs: Mixtral at TP 2 over 8,192 tokens holds 8192 x 2 experts x
    (max(7168, 4096) + max(14336, 4096)) bfloat16 values; dense and quantized models and 0.12 hold none."""
    from kvbudget.engines.vllm.memory import moe_workspace

    mixtral = load_model("mixtral-8x7b")
    size, note = moe_workspace(mixtral, 8192, 2, Release((0, 19)))
    assert size == 8192 * 2 * (7168 + 14336) * 2 and "fused-MoE workspace" in note
    assert moe_workspace(mixtral, 8192, 2, Release((0, 12))) is None
    assert moe_workspace(load_model("llama-3.1-8b"), 8192, 1, Release((0, 19))) is None
    assert moe_workspace(load_model("gpt-oss-20b"), 8192, 1, Release((0, 19))) is None  # MXFP4 experts
    p = plan(mixtral, gpu="H100-80GB", tp=2, options=EngineOptions(engine_version=(0, 19)), recommend=False)
    activation = {t.key: t for t in p.stack}["activation"]
    assert activation.bytes == 1024 * 32000 * 16 + size and "fused-MoE workspace" in activation.note


def test_the_encoder_pass_is_the_peak_where_it_is_the_larger():
    """The plan's profiling peak is the larger of the text pass (with what it holds) and the encoder's pass."""
    from dataclasses import replace as swap

    from kvbudget.budget import memory_stack
    from kvbudget.engines.vllm import VLLM
    from kvbudget.gpus import find_gpu
    from kvbudget.model.weights import model_weights

    model, card = load_model("gemma-3-4b"), find_gpu("H100-80GB")
    serving = VLLM.serving(card.memory_bytes, 8192, EngineOptions(engine_version=(0, 32)), card.name, model=model)
    peaks = [dict((t.key, t.bytes) for t in memory_stack(model, swap(serving, encoder_peak_bytes=e), card,
                                                          model_weights(model, 1, None), None, None, None)[0])
             for e in (0, 20 * GIB)]
    assert peaks[0]["activation"] < 20 * GIB == peaks[1]["activation"]
    assert peaks[0]["kv"] - peaks[1]["kv"] == 20 * GIB - peaks[0]["activation"]
