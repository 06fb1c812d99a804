"""SGLang's scheduler as the simulator follows it (from its source): admission, retraction, the radix cache."""

from __future__ import annotations

import pytest

from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.workload import Request


def sgl(tokens: int, rows: int = 10, chunk: int = 512):
    from kvbudget.engines.sglang.scheduler import SGLangScheduler

    return SGLangScheduler(SchedulerConfig(num_blocks=tokens, block_size=1, max_num_seqs=rows,
                                           max_num_batched_tokens=chunk, max_model_len=4096))

def test_sglang_admits_against_the_running_requests_expected_output_and_prefills_first():
    sim = sgl(1000)
    a = sim.add(Request(arrival=0, prompt_tokens=100, output_tokens=50, max_tokens=500))
    step = sim.schedule()
    assert step.scheduled == ((a, 100),)  # 100 + 500 + 1 < 1,000
    sim.update(step)
    b = sim.add(Request(arrival=0, prompt_tokens=100, output_tokens=50, max_tokens=400))
    # a's remaining 499 tokens x 0.7 are reserved: 900 free - 349.3 = 550.7 > 100 + 400 + 1: b is admitted, and
    # a prefill batch runs alone (a does not decode in it)
    step = sim.schedule()
    assert step.scheduled == ((b, 100),)
    sim.update(step)
    c = sim.add(Request(arrival=0, prompt_tokens=100, output_tokens=50, max_tokens=400))
    # now 800 free - (498 + 399) x 0.7 = 172.1 < 501: c waits, and the running requests decode
    step = sim.schedule()
    assert step.scheduled == ((a, 1), (b, 1)) and list(sim.waiting) == [c]
    assert sim.ratio == pytest.approx(0.7 - (0.7 - 0.098) / 600)  # the ratio decays a step per decode

def test_sglang_retracts_the_shortest_output_to_the_back_of_the_queue():
    sim = sgl(100)
    a = sim.add(Request(arrival=0, prompt_tokens=10, output_tokens=60, max_tokens=60))
    sim.update(sim.schedule())
    b = sim.add(Request(arrival=0, prompt_tokens=10, output_tokens=60,
                        max_tokens=30))  # 90 free - 59 x 0.7 = 48.7 > 41: admitted
    sim.update(sim.schedule())
    retracted = None
    for _ in range(100):
        step = sim.schedule()
        if step.preempted:
            retracted = step
            break
        sim.update(step)
    assert retracted is not None and retracted.preempted == (b,)  # fewer outputs than a
    assert list(sim.waiting) == [b] and b.computed == 0 and b.recomputed > 0
    assert sim.ratio == pytest.approx(min(1.0, (a.out + 20) / (60 + 1)))

def test_sglang_radix_cache_reuses_a_finished_prompt_and_evicts_least_recently_used():
    sim = sgl(300)
    a = sim.add(Request(arrival=0, prompt_tokens=100, output_tokens=2, prefix=(("sys", 80),)))
    while sim.has_work():
        sim.update(sim.schedule())
    assert sim.tree.size == 101  # its prompt and its first output (the last is never computed)
    b = sim.add(Request(arrival=0, prompt_tokens=100, output_tokens=2, prefix=(("sys", 80),)))
    step = sim.schedule()
    assert step.scheduled == ((b, 20),) and b.hit_tokens == 80 and a.finished is not None
    sim.update(step)
    while sim.has_work():
        sim.update(sim.schedule())
    c = sim.add(Request(arrival=0, prompt_tokens=250, output_tokens=2))
    step = sim.schedule()  # 178 free: 72 more come out of the cache, whole leaves, oldest first
    assert step.scheduled == ((c, 250),) and sim.tree.size == 0
