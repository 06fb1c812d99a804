"""`kvbudget check-log`: an engine's startup log beside kvbudget's prediction for the same settings.

Which engine wrote the log, and how to read it, is each engine's own knowledge (the `ReadsLogs` capability:
`reads_log` and `check_log`); this module finds the engine and the model the log names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvbudget.engines import ENGINES, LogCheck, ReadsLogs
from kvbudget.engines.speclog import ReadsSpeculativeLogs
from kvbudget.errors import KVBudgetError
from kvbudget.model.spec import ModelSpec
from kvbudget.speculative import LoggedSpeculative


def detect_engine(text: str) -> ReadsLogs:
    """The registered engine whose startup log this is."""
    readers = [e for e in ENGINES.values() if isinstance(e, ReadsLogs)]
    for engine in readers:
        if engine.reads_log(text):
            return engine
    names = ", ".join(e.name for e in readers)
    raise KVBudgetError(f"check-log: found no KV cache lines of a known engine ({names}) in the log; pass the "
                        "engine's startup log at INFO level (llama-server: -lv 4)")


def model_in_log(text: str) -> str | None:
    """The model the log names: vLLM's model='...', or llama.cpp's GGUF path (its folder's config.json)."""
    m = (re.search(r"model='([^']+)'", text) or re.search(r"model_path='([^']+)'", text)
         or re.search(r"(?:vllm serve|--model-path|--model)\s+(\S+)", text))
    if m:
        return m.group(1)
    m = re.search(r"tensors from (\S+\.gguf)", text)
    if m:
        return str(Path(m.group(1)).parent)
    return None


def speculative_in_log(text: str) -> LoggedSpeculative | None:
    """What the log says about speculative decoding (the method, the draft tokens, the draft model, the drafter's
    weights and pool), read by the engine that wrote it; None where it drafts nothing or its engine does not say."""
    engine = detect_engine(text)
    return engine.speculative_in_log(text) if isinstance(engine, ReadsSpeculativeLogs) else None


def check_log(text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
    """The log's KV figures beside kvbudget's for the same settings; `given` states settings the log leaves out
    (max_model_len, tp, pp, kv_cache_dtype, max_num_batched_tokens, engine_version)."""
    return replace(detect_engine(text).check_log(text, model, given), model_in_log=model_in_log(text))
