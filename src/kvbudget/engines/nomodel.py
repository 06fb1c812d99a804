"""The capability of reading a startup log without its model (check-log's partial check)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from kvbudget.engines.base import LogCheck


@runtime_checkable
class ReadsLogsWithoutModel(Protocol):
    """An engine whose startup logs check-log reads in part without their model: the figures shown, the log's own
    arithmetic (its figures against each other) checked."""

    def check_log_without_model(self, text: str, given: Mapping[str, Any] | None = None) -> LogCheck:
        """The rows of the log that need no model (`missing` left to the caller to fill in)."""
