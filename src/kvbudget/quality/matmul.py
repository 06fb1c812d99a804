"""How llama.cpp multiplies by quantized weights, for the transformers path of a GGUF model.

ggml's CPU matmul does not multiply float activations by the weights: it first converts each activation row to
the weight type's `vec_dot_type` (ggml-cpu.c, type_traits_cpu) and takes integer (or half) dot products. For the
32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) that is 8-bit blocks of 32 with a float16 scale (q8_0, or q8_1
whose codes and scale are q8_0's); F16 and BF16 weights take half-precision inputs; F32 weights take them as they
are. Rounding the inputs is the same in the baseline and in every cache variant, but it is a step function: a
small change in the attention output flips some roundings, and the flips carry a whole step each. On
SmolLM2-135M's Q4_1 file that turns every change to the cache, however small, into a KL of about 0.004 (a bf16 V
cache gives 0.0039 in llama-perplexity, 0.0038 here with the rounding and 0.000004 without), so matching the
engine's figures needs the engine's rounding.

Types with no rule here (the k-quants and i-quants, whose inputs go to 256-value q8_K blocks) are reported by
`unmodelled` and left in float.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvbudget.quality import ggml

_BLOCK_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}  # vec_dot_type q8_0 / q8_1
_HALF = {"F16": torch.float16, "BF16": torch.bfloat16}


def weight_types(model: Any, gguf_file: Path) -> dict[str, str]:
    """The GGUF tensor type of each nn.Linear's weight in `model` (transformers' module names), found through
    gguf-py's name map; the output layer falls back to the token embedding when the file ties them."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    types = {t.name.removesuffix(".weight"): t.tensor_type.name for t in reader.tensors}
    field = reader.get_field("general.architecture")
    arch_name = field.contents() if field is not None else ""
    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        return {}
    blocks = max((int(n.split(".")[1]) + 1 for n in types if n.startswith("blk.")), default=0)
    names = gguf.get_tensor_name_map(arch, blocks)
    found: dict[str, str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        base = names.get_name(name)
        if base == "output" and base not in types:
            base = "token_embd"
        if base in types:
            found[name] = types[base]
    return found


def engine_inputs(model: Any, types: dict[str, str]) -> list[str]:
    """Round every linear layer's input as llama.cpp does for its weight type (a forward pre-hook on each);
    returns the module names whose type has no rule here (left in float)."""
    unmodelled = []
    for name, module in model.named_modules():
        kind = types.get(name)
        if kind is None:
            continue
        if kind in _BLOCK_TYPES:
            module.register_forward_pre_hook(lambda _m, args: (ggml.q8_0_round_trip(args[0]), *args[1:]))
        elif kind in _HALF:
            half = _HALF[kind]
            module.register_forward_pre_hook(lambda _m, args, h=half: (args[0].to(h).to(args[0].dtype), *args[1:]))
        elif kind != "F32":
            unmodelled.append(f"{name} ({kind})")
    return unmodelled
