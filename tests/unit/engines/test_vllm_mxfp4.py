"""vLLM's layout of MXFP4 experts (engines/vllm/mxfp4.py). Every expected byte count is worked out by hand from the
tensor shapes vLLM's source creates for gpt-oss (hidden 2880, expert width 2880, 36 layers of 128 experts for the
120b, 24 of 32 for the 20b): gate_up values [2I, H/2] and down values [H, I/2] uint8, their scales [2I, H/32] and
[H, I/32] one byte each, biases [2I] and [H]."""

from __future__ import annotations

import pytest

import kvbudget
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.vllm.mxfp4 import Mxfp4Kernel, expert_bytes, mxfp4_kernel, mxfp4_layout
from kvbudget.engines.vllm.releases import Release
from kvbudget.units import GIB

MARLIN, TRITON = Mxfp4Kernel.MARLIN, Mxfp4Kernel.TRITON


def test_marlin_pads_width_to_128_and_hidden_to_256():
    """mxfp4.py create_weights (Marlin): 2880 -> 2944 (23 x 128) and 3072 (12 x 256); marlin_utils_fp4.py keeps one
    float8_e8m0 scale per 32 and the biases in bfloat16 (2 bytes)."""
    i, h = 2944, 3072
    values = 2 * i * h // 2 + h * i // 2
    scales = 2 * i * (h // 32) + h * (i // 32)
    assert expert_bytes(MARLIN, 2880, 2880, 2) == values + scales + (2 * i + h) * 2 == 14_431_744
    # tensor parallel 4: 720 per rank -> 768 (6 x 128)
    assert expert_bytes(MARLIN, 720, 2880, 2) == 3 * 768 * 3072 // 2 + 3 * 768 * 3072 // 32 + (2 * 768 + 3072) * 2


def test_triton_on_hopper_keeps_the_scales_twice_and_float32_biases():
    """0.12 on: width rounded to 64 (2880 stays); the loaded scales stay on the layer while hopper_scale.py swizzles a
    copy whose rows are padded to 256 (gate_up 5760 -> 5888, down 2880 -> 3072); biases made float32."""
    values = 5760 * 1440 + 2880 * 1440
    loaded_scales = 5760 * 90 + 2880 * 90
    swizzled = 5888 * 90 + 3072 * 90
    biases = (5760 + 2880) * 4
    assert expert_bytes(TRITON, 2880, 2880, 2) == values + loaded_scales + swizzled + biases == 14_060_160


def test_the_value_layout_of_0_17_to_0_20_pads_to_64():
    """Tensor parallel 2: 1440 per rank -> 1472 (23 x 64). hopper_value.py of 0.17-0.20 pads both sides to 64 first:
    gate_up [2944, 1440 -> 1472], down [2880, 736 -> 768]; without it (0.12-0.16, 0.22 on) nothing to pad."""
    scales = 2944 * 90 + 2880 * 46 + 3072 * 90 + 3072 * 46  # loaded, then swizzled with rows padded to 256
    biases = (2944 + 2880) * 4
    assert expert_bytes(TRITON, 1440, 2880, 2) == 2944 * 1440 + 2880 * 736 + scales + biases
    assert expert_bytes(TRITON, 1440, 2880, 2, prepad=True) == 2944 * 1472 + 2880 * 768 + scales + biases


@pytest.mark.parametrize(("version", "capability", "kernel"), [
    ((0, 10), "9.0", MARLIN),  # 0.10.1 pins torch 2.7.1: Marlin below torch 2.8
    ((0, 11), "9.0", MARLIN),  # no triton_kernels in the wheel before 0.12
    ((0, 12), "9.0", TRITON),
    ((0, 32), "9.0", TRITON),
    ((0, 19), "8.0", MARLIN),  # Ampere
    ((0, 19), "8.9", MARLIN),  # Ada
    ((0, 19), "12.0", MARLIN),  # consumer Blackwell: the Triton kernels need capability < 11
    ((0, 19), "10.0", None),  # FlashInfer's kernels: not modelled
    ((0, 19), None, None),  # no card known (check-log without one, a custom card, AMD)
    ((0, 9), "9.0", None),  # no gpt-oss before 0.10.1
])
def test_the_kernel_by_release_and_capability(version, capability, kernel):
    assert mxfp4_kernel(Release(version), capability) is kernel


def test_only_mxfp4_checkpoints_get_the_layout():
    model = kvbudget.load_model("llama-3.1-8b")
    assert mxfp4_layout(model, Release((0, 19)), "9.0", 1, range(model.num_layers)) is None


def _weights_gib(name: str, gpu: str, tp: int, version: tuple[int, int]) -> float:
    plan = kvbudget.plan(kvbudget.load_model(name), engine="vllm", gpu=gpu, tp=tp, max_model_len=4096,
                         utilization=0.95, options=EngineOptions(engine_version=version), recommend=False)
    return next(t.bytes for t in plan.stack if t.key == "weights") / GIB


# 'Model loading took' in real start-ups (GiB, as vLLM prints them to two decimals). What the plan leaves out of the
# loaded bytes is small (the gpt-oss attention sinks, 64 floats a layer; Marlin's workspace, a few int32 per SM): all
# five come within 0.07 GiB, 0.5%.
LOGGED = [
    ("gpt-oss-120b", "H100-80GB", 1, (0, 10), 65.97),  # vllm#23278, 0.10.1: Marlin
    ("gpt-oss-120b", "H100-80GB", 1, (0, 14), 64.38),  # vllm#33155, 0.14.1: "Using Triton backend"
    ("gpt-oss-120b", "A100-80GB", 4, (0, 10), 17.22),  # dennislee22/vLLM-benchmarking, 0.10.1.1: Marlin
    ("gpt-oss-20b", "A100-80GB", 1, (0, 19), 13.72),  # myoceane.fr, 0.19.0: Marlin
    ("gpt-oss-20b", "H100-80GB", 2, (0, 19), 7.01),  # llm-d-planner's 0.19.0 log: Triton, values padded to 64
]


@pytest.mark.parametrize(("name", "gpu", "tp", "version", "logged"), LOGGED, ids=lambda v: str(v))
def test_the_weights_vllm_logged(name, gpu, tp, version, logged):
    assert abs(_weights_gib(name, gpu, tp, version) - logged) <= 0.07


def test_the_plan_says_which_layout_it_counts():
    plan = kvbudget.plan(kvbudget.load_model("gpt-oss-20b"), engine="vllm", gpu="A100-80GB", max_model_len=4096,
                         options=EngineOptions(engine_version=(0, 19)), recommend=False)
    note = next(t.text() for t in plan.stack if t.key == "weights")
    assert "Marlin layout of the MXFP4 experts" in note


def test_no_card_no_layout():
    """Without a compute capability (check-log, a card given by its memory alone) the checkpoint's count stands."""
    model = kvbudget.load_model("gpt-oss-20b")
    vllm = get_engine("vllm")
    plain = vllm.loaded_bytes(model, EngineOptions(engine_version=(0, 19)), 1)
    on_h100 = vllm.loaded_bytes(model, EngineOptions(engine_version=(0, 19), compute_capability="9.0"), 1)
    assert plain is not None and on_h100 is not None and on_h100[0] > plain[0]


def test_expert_parallel_ranks_hold_whole_experts():
    """Expert parallelism over 8 H100s (0.14): each rank holds 128 / 8 = 16 experts a layer at full width (14,060,160
    B each, above) beside the rest of gpt-oss-120b in bfloat16, per layer attention q/o 2 x 2880 x 4096, k/v
    2 x 2880 x 512, their biases 4096 + 512 + 512 + 2880, 64 sinks, the router 2880 x 128 + 128 and two norms of 2880;
    embeddings and head 2 x 201,088 x 2880, the final norm, and YaRN's rotary table 4096 x 32 positions x 64."""
    per_layer = 2 * 2880 * 4096 + 2 * 2880 * 512 + 4096 + 512 + 512 + 2880 + 64 + 2880 * 128 + 128 + 2 * 2880
    rest = (36 * per_layer + 2 * 201_088 * 2880 + 2880) * 2
    plan = kvbudget.plan(kvbudget.load_model("gpt-oss-120b"), engine="vllm", gpu="H100-80GB", gpus=8,
                         expert_parallel=True, max_model_len=4096, options=EngineOptions(engine_version=(0, 14)),
                         recommend=False)
    weights = next(t.bytes for t in plan.stack if t.key == "weights")
    assert weights == rest + 36 * 16 * 14_060_160 + 4096 * 32 * 64 * 2
