"""The simulator's llama.cpp scheduler against a real llama-server, iteration for iteration.

llama-server runs a tiny random-weight model with `-lv 5`, which logs every decision of its loop: each iteration
("posting NEXT_RESPONSE"), each task launched into a slot or deferred, each prompt chunk ("cached n_tokens = X"),
each generating slot's token ("slot decode token ... n_tokens = X"), each release ("stop processing: n_tokens = X,
truncated = T"), each purge and each failed decode. Requests with real Azure lengths and shared prefixes are sent
over HTTP; the simulator is given each task before the iteration in which the server first saw it, and must decide
the same thing at every iteration. Arrival timing is not reproducible, so the test conditions on where arrivals
fell. `--cache-ram 0`: the host-RAM prompt cache is not simulated.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from harness import gguf_file, llama_server, log_folder
from tiny_configs import TINY

import kvbudget
from kvbudget.engines.llamacpp import LLAMACPP
from kvbudget.engines.llamacpp.scheduler import LlamaServerScheduler, PromptCache
from kvbudget.engines.scheduling.seq import SchedulerConfig
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.traces import find as bundled_trace

pytestmark = pytest.mark.engines

TRACES = Path(bundled_trace("azure-conv-2023").path).parent  # the traces bundled in the package
CONFIG = dict(TINY["llama"], vocab_size=320, max_position_embeddings=8192, head_dim=32, num_attention_heads=2)
N_BATCH = 64

_SLOT = re.compile(r"id +(\d+) \| task (-?\d+) \| (.*)$")


def prompt_ids(r: Request, i: int) -> list[int]:
    """Shared pieces from a seeded generator; each request's own tokens start with a token no other request
    starts its own part with, so no two prompts share more than their pieces."""
    ids: list[int] = []
    for pid, n in r.prefix:
        rng = random.Random(str(pid))
        ids += [rng.randrange(3, 320) for _ in range(n)]
    rng = random.Random(i)
    own = [3 + i] + [rng.randrange(3, 320) for _ in range(r.prompt_tokens - len(ids) - 1)]
    return ids + own


def azure_requests(count: int, longest_prompt: int, longest_output: int) -> list[Request]:
    """Lengths from the Azure conversation trace folded into [30, longest_prompt] (and made unique: the test
    names requests by prompt length); two in three start with one of two 100-token system prompts (prefix
    pieces, mostly the first), so slots find their caches by similarity."""
    out: list[Request] = []
    used: set[int] = set()
    for i, r in enumerate(rescale(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv"), count=count)):
        prompt = 30 + r.prompt_tokens % (longest_prompt - 30)
        while prompt in used:
            prompt = 30 + (prompt - 29) % (longest_prompt - 30)
        used.add(prompt)
        pieces = ((("system", i % 5 == 4), 100),) if i % 3 < 2 and prompt > 120 else ()
        out.append(Request(arrival=i * 0.004, prompt_tokens=prompt, output_tokens=min(r.output_tokens, longest_output),
                           prefix=pieces))
    return out


def serve(requests: list[Request], *args: str) -> str:
    """Send the requests to llama-server at their arrival times; its -lv 5 log."""
    gguf = gguf_file("sim-llama", CONFIG)
    errors: list[str] = []
    with llama_server(gguf, "-b", str(N_BATCH), "-ub", str(N_BATCH), "-lv", "5", "--log-colors", "off", "-t", "2",
                      *args) as url:
        def send(i: int, r: Request) -> None:
            body = json.dumps({"prompt": prompt_ids(r, i), "n_predict": r.output_tokens, "ignore_eos": True,
                               "temperature": 0, "cache_prompt": True}).encode()
            req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=120).read()
            except urllib.error.HTTPError as e:
                errors.append(e.read().decode(errors="replace"))

        start = time.monotonic()
        threads = []
        for i, r in enumerate(requests):
            time.sleep(max(0.0, start + r.arrival - time.monotonic()))
            t = threading.Thread(target=send, args=(i, r))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        port = url.rsplit(":", 1)[1]
    return (log_folder() / f"llama-{port}.log").read_bytes().decode(errors="replace")


def parse(log: str) -> tuple[dict[int, int], list[dict]]:
    """(task id -> prompt length, iterations): per iteration the tasks that arrived before it, launches, prompt
    chunks, decode tokens, releases, purges and failures, in log order."""
    log = log[log.index("listening on"):]
    prompts: dict[int, int] = {}
    seen: set[int] = set()
    its: list[dict] = [dict(arrived=[], launch=[], chunk=[], decode=[], release=[], purge=[], failed=False)]
    for raw in log.splitlines():
        m = _SLOT.search(raw)
        slot, task, text = m.groups() if m else ("-1", "-1", raw)
        it = its[-1]
        if "posting NEXT_RESPONSE" in text:
            its.append(dict(arrived=[], launch=[], chunk=[], decode=[], release=[], purge=[], failed=False))
        elif "processing task, is_child" in text or "defer task" in text:
            t = int(task) if "is_child" in text else int(text.rsplit("= ", 1)[1])
            if t not in seen:
                seen.add(t)
                its[-1]["arrived"].append(t)
            if "is_child" in text:
                it["launch"].append((t, int(slot)))
        elif "new prompt" in text:
            prompts[int(task)] = int(text.rsplit("task.n_tokens = ", 1)[1])
        elif "memory_seq_rm" in text and "cached n_tokens" in text:
            it["chunk"].append((int(slot), int(task), int(text.split("cached n_tokens = ")[1].split(",")[0])))
        elif "slot decode token" in text:
            it["decode"].append((int(slot), int(task), int(text.split("n_tokens = ")[1].split(",")[0])))
        elif "stop processing" in text:
            n, trunc = re.search(r"n_tokens = (\d+), truncated = (\d)", text).groups()
            it["release"].append((int(slot), int(task), int(n), int(trunc)))
        elif "purging slot" in text:
            it["purge"].append(int(text.split("purging slot ")[1].split()[0]))
        elif "Context size has been exceeded" in text:
            it["failed"] = True
    # launches logged before an iteration's "posting" line belong to it (process_new_tasks runs first)
    for j in range(len(its) - 1, 0, -1):
        its[j]["arrived"], its[j]["launch"] = its[j - 1]["arrived"], its[j - 1]["launch"]
    return prompts, its[1:]


def replay(requests: list[Request], log: str, slots: int, context: int, unified: bool, cache_ram: int) -> dict:
    """The simulator through the server's iterations; every iteration must match. Returns counts."""
    model = kvbudget.parse_config(CONFIG)
    n_ctx_slot, pool = LLAMACPP.slot_context(model, context, slots, unified)
    assert f"n_ctx_slot = {n_ctx_slot}" in log
    per_token = LLAMACPP.allocate(model).bytes_per_token
    ram = PromptCache(cache_ram << 20, per_token) if cache_ram else None
    prompts, its = parse(log)
    by_length = {r.prompt_tokens: r for r in requests}
    assert len(by_length) == len(requests)  # prompt lengths name the requests
    # a task that failed before its prompt was ever batched never logs its length: those go to the requests
    # left, in the order they were sent (task ids are given in the order the server received them)
    tasks = sorted(t for it in its for t in it["arrived"])
    assert len(tasks) == len(requests)
    left = [r.prompt_tokens for r in requests if r.prompt_tokens not in set(prompts.values())]
    prompts.update(zip([t for t in tasks if t not in prompts], left, strict=True))
    sim = LlamaServerScheduler(SchedulerConfig(num_blocks=0, block_size=1, max_num_seqs=slots,
                                               max_num_batched_tokens=N_BATCH, max_model_len=n_ctx_slot), pool, ram)
    task_of: dict[int, int] = {}  # uid -> server task id
    counts = dict(iterations=0, deferred=0, hits=0, truncated=0, purges=0, failed=0)
    for k, it in enumerate(its, 1):
        where = f"iteration {k}"
        for t in it["arrived"]:
            task_of[sim.add(by_length[prompts[t]]).uid] = t
        had = set(sim.slot_of)
        step = sim.schedule()
        slot_ids = {uid: slot.id for uid, slot in sim.slot_of.items()}
        assert [(task_of[u], i) for u, i in slot_ids.items() if u not in had] == \
            [x for x in it["launch"] if not step.failed or x[0] in {task_of[u] for u in slot_ids}], where
        decode, chunk = [], []
        for s, n in step.scheduled:
            was = s.computed - n
            (decode if was >= s.prompt else chunk).append((slot_ids.get(s.uid, -1), task_of[s.uid], was))
        assert bool(step.failed) == it["failed"], where
        assert sim.purges - counts["purges"] == len(it["purge"]), where
        if not step.failed:  # (a failed iteration's batch is cleared before the log shows all of it)
            assert decode == it["decode"], where
            assert chunk == it["chunk"], where
        done = sim.update(step)
        ours = [(slot_ids[s.uid], task_of[s.uid], s.computed, int(s.end < s.request.output_tokens)) for s in done]
        logged = it["release"]
        if step.failed:
            failed = {task_of[s.uid] for s in sim.failed[-step.failed:]}
            assert {r[1] for r in logged} == failed | {r[1] for r in ours}, where
            logged = [r for r in logged if r[1] not in failed]
        assert sorted(ours) == sorted(logged), where
        counts["purges"] = sim.purges
        counts["failed"] += step.failed
        counts["truncated"] += sum(r[3] for r in ours)
        counts["iterations"] += 1
        counts["deferred"] = max(counts["deferred"], len(sim.waiting))
    assert not sim.has_work() and not sim.waiting
    counts["hits"] = sim.hit_tokens
    return counts


@pytest.mark.parametrize("cache_ram", [0, 8192])
def test_own_streams_iteration_for_iteration(cache_ram):
    """-np 3, 256 cells a slot: deferral, LRU and similarity slot choice, chunked prompts, truncation; with the
    host-RAM prompt cache off, and on (llama-server's default 8,192 MiB: slots taken for new tasks save their
    cache and load the saved one that serves the new prompt best)."""
    requests = azure_requests(18, 230, 90)
    log = serve(requests, "-np", "3", "-c", str(3 * 256), "--no-kv-unified", "--cache-ram", str(cache_ram))
    counts = replay(requests, log, 3, 256, unified=False, cache_ram=cache_ram)
    print(counts)
    assert counts["deferred"] > 0 and counts["hits"] > 0 and counts["truncated"] > 0


@pytest.mark.parametrize("cache_ram", [0, 8192])
def test_unified_cache_purges_and_fails_iteration_for_iteration(cache_ram):
    """--kv-unified, -np 3 over 512 cells: without the prompt cache idle slots keep their caches until a batch
    needs the cells (purged one at a time); with it (the default) every launch saves the idle slots to RAM and
    clears them. When even one token does not fit, every busy request fails ("Context size has been exceeded"),
    as on the real server."""
    # two requests first, whose slots then sit idle holding 481 of the 512 cells; then the Azure ones, the
    # first alone for 50 ms (it has to purge an idle slot to fit its prompt)
    requests = [Request(arrival=0.0, prompt_tokens=231 + i, output_tokens=10) for i in range(2)]
    requests += [Request(arrival=0.3 + r.arrival + 0.05 * (i > 0), prompt_tokens=r.prompt_tokens,
                         output_tokens=r.output_tokens, prefix=r.prefix)
                 for i, r in enumerate(azure_requests(18, 230, 150))]
    for _ in range(3):  # the scenario rests on arrival timing: a loaded machine may not reach it; every run replays
        log = serve(requests, "-np", "3", "-c", "512", "--kv-unified", "--cache-ram", str(cache_ram))
        counts = replay(requests, log, 3, 512 // 3, unified=True, cache_ram=cache_ram)
        print(counts)
        if counts["failed"] > 0 and (counts["purges"] > 0 if not cache_ram else True):
            break
    assert counts["failed"] > 0 and (counts["purges"] > 0 if not cache_ram else True)
