"""The guard's log, through the standard `logging` module: its decisions and events (`event`) as JSON lines, its
notes and failures as `kvbudget guard: ...` lines, all written by the logger `kvbudget.guard`.

By default that logger writes to stderr (as it is when each line is written) and does not propagate: a handler
added to `logging.getLogger("kvbudget.guard")` sees every line too, and `JsonLines` formats them as the guard
does. A guard given a stream of its own (`guard_log(stream)`, the library's `decision_log`) gets a logger of the
same name, outside the hierarchy, that writes there alone: two guards in one process keep their logs apart."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

NAME = "kvbudget.guard"
INFO = logging.INFO


class JsonLines(logging.Formatter):
    """An event (a record carrying `fields`) as one JSON line, `{"ts": ..., **fields}`; any other record as
    `kvbudget guard: message`, with its traceback when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record.__dict__.get("fields")
        if fields is not None:
            return json.dumps({"ts": round(record.created, 3), **fields})
        text = f"kvbudget guard: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class Stream(logging.StreamHandler):
    """A line per record to `to`, or to `sys.stderr` as it is when the line is written; flushed each time."""

    def __init__(self, to: TextIO | None = None):
        super().__init__(to or sys.stderr)
        self.to = to
        self.setFormatter(JsonLines())

    def emit(self, record: logging.LogRecord) -> None:
        if self.to is None:
            self.stream = sys.stderr
        super().emit(record)


def guard_log(to: TextIO | None = None) -> logging.Logger:
    """The logger a guard writes to: `kvbudget.guard` on stderr, or a logger of its own writing to `to`."""
    if to is not None:
        own = logging.Logger(NAME, INFO)  # not registered: it goes when its guard goes
        own.addHandler(Stream(to))
        own.propagate = False
        return own
    shared = logging.getLogger(NAME)
    if not any(isinstance(h, Stream) for h in shared.handlers):
        shared.addHandler(Stream())
        shared.setLevel(INFO)
        shared.propagate = False
    return shared


class Event(logging.LogRecord):
    """An event's record, made on the request path without LogRecord's caller, thread and process lookups (what a
    formatter reads is there; where it was logged from is not)."""

    def __init__(self, name: str, fields: dict[str, Any]):
        created = time.time()
        self.__dict__.update(
            name=name, msg=fields.get("event", ""), args=(), levelno=INFO, levelname="INFO", pathname="", filename="",
            module="", lineno=0, funcName=None, exc_info=None, exc_text=None, stack_info=None, created=created,
            msecs=(created - int(created)) * 1000, relativeCreated=0.0, thread=None, threadName=None, process=None,
            processName=None, taskName=None, fields=fields)


def event(log: logging.Logger, fields: dict[str, Any]) -> None:
    """One event (`fields`, with its name under "event"), written as a JSON line."""
    if log.isEnabledFor(INFO):
        log.handle(Event(log.name, fields))
