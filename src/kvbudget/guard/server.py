"""Assembling a guard from its configuration (`guard.config`: upstreams, engine, model, budget, policy), and
serving it."""

from __future__ import annotations

import gc
import json
import math
import socket
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TextIO

from kvbudget.choices import Device
from kvbudget.engines import Engine, EngineOptions, get_engine, serving_engines
from kvbudget.engines.metrics import ReportsPool
from kvbudget.errors import KVBudgetError, UpstreamConfigError, spell, spelled
from kvbudget.guard.app import Guard
from kvbudget.guard.config import GuardConfig, parse
from kvbudget.guard.log import guard_log
from kvbudget.guard.signals import Prediction, Predictor

START_READ_BYTES = 16 * 2**20  # the most read of an upstream's answer at start (as the poller reads its gauges)


def _fetch(upstream: str, path: str) -> bytes | None:
    """The body of GET `path` on the upstream at start, within 5 s and START_READ_BYTES; None on any failure."""
    try:
        with urllib.request.urlopen(f"{upstream.rstrip('/')}{path}", timeout=5) as resp:
            body = resp.read(START_READ_BYTES + 1)
    except Exception:
        return None
    return body if len(body) <= START_READ_BYTES else None


def _served_model(upstream: str) -> tuple[str | None, int | None]:
    """The upstream's model name and, where its /v1/models says (vLLM, SGLang), its context length."""
    try:
        entry = json.loads(_fetch(upstream, "/v1/models") or b"")["data"][0]
    except Exception:
        return None, None
    length = entry.get("max_model_len")
    return entry.get("id"), length if isinstance(length, int) and not isinstance(length, bool) else None


def _pool_context(engine: Engine, upstream: str) -> tuple[int, str] | None:
    """The longest request the upstream's engine takes as its pool states it (llama-server's /props: a slot's
    context), and where it was read; None where it states none or does not answer."""
    if not isinstance(engine, ReportsPool):
        return None
    for path in engine.pool_gauge.paths:
        body = _fetch(upstream, path)
        try:
            report = engine.pool_gauge.read(body.decode("utf-8", "replace")) if body is not None else None
        except ValueError:  # not JSON, or not the engine's
            continue
        if report is not None and report.context:
            return report.context, path
    return None


def build_guard(upstreams: Sequence[str] = (), engine: str | Engine | None = None,
                config: GuardConfig | Mapping[str, Any] | None = None, model: str | None = None,
                kv_memory: int | None = None, tokenizer: str | None = None, api_keys: Sequence[str] = (),
                priority_keys: Sequence[str] = (), max_tokens_cap: int | None = None,
                poll_interval: float | None = None, staleness: float | None = None, fail_open: bool | None = None,
                decision_log: TextIO | None = None, device: str | None = None, max_model_len: int | None = None,
                sidecar: bool = False, ext_proc: tuple[str, int] | None = None) -> tuple[Guard, list[str]]:
    """A Guard and the notes to print at start (what it predicts with, and what it cannot). `config` is the
    guard's configuration: the record (`guard.config.read` merged the command line into it already), or a
    mapping as its YAML file holds it, which the other arguments (the command line's settings; None: not given,
    the file's value or the default) are merged over; `kv_memory` overrides the pool each engine states.
    `decision_log`: a stream for the guard's JSON lines (None: the `kvbudget.guard` logger, on stderr). The notes
    are in the library's words."""
    if not isinstance(config, GuardConfig):
        config = parse(config or {}, "config", flags={
            "upstreams": list(upstreams), "engine": engine, "model": model, "kv_memory": kv_memory,
            "tokenizer": tokenizer, "api_keys": list(api_keys), "priority_keys": list(priority_keys),
            "max_tokens_cap": max_tokens_cap, "poll_interval": poll_interval, "staleness_s": staleness,
            "fail_open": fail_open, "device": device, "max_model_len": max_model_len, "sidecar": sidecar,
            "ext_proc": ext_proc})
    guard, notes = assemble(config, decision_log)
    return guard, [spell(note) for note in notes]


def assemble(config: GuardConfig, decision_log: TextIO | None = None) -> tuple[Guard, list[str]]:
    """The Guard a configuration describes, and the notes to print at start."""
    if not config.upstreams:
        raise UpstreamConfigError("upstream: name at least one upstream URL (or 'upstreams' in "
                                  f"{spelled('the config', '--config')})",
                                  param="upstream")
    chosen = get_engine(config.engine)
    if chosen not in serving_engines():
        names = ", ".join(e.name for e in serving_engines())
        raise KVBudgetError(f"engine {chosen.name!r}: the guard fronts a serving engine with a KV usage gauge; "
                            f"choose one of {names}", param="engine")
    policy = config.policy
    notes: list[str] = []
    if policy.max_waiting is not None:
        if chosen.queue_gauges is None:
            raise UpstreamConfigError(f"max_waiting: {chosen.name} exports no gauge of waiting requests; leave it "
                                      "out", param="max_waiting")
        notes.append(f"refusing new requests while a replica has {policy.max_waiting} or more waiting "
                     f"({chosen.queue_gauges[1]}); high-priority ones pass")
    model, context = config.model, config.max_model_len
    served, served_length = _served_model(config.upstreams[0]) if model is None or context is None else (None, None)
    source = model or served
    context = context or served_length
    pool_context = _pool_context(chosen, config.upstreams[0]) if context is None else None
    if pool_context is not None:
        context = pool_context[0]
        notes.append(f"context length {context:,} per request from {pool_context[1]} (give max_model_len to "
                     "override)")
    notes.extend(config.notes)
    prediction, spec = _predictor(chosen, source, config, notes)
    predictor = prediction.predictor
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
    if config.tokenizer:
        from kvbudget.tokens import PromptCounter

        counter = PromptCounter(config.tokenizer, engine=chosen)

        def count_prompt(body: dict[str, Any]) -> int:
            if isinstance(body.get("messages"), list):
                return counter.count_request(body["messages"]).prompt_tokens
            return counter.count_texts([str(body.get("prompt", ""))])[0]

        notes.append(f"prompt lengths from the tokenizer in {config.tokenizer}")
    else:
        notes.append("prompt lengths estimated from characters (4 per token); give a tokenizer for exact counts")
    guard = Guard(replace(config, upstreams=tuple(config.upstreams), engine=chosen, max_model_len=context),
                  replace(prediction, count_prompt=count_prompt), guard_log(decision_log))
    return guard, notes


def _predictor(chosen: Engine, source: str | None, config: GuardConfig, notes: list[str]
               ) -> tuple[Prediction, Any]:
    """What the guard predicts with: the model's allocation on the engine, against each replica's budget: the one
    given (kv_memory), else the pool the replica's engine states (read on every poll; the engine package turns it
    into bytes), else the config's kv_budget_bytes (the plan's estimate; until that pool is read, where there is
    one). The model read is returned beside it."""
    from kvbudget.model.load import load_model

    if source is None:
        notes.append("no model given and the upstream did not name one: acting on observed usage alone")
        return Prediction(), None
    try:
        spec = load_model(source)
    except KVBudgetError as exc:
        notes.append(f"model {source!r} cannot be resolved here ({exc}); acting on observed usage alone")
        return Prediction(), None
    pool = chosen if isinstance(chosen, ReportsPool) and not config.kv_memory else None
    budget = config.kv_memory or config.kv_budget_bytes
    given = spelled("kv_memory", "--kv-memory")
    if not budget and pool is None:
        notes.append(f"no KV budget ({chosen.name} states no pool; give {given}, or "
                     f"{spelled('kv_budget_bytes in the config', 'kv_budget_bytes in --config')}): acting on "
                     "observed usage alone")
        return Prediction(), spec
    # the upstream's device decides vLLM's block size on CPUs
    options = EngineOptions(device=Device.parse(config.device, "device"))
    predictor = Predictor(chosen.allocate(spec, options=options))
    said = f"predicting with {spec.name} on {chosen.name}: {predictor.allocation.bytes_per_token:,} bytes per token"
    if config.kv_memory:
        where = "kv_memory (given)" + (f", over the pool {chosen.name} states" if isinstance(chosen, ReportsPool)
                                       else "")
        notes.append(f"{said}, KV budget {budget:,} bytes per replica (given), from {given}"
                     f"{f' in place of the pool {chosen.name} states' if isinstance(chosen, ReportsPool) else ''}")
        return Prediction(predictor=predictor, budget=budget, budget_source=where), spec
    if pool is None:
        notes.append(f"{said}, KV budget {budget:,} bytes per replica (kv_budget_bytes in the config: the plan's "
                     f"estimate; {chosen.name} states no pool)")
        return Prediction(predictor=predictor, budget=budget, budget_source="kv_budget_bytes (config)"), spec
    engine = pool
    until = "" if not budget else (f"; the config's kv_budget_bytes {budget:,} (the plan's estimate) until it is "
                                   "read")
    notes.append(f"{said}, KV budget from each replica's own pool ({' or '.join(engine.pool_gauge.paths)}), read on "
                 f"every poll{until} (give {given} to override)")
    return Prediction(predictor=predictor, budget=budget, budget_source="kv_budget_bytes (config), until the "
                      "engine's pool is read" if budget else "",
                      pool_budget=lambda report: engine.pool_budget(spec, report, options=options)), spec


def server_config(guard: Guard, host: str, port: int, loop: str = "asyncio") -> Any:
    """The uvicorn configuration the guard serves with: its connection limits in the HTTP protocol (which also
    tells the app when a client leaves), access log off, 30 s to drain admitted requests on SIGTERM. uvicorn's
    X-Forwarded-For handling is off: the guard names clients itself, trusting only its `trusted_proxies`."""
    try:
        import uvicorn
    except ImportError:
        raise KVBudgetError("the guard needs starlette, uvicorn and httptools: pip install 'kvbudget[guard]'") from None
    from kvbudget.guard.limits import protocol_for

    protocol = protocol_for(guard.config.limits, guard.metrics, guard.log)
    return uvicorn.Config(guard.app(), host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=math.ceil(guard.config.shutdown_grace), access_log=False,
                          loop=loop, http=protocol, proxy_headers=False)


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
