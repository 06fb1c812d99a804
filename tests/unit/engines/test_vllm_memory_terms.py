"""vLLM's start-up terms that move with the release, the platform and the share (engines/vllm/memory.py and
releases.py): which start-ups take CUDA graphs out of the KV budget, which models run on Model Runner V2, and that
gpu_memory_utilization moves the budget through the share alone.

Each rule is read from the source of the releases named beside it (vllm/v1/worker/gpu_worker.py, envs.py,
config/vllm.py, v1/worker/gpu/model_runner.py of the sdists 0.18.1 to 0.34.0); where a public log shows a rule at
work, its figures are in the test with its address."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget import load_model, plan
from kvbudget.engines import EngineOptions
from kvbudget.engines.vllm.memory import CUDA_GRAPH_ESTIMATE, cuda_graphs, on_v2_runner
from kvbudget.engines.vllm.releases import Release, v0_batch_defaults
from kvbudget.units import GIB


def _stack(model: str, version: tuple[int, int], gpu: str = "A100-80GB", utilization: float = 0.9,
           **options: object) -> dict[str, int]:
    p = plan(load_model(model), engine="vllm", gpu=gpu, max_model_len=4096, utilization=utilization,
             options=EngineOptions(engine_version=version, **options), recommend=False)  # type: ignore[arg-type]
    return {t.key: t.bytes for t in p.stack}


# (release, ROCm, Model Runner V2, CUDA graphs subtracted): envs.py's default for
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS ("0" in 0.18 and 0.19, "1" from 0.20); gpu_worker.py's platform test
# (0.20 `not is_rocm()`, 0.21-0.25 `is_cuda()`, 0.26 on `is_cuda_alike()`); Model Runner V2's
# profile_cudagraph_memory (`return 0` up to 0.28.0, profiled in 0.29.0).
GRAPH_RULES = [
    ((0, 19), False, False, False),
    ((0, 20), False, False, True),
    ((0, 20), True, False, False),
    ((0, 25), True, False, False),
    ((0, 26), True, False, True),
    ((0, 22), False, True, False),
    ((0, 28), False, True, False),
    ((0, 29), False, True, True),
    ((0, 32), True, True, True),
]


@pytest.mark.parametrize(("version", "rocm", "v2", "subtracted"), GRAPH_RULES)
def test_which_start_ups_take_cuda_graphs_out_of_the_budget(version, rocm, v2, subtracted):
    graphs = cuda_graphs(Release(version), rocm=rocm, v2_runner=v2)
    assert graphs.bytes == (CUDA_GRAPH_ESTIMATE if subtracted else 0), graphs.why
    assert cuda_graphs(Release(version), eager=True, rocm=rocm, v2_runner=v2).bytes == 0  # nothing captured


@pytest.mark.parametrize(("model", "version", "v2"), [
    ("llama-3.1-8b", (0, 21), False),  # VLLM_USE_V2_MODEL_RUNNER defaults to "0"
    ("llama-3.1-8b", (0, 22), False),  # 0.22 names Qwen3ForCausalLM only
    ("qwen3-8b", (0, 22), True),
    ("llama-3.1-8b", (0, 23), True),  # 0.23 adds LlamaForCausalLM and MistralForCausalLM
    ("qwen2.5-7b", (0, 24), False),  # Qwen2ForCausalLM is in no list
    ("qwen2.5-7b", (0, 25), True),  # 0.25: every dense model
    ("qwen3-30b-a3b", (0, 28), False),  # Qwen3MoeForCausalLM: MoE and not named
    ("mixtral-8x7b", (0, 26), False),
    ("deepseek-v2-lite", (0, 24), True),  # DeepseekV2ForCausalLM is named, MoE or not
    ("jamba-1.5-mini", (0, 26), False),  # hybrid
    ("qwen3-30b-a3b", (0, 29), True),  # 0.29: every model
])
def test_model_runner_v2_by_release_and_architecture(model, version, v2):
    assert on_v2_runner(load_model(model), Release(version)) is v2


def test_0_22_and_0_23_keep_quantized_checkpoints_on_the_v1_runner():
    """0.22-0.23's _is_default_v2_model_runner_model: `not model_config.is_moe and not model_config.is_quantized`;
    0.24 drops the test."""
    config = dict(load_model("llama-3.1-8b").config, quantization_config={"quant_method": "fp8"})
    fp8 = load_model(config)
    assert not on_v2_runner(fp8, Release((0, 23))) and on_v2_runner(fp8, Release((0, 24)))


def test_a_dense_model_on_model_runner_v2_keeps_its_graph_memory_in_the_budget():
    """vllm-project/vllm issue #50159 (a controlled A/B on vLLM 0.26.0, Qwen2.5-0.5B-Instruct,
    gpu_memory_utilization 0.85): KV tokens 6,908,880 eager on either runner; with CUDA graphs 6,891,296 on the
    V1 runner and 6,900,336 on Model Runner V2. Qwen2.5-0.5B keeps 24 layers x K and V x 2 heads x 64 x 2 bytes =
    12,288 bytes per token: the V1 runner gave up 0.20 GiB (the estimate it profiled), V2 half of that, which is not
    the estimate (V2's profile_cudagraph_memory returns 0 in 0.26). The plan for a dense Qwen2 model at 0.26 takes
    no graphs off; at 0.24 (V1 runner) its estimate."""
    per_token = 24 * 2 * 2 * 64 * 2
    eager, v1, v2 = 6_908_880, 6_891_296, 6_900_336
    v1_gap, v2_gap = (eager - v1) * per_token / GIB, (eager - v2) * per_token / GIB
    assert v1_gap == pytest.approx(0.20, abs=0.01) and v2_gap < v1_gap / 2
    graphs, no_graphs = _stack("qwen2.5-7b", (0, 26)), _stack("qwen2.5-7b", (0, 26), enforce_eager=True)
    assert graphs["kv"] == no_graphs["kv"]
    v1_graphs, v1_eager = _stack("qwen2.5-7b", (0, 24)), _stack("qwen2.5-7b", (0, 24), enforce_eager=True)
    # vLLM's estimate for an A100's 0.24 defaults (256 sequences, 2,048 tokens: sizes up to min(2 x 256, 512) = 512,
    # 51 PIECEWISE graphs, and 35 FULL ones of 1 to 256) of Qwen2.5-7B's 28 layers: the first capture, then the
    # further graphs of each mode at the second's cost (engines/vllm/graphmemory.py's fitted figures)
    pool = 512 * (4 * 3584 + 2 * 18944) * 2  # the forward pass at 512 tokens, twice in the first capture
    assert v1_eager["kv"] - v1_graphs["kv"] == int(0.44 * GIB) + 2 * pool + 102 * 1024 * 28 * (50 + 34)


def test_rocm_leaves_the_graphs_in_the_budget_until_0_26():
    """An AMD card plans no graphs from 0.20 to 0.25 and the estimate from 0.26; an NVIDIA card the estimate from
    0.20 (MoE models stay on the V1 runner, so the platform decides)."""
    # 51 + 51 graphs of Qwen3-30B-A3B's 48 layers, its forward pass at 512 tokens (hidden 2,048, 8 experts of 768)
    estimate = int(0.44 * GIB) + 2 * 512 * (4 * 2048 + 2 * 8 * 768) * 2 + 102 * 1024 * 48 * (50 + 50)
    for version, rocm_graphs in (((0, 24), 0), ((0, 26), estimate)):
        eager = _stack("qwen3-30b-a3b", version, gpu="MI300X", enforce_eager=True)
        assert eager["kv"] - _stack("qwen3-30b-a3b", version, gpu="MI300X")["kv"] == rocm_graphs
        cuda = _stack("qwen3-30b-a3b", version, gpu="H200")
        assert _stack("qwen3-30b-a3b", version, gpu="H200", enforce_eager=True)["kv"] - cuda["kv"] == estimate


def test_v0_moves_the_budget_by_the_share_alone():
    """vllm-project/vllm issue #11251 (vLLM 0.6.4.post1, two ranks on 15.77 GiB cards): at gpu_memory_utilization
    0.95 weights 7.51, non-torch 0.39, activation peak 2.53 and KV 4.55 GiB; at 0.90 the same three terms and KV 3.76.
    worker.py multiplies the total by the share and takes the rest off unchanged: the budgets differ by
    15.77 x 0.05. The plan's do too."""
    assert 4.55 - 3.76 == pytest.approx(15.77 * 0.05, abs=0.01)
    high, low = (_stack("llama-3.1-8b", (0, 6), gpu="H100-80GB", utilization=u) for u in (0.95, 0.90))
    assert high["kv"] - low["kv"] == high["share"] - low["share"]
    assert {k: high[k] for k in ("weights", "activation", "overhead")} == {
        k: low[k] for k in ("weights", "activation", "overhead")}


@settings(max_examples=60, deadline=None)
@given(minor=st.integers(8, 32), share=st.floats(0.4, 0.95), step=st.floats(0.01, 0.04))
def test_no_term_but_the_share_moves_with_gpu_memory_utilization(minor, share, step):
    """V1's gpu_worker.py (0.8 to 0.32): requested_memory = ceil(total x gpu_memory_utilization) is the only term
    the share enters; the profiling peak, non-torch memory and the CUDA-graph estimate are measured apart from it."""
    a, b = (_stack("llama-3.1-8b", (0, minor), gpu="H100-80GB", utilization=u) for u in (share, share + step))
    total = a["gpu"]
    assert b["kv"] - a["kv"] == math.ceil(total * (share + step)) - math.ceil(total * share)


def _v0_activation(model: str, gpu: str, max_model_len: int) -> int:
    p = plan(load_model(model), engine="vllm", gpu=gpu, max_model_len=max_model_len, utilization=0.9,
             options=EngineOptions(engine_version=(0, 6)), recommend=False)
    return next(t.bytes for t in p.stack if t.key == "activation")


def test_v0_profiles_the_forward_pass_then_the_sorting_sampler():
    """vLLM V0 (0.6.4 / 0.6.6 worker/model_runner.py profile_run): max_model_len tokens (V0's max_num_batched_tokens
    without chunked prefill, at least 2,048) in 256 prompts, then the sampler over their 256 last tokens with
    top_p 0.99 and top_k vocab - 1, which sorts the logits as V1 did before 0.17 (39 bytes per logit, that era's
    fit). Two check cases, neither fitted on:
    - Phi-4 (hidden 5,120, MLP 17,920, vocabulary 100,352) on an H100 at 2,048 tokens, 0.6.5
      (github.com/xinyuwei-david/david-share, Deep-Learning/Phi4/readme.md; tests/data/memory/wide.json): "PyTorch
      activation peak memory takes 0.94GiB". The sampler is the peak: 256 x 100,352 x 39 bytes = 0.93 GiB (the
      forward pass, 2,048 x (2 x 5,120 + 3 x 17,920) x 2 bytes, 0.25 GiB);
    - Llama-3.1-8B (4,096, 14,336, 128,256) on an RTX 3090 at 20,000 tokens, 0.6.4 (vllm-project/vllm issue #10517;
      tests/data/memory/vllm.json): peak_torch_memory 17.06 less the weights 14.99 = 2.07 GiB. The forward pass is
      the peak: 20,000 x 51,200 x 2 bytes = 1.91 GiB (the sampler 1.19)."""
    phi = _v0_activation("phi-4", "H100-80GB", 2048)
    assert phi == 256 * 100352 * 39 and abs(phi / GIB / 0.94 - 1) < 0.02
    llama = _v0_activation("llama-3.1-8b", "RTX-3090", 20000)
    assert llama == 20000 * (2 * 4096 + 3 * 14336) * 2 > 256 * 128256 * 39
    assert abs(llama / GIB / 2.07 - 1) < 0.08


def test_the_first_0_8_patches_sampled_1024_rows_on_every_gpu():
    """engine/arg_utils.py: default_max_num_seqs = 1024 on every GPU in 0.8.0-0.8.3, 256 below an H100 in 0.8.4,
    below 70 GiB in 0.8.5 (what kvbudget plans for 0.8). On an L40S the plan samples 256 rows and says what the
    first patches took; with max_num_seqs 1024 the sampler is 1,024 x 128,256 logits x 39 bytes."""
    def activation(gpu: str, seqs: int | None = None) -> tuple[int, str]:
        p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu=gpu, max_model_len=32768,
                 options=EngineOptions(engine_version=(0, 8), max_num_seqs=seqs), recommend=False)
        term = next(t for t in p.stack if t.key == "activation")
        return term.bytes, term.note

    size, note = activation("L40S")
    assert size == 256 * 128256 * 39 and "0.8.0 to 0.8.3 sampled 1024 rows" in note
    size, note = activation("L40S", 1024)
    assert size == 1024 * 128256 * 39 and "0.8.0" not in note
    assert "0.8.0" not in activation("H100-80GB")[1]  # 1,024 there in every 0.8 patch


def test_v0_chunks_long_prompts_at_512_tokens_until_0_6_5():
    """config.py SchedulerConfig: beyond 32k tokens V0 chunks prefills, at 512 tokens a step in the 0.5.4, 0.6.0 and
    0.6.4 sdists and 2,048 in 0.6.5, 0.6.6 and 0.7.3; shorter contexts run whole (at least 2,048). kvbudget plans
    0.6 as 0.6.6 and says what the first 0.6 patches took."""
    assert v0_batch_defaults(35000, Release((0, 5))) == (512, 256)
    assert v0_batch_defaults(35000, Release((0, 6))) == (2048, 256)
    assert v0_batch_defaults(20000, Release((0, 5))) == (20000, 256)
    p = plan(load_model("llama-3.1-8b"), engine="vllm", gpu="RTX-3090", max_model_len=35000,
             options=EngineOptions(engine_version=(0, 6)), recommend=False)
    assert "0.6.0 to 0.6.4 chunked prefills at 512 tokens" in next(t.note for t in p.stack if t.key == "activation")
