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

from kvbudget.engines import ENGINES, LogCheck, ReadsLogs, ReadsLogsWithoutModel
from kvbudget.engines.speclog import ReadsSpeculativeLogs
from kvbudget.errors import KVBudgetError, named
from kvbudget.logtext import clean
from kvbudget.model.spec import ModelSpec
from kvbudget.speculative import LoggedSpeculative


def detect_engine(text: str) -> ReadsLogs:
    """The registered engine whose startup log this is (read as `logtext.clean` leaves it)."""
    return _engine(clean(text))


def _engine(text: str) -> ReadsLogs:
    readers = [e for e in ENGINES.values() if isinstance(e, ReadsLogs)]
    for engine in readers:
        if engine.reads_log(text):
            return engine
    names = ", ".join(e.name for e in readers)
    raise KVBudgetError(f"check-log: found no KV cache lines of a known engine ({names}) in the log; pass the "
                        "engine's startup log at INFO level (llama-server: -lv 4)")


def model_in_log(text: str) -> str | None:
    """The model the log names: vLLM's model='...', SGLang's model_path, TGI's model_id, the command line's, or
    llama.cpp's GGUF path (its folder's config.json)."""
    m = (re.search(r"model='([^']+)'", text) or re.search(r"model_path='([^']+)'", text)
         or re.search(r'model_id: "([^"]+)"', text)
         or re.search(r"(?:vllm serve|--model-path|--model)[\s=]+['\"]?([^\s'\"-][^\s'\"]*)", text))
    if m:
        return m.group(1)
    m = re.search(r"tensors from (\S+\.gguf)", text)
    if m:
        return str(Path(m.group(1)).parent)
    return None


# What a log shows of its model when it names no path to it (a served name, an architecture, a GGUF's name).
_MODEL_NAMES = (("served-model-name", r"served[_-]model[_-]name['\"]?\s*[=:]\s*\[?\s*['\"]?([\w.:/-]{2,80})"),
                ("architecture", r"\b([A-Z]\w{1,40}For(?:CausalLM|ConditionalGeneration))\b"),
                ("model_type", r"\bmodel_type[=: ]+['\"]?(\w{2,40})"),
                ("general.name", r"general\.name\s+(?:str\s+)?=\s+([^\n]{2,80})"))


def missing_model(text: str, reason: str) -> str:
    """The one line saying which `model` to give for a log whose model cannot be read: `reason`, the names the log
    shows of its model and the catalog's closest names."""
    from kvbudget.catalog import similar

    path = model_in_log(text)
    shown = [(label, m.group(1).strip()) for label, pattern in _MODEL_NAMES
             for m in [re.search(pattern, text)] if m]
    if path:
        shown.insert(0, ("model path", path))
    shown = list({value: (label, value) for label, value in reversed(shown)}.values())[::-1]  # each name once
    names = [name for _, value in shown for name in similar(value.rstrip("/").rsplit("/", 1)[-1], limit=2)]
    said = "; it shows " + ", ".join(f"{label} {value!r}" for label, value in shown) if shown else ""
    closest = f" (the catalog's closest: {', '.join(dict.fromkeys(names))})" if names else ""
    return (f"check-log: {reason}{said}; pass {named('model')} (a catalog name, config.json, model folder or Hub "
            f"id){closest} for the rows that need the model")


def check_log_without_model(text: str, reason: str, given: Mapping[str, Any] | None = None) -> LogCheck:
    """The rows of the log that need no model (a partial check: `missing_model` says which model to give;
    `reason`: why the log's own model cannot be read); an error where its engine checks nothing without one."""
    text = clean(text)
    engine = _engine(text)
    if not isinstance(engine, ReadsLogsWithoutModel):
        raise KVBudgetError(missing_model(text, reason))
    return replace(engine.check_log_without_model(text, given), model_in_log=model_in_log(text))


def speculative_in_log(text: str) -> LoggedSpeculative | None:
    """What the log says about speculative decoding (the method, the draft tokens, the draft model, the drafter's
    weights and pool), read by the engine that wrote it; None where it drafts nothing or its engine does not say."""
    return _speculative(clean(text))


def _speculative(text: str) -> LoggedSpeculative | None:
    engine = _engine(text)
    return engine.speculative_in_log(text) if isinstance(engine, ReadsSpeculativeLogs) else None


def draft_in_log(text: str, draft_model: str | None = None) -> dict[str, Any]:
    """The drafter of a log that drafts with a model of its own (EAGLE, EAGLE-3 heads, a draft model), as check-log's
    settings take it: `draft_model` the name it is loaded by (the one given, else the log's) and `draft` its spec
    where it can be read here (the engine asks for `draft_model` where it needs one it does not have); none for
    logs that draft with no model of their own. A `draft_model` given that cannot be read is an error."""
    return _draft(clean(text), draft_model)


def _draft(text: str, draft_model: str | None) -> dict[str, Any]:
    from kvbudget.model.load import load_model

    logged = _speculative(text)
    needs = logged is not None and logged.method is not None and logged.method.needs_draft_model
    if draft_model and not needs:
        drafts = (f"drafts with {logged.engine_method or logged.method}, which has no draft model of its own"
                  if logged is not None else "does not draft")
        raise KVBudgetError(f"draft_model: the log {drafts}; leave {named('draft_model')} out", param="draft_model")
    source = draft_model or (logged.draft if needs and logged is not None else None)
    if not source:
        return {}
    try:
        return {"draft_model": source, "draft": load_model(source)}
    except KVBudgetError as exc:
        if draft_model:
            raise KVBudgetError(f"draft_model {draft_model!r}: {exc}", param="draft_model") from None
        # why, without the loader's own advice (the engine's error says what to pass)
        return {"draft_model": source, "draft_unread": str(exc).removeprefix(f"{source}: ").split("; pass ")[0]}


def check_log(text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
    """The log's KV figures beside kvbudget's for the same settings; `given` states settings the log leaves out
    (max_model_len, tp, pp, kv_cache_dtype, max_num_batched_tokens, engine_version, draft_model). A drafter the
    log names by a path or id readable here is loaded (`draft_in_log`) unless `given` names one."""
    text = clean(text)
    given = dict(given or {})
    if not given.keys() & {"draft", "draft_unread"}:
        given.update(_draft(text, given.get("draft_model")))
    return replace(_engine(text).check_log(text, model, given), model_in_log=model_in_log(text))
