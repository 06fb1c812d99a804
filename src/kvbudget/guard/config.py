"""The guard's configuration, one typed record (`GuardConfig`), and its file: written by `kvbudget plan
--guard-config` (`write_config`, `guard_config_yaml`), read back by `kvbudget guard --config`, `kvbudget alerts
--guard-config` and `kvbudget simulate --guard-config` (`read`).

The YAML is read once, checked as it is read (`parse`): a key the guard does not know, a value of the wrong type
(a string where a list of keys belongs would make every character a key), NaN, an infinity or a count below one
is refused in one line naming the file and the key. Command-line settings are merged in the same place, over
the file's (`parse`'s `flags`): the repeatable ones (API keys, trusted proxies) add to the file's, the others
replace them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

from kvbudget.errors import KVBudgetError, UpstreamConfigError, named, spelled
from kvbudget.guard.policy import Policy
from kvbudget.levels import HYSTERESIS, LEVELS, REJECT, find_level, queue_limits

if TYPE_CHECKING:
    from kvbudget.engines import Engine
    from kvbudget.engines.launch import Launch
    from kvbudget.planner import Plan


def fd_room() -> int:
    """The connections the process's file-descriptor limit leaves room for: 900 under the usual 1,024, at most
    10,000."""
    soft = 1024
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 10_124 if limit == resource.RLIM_INFINITY else limit
    except (ImportError, ValueError, OSError):  # no resource module (Windows): the usual limit
        pass
    return max(16, min(10_000, soft - 124))


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """What the guard's HTTP protocol allows a connection (`guard.limits`)."""

    header_timeout: float = 10.0  # seconds for a request line and headers
    max_header_bytes: int = 64 * 1024  # request line and headers
    max_connections: int = 900  # open at once (below the usual 1,024 file descriptors)
    body_timeout: float = 60.0  # seconds for a whole request body
    max_connections_per_client: int | None = None  # open at once from one address (None: no cap)
    trusted_proxies: frozenset[str] = frozenset()  # addresses the per-client cap does not apply to


@dataclass(frozen=True, kw_only=True)
class ClientLimits:
    """Fairness between clients (`guard.clients`)."""

    max_in_flight: int | None = None  # requests in flight per client (None: no cap)
    header: str | None = None  # a request header naming the client, trusted only from `trusted`
    trusted: frozenset[str] = frozenset()  # addresses of proxies whose `header` is believed


@dataclass(frozen=True, kw_only=True)
class LevelSetting:
    """One entry of the file's `levels`: the level (by its name and action), its threshold, and what the plan
    says it means in this deployment (bytes, tokens, requests; None where the file does not say)."""

    name: str
    action: str
    threshold: float
    kv_bytes: int | None = None
    tokens: int | None = None
    requests: int | None = None


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Everything the guard is configured with, from its file and its command line, checked."""

    upstreams: tuple[str, ...] = ()
    engine: str | Engine = "vllm"
    model: str | None = None  # the served model, for predictions
    tokenizer: str | None = None  # for exact prompt lengths (None: characters / 4)
    device: str = "cuda"  # the upstream's vLLM backend (its block size)
    max_model_len: int | None = None  # the upstream's context length: what a request without a limit may fill
    # the KV budget per replica to predict against: the file's (the plan's estimate) serves where the engine states
    # no pool of its own; one given (the command line's kv_memory) overrides the pool the engine states
    kv_budget_bytes: int | None = None
    kv_memory: int | None = None
    # the rest of the deployment as the plan wrote it (read, not acted on)
    gpu: str | None = None
    tp: int | None = None
    kv_cache_tokens: int | None = None
    bytes_per_token: int | None = None
    fixed_bytes_per_sequence: int | None = None
    levels: tuple[LevelSetting, ...] = ()  # as the file gives them; their thresholds are in `policy`
    policy: Policy = field(default_factory=Policy)
    api_keys: frozenset[str] = frozenset()
    priority_keys: frozenset[str] = frozenset()  # keys whose requests are high priority (also accepted keys)
    max_body_bytes: int = 4 * 2**20
    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0
    idle_timeout: float = 120.0
    max_response_bytes: int = 64 * 2**20  # a non-streamed upstream answer the guard holds to relay
    shutdown_grace: float = 30.0  # seconds admitted requests get to finish after SIGTERM
    limits: ConnectionLimits = field(default_factory=lambda: ConnectionLimits(max_connections=fd_room()))
    clients: ClientLimits = field(default_factory=ClientLimits)  # fairness between clients (guard.clients)
    poll_interval: float = 1.0  # seconds between metric scrapes
    # one replica's sidecar: requests pass untouched (the router in front decides), predicted and counted; its
    # /metrics adds the guard's gauges to a fresh copy of the engine's own
    sidecar: bool = False
    ext_proc: tuple[str, int] | None = None  # (host, port): also serve the policy as an Envoy external processor
    notes: tuple[str, ...] = ()  # what reading it says at start: the file's settings the command line replaced


# --- readers: a value as given -> the record's, or a one-line error ----------------------------------------------

Reader = Callable[[Any, str, str], Any]  # (value, where it was given, its parameter) -> the value


def _fail(where: str, why: str, value: Any, param: str) -> NoReturn:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise UpstreamConfigError(f"{where}: {why} (got {shown})", param=param)


BYTES_MOST = 2**53  # sizes and counts: 8 PiB, exact as a float in every prediction
TOKENS_MOST = 2**31 - 1  # token counts: what an engine reads as a 32-bit integer (as the guard's requests)
DAY = 86_400.0  # seconds: every timeout, interval and wait


def _whole(least: int, most: int = BYTES_MOST) -> Reader:
    def read(value: Any, where: str, param: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            _fail(where, f"must be a whole number from {least} to {most:,}", value, param)
        return value
    return read


def _number(least: float, above: bool, what: str = "number", most: float = DAY) -> Reader:
    def read(value: Any, where: str, param: str) -> float:
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or value < least or (above and value == least) or value > most):
            _fail(where, f"must be a {what} {'above' if above else 'of at least'} {least:g} and at most {most:,g}",
                  value, param)
        return float(value)
    return read


_fraction = _number(0, True, "fraction", most=1)


def _flag(value: Any, where: str, param: str) -> bool:
    if not isinstance(value, bool):
        _fail(where, "must be true or false", value, param)
    return value


def _text(value: Any, where: str, param: str) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(where, "must be a name (text)", value, param)
    return value


def _texts(what: str, secret: bool = False) -> Reader:
    """A list of strings, none repeated; `secret`: bearer tokens (printable, no spaces), and errors never show
    them (keys end up in logs)."""
    def read(value: Any, where: str, param: str) -> tuple[str, ...]:
        if isinstance(value, str):
            raise UpstreamConfigError(f"{where}: must be a list of {what}, not one string (a list of one: "
                                      f"[{'KEY' if secret else value}])", param=param)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v.strip() for v in value):
            why = f"must be a list of {what}, each a string"
            if secret:
                raise UpstreamConfigError(f"{where}: {why}", param=param)
            _fail(where, why, value, param)
        for i, v in enumerate(value, 1):
            if secret and not (v.isprintable() and v.isascii() and " " not in v):
                raise UpstreamConfigError(f"{where}: key {i} has spaces or characters a bearer token cannot carry; "
                                          "use printable ASCII without spaces", param=param)
            if v in value[:i - 1]:
                raise UpstreamConfigError(f"{where}: entry {i} repeats entry {value.index(v) + 1}"
                                          f"{'' if secret else f' ({v!r})'}; give each once", param=param)
        return tuple(value)
    return read


def _urls(value: Any, where: str, param: str) -> tuple[str, ...]:
    urls = _texts("URLs")(value, where, param)
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise UpstreamConfigError(f"{where} {url!r}: must be an http:// or https:// URL", param=param)
    return urls


def _choice(*allowed: str) -> Reader:
    def read(value: Any, where: str, param: str) -> str:
        if value not in allowed:
            _fail(where, f"must be one of {', '.join(allowed)}", value, param)
        return str(value)
    return read


def _address(value: Any, where: str, param: str) -> tuple[str, int]:
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
        _fail(where, "must be a (host, port) pair", value, param)
    return value


def _engine(value: Any, where: str, param: str) -> Any:
    return value if not isinstance(value, str | bytes) and hasattr(value, "name") else _text(value, where, param)


def _levels(value: Any, where: str, param: str) -> tuple[LevelSetting, ...]:
    if not isinstance(value, list):
        _fail(where, "must be a list of levels, each with name/action and threshold", value, param)
    return tuple(_level(entry, i, where, param) for i, entry in enumerate(value, 1))


LEVEL_KEYS = ("name", "action", "threshold", "kv_bytes", "tokens", "requests")


def _level(entry: Any, i: int, where: str, param: str) -> LevelSetting:
    if not isinstance(entry, dict):
        raise UpstreamConfigError(f"{where}: entry {i} must be a mapping with name/action and threshold",
                                  param=param)
    for key in entry:
        if key not in LEVEL_KEYS:
            raise UpstreamConfigError(f"{where}: entry {i}: unknown key {key!r}; a level takes "
                                      f"{', '.join(LEVEL_KEYS)}", param=param)
    by_name, by_action = find_level(name=entry.get("name")), find_level(action=entry.get("action"))
    if by_name and by_action and by_name != by_action:
        raise UpstreamConfigError(f"{where}: entry {i} names level {entry.get('name')!r} but action "
                                  f"{entry.get('action')!r}, which belongs to {by_action.name!r}", param=param)
    level = by_name or by_action
    if level is None:
        known = ", ".join(f"{lv.name} ({lv.action})" for lv in LEVELS)
        raise UpstreamConfigError(f"{where}: entry {i} names no known level; use one of {known}", param=param)
    threshold = entry.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise UpstreamConfigError(f"{where}: entry {i} ({level.name}) needs a numeric threshold (got "
                                  f"{threshold!r})", param=param)
    counts = {k: _whole(0)(entry[k], f"{where}: entry {i}: {k}", param) for k in LEVEL_KEYS[3:] if k in entry}
    return LevelSetting(name=level.name, action=level.action, threshold=float(threshold), **counts)


SECONDS = _number(0, True, "number of seconds")
POLL_LEAST = 0.05  # seconds between scrapes: 20 a second per replica at most (0 scraped 5,300 times a second)
TOKENS = _whole(1, TOKENS_MOST)
KEYS: dict[str, Reader] = {  # every key of the file, and how its value is read
    "upstreams": _urls, "engine": _engine, "model": _text, "gpu": _text, "tp": _whole(1),
    "kv_budget_bytes": _whole(1), "kv_cache_tokens": _whole(0), "bytes_per_token": _whole(0),
    "fixed_bytes_per_sequence": _whole(0), "max_model_len": TOKENS, "levels": _levels,
    "hysteresis": _number(0, False, most=1), "priority_reject": _fraction, "max_tokens_cap": TOKENS,
    "max_tokens_fraction": _fraction, "staleness_s": SECONDS, "fail_open": _flag,
    "retry_after_s": _whole(0, int(DAY)), "default_max_tokens": TOKENS, "max_waiting": _whole(1),
    "api_keys": _texts("keys", True), "priority_keys": _texts("keys", True), "max_body_bytes": _whole(1),
    "connect_timeout": SECONDS, "first_byte_timeout": SECONDS, "idle_timeout": SECONDS,
    "max_response_bytes": _whole(1), "shutdown_grace": _number(0, False, "number of seconds"),
    "header_timeout": SECONDS, "max_header_bytes": _whole(1), "max_connections": _whole(1),
    "body_timeout": SECONDS, "max_connections_per_client": _whole(1), "max_in_flight_per_client": _whole(1),
    "client_header": _text, "trusted_proxies": _texts("addresses"),
    "poll_interval": _number(POLL_LEAST, False, "number of seconds"),
}
FLAGS: dict[str, Reader] = {**KEYS, "tokenizer": _text, "device": _choice("cuda", "cpu"), "sidecar": _flag,
                            "ext_proc": _address, "kv_memory": _whole(1)}  # what the command line also sets
PARAM = {"upstreams": "upstream", "staleness_s": "staleness", "api_keys": "api_key", "priority_keys": "priority_key",
         "trusted_proxies": "trusted_proxy", "fail_open": "fail_closed"}  # a key's command-line parameter
ADDED = ("api_keys", "priority_keys", "trusted_proxies")  # the command line adds to the file's
POLICY = ("hysteresis", "priority_reject", "max_tokens_cap", "max_tokens_fraction", "staleness_s", "fail_open",
          "retry_after_s", "default_max_tokens", "max_waiting")
LIMITS = ("header_timeout", "max_header_bytes", "max_connections", "body_timeout", "max_connections_per_client")


def _unknown(source: str, key: Any) -> NoReturn:
    import difflib

    close = difflib.get_close_matches(str(key), list(KEYS), n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"remove it (the guard reads {', '.join(KEYS)})"
    raise UpstreamConfigError(f"{source}: unknown key {key!r}; {fix}", param=str(key))


def parse(data: Mapping[str, Any], source: str = "config", flags: Mapping[str, Any] | None = None) -> GuardConfig:
    """The guard's configuration from its file's mapping (`source` names the file in errors) and the command
    line's settings (`flags`, by the file's key names, None for not given: a flag's default never replaces the
    file's value), each checked; a flag given replaces the file's value, and says so in the record's notes."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in KEYS:
            _unknown(source, key)
        if value is not None:
            values[key] = KEYS[key](value, f"{source}: {key}", key)
    notes, flagged = [], set()
    for key, value in (flags or {}).items():
        if value is None or (isinstance(value, list | tuple) and not value):
            continue
        flagged.add(key)
        param = PARAM.get(key, key)
        given = FLAGS[key](tuple(value) if key in ADDED else value, param, param)
        if key in values and key not in ADDED and values[key] != given:
            if isinstance(given, bool):  # fail_open is the command line's --fail-closed
                shown = named(param, value=given if param == key else not given)
            else:
                shown = f"{named(param)} {given:g}" if isinstance(given, float) else f"{named(param)} {given}"
            before = str(values[key]).lower() if isinstance(given, bool) else values[key]
            notes.append(f"{shown} replaces {key}: {before} in {source}")
        values[key] = tuple(values.get(key, ())) + given if key in ADDED else given
    poll, stale = values.get("poll_interval", GuardConfig.poll_interval), values.get("staleness_s", Policy.staleness_s)
    if stale < 2 * poll:  # else a reading goes stale between two scrapes and the guard no longer sees the engine
        from_file = "staleness_s" in data and "staleness_s" not in flagged  # else the flag's, or the default
        param = "staleness_s" if from_file else "staleness"
        where = f"{source}: {param}" if from_file else param
        raise UpstreamConfigError(f"{where}: must be at least twice the poll interval ({2 * poll:g} s), or a "
                                  "reading goes stale before the next one and the engine's usage is not seen (got "
                                  f"{stale:g})", param=param)
    return _record(values, source if data else None, tuple(notes))


def _record(values: dict[str, Any], source: str | None, notes: tuple[str, ...] = ()) -> GuardConfig:
    levels = values.pop("levels", ())
    thresholds = {find_level(name=lv.name).key: lv.threshold for lv in levels}  # type: ignore[union-attr]
    try:
        policy = Policy(**thresholds, **{k: values.pop(k) for k in POLICY if k in values})
    except UpstreamConfigError as exc:
        raise UpstreamConfigError(f"{source}: {exc}" if source else str(exc), param=exc.param) from None
    trusted = frozenset(values.pop("trusted_proxies", ()))
    limits = {k: values.pop(k) for k in LIMITS if k in values}
    header, cap = values.pop("client_header", None), values.pop("max_in_flight_per_client", None)
    if header and not trusted:
        proxies = spelled("trusted_proxies", "--trusted-proxy ADDR")
        raise UpstreamConfigError(f"client_header: a header names a client only from a trusted proxy; give "
                                  f"{proxies} too (a client could name itself anything)", param="client_header")
    for key in ("api_keys", "priority_keys"):
        if key in values:
            values[key] = frozenset(values[key])
    return GuardConfig(
        **values, levels=levels, policy=policy, notes=notes,
        limits=ConnectionLimits(**{"max_connections": fd_room(), **limits}, trusted_proxies=trusted),
        clients=ClientLimits(max_in_flight=cap, header=header.strip().lower() if header else None, trusted=trusted))




def read_yaml(path: str, param: str) -> dict[str, Any]:
    """A YAML mapping from a file, its errors naming the file or the parameter."""
    try:
        import yaml  # noqa: F401  (only whether it is installed)
    except ImportError:
        raise KVBudgetError(f"{param} needs PyYAML: pip install 'kvbudget[guard]'", param=param) from None
    from kvbudget.files import read_yaml as read_bounded

    data = read_bounded(path, param) or {}  # within the size and nesting bounds, UTF-8 text
    if not isinstance(data, dict):
        raise KVBudgetError(f"{path}: expected a YAML mapping")
    return data


def read(path: str | None, param: str = "config", flags: Mapping[str, Any] | None = None) -> GuardConfig:
    """The guard's configuration from its file (None: none) and the command line's settings."""
    return parse(read_yaml(path, param) if path else {}, path or "config", flags)


def of(config: GuardConfig | Mapping[str, Any] | None, source: str = "config") -> GuardConfig:
    """A configuration as the library takes it: the record, a mapping as the file holds it, or None (defaults)."""
    return config if isinstance(config, GuardConfig) else parse(config or {}, source)


# --- the file `kvbudget plan --guard-config` writes ----------------------------------------------------------------

def write_config(*, model: str, engine: str, gpu: str, tp: int, kv_budget_bytes: int, kv_cache_tokens: int,
                 bytes_per_token: int, fixed_bytes_per_sequence: int, max_model_len: int,
                 levels: Iterable[Any], written_by: str = "kvbudget plan --guard-config") -> str:
    """The guard's configuration as YAML (plain scalars, written without a YAML library): the deployment's KV
    figures and each level's threshold and action with what it means in bytes, tokens and requests (`levels`:
    records with name, fraction, action, kv_bytes, tokens and requests, as the planner's degradation table has)."""
    lines = [
        f"# kvbudget guard configuration, written by `{written_by}`",
        f"# {model} on {gpu} with {engine}; thresholds are fractions of the KV budget.",
        f"model: {model}",
        f"engine: {engine}",
        f"gpu: {gpu}",
        f"tp: {tp}",
        f"kv_budget_bytes: {kv_budget_bytes}",
        f"kv_cache_tokens: {kv_cache_tokens}",
        f"bytes_per_token: {bytes_per_token}",
        f"fixed_bytes_per_sequence: {fixed_bytes_per_sequence}",
        f"max_model_len: {max_model_len}",
        f"hysteresis: {HYSTERESIS}",
        "levels:",
    ]
    for level in levels:
        lines += [
            f"  - name: {level.name}",
            f"    threshold: {level.fraction}",
            f"    action: {level.action}",
            f"    kv_bytes: {level.kv_bytes}",
            f"    tokens: {level.tokens}",
            f"    requests: {level.requests}",
        ]
    return "\n".join(lines) + "\n"


def guard_config_yaml(p: Plan) -> str:
    """The degradation plan as the guard's YAML configuration (`kvbudget guard --config`), and the engine's own
    queue limits from the same reject level as a comment (`engine_queue_flags`)."""
    text = write_config(model=p.model.name, engine=p.engine.name, gpu=p.gpu, tp=p.tp, kv_budget_bytes=p.kv_memory_bytes,
                        kv_cache_tokens=p.capacity.physical_token_slots, bytes_per_token=p.estimate.bytes_per_token,
                        fixed_bytes_per_sequence=p.estimate.fixed_bytes_per_sequence,
                        max_model_len=p.capacity.max_model_len, levels=p.levels)
    flags = engine_queue_flags(p)
    if flags is None:
        return text
    said = [f"# {p.engine.name}'s own admission from the {REJECT.name} level: {flags.shell}"] if flags.argv else []
    return text + "".join(f"{line}\n" for line in said + [f"# {note}" for note in flags.notes])


def engine_queue_flags(p: Plan) -> Launch | None:
    """The flags of the engine's own queue limits (vLLM's --max-num-queued-reqs and --max-num-queued-tokens) from
    the plan's reject level, as `kvbudget.deploy` sets them (`levels.queue_limits`); None for an engine without
    them."""
    from kvbudget.engines.launch import ShedsQueue

    if not isinstance(p.engine, ShedsQueue) or p.options.max_num_seqs is None:
        return None
    reject = next(level for level in p.levels if level.name == REJECT.name)
    reqs, tokens = queue_limits(p.options.max_num_seqs, reject.requests, reject.tokens)
    version = p.options.engine_version
    flags = p.engine.queue_flags(reqs, tokens, ".".join(map(str, version)) if version else None)
    if p.replicas > 1 and flags.argv:  # vLLM's API server counts over its data-parallel ranks (queued.py)
        flags = replace(flags, notes=(*flags.notes, f"the limits are one replica's: one server of {p.replicas} "
                                      f"data-parallel replicas counts over all of them (x{p.replicas})"))
    return flags


__all__ = ["ClientLimits", "ConnectionLimits", "GuardConfig", "LevelSetting", "engine_queue_flags", "guard_config_yaml",
           "of", "parse",
           "read", "read_yaml", "write_config"]
