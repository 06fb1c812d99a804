"""Assembling and serving a guard from command-line settings: upstreams, engine, model, budget, policy."""

from __future__ import annotations

import gc
import json
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from kvbudget.engines import Engine, EngineOptions, get_engine, serving_engines
from kvbudget.errors import KVBudgetError, UpstreamConfigError
from kvbudget.guard.app import Guard, GuardConfig
from kvbudget.guard.policy import policy_from_config
from kvbudget.guard.signals import Predictor


def _served_model(upstream: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{upstream.rstrip('/')}/v1/models", timeout=5) as resp:
            return json.loads(resp.read())["data"][0]["id"]
    except Exception:
        return None


def build_guard(upstreams: list[str], engine: str | Engine = "vllm", config: dict[str, Any] | None = None,
                model: str | None = None, kv_memory: int | None = None, tokenizer: str | None = None,
                api_keys: Sequence[str] = (), max_tokens_cap: int | None = None, poll_interval: float = 1.0,
                staleness: float = 10.0, fail_open: bool = True, decision_log: TextIO | None = None,
                device: str = "cuda") -> tuple[Guard, list[str]]:
    """A Guard and the notes to print at start (what it predicts with, and what it cannot)."""
    from kvbudget.model.load import load_model

    config = config or {}
    if not upstreams:
        raise UpstreamConfigError("upstream: name at least one upstream URL (or 'upstreams' in the config)",
                                  param="upstream")
    for url in upstreams:
        if not url.startswith(("http://", "https://")):
            raise UpstreamConfigError(f"upstream {url!r}: must be an http:// or https:// URL", param="upstream")
    chosen = get_engine(engine)
    if chosen not in serving_engines():
        names = ", ".join(e.name for e in serving_engines())
        raise KVBudgetError(f"engine {chosen.name!r}: the guard fronts a serving engine with a KV usage gauge; "
                            f"choose one of {names}", param="engine")
    policy = policy_from_config(config, max_tokens_cap=max_tokens_cap, staleness_s=staleness, fail_open=fail_open)
    notes = []
    source = model or _served_model(upstreams[0])
    predictor = None
    budget = kv_memory or config.get("kv_budget_bytes")
    if source is None:
        notes.append("no model given and the upstream did not name one: acting on observed usage alone")
    else:
        try:
            spec = load_model(source)
        except KVBudgetError as exc:
            spec = None
            notes.append(f"model {source!r} cannot be resolved here ({exc}); acting on observed usage alone")
        if spec is not None and budget:
            # the upstream's device matters where the engine's block size depends on it (vLLM's CPU backend)
            predictor = Predictor(chosen.allocate(spec, options=EngineOptions(device=device)), int(budget))
            per_token = predictor.allocation.bytes_per_token
            notes.append(f"predicting with {spec.name} on {chosen.name}: {per_token:,} bytes "
                         f"per token, KV budget {int(budget):,} bytes per replica")
        elif spec is not None:
            notes.append("no KV budget (kv_memory, or kv_budget_bytes in the config): acting on observed usage alone")
    count_prompt: Callable[[dict[str, Any]], int] | None = None
    if tokenizer:
        from kvbudget.tokens import PromptCounter

        counter = PromptCounter(tokenizer, engine=chosen)

        def count_prompt(body: dict[str, Any]) -> int:
            if isinstance(body.get("messages"), list):
                return counter.count_request(body["messages"]).prompt_tokens
            return counter.count_texts([str(body.get("prompt", ""))])[0]

        notes.append(f"prompt lengths from the tokenizer in {tokenizer}")
    else:
        notes.append("prompt lengths estimated from characters (4 per token); give a tokenizer for exact counts")
    limits = {key: config[key] for key in ("max_body_bytes", "connect_timeout", "first_byte_timeout",
                                           "idle_timeout") if key in config}
    guard = Guard(GuardConfig(upstreams=list(upstreams), engine=chosen, policy=policy, predictor=predictor,
                              count_prompt=count_prompt, api_keys=frozenset(api_keys) | frozenset(
                                  config.get("api_keys", [])), poll_interval=poll_interval,
                              decision_log=decision_log, **limits))
    return guard, notes


def serve(guard: Guard, host: str, port: int) -> None:
    try:
        import uvicorn
    except ImportError:
        raise KVBudgetError("the guard needs starlette, uvicorn and httptools: pip install 'kvbudget[guard]'") from None
    # uvicorn drains in-flight requests on SIGTERM (up to timeout_graceful_shutdown) before it exits.
    try:  # uvloop is the faster event loop where it exists (kvbudget[guard] brings it; not on Windows)
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    gc.collect()
    gc.freeze()  # what start-up loaded is never garbage: keep it out of the collector's full passes
    uvicorn.run(guard.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=30,
                access_log=False, loop=loop, http="httptools")
