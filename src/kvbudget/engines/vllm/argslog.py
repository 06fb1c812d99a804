"""vLLM logs that state no KV figure but their settings: the server's argument namespace (`Namespace(...)` or its
fields alone, as vllm/entrypoints/openai/api_server.py prints its args), and the cross-layer KV cache shape of an
offloading connector (v1/worker/kv_connector_model_runner_mixin.py, allocate_uniform_kv_caches, 2026: "Allocating a
cross layer KV cache of shape %s", the shape `(num_blocks, ...)` with the layers, K and V, the block's tokens, the KV
heads of a rank and the head size in the attention backend's stride order)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvbudget.dtypes import get_dtype
from kvbudget.engines.base import LogCheck, LogRow
from kvbudget.engines.settingscheck import settings_rows
from kvbudget.model.spec import ModelSpec
from kvbudget.units import format_bytes

if TYPE_CHECKING:
    from kvbudget.engines.vllm.logsettings import LogSettings

SHAPE = re.compile(r"Allocating a cross layer KV cache of shape \((\d{1,12}(?:, \d{1,9}){3,7})\)")
NAMESPACE = r"\bnum_gpu_blocks_override=(?:None|\d)"  # a field only vLLM's engine arguments have
# V0's engine line (vllm/engine/llm_engine.py, 0.2 to 0.6: "Initializing an LLM engine (v%s) with config: model=%r,
# ..., max_seq_len=%d, ..., tensor_parallel_size=%d, ..."; no version before 0.3): its settings alone where the log
# is cut before the blocks line
ENGINE_CONFIG = r"Initializing an LLM engine (?:\(v[\w.+-]{1,40}\) )?with config: model="
# worker.py's profiling results (0.6.4 to 0.7; one line each from 0.6.5, under '(VllmWorkerProcess pid=...)' on the
# workers): the engine's share (total x gpu_memory_utilization), read alone by engines/vllm/nomodel.py
SHARE = r"the current vLLM instance can use total_gpu_memory \("
SIGNATURES = (SHAPE.pattern, NAMESPACE, ENGINE_CONFIG, SHARE)


def check(text: str, model: ModelSpec, st: LogSettings, settings: dict, assumed: dict,
          block: Callable[[], tuple[int, int]]) -> LogCheck | None:
    """The shape line's values a block against the model's, the blocks and their memory shown; else the argument
    namespace's max_model_len and tensor parallel size against the model; None where the log has neither.
    `block()`: the engine's block for the model under these settings (its bytes, its tokens)."""
    if shape := SHAPE.search(text):
        dims = [int(d) for d in shape.group(1).split(", ")]
        blocks, per_block = dims[0], math.prod(dims[1:])
        block_bytes, block_size = block()
        dtype = get_dtype(model.dtype if st.kv_dtype == "auto" else st.kv_dtype)
        ours = block_bytes // dtype.bytes_for(1)
        shown = (LogRow("cross-layer KV cache: values a block", f"{per_block:,}", f"{ours:,}", per_block == ours,
                       f"the shape's dimensions but the first (blocks) multiplied; {block_size}-token blocks "
                       f"of every layer on a rank"),
                LogRow("GPU blocks", f"{blocks:,}", "-", None, "the shape's first dimension"),
                LogRow("KV memory these blocks take", "-", format_bytes(blocks * block_bytes), None,
                       "per GPU; the log prints no budget"))
        return LogCheck(engine="vllm", model_in_log=None, settings=settings, rows=shown,
                        assumed={**assumed, "KV budget": "not printed: the memory of the shape's blocks"})
    if re.search(NAMESPACE, text) or re.search(ENGINE_CONFIG, text):
        rows = settings_rows(model, max_len=st.max_len if "max_model_len" not in assumed else None,
                             tp=st.tp if "tp" not in assumed else None, length_name="max_model_len")
        if rows:
            return LogCheck(engine="vllm", model_in_log=None, settings=settings, rows=tuple(rows),
                            assumed={**assumed, "KV budget": "not in the log (its arguments only): what they allow "
                                                             "against the model checked"})
    return None
