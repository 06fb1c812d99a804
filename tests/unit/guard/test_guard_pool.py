"""The guard reads each replica's KV pool from the engine itself (no --kv-memory): stubs that export what vLLM,
SGLang and llama-server export, driven by the official openai client. Real engines: tests/engines/."""

from __future__ import annotations

import io
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from kvbudget.engines import ENGINES  # noqa: E402
from kvbudget.engines.metrics import parse_prometheus  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402

MODEL = "llama-3.1-8b"  # 128 KiB a token on every engine here (32 layers, 8 KV heads of 128, 16-bit)
TOKEN = 32 * 2 * 8 * 128 * 2


class PoolStub:
    """An engine replica stating its pool as `engine` does (vllm, sglang, llamacpp), with a quiet KV gauge."""

    def __init__(self, engine: str, tokens: int = 16_000):
        self.engine, self.tokens = engine, tokens
        self.bodies: list[dict] = []

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse
        from starlette.routing import Route

        async def metrics(request):
            if self.engine == "vllm":  # every cache setting a label, as v1/metrics/loggers.py writes them
                return PlainTextResponse(
                    'vllm:kv_cache_usage_perc{engine="0"} 0.01\n'
                    f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",enable_prefix_caching='
                    f'"True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="{self.tokens // 16}"'
                    f',swap_space="0"}} 1.0\n')
            return PlainTextResponse('sglang:token_usage{model_name="m"} 0.01\n')

        async def server_info(request):
            return JSONResponse({"model_path": MODEL, "page_size": 1, "context_length": None,
                                 "max_total_num_tokens": self.tokens, "max_req_input_len": self.tokens - 5,
                                 "internal_states": [{"memory_usage": {"token_capacity": self.tokens}}]})

        async def props(request):
            return JSONResponse({"default_generation_settings": {"n_ctx": self.tokens // 2, "params": {}},
                                 "total_slots": 2, "model_path": "/models/llama.gguf"})

        async def slots(request):
            return JSONResponse([{"id": i, "n_ctx": self.tokens // 2, "is_processing": False} for i in range(2)])

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        async def chat(request):
            body = await request.json()
            self.bodies.append(body)
            return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

        return Starlette(routes=[Route("/metrics", metrics), Route("/server_info", server_info),
                                 Route("/props", props), Route("/slots", slots), Route("/health", models),
                                 Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])


def guard_on(stub_url: str, engine: str, log: io.StringIO, **kw):
    return build_guard([stub_url], engine, poll_interval=0.05, staleness=5.0, decision_log=log, **kw)


def ask(url: str, max_tokens: int):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=max_tokens)


@pytest.mark.parametrize("engine, path, forwarded, level", [("vllm", "/metrics", 15_000, "2"),
                                                             ("sglang", "/server_info", 15_000, "2"),
                                                             ("llamacpp", "/props", 8_000, "0")])
def test_a_request_twice_the_pool_is_capped_without_kv_memory(serve, engine, path, forwarded, level):
    """A pool of 16,000 tokens; a request of max_tokens 30,000 alone needs about twice it: the guard caps it to
    half (15,000: 94% of the pool, level 2) instead of forwarding it unchanged. llama-server's pool is 2 slots of
    8,000 tokens: the request is cut to its slot (half the pool, level 0)."""
    stub, log = PoolStub(engine), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, notes = guard_on(upstream.url, engine, log)
        assert any(f"KV budget from each replica's own pool ({path}" in n for n in notes), notes
        with serve(guard.app()) as g:
            raw = ask(g.url, 30_000)
            assert stub.bodies[-1]["max_tokens"] == forwarded and raw.headers["x-kvbudget-level"] == level
            metrics = httpx.get(f"{g.url}/metrics").text
            assert f'kvbudget_guard_kv_budget_bytes{{replica="{upstream.url}"}}' in metrics
            assert parse_prometheus(metrics, "kvbudget_guard_kv_budget_bytes") == 16_000 * TOKEN
            ready = httpx.get(f"{g.url}/readyz").json()["replicas"][0]
            assert ready["budget_bytes"] == 16_000 * TOKEN and ready["pool"]
    (event,) = [json.loads(line) for line in log.getvalue().splitlines() if '"event": "pool"' in line]
    assert (event["tokens"], event["budget_bytes"]) == (16_000, 16_000 * TOKEN)


def test_a_replica_restarted_with_another_pool_is_read_again(serve):
    stub, log = PoolStub("vllm"), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, _ = guard_on(upstream.url, "vllm", log)
        with serve(guard.app()) as g:
            stub.tokens = 64_000  # the engine came back with four times the blocks
            deadline = time.monotonic() + 5
            while httpx.get(f"{g.url}/readyz").json()["replicas"][0]["budget_bytes"] != 64_000 * TOKEN:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            ask(g.url, 30_000)
            assert stub.bodies[-1]["max_tokens"] == 30_000  # 47% of the new pool: forwarded as asked
    events = [json.loads(line) for line in log.getvalue().splitlines() if '"event": "pool"' in line]
    assert [e["tokens"] for e in events] == [16_000, 64_000] and events[1]["previous_bytes"] == 16_000 * TOKEN


def test_kv_memory_still_overrides_the_engines_pool(serve):
    stub, log = PoolStub("vllm"), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, notes = guard_on(upstream.url, "vllm", log, kv_memory=100_000 * TOKEN)
        assert any("(given)" in n for n in notes)
        with serve(guard.app()) as g:
            ask(g.url, 30_000)
            assert stub.bodies[-1]["max_tokens"] == 30_000  # 30% of the given budget
    assert '"event": "pool"' not in log.getvalue()


def test_pool_readers_take_what_each_engine_exports():
    def read(engine: str, body: str):
        return ENGINES[engine].pool_gauge.read(body)

    vllm = read("vllm", 'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="2500"} 1.0\n')
    assert (vllm.tokens, vllm.blocks, vllm.block_size) == (80_000, 2500, 32)
    assert read("vllm", 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n') is None  # profiling
    assert read("vllm", "vllm:kv_cache_usage_perc 0.1\n") is None
    # SGLang without the scheduler's figure: the data-parallel ranks' capacities
    dp = read("sglang", json.dumps({"page_size": 64, "internal_states": [{"memory_usage": {"token_capacity": 700}},
                                                                         {"memory_usage": {"token_capacity": 300}}]}))
    assert (dp.tokens, dp.block_size) == (1000, 64)
    llama = read("llamacpp", json.dumps({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4}))
    assert (llama.tokens, llama.context) == (16_384, 4096)
    tgi = read("tgi", json.dumps({"max_batch_total_tokens": 123_456, "max_total_tokens": 4096}))
    assert (tgi.tokens, tgi.context) == (123_456, 4096)
    assert ENGINES["tgi"].pool_gauge.read(json.dumps({"max_total_tokens": 4096})) is None


def test_the_engines_pool_is_preferred_over_the_plans_estimate_in_the_config(serve):
    """The README's example writes the plan's estimate into guard.yaml as kv_budget_bytes, which then replaced the
    pool the engine reports, and /readyz showed budget_bytes null. Now the engine's pool wins, the config's figure
    serves until it is read, and /readyz shows the budget in use and where it came from."""
    stub, log = PoolStub("vllm"), io.StringIO()
    estimate = 20_000 * TOKEN  # the plan's figure, 25% above what the engine found
    with serve(stub.app()) as upstream:
        guard, notes = guard_on(upstream.url, "vllm", log, config={"kv_budget_bytes": estimate})
        assert guard.replicas[0].budget == estimate  # before the first poll: the config's
        assert any(f"kv_budget_bytes {estimate:,} (the plan's estimate) until it is read" in n for n in notes), notes
        with serve(guard.app()) as g:
            ready = httpx.get(f"{g.url}/readyz").json()["replicas"][0]
            assert ready["budget_bytes"] == 16_000 * TOKEN and "cache_config_info" in ready["budget_source"]
            ask(g.url, 30_000)
            assert stub.bodies[-1]["max_tokens"] == 15_000  # judged against the engine's 16,000 tokens
    (event,) = [json.loads(line) for line in log.getvalue().splitlines() if '"event": "pool"' in line]
    assert event["previous_bytes"] == estimate and "kv_budget_bytes" in event["previous_source"]


def test_kv_memory_given_shows_in_readyz_as_the_budget_in_use(serve):
    stub, log = PoolStub("vllm"), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, notes = guard_on(upstream.url, "vllm", log, kv_memory=100_000 * TOKEN,
                                config={"kv_budget_bytes": 20_000 * TOKEN})
        assert any("from kv_memory in place of the pool vllm states" in n for n in notes), notes
        with serve(guard.app()) as g:
            ready = httpx.get(f"{g.url}/readyz").json()["replicas"][0]
            assert ready["budget_bytes"] == 100_000 * TOKEN and ready["budget_source"].startswith("kv_memory (given)")
