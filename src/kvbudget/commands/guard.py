"""`guard`: the KV-aware proxy, assembled from its configuration file and command line (`guard.config`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbudget.commands.options import option, optional_one, size
from kvbudget.errors import KVBudgetError, spell


def _engines(default: str) -> Any:
    def help() -> str:
        from kvbudget.engines import serving_engines

        return f"one of {', '.join(e.name for e in serving_engines())} ({default})"
    return help


@dataclass(frozen=True, kw_only=True)
class GuardRequest:
    """What `guard` is asked, as given."""

    upstream: Sequence[str] = option("engine base URL (repeatable)", (), repeat=True)
    config: str | None = option("YAML: upstreams, engine, thresholds (e.g. from kvbudget plan --guard-config)")
    engine: str | None = option(_engines("default vllm, or the config's"))
    listen: str = option("HOST:PORT, [IPv6]:PORT or :PORT (all interfaces) to listen on (default 127.0.0.1:8080)",
                         "127.0.0.1:8080")
    model: str | None = option("the served model (catalog name, config, folder, Hub id) for predictions")
    kv_memory: str | None = option("KV budget per replica for predictions, over the pool the engine states (default: "
                                   "that pool, else the config's kv_budget_bytes)")
    tokenizer: str | None = option("tokenizer for exact prompt lengths (default: characters / 4)")
    max_model_len: str | None = option("the upstream's context length, what a request without max_tokens may fill "
                                       "(default: its /v1/models, else the model's config)")
    api_key: Sequence[str] = option("accept only these bearer tokens (repeatable)", (), repeat=True)
    priority_key: Sequence[str] = option("bearer tokens whose requests are high priority (repeatable; with keys, the "
                                         "x-kvbudget-priority header is ignored)", (), repeat=True)
    max_tokens_cap: str | None = option("level 1 caps max_tokens at this (default: half of what was asked)")
    max_waiting: str | None = option("refuse new requests (503, Retry-After; priority ones pass) while a replica's "
                                     "engine has N or more waiting in its queue (default: off; the queue is read "
                                     "from its /metrics)", metavar="N")
    poll_interval: str | None = option("seconds between metric scrapes, at least 0.05 (default: the config's "
                                       "poll_interval, else 1)")
    staleness: str | None = option("seconds after which scraped usage is stale, at least twice --poll-interval "
                                   "(default: the config's staleness_s, else 10)")
    device: str = option("vLLM backend the upstream runs (block size for predictions; default cuda)", "cuda",
                         choices=("cuda", "cpu"))
    sidecar: bool = option("one per engine replica, beside it: requests pass untouched (a router in front decides), "
                           "/metrics adds observed, predicted and kvbudget_guard_kv_usage to the engine's own, "
                           "/readyz fails at level 3", False)
    ext_proc: str | None = option("also serve the policy as an Envoy external processor (gRPC) on this address: "
                                  "body rewrites at levels 1-2, 503 at level 3; needs kvbudget[extproc]",
                                  metavar="HOST:PORT")
    max_connections_per_client: str | None = option("open connections one address may hold (503 and closed beyond; "
                                                    "trusted proxies exempt)", metavar="N")
    max_in_flight_per_client: str | None = option("requests one client may have in flight (429 with Retry-After "
                                                  "beyond); a client is its API key with --api-key, else "
                                                  "--client-header from a --trusted-proxy, else its address",
                                                  metavar="N")
    client_header: str | None = option("a header naming the client, believed only from a --trusted-proxy (e.g. "
                                       "x-client-id)", metavar="NAME")
    trusted_proxy: Sequence[str] = option("address of a proxy in front of the guard (repeatable): its "
                                          "--client-header is believed and its connections are not capped per "
                                          "client", (), repeat=True, metavar="ADDR")
    fail_closed: bool = option("reject when metrics are stale (default: the config's fail_open, else act on the "
                               "prediction)", False)


@dataclass(frozen=True)
class Serving:
    """A guard ready to serve: the guard, the notes to print at start, and the address to listen on."""

    guard: Any  # kvbudget.guard.app.Guard (its module needs kvbudget[guard])
    notes: list[str]
    host: str
    port: int


def _ext_proc(text: str) -> tuple[str, int]:
    """--ext-proc's address, checked here: the gRPC packages, and a port this machine can listen on."""
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
    except ImportError as exc:
        raise KVBudgetError(f"ext_proc needs {exc.name}: pip install 'kvbudget[extproc]'", param="ext_proc") from None
    from kvbudget.guard.server import bind
    from kvbudget.validate import listen_address

    try:
        address = listen_address(text)
        bind(*address).close()  # a taken port or a foreign address fails here, in one line
    except KVBudgetError as exc:
        raise KVBudgetError(str(exc).replace("listen:", "ext_proc:", 1), param="ext_proc") from None
    return address


def _seconds(text: str | None, param: str) -> float | None:
    """A number of seconds as typed (None: not given; its range is checked with the configuration's)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise KVBudgetError(f"{param}: takes a number of seconds, not {text!r}", param=param) from None


def flags(ask: GuardRequest) -> dict[str, Any]:
    """The command line's settings, read, by the configuration file's key names (None: not given)."""
    counts = {name: optional_one(getattr(ask, name), name)
              for name in ("max_connections_per_client", "max_in_flight_per_client", "max_waiting")}
    return {"upstreams": list(ask.upstream), "engine": ask.engine, "model": ask.model,
            "kv_memory": size(ask.kv_memory, "kv_memory"), "tokenizer": ask.tokenizer,
            "api_keys": list(ask.api_key), "priority_keys": list(ask.priority_key),
            "max_tokens_cap": optional_one(ask.max_tokens_cap, "max_tokens_cap"),
            "poll_interval": _seconds(ask.poll_interval, "poll_interval"), "staleness_s": _seconds(
                ask.staleness, "staleness"), "fail_open": False if ask.fail_closed else None, "device": ask.device,
            "max_model_len": optional_one(ask.max_model_len, "max_model_len"),
            "sidecar": ask.sidecar, **counts, "client_header": ask.client_header or None,
            "trusted_proxies": list(ask.trusted_proxy)}


def answer(ask: GuardRequest) -> Serving:
    """The guard a request describes: its configuration file with the command line merged over it, checked."""
    try:
        from kvbudget.guard.config import read
        from kvbudget.guard.server import assemble
        from kvbudget.validate import listen_address
    except ImportError as exc:
        raise KVBudgetError(f"the guard needs {exc.name}: pip install 'kvbudget[guard]'") from None

    host, port = listen_address(ask.listen)
    ext_proc = _ext_proc(ask.ext_proc) if ask.ext_proc else None
    config = read(ask.config, "config", {**flags(ask), "ext_proc": ext_proc})
    guard, notes = assemble(config)
    return Serving(guard, [spell(note, command_line=True) for note in notes], host, port)
