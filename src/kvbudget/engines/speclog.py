"""Speculative decoding in start-up logs, engine-neutral: the capability an engine's log reader offers
(`ReadsSpeculativeLogs`: what its log says about the drafter, as a `LoggedSpeculative`), and the rows check-log
prints for it: shown beside what was asked and planned where a plan is given (`speculative_rows`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath
from typing import Protocol, runtime_checkable

from kvbudget.engines.base import LogRow
from kvbudget.errors import KVBudgetError
from kvbudget.speculative import LoggedAcceptance, LoggedSpeculative, Speculative
from kvbudget.units import GIB


@runtime_checkable
class ReadsSpeculativeLogs(Protocol):
    """An engine whose start-up logs say whether and how it drafts."""

    def speculative_in_log(self, text: str) -> LoggedSpeculative | None:
        """What the log says about speculative decoding; None where it drafts nothing (or does not say)."""


@runtime_checkable
class ReadsAcceptanceLogs(Protocol):
    """An engine whose logs print the acceptance its drafts met (a periodic metrics line)."""

    def acceptance_in_log(self, text: str) -> LoggedAcceptance | None:
        """The log's last acceptance metrics line; None where it has none."""


ACCEPTANCE_LOG_TAIL_BYTES = 16 << 20  # the end of a log searched for acceptance lines (they are printed every few s)


def acceptance_in_file(path: str, spec: Speculative) -> Speculative:
    """`spec` with the acceptance read from the log at `path` (the last metrics line any engine's reader finds in
    its last ACCEPTANCE_LOG_TAIL_BYTES), its source said in `acceptance_note`."""
    from kvbudget.engines import ENGINES
    from kvbudget.files import read_tail

    text, cut = read_tail(path, "acceptance_from", ACCEPTANCE_LOG_TAIL_BYTES)
    for engine in ENGINES.values():
        logged = engine.acceptance_in_log(text) if isinstance(engine, ReadsAcceptanceLogs) else None
        if logged is not None:
            rates, how = logged.rates(spec.num_tokens)
            tail = "" if not cut else f" (its last {ACCEPTANCE_LOG_TAIL_BYTES >> 20} MiB)"
            note = f"read from {path}{tail}: the last of {logged.lines:,} {engine.name} metrics lines, {how}"
            return replace(spec, acceptance=rates, acceptance_note=note)
    raise KVBudgetError(f"acceptance_from {path}: no acceptance metrics line found (vLLM's 'SpecDecoding metrics: "
                        "... Mean acceptance length' or SGLang's 'Decode batch ... accept len'); give a log of a run "
                        "that drafted, or the rates with acceptance", param="acceptance_from")


def method_text(logged: LoggedSpeculative) -> str:
    """The method as the log names it, with kvbudget's name where it differs."""
    name = logged.engine_method or "(not named)"
    if logged.method is None:
        return f"{name} (not one kvbudget models)"
    return name if name.lower().replace("_", "-") == str(logged.method) else f"{name} ({logged.method})"


def _same_model(a: str, b: str) -> bool:
    """Whether two ways of naming a model (a path, a Hub id) name the same one: their last parts agree."""
    return PurePosixPath(a.rstrip("/")).name.lower() == PurePosixPath(b.rstrip("/")).name.lower()


def speculative_rows(logged: LoggedSpeculative, asked: Speculative | None = None, *,
                     drafter_bytes: int | None = None, draft_pool_tokens: int | None = None) -> list[LogRow]:
    """The log's speculative settings and drafter lines as rows. Alone, each is shown (never a mismatch); with
    `asked` (the same settings as a command takes them), the method, the draft tokens per step and the draft model
    are checked against the log's; with `drafter_bytes` (the plan's drafter weights per GPU) the logged weights are
    shown beside it; with `draft_pool_tokens` (the engine's rule for a pool sized apart) the logged pool is
    checked against it."""
    rows = [LogRow("speculative: method", method_text(logged), str(asked.method) if asked else "-",
                   None if asked is None or logged.method is None else logged.method == asked.method,
                   "read from " + (logged.lines[0].strip()[:120] if logged.lines else "the log"))]
    if logged.num_tokens is not None or asked is not None:
        tokens = "-" if logged.num_tokens is None else str(logged.num_tokens)
        rows.append(LogRow("speculative: draft tokens per step", tokens, str(asked.num_tokens) if asked else "-",
                           None if asked is None or logged.num_tokens is None
                           else logged.num_tokens == asked.num_tokens,
                           "verified as k + 1 query tokens per sequence each step"))
    if logged.num_steps is not None or logged.topk is not None or logged.num_draft_tokens is not None:
        tree = ", ".join(f"{name} {value}" for name, value in (("steps", logged.num_steps), ("top-k", logged.topk),
                                                                ("draft tokens", logged.num_draft_tokens))
                         if value is not None)
        rows.append(LogRow("speculative: draft tree", tree, "-", None,
                           "a chain where top-k is 1 (draft tokens = steps + 1), else a tree of draft tokens"))
    if logged.draft is not None or (asked is not None and asked.draft_id is not None):
        ours = asked.draft_id if asked is not None and asked.draft_id else "-"
        same = None if logged.draft is None or ours == "-" else _same_model(logged.draft, ours)
        rows.append(LogRow("speculative: draft model", logged.draft or "-", ours, same,
                           "compared by the last part of the path or Hub id"))
    if logged.drafter_weights_gib is not None or logged.weights_include_drafter:
        logged_text = (f"{logged.drafter_weights_gib:.2f} GiB" if logged.drafter_weights_gib is not None
                       else "in the weights line")
        note = ("the drafter's own load line" if logged.drafter_weights_gib is not None else
                "the engine loads the drafter before it prints 'Model loading took': that figure counts both")
        if logged.shares:
            note += "; shared with the target: " + " and ".join(logged.shares)
        ours = "-" if drafter_bytes is None else f"{drafter_bytes / GIB:.2f} GiB"
        if drafter_bytes is not None and logged.drafter_weights_gib:
            note += f" ({drafter_bytes / (logged.drafter_weights_gib * GIB) - 1:+.1%}: kvbudget counts parameters)"
        rows.append(LogRow("speculative: drafter weights", logged_text, ours, None, note))
    if logged.draft_pool_tokens is not None:
        size = f", {logged.draft_pool_gib:.2f} GB" if logged.draft_pool_gib is not None else ""
        extra = (f"; {logged.draft_pool_tokens - logged.pool_tokens:+,} tokens beside the target's pool"
                 if logged.pool_tokens is not None else "")
        rows.append(LogRow("speculative: draft pool (tokens)", f"{logged.draft_pool_tokens:,}{size}",
                           "-" if draft_pool_tokens is None else f"{draft_pool_tokens:,}",
                           None if draft_pool_tokens is None else draft_pool_tokens == logged.draft_pool_tokens,
                           "the drafter's own pool, allocated after the target's" + extra))
    return rows

