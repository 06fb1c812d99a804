"""SGLang: its token pool, memory and logs (`engine`), releases, HiCache's host tier, and its scheduler with the
radix cache for the simulator (`simulator`, `scheduler`, `hiradix`).

The registered `SGLANG` is the engine with its scheduler model, loaded when first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvbudget.engines.base import EngineOptions
from kvbudget.engines.launch import Launch
from kvbudget.engines.sglang.engine import SGLangEngine
from kvbudget.engines.sglang.releases import BUDGET_ERAS, NEWEST, budget_era

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.sglang.simulator import SGLangSimulator
    from kvbudget.speculative import LoggedAcceptance, LoggedSpeculative


@dataclass(frozen=True)
class SGLangServer(SGLangEngine):
    """SGLang with `simulate` (Simulates), its command line (Launches), its speculative lines
    (ReadsSpeculativeLogs) and the eras its budget was checked in (ChecksBudget) beside its memory and logs."""

    budget_eras: ClassVar[tuple[str, ...]] = tuple(label for _, label in BUDGET_ERAS)  # ChecksBudget

    def budget_era(self, options: EngineOptions) -> str:  # ChecksBudget
        return budget_era(options.engine_version or NEWEST)

    def simulator(self) -> SGLangSimulator:
        from kvbudget.engines.sglang.simulator import SGLangSimulator

        return SGLangSimulator(self)

    def command(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        from kvbudget.engines.sglang.launch import command

        return command(self, pool, deployment)

    def speculative_in_log(self, text: str) -> LoggedSpeculative | None:  # ReadsSpeculativeLogs
        from kvbudget.engines.sglang.speclog import read_speculative

        return read_speculative(text)

    def acceptance_in_log(self, text: str) -> LoggedAcceptance | None:  # ReadsAcceptanceLogs
        from kvbudget.engines.sglang.speclog import read_acceptance

        return read_acceptance(text)


SGLANG = SGLangServer()

__all__ = ["SGLANG", "SGLangEngine", "SGLangServer"]
