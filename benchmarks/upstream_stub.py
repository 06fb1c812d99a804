"""A minimal OpenAI-style upstream for the guard benchmark: constant small answers (streamed as a few SSE
events when asked), a /metrics gauge; a request's "fault" field plays an engine failing (500, dying
mid-stream, slow)."""

import asyncio
import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

ANSWER = {"id": "c", "object": "chat.completion", "created": 0, "model": "stub",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}}


CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "stub",
         "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}


SCRAPES = [0]  # how often /metrics was read (GET /stub/scrapes)
FAULT: list[str | None] = [None]  # a fault every completion plays (POST /stub/fault with its name as the body)


async def chat(request):
    body = await request.json()
    fault = body.get("fault") or FAULT[0]  # the soak benchmark's faults: "500", "die" (mid-stream), "slow" (1 s)
    if fault == "500":
        return JSONResponse({"error": {"message": "engine failure"}}, status_code=500)
    if fault == "slow":
        await asyncio.sleep(1.0)
    if body.get("stream"):
        async def events():
            for i in range(4):
                if fault == "die" and i == 2:
                    raise RuntimeError("the engine died mid-stream")
                if fault == "slow":
                    await asyncio.sleep(0.2)
                yield f"data: {json.dumps(CHUNK)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
    return JSONResponse(ANSWER)


async def metrics(request):
    SCRAPES[0] += 1
    return PlainTextResponse('vllm:kv_cache_usage_perc{engine="0"} 0.1\n')


async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": "stub"}]})


async def scrapes(request):
    return PlainTextResponse(str(SCRAPES[0]))


async def fault(request):
    FAULT[0] = (await request.body()).decode() or None
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/stub/scrapes", scrapes), Route("/stub/fault", fault, methods=["POST"]),
                        Route("/v1/chat/completions", chat, methods=["POST"]), Route("/metrics", metrics),
                        Route("/v1/models", models)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False, loop="uvloop",
                http="httptools")
