"""vLLM V1's refusal to start for want of KV cache memory, read from whatever part of it a paste kept.

v1/core/kv_cache_utils.py (check_enough_kv_cache_memory) raises "To serve at least one request with the model's
(0.8-0.10: models's) max seq len (N), (X GiB KV cache is needed, which is larger than the available KV cache memory
(Y GiB). Based on the available memory, the estimated maximum model length is Z. Try increasing ...". Pastes
hard-wrap it (the wrap joined back without its blank), cut it mid-word, or drop its parentheses: each part is read
on its own, and the refusal is the parts that survive."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.engines.base import EngineOptions, LogCheck, LogRow
from kvbudget.engines.vllm.budgetless import shown_settings
from kvbudget.model.spec import ModelSpec
from kvbudget.units import GIB

if TYPE_CHECKING:
    from kvbudget.engines.vllm.engine import VLLMEngine
    from kvbudget.engines.vllm.logsettings import LogSettings

# Each part, with any run of blanks (or none, where a hard wrap was joined back without one) between its words.
_SPACE = r"\s*"
_GIB = r"(\d{1,9}(?:\.\d{1,6})?)"  # a figure in GiB, bounded (a run of digits is never read in quadratic time)


def _loose(words: str) -> str:
    return words.replace(" ", _SPACE)


_START = re.compile(_loose("To serve at least one request with the model") + r"[s']{0,3}" + _SPACE + _loose("max seq len"))
_NEEDED = re.compile(r"\(?" + _GIB + _SPACE + _loose("GiB KV cache is need"))
_AVAILABLE = re.compile(_loose("than the available KV cache memory") + _SPACE + r"\(" + _GIB + _SPACE + r"GiB\)")
_ESTIMATED = re.compile(_loose("stimated maximum model length is") + r"\s*(\d[\d,]{0,15})")
_MAX_LEN = re.compile(_loose("max seq len") + r"\s*\((\d{1,12})\)")
# What marks a pasted fragment as this refusal (any one of them)
SIGNATURES = (_START.pattern, _NEEDED.pattern, _loose("KV cache is needed, which is larger"))


@dataclass(frozen=True)
class Refusal:
    """What survives of the refusal: `needed` and `available` as printed (GiB), None where cut off."""

    max_len: str | None
    needed: str | None
    available: str | None
    estimated: int | None


def read_refusal(text: str) -> Refusal | None:
    """The V1 refusal in `text` (a cleaned log), or None where no part of it is there. V0's refusal ("max seq len
    (N) is larger than the maximum number of tokens ...") is not this one."""
    flat = re.sub(r"\s+", " ", text)
    start = _START.search(flat)
    needed = _NEEDED.search(flat, start.start() if start else 0)
    if start is None and needed is None:
        return None
    at = start.start() if start else needed.start() if needed else 0
    length = _MAX_LEN.search(flat, at)
    available = _AVAILABLE.search(flat, at)
    estimated = _ESTIMATED.search(flat, at)
    return Refusal(max_len=length.group(1) if length and start else None,
                   needed=needed.group(1) if needed else None,
                   available=available.group(1) if available else None,
                   estimated=int(estimated.group(1).replace(",", "")) if estimated else None)


def needed_gib(engine: VLLMEngine, model: ModelSpec, s: LogSettings, options: EngineOptions) -> float:
    """The memory one request of max_model_len takes in `model`'s pool (GiB), as the refusal states it."""
    layout, _ = engine.pool(model, s.kv_dtype, s.tp, options)
    return layout.blocks_per_request(s.max_len) * layout.block_bytes / GIB


def needed_check(engine: VLLMEngine, model: ModelSpec, s: LogSettings, read: dict, assumed: dict,
                 needed: str) -> LogCheck:
    """A refusal cut before the memory it had: the memory one request needs, which needs no budget, beside the
    plan's (under pipeline parallelism, any stage's: which stage fell short needs the budget)."""
    options = s.options()
    stages = [model] if s.pp == 1 else [model.stage(r) for r in engine.pipeline_stages(
        model.num_layers, s.pp, s.partition)]
    if s.pp > 1:
        stages.append(engine.checked_model(model, stages[0], options))
    ours = list(dict.fromkeys(f"{needed_gib(engine, m, s, options):.2f}" for m in stages))
    logged = f"{float(needed):.2f}"
    where = "one request of max_model_len" + (" on a pipeline stage (or the whole model, 0.14-0.16)"
                                               if s.pp > 1 else "")
    row = LogRow("refused: KV cache needed", f"{needed} GiB", " or ".join(f"{g} GiB" for g in ours),
                 logged in ours, f"{where}; the refusal is cut before the memory it had")
    return LogCheck(engine="vllm", model_in_log=None, settings=shown_settings(s, read, assumed), rows=(row,),
                    assumed={**assumed, "KV budget": "not in the log: the refusal is cut before the available KV "
                                                     "cache memory"})
