"""How vLLM lays out an MXFP4 checkpoint's routed experts (gpt-oss) in GPU memory, per release and GPU: the bytes its
'Model loading took' counts beyond the checkpoint's own 4.25 bits per weight.

Read in the wheels of vLLM 0.10.1, 0.10.2, 0.11.0, 0.12.0, 0.14.0, 0.19.0, 0.24.0 and 0.32.0 (the Python source is
the sdist's; the bundled Triton layouts also in 0.15 to 0.23), `model_executor/layers/quantization/mxfp4.py` (0.19 on:
`fused_moe/oracle/mxfp4.py` select_mxfp4_moe_backend and mxfp4_round_up_hidden_size_and_intermediate_size; 0.32 ranks
Humming ahead of Marlin on 9.0 only, where the Triton kernels come first):

- Which kernel. Marlin on every CUDA GPU below compute capability 9.0 (0.10.1 `_should_use_marlin`: "marlin kernel
  has better performance on ampere"; 0.11 `get_mxfp4_backend`: capability < 9; 0.12 on: the Triton kernels need
  9.0 <= capability < 11.0) and on consumer Blackwell (12.x, the same bound). On Hopper (9.0) Marlin too up to 0.11:
  the Triton kernels need the optional `triton_kernels` package, which the wheels neither ship nor require before
  0.12 (`has_triton_kernels`; 0.12.0's wheel is the first with `vllm/third_party/triton_kernels`), and 0.10.1 pins
  torch 2.7.1 (Marlin below torch 2.8); from 0.12 the Triton kernels. An install that adds `triton_kernels` itself
  runs them earlier (0.11.1-0.11.2 with torch 2.9: the layout below, 1.6 GiB less for gpt-oss-120b): not assumed.
  Data-centre Blackwell (10.x) takes FlashInfer's kernels and AMD and Intel cards their own: not modelled (the
  checkpoint's count stands).
- Marlin (`create_weights` and `utils/marlin_utils_fp4.py` prepare_moe_fp4_layer_for_marlin): the expert width on a
  rank rounded up to 128 and the hidden size to 256; 4-bit values, one 8-bit scale per 32 (float8_e8m0fnu after
  `mxfp4_marlin_process_scales`), biases in the model's 16-bit dtype, on the padded sizes.
- Triton on Hopper (`process_weights_after_loading`, `utils/mxfp4_utils.py` _swizzle_mxfp4, torch >= 2.8.1 from 0.12:
  swizzled): the expert width rounded up to 64; values as stored (`hopper_value.py` pads rows to 16 and row bytes to
  32; the triton_kernels that 0.17 to 0.20 bundle first pad both to 64, absent from 0.16's and 0.22's); the biases
  made float32; the scales swizzled into a new tensor (`triton_kernels/tensor_details/layout_details/
  hopper_scale.py`: rows padded to a multiple of 2 x num_warps x 2 x 8 = 256 at 8 warps, columns to 2) while the
  loaded scale parameters stay on the layer (only the values are deleted), so the scales are held twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvbudget.dtypes import get_dtype
from kvbudget.engines.base import EngineOptions, layer_stages
from kvbudget.engines.vllm.releases import Release, release
from kvbudget.model.params import count_parameters, routed_experts
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB, cdiv

FIRST = (0, 10)  # gpt-oss support arrives in 0.10.1
TRITON_BUNDLED = (0, 12)  # vllm/third_party/triton_kernels first ships in 0.12.0's wheel (with torch 2.9.0)
VALUE_PREPAD = ((0, 17), (0, 22))  # releases whose hopper_value.py pads both sides of each matrix to 64 first
MXFP4_BLOCK = 32  # values per 8-bit scale (OCP MX)
HOPPER_SCALE_ROWS = 2 * 8 * 2 * 8  # hopper_scale.py SWIZZLE_ALIGN_M at num_warps 8 (vLLM's default outside batched MoE)


class Mxfp4Kernel(Enum):
    """The MoE kernels whose weight layout kvbudget models."""

    MARLIN = "Marlin"
    TRITON = "Triton (Hopper)"


@dataclass(frozen=True)
class Padding:
    """How a kernel rounds up the expert width on a rank (`inter`) and the hidden size (`hidden`)."""

    inter: int
    hidden: int


PADDING = {Mxfp4Kernel.MARLIN: Padding(128, 256), Mxfp4Kernel.TRITON: Padding(64, 1)}


def round_up(x: int, to: int) -> int:
    return cdiv(x, to) * to


def mxfp4_kernel(rel: Release, compute_capability: str | None) -> Mxfp4Kernel | None:
    """The MoE kernel release `rel` runs MXFP4 experts with on a CUDA GPU of `compute_capability` ("9.0"); None where
    kvbudget does not model it (no capability known, data-centre Blackwell, a release without gpt-oss)."""
    if compute_capability is None or rel.version < FIRST:
        return None
    major = int(compute_capability.split(".")[0])
    if major < 9 or major >= 11:
        return Mxfp4Kernel.MARLIN
    if major == 9:
        return Mxfp4Kernel.MARLIN if rel.version < TRITON_BUNDLED else Mxfp4Kernel.TRITON
    return None


def expert_bytes(kernel: Mxfp4Kernel, inter: int, hidden: int, bias_bytes: int, prepad: bool = False) -> int:
    """One expert's loaded bytes on one rank: gate_up (2 x `inter` rows of `hidden`) and down (`hidden` rows of
    `inter`) with their scales and biases, `inter` being the expert width on that rank (`prepad`: the Hopper value
    layout of 0.17 to 0.20, which pads each matrix to multiples of 64 first)."""
    pad = PADDING[kernel]
    i, h = round_up(inter, pad.inter), round_up(hidden, pad.hidden)
    values = 3 * i * h // 2
    scales = 3 * i * h // MXFP4_BLOCK
    if kernel is Mxfp4Kernel.MARLIN:
        return values + scales + (2 * i + h) * bias_bytes
    # hopper_value.py pads each matrix's rows to 16 and its bytes per row to 32, or first both to 64
    rows, row_bytes = (64, 64) if prepad else (16, 32)
    values = (round_up(2 * i, rows) * round_up(h // 2, row_bytes)
              + round_up(h, rows) * round_up(i // 2, row_bytes))
    swizzled = (round_up(2 * i, HOPPER_SCALE_ROWS) * round_up(h // MXFP4_BLOCK, 2)
                + round_up(h, HOPPER_SCALE_ROWS) * round_up(i // MXFP4_BLOCK, 2))
    return values + scales + swizzled + (2 * i + h) * 4  # float32 biases


def mxfp4_layout(model: ModelSpec, rel: Release, compute_capability: str | None, tp: int, layers: range,
                 ep: int = 1) -> tuple[int, str] | None:
    """What release `rel` loads for `model`'s MXFP4 experts in `layers` on one of `tp` ranks beyond the checkpoint's
    count of them, and its note; None for a model without MXFP4 experts (quant_method mxfp4) or where the kernel is
    not modelled. `ep` > 1: expert parallelism, each of tp x ep ranks holding its share of the experts whole (vLLM's
    FusedMoE splits no expert when --enable-expert-parallel is on)."""
    from kvbudget.model.weights import FP4_EXPERT_BYTES, mxfp4_checkpoint  # (a weights' reader: not on every path)

    experts = routed_experts(model)
    if not mxfp4_checkpoint(model) or experts is None:
        return None
    kernel = mxfp4_kernel(rel, compute_capability)
    if kernel is None:
        return None
    groups = [g for g in count_parameters(model).groups if g.part == "experts" and g.layer in layers]
    counted = sum(g.count for g in groups) / (tp * ep) * FP4_EXPERT_BYTES
    moe_layers = len({g.layer for g in groups})
    prepad = VALUE_PREPAD[0] <= rel.version < VALUE_PREPAD[1]
    width, share = (experts.intermediate // tp, experts.experts) if ep == 1 else (
        experts.intermediate, experts.experts / (tp * ep))
    loaded = moe_layers * share * expert_bytes(kernel, width, experts.hidden, get_dtype(model.dtype).bytes_for(1),
                                               prepad)
    extra = int(loaded - counted)
    return extra, (f"vLLM {rel.label}'s {kernel.value} layout of the MXFP4 experts {extra / GIB:+.2f} GiB (padded "
                   "sizes, scales and biases as the kernel keeps them, from the source)")


def experts_as_loaded(model: ModelSpec, options: EngineOptions, tp: int, pp: int, ep: int = 1
                      ) -> tuple[int, str] | None:
    """`mxfp4_layout` on the most loaded of `pp` pipeline stages, for the release and GPU `options` name."""
    stages = layer_stages(model.num_layers, pp, options.pp_layer_partition)
    rel, capability = release(options), options.compute_capability
    found = [x for x in (mxfp4_layout(model, rel, capability, tp, s, ep) for s in stages) if x]
    return max(found, key=lambda x: x[0]) if found else None
