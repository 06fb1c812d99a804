"""The LoRA slots vLLM allocates beside the weights when it serves adapters (--enable-lora), from vLLM 0.32's
source (vllm/lora/layers/*.py create_lora_weights) and checked against a real vLLM 0.32 process (the CPU backend
runs the same layer code): every supported layer gets, per slot (max_loras of them), an A matrix of max_lora_rank
rows and a B matrix of max_lora_rank columns in the model's dtype:

- QKV: A is rank x hidden for each of Q, K and V; B is (q + 2 kv) / tp x rank (column-parallel: the outputs split);
- output projection: A is rank x q / tp (row-parallel: the inputs split), B is hidden x rank;
- gate and up: A is rank x hidden twice; B is 2 x intermediate / tp x rank;
- down: A is rank x intermediate / tp, B is hidden x rank;
- the embedding: A is vocabulary x rank, B is hidden x rank; the LM head: A is rank x hidden, B is vocabulary x rank
  (both whole on every rank).

They are made when the model loads, so vLLM's 'Model loading took' counts them with the weights.
"""

from __future__ import annotations

from kvbudget.errors import EngineRuleError
from kvbudget.model.params import LLAMA_LIKE, dense_shapes
from kvbudget.model.spec import ModelSpec
from kvbudget.units import format_bytes

POSSIBLE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # config/lora.py: max_lora_rank must be one of these
MAX_VOCAB = 258048  # lora/layers/logits_processor.py refuses a larger vocabulary with LoRA
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def lora_bytes(model: ModelSpec, max_loras: int, rank: int, tp: int) -> tuple[int, str]:
    """Bytes of LoRA slots on one tensor-parallel rank, and how they are made up."""
    if rank not in POSSIBLE_RANKS:
        raise EngineRuleError(f"max_lora_rank {rank}: vLLM takes {', '.join(map(str, POSSIBLE_RANKS))}",
                              param="max_lora_rank")
    if max_loras < 1:
        raise EngineRuleError(f"max_loras {max_loras}: give at least 1", param="max_loras")
    s = dense_shapes(model, LLAMA_LIKE, "LoRA slots are")
    if s.vocab > MAX_VOCAB:
        raise EngineRuleError(f"enable_lora: vLLM refuses LoRA for a vocabulary of {s.vocab:,} (more than "
                              f"{MAX_VOCAB:,})", param="enable_lora")
    per_layer = 7 * s.hidden + (2 * s.q + 2 * s.kv + 3 * s.mlp) // tp
    values = rank * (2 * s.vocab + 2 * s.hidden + s.layers * per_layer)
    total = max_loras * values * DTYPE_BYTES.get(model.dtype, 2)
    return total, (f"with {format_bytes(total)} of LoRA slots ({max_loras} of rank {rank} beside the "
                   "embedding, LM head and every projection, from vLLM 0.32's source)")
