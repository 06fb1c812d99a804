"""llama.cpp: its KV cells, slots and memory (`engine`), what changed between builds (`releases`), its logs
(`logs`), and llama-server's loop for the simulator (`simulator`, `scheduler`).

The registered `LLAMACPP` is the engine with its capabilities (a scheduler model, a log reader), each loaded when
first asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbudget.engines.base import LogCheck
from kvbudget.engines.launch import Launch
from kvbudget.engines.llamacpp.engine import LlamaCppEngine
from kvbudget.model.spec import ModelSpec

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.llamacpp.simulator import LlamaCppSimulator


@dataclass(frozen=True)
class LlamaServer(LlamaCppEngine):
    """llama.cpp with what it offers beyond its memory: `simulate` (Simulates), `check-log` (ReadsLogs) and its
    command line (Launches)."""

    def simulator(self) -> LlamaCppSimulator:
        from kvbudget.engines.llamacpp.simulator import LlamaCppSimulator

        return LlamaCppSimulator(self)

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        from kvbudget.engines.llamacpp.logs import check_log

        return check_log(self, text, model, given or {})

    def check_log_without_model(self, text: str, given: Mapping[str, Any] | None = None) -> LogCheck:
        from kvbudget.engines.llamacpp.logs import check_without_model  # ReadsLogsWithoutModel

        return check_without_model(text)

    def command(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        from kvbudget.engines.llamacpp.launch import command

        return command(pool, deployment)


LLAMACPP = LlamaServer()

__all__ = ["LLAMACPP", "LlamaCppEngine", "LlamaServer"]
