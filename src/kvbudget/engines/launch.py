"""An engine's server started for one pool of a deployment: the capability (`Launches`) and what it answers
(`Launch`). Each engine that has one writes its own command line, per release, from its own source
(engines/vllm/launch.py, engines/sglang/launch.py, engines/llamacpp/launch.py); `kvbudget.deploy` writes it out.
(A module of its own rather than base.py, which is near the 600-line limit.)"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from kvbudget.errors import EngineRuleError

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment, PoolPlan


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One replica's command line, what it leaves to something else (notes), and the engine's files it follows."""

    argv: tuple[str, ...]
    image: str  # the engine's published container image for the release (manifests run argv in it)
    # llm-d's routing sidecar connector for this engine's disaggregated prefill (llm-d-inference-scheduler
    # pkg/sidecar/proxy/proxy.go: "nixlv2" for vLLM's NIXL connector, "sglang" for SGLang's); "" where none
    pd_connector: str = ""
    notes: tuple[str, ...] = ()
    source: str = ""

    @property
    def shell(self) -> str:
        """The command as one shell line, each argument quoted where it needs to be."""
        return shlex.join(self.argv)


@runtime_checkable
class ShedsQueue(Protocol):
    """An engine whose server refuses requests itself past limits on its queue (vLLM's --max-num-queued-reqs and
    --max-num-queued-tokens, from 0.29): the flags that set them, on a release (None: the newest modelled)."""

    def queue_flags(self, max_num_queued_reqs: int | None, max_num_queued_tokens: int | None,
                    release: str | None = None) -> Launch:
        """The flags (argv: the flags alone) and, for a limit the release cannot take, a note saying so."""


@runtime_checkable
class Launches(Protocol):
    """An engine that writes its server's command line for a pool of a deployment."""

    def command(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        """The command each replica of `pool` runs; a setting the engine or its release cannot take is refused in
        one line naming the setting."""


@runtime_checkable
class RunsUnderDynamo(Protocol):
    """An engine NVIDIA Dynamo runs as a worker (`python3 -m dynamo.<engine>`), for its DynamoGraphDeployment."""

    dynamo_framework: ClassVar[str]  # the engine as the DynamoGraphDeployment's spec.backendFramework names it

    def dynamo_worker(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        """The worker command of one replica of `pool` in Dynamo's runtime image, and that image."""


@runtime_checkable
class RunsUnderKServe(Protocol):
    """An engine KServe's LLMInferenceService templates start themselves (their `vllm serve /mnt/models --port ...
    --tensor-parallel-size ... $@`): a pool's settings go to it as the main container's args."""

    def kserve_args(self, pool: PoolPlan, deployment: Deployment) -> Launch:
        """The flags of one replica of `pool` the template does not set itself (argv: the flags alone)."""


def refuse(param: str, why: str) -> EngineRuleError:
    """A pool setting the engine's command line cannot express, as the one-line error naming it."""
    return EngineRuleError(f"{param}: {why}", param=param)


__all__ = ["Launch", "Launches", "RunsUnderDynamo", "RunsUnderKServe", "refuse"]
