"""vLLM: everything kvbudget knows about it, one module per job.

- `engine`: the block layout, capacity and serving defaults (`VLLMEngine`);
- `packed`: DeepSeek-V4's packed groups of different page sizes;
- `releases`: what changed between releases (`--engine vllm@0.8.5`);
- `logs` (with `logsettings`, `budgetless`, `memorylog`, and `nomodel` for a log without its model): reading its
  startup logs back (check-log);
- `simulator`, with `blocks`, `pool`, `scheduler`, `hybrid`, `cached`, `offloading`, `lmcache`, `contiguous`: its
  KV cache groups, block pool and scheduler for the simulator, and the contiguous-allocation baselines of the
  PagedAttention paper.

The registered `VLLM` is the engine with its capabilities (a scheduler model, a log reader), each loaded when first
asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kvbudget.engines.base import EngineOptions, LogCheck
from kvbudget.engines.launch import Launch
from kvbudget.engines.vllm.engine import VLLMEngine
from kvbudget.engines.vllm.releases import BUDGET_ERAS, budget_era
from kvbudget.model.spec import ModelSpec

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines.vllm.simulator import VLLMSimulator
    from kvbudget.speculative import LoggedAcceptance, LoggedSpeculative


@dataclass(frozen=True)
class VLLMServer(VLLMEngine):
    """vLLM with what it offers beyond its memory: `simulate` (Simulates), `check-log` (ReadsLogs,
    ReadsSpeculativeLogs), its command line (Launches) and the eras its budget was checked in (ChecksBudget)."""

    budget_eras: ClassVar[tuple[str, ...]] = tuple(label for _, label in BUDGET_ERAS)  # ChecksBudget

    def budget_era(self, options: EngineOptions) -> str:  # ChecksBudget
        return budget_era(options)

    def simulator(self) -> VLLMSimulator:
        from kvbudget.engines.vllm.simulator import VLLMSimulator

        return VLLMSimulator(self)

    def check_log(self, text: str, model: ModelSpec, given: Mapping[str, Any] | None = None) -> LogCheck:
        from kvbudget.engines.vllm.logs import check_log

        return check_log(self, text, model, dict(given or {}))

    def check_log_without_model(self, text: str, given: Mapping[str, Any] | None = None) -> LogCheck:
        from kvbudget.engines.vllm.nomodel import check_without_model  # ReadsLogsWithoutModel

        return check_without_model(text)

    def speculative_in_log(self, text: str) -> LoggedSpeculative | None:  # ReadsSpeculativeLogs
        from kvbudget.engines.vllm.speclog import read_speculative

        return read_speculative(text)

    def acceptance_in_log(self, text: str) -> LoggedAcceptance | None:  # ReadsAcceptanceLogs
        from kvbudget.engines.vllm.speclog import read_acceptance

        return read_acceptance(text)

    def command(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        from kvbudget.engines.vllm.launch import command

        return command(pool, deployment)

    def queue_flags(self, max_num_queued_reqs: int | None, max_num_queued_tokens: int | None,
                    release: str | None = None) -> Launch:  # ShedsQueue
        from kvbudget.engines.vllm.launch import queue_flags
        from kvbudget.engines.vllm.releases import DEFAULT, parse_release

        version = parse_release(release) if release else DEFAULT
        return queue_flags(max_num_queued_reqs, max_num_queued_tokens, version,
                           release or ".".join(map(str, version)))

    def kserve_args(self, pool: PoolPlan, deployment: Deployment) -> Launch:  # RunsUnderKServe
        from kvbudget.engines.vllm.launch import kserve_args

        return kserve_args(pool, deployment)

    dynamo_framework: ClassVar[str] = "vllm"  # RunsUnderDynamo

    def dynamo_worker(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        from kvbudget.engines.vllm.launch import dynamo_worker

        return dynamo_worker(pool, deployment)


VLLM = VLLMServer()

__all__ = ["VLLM", "VLLMEngine", "VLLMServer"]
