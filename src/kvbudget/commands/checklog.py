"""`check-log`: an engine's startup log beside kvbudget's prediction for the same settings."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.commands.options import load, option, warn
from kvbudget.errors import KVBudgetError
from kvbudget.logtext import MAX_LOG_CHARS
from kvbudget.speculative import MAX_SPECULATIVE_TOKENS
from kvbudget.units import parse_positive_ints

if TYPE_CHECKING:
    from kvbudget.engines import LogCheck
    from kvbudget.model.spec import ModelSpec

GIVEN = "settings the log does not state (otherwise the engine's default is assumed and shown as assumed)"


@dataclass(frozen=True, kw_only=True)
class CheckLogRequest:
    """What `check-log` is asked: the log (its text read from the file, or stdin for -), and the settings it does
    not state (None: the engine's default, shown as assumed)."""

    log: str = option("startup log of vLLM, SGLang, TGI or llama-server (- for stdin)", "", positional=True)
    model: str | None = option("the model (catalog name, config.json, folder, Hub id) when the log's model path is "
                               "not readable here", web=False)
    json: bool = option("print JSON", False, web=False)
    engine_version: str | None = option("the engine's version, e.g. 0.8.5 (vLLM changed what it prints)",
                                        group=GIVEN)
    max_model_len: int | None = option("", group=GIVEN, kind=int)
    tp: int | None = option("tensor parallel size", group=GIVEN, kind=int)
    pp: int | None = option("pipeline parallel size", group=GIVEN, kind=int)
    kv_cache_dtype: str | None = option("auto, fp8, ...", group=GIVEN)
    max_num_batched_tokens: int | None = option("", group=GIVEN, kind=int)
    pp_layer_partition: str | None = option("vLLM's VLLM_PP_LAYER_PARTITION, e.g. 16,32", group=GIVEN)
    attention_backend: str | None = option("vLLM's MLA backend: FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, "
                                           "FLASH_ATTN_MLA, TRITON_MLA", group=GIVEN)
    num_speculative_tokens: int | None = option("vLLM: draft tokens per step (speculative_config; alone: with the "
                                                "model's MTP layers)", group=GIVEN, kind=int)
    draft_model: str | None = option("vLLM: the drafter of an EAGLE, EAGLE-3 or draft-model log (config.json, folder, "
                                     "catalog name, Hub id) when the log's draft path is not readable here",
                                     group=GIVEN, web=False)


@dataclass(frozen=True)
class LogAnswer:
    """The log's check and the model it was checked against (None: a partial check, the rows that need no model);
    `to_dict()` (the check's) is what --json prints."""

    check: LogCheck
    model: ModelSpec | None
    missing: str = ""  # a partial check (no model, or the lines the full check needs): the one line saying what to give

    def to_dict(self) -> dict[str, Any]:
        return self.check.to_dict() | {"partial": bool(self.missing), "missing": self.missing}


GIVEN_NAMES = ("engine_version", "max_model_len", "tp", "pp", "kv_cache_dtype", "max_num_batched_tokens",
               "pp_layer_partition", "attention_backend", "num_speculative_tokens")


MAX_LINE_CHARS = 64 * 1024  # of one line (a line without an end is read in pieces of this)
# where an engine's start-up section ends: what follows is traffic, which check-log does not read
STARTED = ("Application startup complete", "server is listening on", "The server is fired up and ready to roll")


def read_log(path: str) -> str:
    """The log's start-up section: the file's lines (undecodable bytes replaced), or stdin's for -, up to the line
    saying the server started, and MAX_LOG_CHARS at most (said on stderr where the log is cut there)."""
    if path == "-":
        return _start_up(sys.stdin, "stdin")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return _start_up(fh, path)
    except OSError as exc:
        raise KVBudgetError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _start_up(lines: Any, name: str) -> str:
    kept: list[str] = []
    size = 0
    while line := lines.readline(MAX_LINE_CHARS):
        kept.append(line)
        size += len(line)
        if any(mark in line for mark in STARTED):
            break
        if size >= MAX_LOG_CHARS:
            warn(f"check-log: read the first {MAX_LOG_CHARS // (1024 * 1024)} MiB of {name}, which does not say "
                 "the server started by then; the rest is not read")
            break
    return "".join(kept)


def model_of(ask: CheckLogRequest, text: str) -> ModelSpec | str:
    """The model the request names, else the one the log names; where the log names none that can be read here,
    why (the caller checks what needs no model and says which model to give)."""
    from kvbudget.checklog import model_in_log

    source = ask.model or model_in_log(text)
    if source is None:
        return "the log names no model path"
    try:
        return load(source)
    except KVBudgetError as exc:
        if ask.model:
            raise
        return f"the log's model {source!r} cannot be read here ({str(exc).split('; pass ')[0]})"


def given(ask: CheckLogRequest) -> dict[str, Any]:
    """The settings the request states, checked (positive counts, a partition of layers)."""
    if ask.pp_layer_partition:
        parse_positive_ints(ask.pp_layer_partition, "pp_layer_partition")
    if ask.num_speculative_tokens is not None and not 0 <= ask.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        raise KVBudgetError(f"num_speculative_tokens: {ask.num_speculative_tokens} is out of range; give 0 (none) to "
                            f"{MAX_SPECULATIVE_TOKENS}", param="num_speculative_tokens")
    for name in ("max_model_len", "tp", "pp", "max_num_batched_tokens"):
        value = getattr(ask, name)
        if value is not None and value <= 0:
            raise KVBudgetError(f"{name}: {value} is not positive", param=name)
    return {name: getattr(ask, name) for name in GIVEN_NAMES if getattr(ask, name) is not None}


def answer(ask: CheckLogRequest) -> LogAnswer:
    """The log beside kvbudget's figures for its model and settings."""
    from kvbudget.checklog import check_log, check_log_without_model, detect_engine, draft_in_log, missing_model

    text = read_log(ask.log)
    detect_engine(text)
    settings = given(ask)
    model = model_of(ask, text)
    if isinstance(model, str):  # no model: the rows that need none, and which model to give
        shown = check_log_without_model(text, model, settings)
        if not shown.rows:  # nothing to show without the model: the one line, not an empty check
            raise KVBudgetError(missing_model(text, f"{model}, and its KV lines hold nothing to check without it"))
        return LogAnswer(shown, None, missing_model(text, model))
    settings.update(draft_in_log(text, ask.draft_model))
    try:
        return LogAnswer(check_log(text, model, settings), model)
    except KVBudgetError as exc:  # the log lacks what the full check needs: what needs neither, and what it lacks
        partial = None if exc.param else check_log_without_model(text, str(exc), settings)
        if partial is None or not partial.rows:
            raise
        return LogAnswer(partial, model, str(exc))
