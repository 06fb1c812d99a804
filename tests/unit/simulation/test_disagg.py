"""Disaggregated prefill and decode: each prefill replica runs exactly as a single run of the prefill requests it
was sent (one output token each), each decode replica as a single run of the decode requests it was sent (each
arriving when its prefill finished, its prompt's KV read over the link before it runs); the KV moved is the
engine's blocks at their bytes; the decode side waits for room before it reads."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import AZURE, LLAMA, close

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.setup import Role, config_of
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.engines.vllm.disagg import PrefillScheduler
from kvbudget.interconnects import KVLink, kv_link
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import SAMPLE_INTERVAL_S, _Run, setup_for, simulate

SMALL = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30)  # 1,024 blocks: queues form
BIG = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=6 << 30, max_num_seqs=64)
IB = KVLink(name="ib", latency=30e-6, bandwidth=25e9)


def azure(n: int = 600, scale: float = 8.0) -> list[Request]:
    return [replace(r, prompt_tokens=min(r.prompt_tokens, 6000))
            for r in rescale(read_trace(AZURE), scale, 0, n)]


def pd(prefill: int = 2, decode: int = 2, p_setup=SMALL, d_setup=SMALL) -> list[Pool]:
    return [Pool(name="prefill", setup=p_setup, replicas=prefill, role=Role.PREFILL),
            Pool(name="decode", setup=d_setup, replicas=decode, role=Role.DECODE)]


def replay(router: str, pools: list[Pool], requests: list[Request], fast: bool = True, link=IB):
    """The fleet, then each replica alone: a prefill replica on the prefill requests it was sent, each holding its
    blocks until the decode side's read of it was done (when the fleet's run says); a decode replica on the
    decode requests it was sent, each arriving when its prefill finished. The same schedules (their seconds to
    rounding)."""
    requests = [replace(r, id=str(i)) for i, r in enumerate(requests)]
    sent: dict[int, list[Request]] = {}
    reads: dict[str, tuple[float, float]] = {}
    fleet = simulate_fleet(LLAMA, requests, pools, router, kv_link=link, fast=fast,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r),
                           on_transfer=lambda d, start, end: reads.__setitem__(d.id, (start, end)))
    assert fleet.requests == len(requests) == fleet.completed == len(reads) == fleet.kv_transfer.count
    routed = {role: sum(r.routed for r in fleet.replicas if r.role is role) for role in (Role.PREFILL, Role.DECODE)}
    assert routed == {Role.PREFILL: len(requests), Role.DECODE: len(requests)}
    each_alone(fleet, sent, reads, fast)
    return fleet, sent


def each_alone(fleet, sent: dict[int, list[Request]], reads: dict[str, tuple[float, float]], fast: bool = True):
    """Each replica of a disaggregated fleet's run against a single run of what it was sent (`reads`: each decode
    request's read, by id, as the fleet's on_transfer reported it)."""
    for rep in fleet.replicas:
        mine = sent.get(rep.index, [])
        assert rep.routed == len(mine)
        if not mine:
            continue
        setup = rep.simulation.setup
        if rep.role is Role.PREFILL:
            assert all(r.output_tokens == 1 for r in mine)
            held = PrefillScheduler(config_of(setup), {id(r): reads[r.id][1] for r in mine})
            alone = _Run(setup, held, mine, fast, SAMPLE_INTERVAL_S, None, None).result()
        else:
            assert all(reads[r.id][0] >= r.arrival for r in mine)
            alone = simulate(LLAMA, mine, setup=setup, fast=fast)
        got = rep.simulation
        assert close((got.steps, got.completed, got.preemptions, got.duration_s),
                     (alone.steps, alone.completed, alone.preemptions, alone.duration_s))
        assert close(got.ttft_sorted, alone.ttft_sorted) and close(got.e2e_sorted, alone.e2e_sorted)
        assert close(got.tpot_sorted, alone.tpot_sorted)
        assert close((got.peak_usage, got.mean_usage, got.peak_waiting),
                     (alone.peak_usage, alone.mean_usage, alone.peak_waiting))


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv"])
def test_each_side_runs_exactly_as_a_single_run_of_what_it_was_sent(router):
    fleet, sent = replay(router, pd(), azure())
    assert fleet.preemptions > 0  # the small decode pool is under pressure
    assert fleet.kv_transfer.wait_s > 0


def test_shared_prefixes_on_both_sides_run_exactly_as_alone():
    """Five system prompts shared by the requests: prefix-cache hits on the prefill side and reads of only the
    missing blocks on the decode side, under pressure (preemptions); the fast path and the reference agree."""
    requests = [replace(r, prefix=((f"system {i % 5}", r.prompt_tokens // 2),)) for i, r in enumerate(azure(400))]
    fast, _ = replay("least-kv", pd(2, 2), requests)
    slow, _ = replay("least-kv", pd(2, 2), requests, fast=False)
    assert close((fast.e2e, fast.kv_transfer), (slow.e2e, slow.kv_transfer)) and fast.preemptions > 0
    assert all(r.simulation.prefix_hit_tokens > 0 for r in fast.replicas)


def test_the_fast_path_changes_nothing_on_either_side():
    requests = azure(300)
    fast = simulate_fleet(LLAMA, requests, pd(1, 2), "least-requests", kv_link=IB)
    slow = simulate_fleet(LLAMA, requests, pd(1, 2), "least-requests", kv_link=IB, fast=False)
    for a, b in zip(fast.replicas, slow.replicas, strict=True):
        assert close(a.simulation.e2e_sorted, b.simulation.e2e_sorted) and a.routed == b.routed
    assert close((fast.kv_transfer, fast.e2e), (slow.kv_transfer, slow.e2e))
    replay("least-requests", pd(1, 2), requests, fast=False)


def test_a_transfer_by_hand():
    """Llama 3.1 8B, bf16, one GPU: 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 131,072 bytes a token;
    a prompt of 1,000 tokens is read as whole blocks of 16: 63 blocks, 1,008 token slots."""
    one = [Request(arrival=0.0, prompt_tokens=1000, output_tokens=50, id="a")]
    fleet = simulate_fleet(LLAMA, one, pd(1, 1, BIG, BIG), kv_link="roce:25GB/s")
    t = fleet.kv_transfer
    nbytes = 63 * 16 * 32 * 2 * 8 * 128 * 2
    assert (t.count, t.bytes_per_gpu, t.bytes, t.wait_s) == (1, nbytes, nbytes, 0.0)
    assert t.seconds == pytest.approx(30.3e-6 + nbytes / 25e9, rel=1e-12)  # RoCE's latency in interconnects.json
    prefill, decode = fleet.replicas
    # the client waits for the prefill, the read, then the decode side's first step (the last prompt token again)
    assert fleet.ttft.max > prefill.simulation.e2e.max + t.seconds
    assert decode.simulation.ttft.max > t.seconds
    assert fleet.e2e.max == pytest.approx(prefill.simulation.e2e.max + decode.simulation.e2e.max)
    assert fleet.output_tokens == 50 and fleet.prompt_tokens == 1000
    # two GPUs (tensor parallel 2): each reads its half of the heads, so twice as fast in all; the bytes in all
    two = setup_for(LLAMA, gpu="H100-80GB", max_model_len=8192, kv_memory=6 << 30, tp=2)
    t2 = simulate_fleet(LLAMA, one, pd(1, 1, two, two), kv_link="roce:25GB/s").kv_transfer
    assert (t2.bytes_per_gpu, t2.bytes) == (nbytes // 2, nbytes)


def test_the_decode_side_reads_only_what_its_prefix_cache_lacks():
    """Two requests share a 1,600-token prefix (100 blocks). The first's read is its 125 blocks; when the second
    comes the decode replica still has the prefix keyed (freed to the queue's tail), so it reads the other 25
    (vLLM reads the blocks `get_unhashed_block_ids` gives)."""
    shared = (("system prompt", 1600),)
    two = [Request(arrival=0.0, prompt_tokens=2000, output_tokens=20, prefix=shared, id="a"),
           Request(arrival=5.0, prompt_tokens=2000, output_tokens=20, prefix=shared, id="b")]
    fleet, _ = replay("round-robin", pd(1, 1, BIG, BIG), two)
    assert fleet.kv_transfer.bytes_per_gpu == (125 + 25) * 16 * 131072
    decode = fleet.replicas[1].simulation
    assert decode.prefix_hit_tokens == 1600
    cold = replace(BIG, prefix_caching=False)
    assert simulate_fleet(LLAMA, two, pd(1, 1, cold, cold), kv_link=IB).kv_transfer.bytes_per_gpu == \
        2 * 125 * 16 * 131072


def test_an_mla_model_moves_its_latent_only():
    """DeepSeek-V2-Lite (MLA): one latent of kv_lora_rank 512 + rope 64 a layer, 27 layers, bf16: 31,104 bytes a
    token (a GQA cache of its 16 heads x 128 would be 221,184)."""
    model = kvbudget.load_model("deepseek-v2-lite")
    s = setup_for(model, gpu="H100-80GB", max_model_len=8192, kv_memory=4 << 30)
    one = [Request(arrival=0.0, prompt_tokens=4000, output_tokens=20, id="a")]
    fleet = simulate_fleet(model, one, pd(1, 1, s, s), kv_link="100GB/s")
    per_token = 27 * (512 + 64) * 2
    blocks = math.ceil(4000 / s.block_size)
    assert fleet.kv_transfer.bytes_per_gpu == blocks * s.block_size * per_token
    assert fleet.kv_transfer.seconds == pytest.approx(blocks * s.block_size * per_token / 100e9, rel=1e-12)


def test_a_full_decode_pool_makes_requests_wait_before_their_read():
    """The decode replica holds 1,024 blocks (the null block aside, 1,023): two requests of 6,000 + 300 tokens
    hold 2 x 394, and the third's prompt needs 375 more, so it waits, holding nothing, until the first finishes;
    with room (6 GiB) a request waits only for the step in progress to end."""
    burst = [Request(arrival=0.001 * i, prompt_tokens=6000, output_tokens=300, id=str(i)) for i in range(3)]
    tight = simulate_fleet(LLAMA, burst, pd(1, 1, BIG, SMALL), kv_link=IB)
    roomy = simulate_fleet(LLAMA, burst, pd(1, 1, BIG, BIG), kv_link=IB)
    assert roomy.kv_transfer.count == 3 and roomy.kv_transfer.max_wait_s < 0.05
    t = tight.kv_transfer
    decode = tight.replicas[1].simulation
    assert t.count == 3 and t.max_wait_s > 0.5 * decode.e2e_sorted[0]  # about a first request's whole answer
    assert t.wait_s < t.max_wait_s + 2 * roomy.kv_transfer.max_wait_s  # the others did not wait for room
    assert tight.e2e.max > roomy.e2e.max + 0.9 * t.max_wait_s


def test_a_stalled_decode_side_holds_the_prefill_sides_blocks():
    """The prefill replica holds 511 blocks, three prompts of 3,000 tokens (188 blocks each) at most while their
    reads wait; the decode replica stages four requests of 4,000 tokens (250 blocks each) of its 1,023. The fifth
    and sixth wait there for room, their blocks held on the prefill side meanwhile (until the read), so the
    eighth cannot even be prefilled until one of them is read: the stall reaches back. With room on the decode
    side nothing waits."""
    p = setup_for(LLAMA, gpu="H100-80GB", max_model_len=4096, kv_memory=1 << 30)
    d = setup_for(LLAMA, gpu="H100-80GB", max_model_len=4096, kv_memory=2 << 30)
    roomy = setup_for(LLAMA, gpu="H100-80GB", max_model_len=4096, kv_memory=8 << 30)
    assert (p.num_blocks, d.num_blocks) == (512, 1024)
    burst = [Request(arrival=0.01 * i, prompt_tokens=3000, output_tokens=1000, id=str(i)) for i in range(8)]
    stalled, _ = replay("round-robin", pd(1, 1, p, d), burst)
    free, _ = replay("round-robin", pd(1, 1, p, roomy), burst)
    prefill = stalled.replicas[0].simulation
    assert stalled.kv_transfer.max_wait_s > 3.0 and free.kv_transfer.max_wait_s < 0.05
    assert prefill.e2e_sorted[-1] > 0.8 * stalled.kv_transfer.max_wait_s  # the eighth waited for a held block
    assert free.replicas[0].simulation.e2e_sorted[-1] < 1.0
    assert close(prefill.e2e_sorted[:7], free.replicas[0].simulation.e2e_sorted[:7])


def test_a_slower_link_costs_its_bytes_in_the_first_token():
    requests = [Request(arrival=i * 2.0, prompt_tokens=4000, output_tokens=10, id=str(i)) for i in range(5)]
    fast = simulate_fleet(LLAMA, requests, pd(1, 1, BIG, BIG), kv_link="100GB/s")
    slow = simulate_fleet(LLAMA, requests, pd(1, 1, BIG, BIG), kv_link="1GB/s")
    nbytes = math.ceil(4000 / 16) * 16 * 131072
    gap = nbytes / 1e9 - nbytes / 100e9
    assert slow.ttft.p50 - fast.ttft.p50 == pytest.approx(gap, rel=0.05)


@pytest.mark.parametrize("kwargs, says, param", [
    ({"kv_link": None}, "a disaggregated fleet moves each prompt's KV over a link", "kv_link"),
    ({"kv_link": "0GB/s"}, "0GB/s is not a rate in GB/s", "kv_link"),
    ({"kv_link": "-5GB/s"}, "not a rate in GB/s", "kv_link"),
    ({"kv_link": "25Gb/s"}, "not a rate in GB/s \\(bytes\\)", "kv_link"),
    ({"kv_link": "carrier-pigeon"}, "name one of nvlink, infiniband, roce, pcie, tcp", "kv_link"),
])
def test_bad_links_are_refused_in_one_line(kwargs, says, param):
    with pytest.raises(KVBudgetError, match=says) as err:
        simulate_fleet(LLAMA, azure(5), pd(), "round-robin", **kwargs)
    assert err.value.param == param and "\n" not in str(err.value)


def test_a_link_object_is_checked_too():
    with pytest.raises(KVBudgetError, match="kv_link: 0.0 must be a number above 0") as err:
        KVLink(name="x", latency=0.0, bandwidth=0.0)
    assert err.value.param == "kv_link"


def test_nvlink_takes_the_cards_rate():
    assert kv_link("nvlink", [kvbudget.gpus.find_gpu("H100-80GB")]).bandwidth == 450e9  # 900 GB/s both ways
    with pytest.raises(KVBudgetError, match="nvlink's rate is the card's own"):
        kv_link("nvlink", [None])


def test_bad_fleets_are_refused_before_any_run():
    with pytest.raises(KVBudgetError, match="needs prefill and decode pools") as err:
        simulate_fleet(LLAMA, azure(5), [Pool(name="p", setup=SMALL, role=Role.PREFILL)], kv_link=IB)
    assert err.value.param == "decode_replicas"
    with pytest.raises(KVBudgetError, match="needs prefill and decode pools") as err:
        simulate_fleet(LLAMA, azure(5), pd() + [Pool(name="both", setup=SMALL)], kv_link=IB)
    with pytest.raises(KVBudgetError, match="kv_link: goes with prefill and decode pools"):
        simulate_fleet(LLAMA, azure(5), [Pool(name="m", setup=SMALL, replicas=2)], kv_link=IB)
    mistral = kvbudget.load_model("mistral-7b")  # sliding windows: several cache groups
    windowed = setup_for(mistral, gpu="H100-80GB", max_model_len=8192)
    with pytest.raises(KVBudgetError, match="one full-attention group .* not several KV cache groups") as err:
        simulate_fleet(mistral, azure(5), pd(1, 1, windowed, windowed), kv_link=IB)
    assert err.value.param == "prefill_replicas" and "\n" not in str(err.value)
    sglang = setup_for(LLAMA, engine="sglang", gpu="H100-80GB", max_model_len=8192)
    with pytest.raises(KVBudgetError, match="prefill_replicas: pool prefill: simulate follows .* not sglang"):
        simulate_fleet(LLAMA, azure(5), pd(1, 1, sglang, sglang), kv_link=IB)
    with pytest.raises(KVBudgetError, match="one sequence a request"):
        simulate_fleet(LLAMA, [Request(arrival=0.0, prompt_tokens=10, output_tokens=5, n=2)], pd(), kv_link=IB)


SIM = ("simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "16k", "--rate", "5", "--requests", "40")


def test_the_command_runs_a_disaggregated_fleet_and_prints_its_transfers(capsys):
    import json

    from simkit import cli

    code, out, _ = cli(capsys, *SIM, "--prefill-replicas", "1", "--decode-replicas", "2", "--kv-link",
                       "roce:50GB/s", "--json")
    assert code == 0
    fleet = json.loads(out)
    assert [p["role"] for p in fleet["fleet"]["pools"]] == ["prefill", "decode"]
    k = fleet["fleet"]["kv_transfer"]
    assert k["count"] == fleet["completed"] == 40 and k["link"]["bandwidth_bytes_per_s"] == 50e9
    code, out, _ = cli(capsys, *SIM, "--prefill-replicas", "1", "--decode-replicas", "2", "--kv-link", "roce")
    assert code == 0 and "KV moved over roce (24.0 GB/s a GPU, 30.3 us each): 40 reads" in out
    assert re.search(r"2 decode +20 +20 ", out)


@pytest.mark.parametrize("argv, says", [
    (("--kv-link", "roce"), "--kv-link: goes with --prefill-replicas and --decode-replicas"),
    (("--prefill-replicas", "2", "--kv-link", "roce"), "--decode-replicas: disaggregated serving needs"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "0GB/s"), "0GB/s is not a rate in GB/s"),
    (("--prefill-replicas", "1", "--decode-replicas", "5000", "--kv-link", "roce"), "--decode-replicas"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "roce", "--max-concurrency", "4"),
     "--max-concurrency: a closed loop of clients in front of one engine, not yet in front of a fleet"),
])
def test_the_command_refuses_bad_fleets_in_one_line(capsys, argv, says):
    from simkit import cli

    code, out, err = cli(capsys, *SIM, *argv)
    assert code == 2 and says in err and err.count("\n") == 1 and not out


def test_the_static_sizing_by_hand():
    """A step of t tokens takes 10 ms + 10 us x t (the time model given). BIG: 6 GiB of blocks of 16 tokens at
    131,072 bytes a token = 3,072 blocks, 3,071 usable; max_num_batched_tokens 8,192, max_num_seqs 64.
    Prefill: 4 prompts of 2,000 a step, 10 + 80 ms: 22.5 ms a request. Decode: a request ends at 2,300 tokens,
    144 blocks: 21 fit; a step of 21 tokens is 10.21 ms; 300 of them over 21 requests: 145.857 ms a request."""
    from kvbudget.engines.scheduling.timing import TimeModel
    from kvbudget.simulation.pdsizing import size_disaggregated

    assert (BIG.num_blocks, BIG.block_size, BIG.bytes_per_token, BIG.max_num_batched_tokens) == \
        (3072, 16, 131072, 8192)
    tm = TimeModel(weights=0.01, per_context=0.0, per_token=0.0, overhead=0.0, token_cost=1e-5, basis="given")
    z = size_disaggregated(replace(BIG, time_model=tm), 20.0, 2000, 300, KVLink(name="l", latency=0.0,
                                                                                 bandwidth=25e9))
    assert (z.prefill_batch, z.decode_batch) == (4, 21)
    assert z.prefill_seconds == pytest.approx(0.0225)
    assert z.decode_step_seconds == pytest.approx(0.01021)
    assert z.decode_seconds == pytest.approx(300 * 0.01021 / 21)
    assert z.ratio == pytest.approx(0.0225 / (300 * 0.01021 / 21))
    assert (z.prefill_replicas, z.decode_replicas) == (1, 3)  # 20 x 22.5 ms = 0.45; 20 x 145.9 ms = 2.92
    nbytes = 125 * 16 * 131072  # 2,000 tokens: 125 whole blocks
    assert (z.transfer_bytes, z.transfer_seconds) == (nbytes, pytest.approx(nbytes / 25e9))
    assert z.staging_bytes == pytest.approx(20 * nbytes / 25e9 * nbytes)
    # 20 requests/s each decoding 300 x 10.21 ms, over 3 replicas: 20.42 at once, each 2,150 tokens (135 blocks)
    assert z.decode_held_bytes == pytest.approx(20 * 300 * 0.01021 / 3 * 135 * 16 * 131072)
    # a prompt longer than the token budget goes in chunks: 4,096 then 3,904 tokens, each step 10 ms + 10 us a token
    chunked = replace(BIG, time_model=tm, max_num_batched_tokens=4096)
    long = size_disaggregated(chunked, 1.0, 8000, 10, KVLink(name="l", latency=0.0, bandwidth=25e9))
    assert long.prefill_batch == 1 and long.prefill_seconds == pytest.approx(0.02 + 1e-5 * 8000)


def test_the_static_sizing_is_what_the_simulator_needs():
    """30 requests/s of 2,000 + 300 tokens: the sizing's prefill and decode replicas keep the client's first token
    quick and nobody waits for decode room; one replica fewer on either side and the queues grow."""
    from kvbudget.simulation.pdsizing import size_disaggregated

    s = setup_for(LLAMA, gpu="H100-80GB", max_model_len=4096, kv_memory=4 << 30)
    z = size_disaggregated(s, 30.0, 2000, 300, IB)
    p, d = z.prefill_replicas, z.decode_replicas
    assert p > 1 and d > 1
    traffic = [Request(arrival=i / 30, prompt_tokens=2000, output_tokens=300, id=str(i)) for i in range(450)]

    def run(prefill: int, decode: int):
        return simulate_fleet(LLAMA, traffic, pd(prefill, decode, s, s), "least-requests", kv_link=IB)

    sized = run(p, d)
    assert sized.ttft.p99 < 0.2 and sized.kv_transfer.max_wait_s < 0.05
    assert run(p, d - 1).ttft.p99 > 1.0 and run(p - 1, d).ttft.p99 > 1.0


def test_the_static_sizing_refuses_what_cannot_be_served():
    from kvbudget.simulation.pdsizing import size_disaggregated

    with pytest.raises(KVBudgetError, match="pd_rate: 0 must be a number above 0"):
        size_disaggregated(BIG, 0, 100, 100, IB)
    with pytest.raises(KVBudgetError, match="pass max_model_len 8,192"):
        size_disaggregated(BIG, 1.0, 8000, 300, IB)
    sglang = setup_for(LLAMA, engine="sglang", gpu="H100-80GB", max_model_len=8192)
    with pytest.raises(KVBudgetError, match="pd_rate: simulate follows disaggregated prefill and decode on vLLM"):
        size_disaggregated(sglang, 1.0, 100, 100, IB)
    mistral = setup_for(kvbudget.load_model("mistral-7b"), gpu="H100-80GB", max_model_len=8192)
    with pytest.raises(KVBudgetError, match="not several KV cache groups"):
        size_disaggregated(mistral, 1.0, 100, 100, IB)


def test_plan_prints_the_p_d_sizing_and_refuses_half_of_it(capsys):
    import json

    from simkit import cli

    plan = ("plan", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "16k")
    pd_args = ("--pd-rate", "20", "--pd-prompt-tokens", "2000", "--pd-output-tokens", "300", "--kv-link", "roce")
    code, out, _ = cli(capsys, *plan, *pd_args, "--json")
    z = json.loads(out)["disaggregated"]
    assert code == 0 and z["prefill_replicas"] >= 1 and z["transfer_bytes"] == 125 * 16 * 131072
    code, out, _ = cli(capsys, *plan, *pd_args)
    assert code == 0 and "Disaggregated prefill and decode for 20 requests/s" in out
    code, out, err = cli(capsys, *plan, "--pd-rate", "20", "--kv-link", "roce")
    assert code == 2 and "--pd-prompt-tokens: the P:D sizing needs" in err and err.count("\n") == 1
    code, out, err = cli(capsys, *plan, *pd_args[:-1], "0GB/s")
    assert code == 2 and "0GB/s is not a rate in GB/s" in err


@pytest.mark.parametrize("prefill,decode", [(1, 1), (1, 3), (2, 3)])
def test_a_decode_replica_runs_its_decode_steps_as_alone(monkeypatch, prefill, decode):
    """The sides are not held in lock-step: a decode replica's runs of decode steps are cut where a single run of
    what it was sent cuts them (at each request handed to it, each read done, each finish), not at the prefill
    side's steps or the clients' arrivals, so it takes as many turns of its clock as that run (and, as ever, the
    same steps)."""
    turns: dict[int, int] = {}
    turn = _Run.turn

    def counted(run, arrival):
        turns[id(run)] = turns.get(id(run), 0) + 1
        return turn(run, arrival)

    monkeypatch.setattr(_Run, "turn", counted)
    requests = [replace(r, id=str(i)) for i, r in enumerate(azure(300, 2.0))]
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(LLAMA, requests, pd(prefill, decode, BIG, BIG), "round-robin", kv_link=IB,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    fleet_turns = sorted(turns.values())
    for rep in fleet.replicas:
        if rep.role is Role.DECODE:
            turns.clear()
            alone = _Run(rep.simulation.setup, rep.simulation.setup.simulator.scheduler(rep.simulation.setup),
                         sent[rep.index], True, SAMPLE_INTERVAL_S, None, None).result()
            assert alone.steps == rep.simulation.steps and alone.fast_steps > 0.8 * alone.steps
            assert sum(turns.values()) in fleet_turns, (sum(turns.values()), fleet_turns)


TIGHT = setup_for(LLAMA, gpu="H100-80GB", max_model_len=4096, kv_memory=1 << 30, max_num_seqs=8)  # 512 blocks


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.2), st.integers(16, 3000), st.integers(1, 300)), min_size=2,
                max_size=30),
       st.integers(1, 2), st.integers(1, 3), st.sampled_from(["round-robin", "least-requests", "least-kv"]),
       st.sampled_from([IB, KVLink(name="slow", latency=1e-3, bandwidth=2e9)]))
def test_each_side_runs_as_alone_under_any_load(gaps, prefill, decode, router, link):
    """Bursts into tight pools on both sides (queues, decode-side stalls that hold the prefill side's blocks,
    preemptions), one or more replicas a side, a fast or a slow link: every replica runs as a single run of what
    it was sent, each side going only as far as what it must know of the other."""
    t, requests = 0.0, []
    for gap, prompt, out in gaps:
        t += gap
        requests.append(Request(arrival=t, prompt_tokens=prompt, output_tokens=out))
    replay(router, pd(prefill, decode, TIGHT, TIGHT), requests, link=link)
