"""The static answer for disaggregated prefill and decode: the replicas of each side a traffic needs, from the
steps of the time model, the ratio that balances their work, and the KV the decode side stages.

    >>> size_disaggregated(setup, rate=20, prompt_tokens=2000, output_tokens=300, link=kv_link("roce"))

A prefill replica packs whole prompts into steps of up to max_num_batched_tokens (a longer prompt in chunks of it);
a decode replica runs as many requests at once as its KV holds at their final length (whole blocks; at most
max_num_seqs), each step timed at the mean context (prompt + half the output). Each side is sized to be busy at
most all of the time at the rate (utilization 1: queues grow without bound past it). An estimate of the steady
state from the time model; `simulate --prefill-replicas P --decode-replicas D` runs the traffic through them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvbudget import validate
from kvbudget.engines.scheduling.setup import Setup
from kvbudget.errors import KVBudgetError, named
from kvbudget.interconnects import KVLink
from kvbudget.units import cdiv

MAX_RATE = 1e6  # requests per second a sizing takes: past any fleet (a million a second)


@dataclass(frozen=True, kw_only=True)
class PDSizing:
    """A traffic's prefill and decode work on one deployment, and the fleet that balances them."""

    rate: float  # requests per second
    prompt_tokens: int
    output_tokens: int
    prefill_batch: int  # prompts one prefill step packs (1: a prompt of a step or more, in chunks)
    prefill_seconds: float  # a prefill replica's busy seconds per request
    decode_batch: int  # requests a decode replica runs at once: what its KV holds at their final length
    decode_step_seconds: float  # one decode step at that batch, mid-output: the time per output token it runs at
    decode_seconds: float  # a decode replica's busy seconds per request (its output's steps over the batch)
    ratio: float  # prefill replicas per decode replica that balance the two sides' work
    prefill_replicas: int  # replicas each side needs at the rate (busy at most all of the time)
    decode_replicas: int
    link: KVLink
    transfer_bytes: int  # one prompt's KV read by the decode side: whole blocks, one GPU's shard
    transfer_seconds: float
    staging_bytes: float  # KV on the link at the rate (requests in transfer x their bytes), one GPU's shard
    decode_held_bytes: float  # KV a decode replica holds at the rate (requests decoding x their mean blocks), a GPU
    decode_budget_bytes: int  # a decode replica's KV budget, one GPU

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "link"}
        return {**out, "link": self.link.to_dict()}


def size_disaggregated(setup: Setup, rate: float, prompt_tokens: int, output_tokens: int,
                       link: KVLink) -> PDSizing:
    """The prefill and decode replicas of `setup` (as `setup_for` gives, with its time model) that `rate` requests
    per second of `prompt_tokens` in and `output_tokens` out need, and what crosses `link`."""
    validate.number(rate, "pd_rate", 0.0, MAX_RATE)
    why = setup.simulator.disaggregation(setup)
    if why is not None:
        raise KVBudgetError(f"pd_rate: {why}", param="pd_rate")
    n = validate.positive(prompt_tokens, "pd_prompt_tokens", "tokens")
    m = validate.positive(output_tokens, "pd_output_tokens", "tokens")
    if n + m > setup.max_model_len:
        raise KVBudgetError(f"pd_prompt_tokens: {n:,} + {m:,} output tokens pass max_model_len "
                            f"{setup.max_model_len:,}; raise {named('max_model_len')}", param="pd_prompt_tokens")
    tm, bs = setup.time_model, setup.block_size
    budget = setup.max_num_batched_tokens
    if n <= budget:  # whole prompts packed into one step
        k = max(1, min(budget // n, setup.max_num_seqs))
        prefill = tm.step_seconds(k * n, k * n, k * n * (n + 1) // 2, k) / k
    else:  # chunks of the token budget, each attending over the chunks before it
        k, prefill, done = 1, 0.0, 0
        while done < n:
            c = min(budget, n - done)
            prefill += tm.step_seconds(c, done + c, c * done + c * (c + 1) // 2, 1)
            done += c
    slots = setup.token_slots
    b = min(setup.max_num_seqs, (slots // bs) // cdiv(n + m, bs))
    if b < 1:
        raise KVBudgetError(f"pd_prompt_tokens: a decode replica's KV ({slots:,} token slots) cannot hold one "
                            f"request of {n + m:,} tokens; give a larger GPU or KV budget, or shorter requests",
                            param="pd_prompt_tokens")
    mid = n + m // 2
    step = tm.step_seconds(b, b * mid, None, b)
    decode = m * step / b
    transfer_bytes = setup.simulator.kv_read_bytes(setup, n)
    transfer = link.seconds(transfer_bytes)
    decode_replicas = max(1, math.ceil(rate * decode))
    decoding = rate * m * step / decode_replicas  # requests decoding on one replica at once (Little's law)
    return PDSizing(rate=rate, prompt_tokens=n, output_tokens=m, prefill_batch=k, prefill_seconds=prefill,
                    decode_batch=b, decode_step_seconds=step, decode_seconds=decode, ratio=prefill / decode,
                    prefill_replicas=max(1, math.ceil(rate * prefill)), decode_replicas=decode_replicas, link=link,
                    transfer_bytes=transfer_bytes, transfer_seconds=transfer,
                    staging_bytes=rate * transfer * transfer_bytes,
                    decode_held_bytes=decoding * cdiv(mid, bs) * bs * setup.bytes_per_token,
                    decode_budget_bytes=slots * setup.bytes_per_token)
