"""vLLM's disaggregated prefill and decode over the NIXL connector, both sides, step for step.

What it follows (github:vllm-project/vllm at commit 002a1057 on main, vllm/distributed/kv_transfer/kv_connector/
v1/nixl_connector.py and v1/core/sched/scheduler.py; the toy proxy of examples/online_serving/disaggregated_serving/):
- the proxy sends the request to a prefill instance with max_tokens 1 and `do_remote_decode`; it runs as any
  request and finishes after its first token (FINISHED_LENGTH_CAPPED); `request_finished` then returns
  `delay_free_blocks` (any block held) with the block ids, and the scheduler does not free them: they are freed
  when the decode side's read is reported done (`finished_sending`), or after VLLM_NIXL_ABORT_REQUEST_TIMEOUT
  (480 s) if it never comes;
- the proxy then sends the request to a decode instance with `do_remote_prefill`; its scheduler asks the connector
  (`get_num_new_matched_tokens`): the prompt's tokens past the local prefix-cache hit, loaded asynchronously; it
  allocates blocks for them (the whole prompt must fit, as for any admission, and the queue waits, first come
  first served, until it does: the decode-side stall), puts the request in WAITING_FOR_REMOTE_KVS (it leaves the
  queue without running, takes no seat and no token budget) and the worker reads the blocks that have no cache
  key (`get_unhashed_block_ids`), whole blocks, every layer (K and V regions; one region a layer under MLA),
  asynchronously beside the steps; when the read is reported done the request's blocks are keyed and it runs
  from num_computed_tokens = the prompt - 1 (`_update_waiting_for_remote_kv`: the last prompt token is computed
  again, which samples the first output token the client sees: the proxy streams the decode instance's answer
  and drops the prefill's token); a decode request preempted later recomputes locally (`do_remote_prefill` is
  cleared after the first allocation);
- windows: NIXL reads only the last window's blocks of a chunked-local layer (Llama 4's `block_window_per_layer`);
  kvbudget simulates disaggregation for models of one full-attention cache group (MLA included), and refuses
  the others.
What it does not follow: the handshake, a transfer reported a step late, and heterogeneous TP between the sides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kvbudget.engines.scheduling.seq import SchedulerConfig, Seq, Step, TransferTotals
from kvbudget.engines.vllm.offloading import AsyncLoadScheduler
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.units import cdiv

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.workload import Request
    from kvbudget.interconnects import KVLink

# VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default (vllm/envs.py on main; 120 in older releases): a prefill's blocks go if
# no read has come by then
ABORT_TIMEOUT_S = 480.0

SOURCE = ("github:vllm-project/vllm 002a1057 distributed/kv_transfer/kv_connector/v1/nixl_connector.py, "
          "v1/core/sched/scheduler.py")


def read_blocks(prompt_tokens: int, hit_blocks: int, block_size: int) -> int:
    """Blocks a decode instance reads for a prompt: every block of the prompt past its local prefix-cache hit
    (the last one partly filled included)."""
    return max(cdiv(prompt_tokens, block_size) - hit_blocks, 0)


class PrefillScheduler(VLLMScheduler):
    """A prefill instance: requests finish after their first token and hold their blocks (`delay_free_blocks`)
    until the decode side's read is done (`release`, or `reads` known ahead: id of a request -> when), or
    VLLM_NIXL_ABORT_REQUEST_TIMEOUT after their finish."""

    def __init__(self, config: SchedulerConfig, reads: Mapping[int, float] | None = None) -> None:
        super().__init__(config)
        self.reads = reads or {}
        self.held: dict[int, tuple[float, Seq]] = {}  # id of a request -> (its blocks freed at, it)

    def _free_finished(self, done: list[Seq]) -> None:
        for s in done:
            assert s.finished is not None
            at = s.finished + ABORT_TIMEOUT_S
            self.held[id(s.request)] = (min(at, self.reads.get(id(s.request), at)), s)

    def release(self, request: Request, at: float) -> None:
        """The decode side's read of `request` is done at `at` (its blocks go then, or at the timeout if sooner)."""
        key = id(request)
        if key in self.held:
            t, s = self.held[key]
            self.held[key] = (min(t, at), s)

    def next_ready(self) -> float | None:
        return min((t for t, _ in self.held.values()), default=None)

    def _release(self) -> None:
        """Reads reported done by now (`finished_sending`): their blocks freed, in finishing order."""
        clock = self.clock
        done = [k for k, (t, _) in self.held.items() if t <= clock]
        for k in done:
            self._free(self.held.pop(k)[1])

    def schedule(self) -> Step:
        self._release()
        return super().schedule()

    def decode_run_limit(self) -> int:
        self._release()
        return super().decode_run_limit()


class DecodeScheduler(AsyncLoadScheduler):
    """A decode instance: every request's prompt KV is read from the prefill side before it runs."""

    def __init__(self, config: SchedulerConfig, link: KVLink, block_bytes: int,
                 on_read: Callable[[Request, float, float], None] | None = None) -> None:
        super().__init__(config)
        self.link, self.block_bytes, self.on_read = link, block_bytes, on_read
        self.read: set[int] = set()  # requests whose read has started (a later preemption recomputes locally)
        self.totals = TransferTotals()

    def transfer_totals(self) -> TransferTotals:
        return self.totals

    def _start_load(self, s: Seq) -> bool | None:
        if s.uid in self.read or s.preemptions:
            return None
        hits = self._hits(s)
        hit = len(hits)
        whole, _ = self._needs(s, 0, hits)
        if whole > self.pool.nfree - self.reserved:
            return False  # the decode side allocates before it reads: no room, the queue waits
        if hit:
            assert self.cache is not None
            self.cache.touch(s, hits)  # type: ignore[arg-type]
        bs = self.cfg.block_size
        s.nblocks = s.ncached = hit
        extra = read_blocks(s.prompt, hit, bs)
        self.pool.take(s, extra)
        s.nblocks += extra
        s.computed = s.prompt - 1  # (_update_waiting_for_remote_kv: the last prompt token is computed again)
        if self.caching:
            s.hit_tokens = hit * bs
            self.hit_tokens += hit * bs
            self.queried_tokens += s.num_tokens
        self.read.add(s.uid)
        nbytes = extra * self.block_bytes
        seconds = self.link.seconds(nbytes)
        wait = self.clock - s.request.arrival
        t = self.totals
        self.totals = TransferTotals(count=t.count + 1, bytes_per_gpu=t.bytes_per_gpu + nbytes,
                                     seconds=t.seconds + seconds, wait_s=t.wait_s + wait,
                                     max_wait_s=max(t.max_wait_s, wait))
        self._dispatch(s, seconds)
        if self.on_read is not None:
            self.on_read(s.request, self.clock, self.clock + seconds)
        return True

    def _free(self, s: Seq) -> None:
        if s.finished is not None:
            self.read.discard(s.uid)
        super()._free(s)
