"""Assembling and serving a guard from command-line settings: upstreams, engine, model, budget, policy."""

from __future__ import annotations

import gc
import json
import math
import socket
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from kvbudget.choices import Device
from kvbudget.engines import Engine, EngineOptions, get_engine, serving_engines
from kvbudget.engines.metrics import PoolReport, ReportsPool
from kvbudget.errors import KVBudgetError, UpstreamConfigError, spelled
from kvbudget.guard.app import Guard, GuardConfig
from kvbudget.guard.clients import ClientLimits
from kvbudget.guard.limits import ConnectionLimits
from kvbudget.guard.policy import policy_from_config
from kvbudget.guard.signals import Predictor


def _served_model(upstream: str) -> tuple[str | None, int | None]:
    """The upstream's model name and, where its /v1/models says (vLLM, SGLang), its context length."""
    try:
        with urllib.request.urlopen(f"{upstream.rstrip('/')}/v1/models", timeout=5) as resp:
            entry = json.loads(resp.read())["data"][0]
    except Exception:
        return None, None
    length = entry.get("max_model_len")
    return entry.get("id"), length if isinstance(length, int) and not isinstance(length, bool) else None


def build_guard(upstreams: list[str], engine: str | Engine = "vllm", config: dict[str, Any] | None = None,
                model: str | None = None, kv_memory: int | None = None, tokenizer: str | None = None,
                api_keys: Sequence[str] = (), priority_keys: Sequence[str] = (), max_tokens_cap: int | None = None,
                poll_interval: float = 1.0,
                staleness: float = 10.0, fail_open: bool = True, decision_log: TextIO | None = None,
                device: str = "cuda", max_model_len: int | None = None, sidecar: bool = False,
                ext_proc: tuple[str, int] | None = None) -> tuple[Guard, list[str]]:
    """A Guard and the notes to print at start (what it predicts with, and what it cannot)."""
    config = config or {}
    if not upstreams:
        raise UpstreamConfigError("upstream: name at least one upstream URL (or 'upstreams' in "
                                  f"{spelled('the config', '--config')})",
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
    notes: list[str] = []
    if policy.max_waiting is not None:
        if chosen.queue_gauges is None:
            raise UpstreamConfigError(f"max_waiting: {chosen.name} exports no gauge of waiting requests; leave it "
                                      "out", param="max_waiting")
        notes.append(f"refusing new requests while a replica has {policy.max_waiting} or more waiting "
                     f"({chosen.queue_gauges[1]}); high-priority ones pass")
    served, served_length = _served_model(upstreams[0]) if model is None or max_model_len is None else (None, None)
    source = model or served
    context = max_model_len or config.get("max_model_len") or served_length
    budget = kv_memory or config.get("kv_budget_bytes")
    predictor, pool_budget, spec = _predictor(chosen, source, int(budget) if budget else None, device, notes)
    if predictor is not None and context is None and spec is not None and spec.max_position_embeddings:
        context = spec.max_position_embeddings
        notes.append(f"context length {context:,} from the model's config (the upstream did not say; give "
                     "max_model_len if it serves less)")
    if predictor is not None and context is None:
        notes.append(f"no context length known: a request without max_tokens is predicted at "
                     f"{policy.default_max_tokens:,} output tokens (give max_model_len)")
    elif predictor is not None:
        notes.append(f"a request without an output limit is predicted to fill the context ({context:,} tokens)")
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
    settings: dict[str, Any] = {key: config[key] for key in ("max_body_bytes", "connect_timeout",
                                                             "first_byte_timeout", "idle_timeout",
                                                             "max_response_bytes", "shutdown_grace") if key in config}
    guard = Guard(GuardConfig(upstreams=list(upstreams), engine=chosen, policy=policy, predictor=predictor,
                              pool_budget=pool_budget,
                              count_prompt=count_prompt, max_model_len=context,
                              api_keys=frozenset(api_keys) | frozenset(config.get("api_keys", [])),
                              priority_keys=frozenset(priority_keys) | frozenset(config.get("priority_keys", [])),
                              poll_interval=poll_interval, sidecar=sidecar, ext_proc=ext_proc,
                              decision_log=decision_log, limits=connection_limits(config),
                              clients=ClientLimits.from_config(config), **settings))
    return guard, notes


def _predictor(chosen: Engine, source: str | None, budget: int | None, device: str, notes: list[str]
               ) -> tuple[Predictor | None, Callable[[PoolReport], int] | None, Any]:
    """What the guard predicts with: the model's allocation on the engine, against the budget given or, where the
    engine states its pool, each replica's own (the pool's budget, from the engine package); the model read."""
    from kvbudget.model.load import load_model

    if source is None:
        notes.append("no model given and the upstream did not name one: acting on observed usage alone")
        return None, None, None
    try:
        spec = load_model(source)
    except KVBudgetError as exc:
        notes.append(f"model {source!r} cannot be resolved here ({exc}); acting on observed usage alone")
        return None, None, None
    if not budget and not isinstance(chosen, ReportsPool):
        notes.append(f"no KV budget ({chosen.name} states no pool; give kv_memory, or kv_budget_bytes in the "
                     "config): acting on observed usage alone")
        return None, None, spec
    # the upstream's device decides vLLM's block size on CPUs
    options = EngineOptions(device=Device.parse(device, "device"))
    predictor = Predictor(chosen.allocate(spec, options=options), budget)
    per_token = predictor.allocation.bytes_per_token
    if budget:
        notes.append(f"predicting with {spec.name} on {chosen.name}: {per_token:,} bytes per token, KV budget "
                     f"{budget:,} bytes per replica (given)")
        return predictor, None, spec
    assert isinstance(chosen, ReportsPool)
    engine = chosen
    notes.append(f"predicting with {spec.name} on {chosen.name}: {per_token:,} bytes per token, KV budget from "
                 f"each replica's own pool ({' or '.join(engine.pool_gauge.paths)}), read on every poll (give "
                 "kv_memory to override)")
    return predictor, lambda report: engine.pool_budget(spec, report, options=options), spec


def connection_limits(config: dict[str, Any]) -> ConnectionLimits:
    """The connection limits from the config, each a positive number; max_connections defaults to what the
    process's file-descriptor limit leaves room for (900 under the usual 1,024, at most 10,000)."""
    values: dict[str, Any] = {}
    for key in ("header_timeout", "max_header_bytes", "max_connections", "body_timeout", "max_connections_per_client"):
        if key in config:
            value = config[key]
            whole = key.startswith("max_")
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or value <= 0:
                raise UpstreamConfigError(f"{key}: must be a positive {'whole number' if whole else 'number'} "
                                          f"(got {value!r})", param=key)
            values[key] = value
    if "max_connections" not in values:
        soft = 1024
        try:
            import resource

            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            soft = 10_124 if limit == resource.RLIM_INFINITY else limit
        except (ImportError, ValueError, OSError):  # no resource module (Windows): the usual limit
            pass
        values["max_connections"] = max(16, min(10_000, soft - 124))
    trusted = config.get("trusted_proxies") or []
    return ConnectionLimits(**values, trusted_proxies=frozenset(t for t in trusted if isinstance(t, str)))


def server_config(guard: Guard, host: str, port: int, loop: str = "asyncio") -> Any:
    """The uvicorn configuration the guard serves with: its connection limits in the HTTP protocol (which also
    tells the app when a client leaves), access log off, 30 s to drain admitted requests on SIGTERM. uvicorn's
    X-Forwarded-For handling is off: the guard names clients itself, trusting only its `trusted_proxies`."""
    try:
        import uvicorn
    except ImportError:
        raise KVBudgetError("the guard needs starlette, uvicorn and httptools: pip install 'kvbudget[guard]'") from None
    from kvbudget.guard.limits import protocol_for

    protocol = protocol_for(guard.config.limits, guard.metrics, guard.config.decision_log)
    return uvicorn.Config(guard.app(), host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=math.ceil(guard.config.shutdown_grace), access_log=False,
                          loop=loop, http=protocol, proxy_headers=False)


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces) for --listen, checked."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise KVBudgetError(f"listen: {text!r} is not HOST:PORT with a port from 1 to 65535 (IPv6: [::1]:8080)",
                            param="listen")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise KVBudgetError(f"listen: {text!r}: put an IPv6 address in brackets, as [::1]:{port}", param="listen")
    return host or "0.0.0.0", int(port)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a taken port or an unknown address is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise KVBudgetError(f"listen: {host!r} is not an address of this machine ({exc.strerror})",
                            param="listen") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # (uvicorn's backlog) listening now: a second guard on the port fails here
    except OSError as exc:
        sock.close()
        raise KVBudgetError(f"listen: cannot listen on {host}:{port}: {exc.strerror} (another program may hold "
                            "the port; choose another)", param="listen") from None
    return sock


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(guard: Guard, host: str, port: int, announce: Callable[[str], None] | None = None) -> None:
    import uvicorn

    # uvicorn drains in-flight requests on SIGTERM (up to timeout_graceful_shutdown) before it exits.
    try:  # uvloop is the faster event loop where it exists (kvbudget[guard] brings it; not on Windows)
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    sock = bind(host, port)
    config = server_config(guard, host, port, loop)
    shown = _shown(host)
    (announce or print)(f"listening on http://{shown}:{sock.getsockname()[1]}")
    if guard.config.ext_proc is not None:
        ext_host, ext_port = guard.config.ext_proc
        (announce or print)(f"Envoy external processor (gRPC) on {_shown(ext_host)}:{ext_port}")
    gc.collect()
    gc.freeze()  # what start-up loaded is never garbage: keep it out of the collector's full passes

    class GuardServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                guard.begin_shutdown()
            super().handle_exit(sig, frame)

    GuardServer(config).run(sockets=[sock])
