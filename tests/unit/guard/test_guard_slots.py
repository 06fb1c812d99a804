"""llama-server's per-slot context, read from /props with no configuration: a request whose prompt and output
limit cannot fit its slot is capped to what the slot holds, or refused when the prompt alone fills it. A stub
states what llama-server states (tools/server/server-context.cpp, get_res_props: `default_generation_settings.n_ctx`
is a slot's context, `total_slots` the slots); the official openai client drives the guard. The real server:
tests/engines/test_llamacpp_real.py."""

from __future__ import annotations

import io
import json

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from kvbudget.guard.policy import fit_context  # noqa: E402
from kvbudget.guard.server import build_guard  # noqa: E402

MODEL = "llama-3.1-8b"
SLOT = 4096  # `llama-server -c 16384 -np 4`: 4 slots of 4,096 tokens


class SlotsStub:
    """A llama-server of 4 slots of 4,096 tokens: /props, /slots and its /v1/models (no context length there)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def props(request):
            return JSONResponse({"default_generation_settings": {"n_ctx": SLOT, "params": {"n_predict": -1}},
                                 "total_slots": 4, "model_path": "/models/llama-3.1-8b.gguf"})

        async def slots(request):
            return JSONResponse([{"id": i, "n_ctx": SLOT, "is_processing": False} for i in range(4)])

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                             "meta": {"n_ctx_train": 131072}}]})

        async def answer(request):
            self.bodies.append(await request.json())
            return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                              "text": "ok", "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

        return Starlette(routes=[Route("/props", props), Route("/slots", slots), Route("/health", models),
                                 Route("/v1/models", models), Route("/v1/chat/completions", answer, methods=["POST"]),
                                 Route("/v1/completions", answer, methods=["POST"])])


def client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=20)


def test_the_slot_context_comes_from_props_and_caps_n_predict(serve):
    """The issue's case: /props says 4,096 tokens a slot over 4 slots, and a request with n_predict 8,000 was
    forwarded unchanged (the context taken from the model's config, 131,072). Now it is capped to the slot."""
    stub, log = SlotsStub(), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, notes = build_guard([upstream.url], "llamacpp", poll_interval=0.05, decision_log=log)
        assert any("context length 4,096 per request from /props" in n for n in notes), notes
        with serve(guard.app()) as g:
            chat = client(g.url).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], extra_body={"n_predict": 8000})
            assert chat.choices[0].message.content == "ok"
            # a prompt counted from characters (no tokenizer): capped to the slot itself, never below what the
            # server could still generate
            assert stub.bodies[-1]["n_predict"] == SLOT
            # token ids count exactly: 1,000 of them leave 3,096 tokens of the slot
            client(g.url).completions.create(model=MODEL, prompt=[1] * 1000, max_tokens=6000)
            assert stub.bodies[-1]["max_tokens"] == SLOT - 1000
            # a request that fits its slot is forwarded untouched
            client(g.url).completions.create(model=MODEL, prompt=[1] * 1000, max_tokens=3000)
            assert stub.bodies[-1]["max_tokens"] == 3000
            # a prompt that fills the slot alone is refused at once, as llama-server refuses it (400)
            with pytest.raises(openai.BadRequestError) as refused:
                client(g.url).completions.create(model=MODEL, prompt=[1] * SLOT, max_tokens=10)
            assert "4,096" in str(refused.value) and len(stub.bodies) == 3
    decisions = [json.loads(line) for line in log.getvalue().splitlines() if '"event": "decision"' in line]
    assert decisions[0]["changes"] == [f"n_predict 8000->{SLOT} (the context of {SLOT:,} tokens)"]


def test_a_given_context_length_wins_over_props(serve):
    stub, log = SlotsStub(), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, _ = build_guard([upstream.url], "llamacpp", poll_interval=0.05, decision_log=log, max_model_len=2048)
        with serve(guard.app()) as g:
            client(g.url).completions.create(model=MODEL, prompt=[1] * 1000, max_tokens=6000)
            assert stub.bodies[-1]["max_tokens"] == 1048


def test_a_sidecar_forwards_as_sent(serve):
    stub, log = SlotsStub(), io.StringIO()
    with serve(stub.app()) as upstream:
        guard, _ = build_guard([upstream.url], "llamacpp", poll_interval=0.05, decision_log=log, sidecar=True)
        with serve(guard.app()) as g:
            client(g.url).completions.create(model=MODEL, prompt=[1] * 1000, max_tokens=6000)
            assert stub.bodies[-1]["max_tokens"] == 6000


def test_fit_context_caps_every_field_the_engine_reads():
    fields = ("n_predict", "max_completion_tokens", "max_tokens")
    body = {"n_predict": 9000, "max_tokens": 100, "max_completion_tokens": -1}
    fitted, changes = fit_context(body, [1000], 4096, fields, exact=True)
    assert fitted == {"n_predict": 3096, "max_tokens": 100, "max_completion_tokens": -1} and body["n_predict"] == 9000
    assert changes == ("n_predict 9000->3096 (the context of 4,096 tokens)",)
    # a batch of prompts: the longest decides
    assert fit_context({"max_tokens": 4000}, [10, 3000], 4096, fields, exact=True)[0] == {"max_tokens": 1096}
    assert fit_context({"max_tokens": 4000}, [10, 3000], 4096, fields, exact=False)[0] == {"max_tokens": 4000}
    refused = fit_context({"max_tokens": 1}, [4096], 4096, fields, exact=True)
    assert isinstance(refused, str) and "4,096 tokens" in refused
    # an estimate never refuses: the server counts the prompt itself
    assert fit_context({"max_tokens": 1}, [5000], 4096, fields, exact=False) == ({"max_tokens": 1}, ())


def test_an_answer_past_the_start_read_bound_is_not_read(serve, monkeypatch):
    """The start-up reads of /v1/models and /props stop at START_READ_BYTES (as the poller's reads do): a longer
    answer states no context."""
    from kvbudget.guard import server

    monkeypatch.setattr(server, "START_READ_BYTES", 100)
    stub = SlotsStub()
    with serve(stub.app()) as upstream:
        _, notes = build_guard([upstream.url], "llamacpp", poll_interval=0.05, decision_log=io.StringIO())
    assert not any("per request from /props" in n for n in notes), notes
