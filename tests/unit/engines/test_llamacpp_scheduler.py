"""llama-server's loop as the simulator follows it: slots, the unified pool, the host-RAM prompt cache."""

from __future__ import annotations

from kvbudget.engines.llamacpp.scheduler import LlamaServerScheduler
from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.workload import Request


def lcp_sched(slots: int, n_ctx: int, n_batch: int, pool: int = 0) -> LlamaServerScheduler:
    return LlamaServerScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=slots,
                                                max_num_batched_tokens=n_batch, max_model_len=n_ctx), pool)

def test_llamacpp_slots_lru_deferral_and_batch_order():
    sim = lcp_sched(2, 64, 8)
    a, b, c = (sim.add(Request(arrival=0, prompt_tokens=p, output_tokens=3)) for p in (10, 5, 4))
    step = sim.schedule()
    # never-used slots tie on last use and the last one wins: a -> slot 1, b -> slot 0, c is deferred
    assert (sim.slot_of[a.uid].id, sim.slot_of[b.uid].id, list(sim.waiting)) == (1, 0, [c])
    # prompts in slot order (b first) until the batch holds 8 tokens
    assert [(s, n) for s, n in step.scheduled] == [(b, 5), (a, 3)]
    sim.update(step)
    step = sim.schedule()
    # b generates (one token, first); a's prompt goes on
    assert [(s, n) for s, n in step.scheduled] == [(b, 1), (a, 7)]
    sim.update(step)
    step = sim.schedule()
    assert [(s, n) for s, n in step.scheduled] == [(b, 1), (a, 1)]
    assert sim.update(step) == [b]  # b has its 3 tokens: slot 0 is free, c moves to the front of the queue
    step = sim.schedule()
    assert sim.slot_of[c.uid].id == 0 and [(s, n) for s, n in step.scheduled] == [(a, 1), (c, 4)]

def test_llamacpp_truncates_at_the_slot_context_and_reuses_a_slots_prompt():
    sim = lcp_sched(1, 16, 64)
    first = sim.add(Request(arrival=0, prompt_tokens=10, output_tokens=20, prefix=(("system", 8),)))
    assert first.end == 6  # stops when cached tokens + 1 reach n_ctx: 10 + 6 - 1 + 1 = 16
    while sim.has_work():
        sim.update(sim.schedule())
    assert first.computed == 15 and first.out == 6
    second = sim.add(Request(arrival=0, prompt_tokens=9, output_tokens=2, prefix=(("system", 8),)))
    step = sim.schedule()
    assert second.hit_tokens == 8 and step.scheduled == ((second, 1),)  # the shared 8 tokens come from the slot
    sim.update(step)
    same = sim.add(Request(arrival=0, prompt_tokens=8, output_tokens=1, prefix=(("system", 8),)))
    sim.update(sim.schedule())
    step = sim.schedule()
    assert same.hit_tokens == 7 and step.scheduled == ((same, 1),)  # a whole-prompt hit still computes one token

def test_llamacpp_unified_pool_purges_idle_slots_then_fails_every_busy_request():
    sim = lcp_sched(3, 48, 32, pool=48)
    done = sim.add(Request(arrival=0, prompt_tokens=20, output_tokens=1))
    sim.update(sim.schedule())  # finished at once; its slot keeps its 20 cells while idle
    assert done.finished is not None and sim.purges == 0
    big = sim.add(Request(arrival=0, prompt_tokens=40, output_tokens=5))
    step = sim.schedule()  # 32 tokens do not fit beside the idle 20: that slot is purged
    assert step.scheduled == ((big, 32),) and sim.purges == 1
    sim.update(step)
    sim.update(sim.schedule())  # the last 8 prompt tokens: 40 of 48 cells used
    other = sim.add(Request(arrival=0, prompt_tokens=12, output_tokens=5))
    step = sim.schedule()
    # 1 + 12 tokens, 8 cells free and nothing idle to purge: a sub-batch of 8 goes through (big's token and 7 of
    # other's), then sub-batches of 4, 2, 1 fail: every busy request gets the error
    assert step.failed == 2 and sim.failed == [other, big] and not sim.has_work()  # (in slot order: 0, 1)
    assert step.scheduled == ((big, 1),) and step.tokens == 1

def test_llamacpp_host_ram_prompt_cache_saves_a_slot_and_loads_the_best_saved_prompt():
    """llama-server's --cache-ram: with one slot, a request on another system prompt takes the slot (least
    recently used), which saves the first request's cache to RAM; a third request on the first system prompt
    then loads it back (it keeps 100 of its 101 tokens, over a quarter) and computes only its own tokens."""
    from kvbudget.engines.llamacpp.scheduler import PromptCache

    sim = LlamaServerScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=1, max_num_batched_tokens=512,
                                               max_model_len=512), 0, PromptCache(8 << 30, 1024))
    for system, prompt in (("a", 100), ("b", 100), ("a", 120)):
        seq = sim.add(Request(arrival=0, prompt_tokens=prompt, output_tokens=2, prefix=((system, 100),)))
        while sim.has_work():
            sim.update(sim.schedule())
    assert seq.hit_tokens == 100  # from RAM: the slot itself held system prompt b
    assert [(c.prompt, n) for c, n in sim.ram.entries] == [(100, 101)]  # b's cache, saved when a's was loaded
    no_ram = LlamaServerScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=1,
                                                  max_num_batched_tokens=512, max_model_len=512), 0)
    for system, prompt in (("a", 100), ("b", 100), ("a", 120)):
        seq = no_ram.add(Request(arrival=0, prompt_tokens=prompt, output_tokens=2, prefix=((system, 100),)))
        while no_ram.has_work():
            no_ram.update(no_ram.schedule())
    assert seq.hit_tokens == 0
