"""`kvbudget guard` (the KV-aware proxy) and `kvbudget alerts` (rules and a dashboard for the same levels)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvbudget.choices import Device
from kvbudget.cli.common import write_atomically
from kvbudget.commands.options import one, read_yaml, size
from kvbudget.engines import serving_engines
from kvbudget.errors import KVBudgetError


def add_parser(sub: Any) -> None:
    names = ", ".join(e.name for e in serving_engines())
    gd = sub.add_parser("guard", help="KV-aware OpenAI-compatible proxy with three degradation levels")
    gd.add_argument("--upstream", action="append", default=[], help="engine base URL (repeatable)")
    gd.add_argument("--config", help="YAML: upstreams, engine, thresholds (e.g. from kvbudget plan --guard-config)")
    gd.add_argument("--engine", help=f"one of {names} (default vllm, or the config's)")
    gd.add_argument("--listen", default="127.0.0.1:8080",
                    help="HOST:PORT, [IPv6]:PORT or :PORT (all interfaces) to listen on (default 127.0.0.1:8080)")
    gd.add_argument("--model", help="the served model (catalog name, config, folder, Hub id) for predictions")
    gd.add_argument("--kv-memory", help="KV budget per replica for predictions (default: the config's)")
    gd.add_argument("--tokenizer", help="tokenizer for exact prompt lengths (default: characters / 4)")
    gd.add_argument("--max-model-len", help="the upstream's context length, what a request without max_tokens may "
                                            "fill (default: its /v1/models, else the model's config)")
    gd.add_argument("--api-key", action="append", default=[], help="accept only these bearer tokens (repeatable)")
    gd.add_argument("--priority-key", action="append", default=[],
                    help="bearer tokens whose requests are high priority (repeatable; with keys, the "
                         "x-kvbudget-priority header is ignored)")
    gd.add_argument("--max-tokens-cap", help="level 1 caps max_tokens at this (default: half of what was asked)")
    gd.add_argument("--max-waiting", metavar="N",
                    help="refuse new requests (503, Retry-After; priority ones pass) while a replica's engine has N "
                         "or more waiting in its queue (default: off; the queue is read from its /metrics)")
    gd.add_argument("--poll-interval", default="1", help="seconds between metric scrapes (default 1)")
    gd.add_argument("--staleness", default="10", help="seconds after which scraped usage is stale (default 10)")
    gd.add_argument("--device", default=str(Device.CUDA), choices=Device.values(),
                    help="vLLM backend the upstream runs (block size for predictions; default cuda)")
    gd.add_argument("--sidecar", action="store_true",
                    help="one per engine replica, beside it: requests pass untouched (a router in front decides), "
                         "/metrics adds observed, predicted and kvbudget_guard_kv_usage to the engine's own, "
                         "/readyz fails at level 3")
    gd.add_argument("--ext-proc", metavar="HOST:PORT",
                    help="also serve the policy as an Envoy external processor (gRPC) on this address: body "
                         "rewrites at levels 1-2, 503 at level 3; needs kvbudget[extproc]")
    gd.add_argument("--max-connections-per-client", metavar="N",
                    help="open connections one address may hold (503 and closed beyond; trusted proxies exempt)")
    gd.add_argument("--max-in-flight-per-client", metavar="N",
                    help="requests one client may have in flight (429 with Retry-After beyond); a client is its "
                         "API key with --api-key, else --client-header from a --trusted-proxy, else its address")
    gd.add_argument("--client-header", metavar="NAME", help="a header naming the client, believed only from a "
                                                             "--trusted-proxy (e.g. x-client-id)")
    gd.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                    help="address of a proxy in front of the guard (repeatable): its --client-header is believed "
                         "and its connections are not capped per client")
    gd.add_argument("--fail-closed", action="store_true", help="reject when metrics are stale (default: act on "
                                                               "the prediction)")
    gd.set_defaults(run=run_guard)

    al = sub.add_parser("alerts", help="Prometheus alert rules and a Grafana dashboard for the three levels")
    al.add_argument("--engine", default="vllm", help=f"one of {names} (default vllm)")
    al.add_argument("--guard-config", help="take the thresholds from this guard YAML")
    al.add_argument("--out", default=".", help="folder for kvbudget-alerts.yaml and kvbudget-dashboard.json")
    al.set_defaults(run=run_alerts)


def run_alerts(args: argparse.Namespace) -> int:
    from kvbudget.guard.alerts import alert_rules, dashboard, thresholds_of

    thresholds = thresholds_of(read_yaml(args.guard_config, "guard_config")) if args.guard_config else {}
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise KVBudgetError(f"--out {args.out}: a file, not a folder; name a folder (it is created if missing)")
    rules, board = alert_rules(args.engine, thresholds), dashboard(args.engine, thresholds)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise KVBudgetError(f"--out {args.out}: cannot create the folder ({exc.strerror or exc})") from None
    write_atomically(os.path.join(args.out, "kvbudget-alerts.yaml"), rules, "--out")  # each says where it went
    write_atomically(os.path.join(args.out, "kvbudget-dashboard.json"), board, "--out")
    return 0


def run_guard(args: argparse.Namespace) -> int:
    try:
        from kvbudget.guard.server import build_guard, listen_address, serve
    except ImportError as exc:
        raise KVBudgetError(f"the guard needs {exc.name}: pip install 'kvbudget[guard]'") from None

    host, port = listen_address(args.listen)
    ext_proc = None
    if args.ext_proc:
        try:
            import grpc  # noqa: F401
            from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
        except ImportError as exc:
            raise KVBudgetError(f"--ext-proc needs {exc.name}: pip install 'kvbudget[extproc]'") from None
        from kvbudget.guard.server import bind

        try:
            ext_proc = listen_address(args.ext_proc)
            bind(*ext_proc).close()  # a taken port or a foreign address fails here, in one line
        except KVBudgetError as exc:
            raise KVBudgetError(str(exc).replace("listen:", "--ext-proc:", 1)) from None

    config = read_yaml(args.config, "config") if args.config else {}
    for name in ("max_connections_per_client", "max_in_flight_per_client", "max_waiting"):
        if getattr(args, name) is not None:
            config[name] = one(getattr(args, name), name)
    if args.client_header:
        config["client_header"] = args.client_header
    if args.trusted_proxy:
        config["trusted_proxies"] = list(config.get("trusted_proxies") or []) + args.trusted_proxy
    try:
        poll, stale = float(args.poll_interval), float(args.staleness)
    except ValueError:
        raise KVBudgetError("--poll-interval and --staleness take seconds (numbers)") from None
    guard, notes = build_guard(
        upstreams=args.upstream or config.get("upstreams", []), engine=args.engine or config.get("engine", "vllm"),
        config=config, model=args.model or config.get("model"),
        kv_memory=size(args.kv_memory, "kv_memory"), tokenizer=args.tokenizer, api_keys=args.api_key,
        priority_keys=args.priority_key,
        max_tokens_cap=one(args.max_tokens_cap, "max_tokens_cap") if args.max_tokens_cap else None,
        poll_interval=poll, staleness=stale, fail_open=not args.fail_closed, device=args.device,
        max_model_len=one(args.max_model_len, "max_model_len") if args.max_model_len else None,
        sidecar=args.sidecar, ext_proc=ext_proc)
    for note in notes:
        print(f"kvbudget guard: {note}", file=sys.stderr)
    serve(guard, host, port, announce=lambda line: print(f"kvbudget guard: {line}", file=sys.stderr, flush=True))
    return 0
