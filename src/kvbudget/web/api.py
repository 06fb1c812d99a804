"""What `kvbudget web` answers: every /api/ answer is a command's request answered by the library.

A request's parameters are the command's own options (`/api/estimate?model=llama-3.1-8b&tp=2` asks what
`kvbudget estimate llama-3.1-8b --tp 2 --json` asks): both front ends build the same typed request from the same
description of its fields (`kvbudget.commands`) and print or serve the same answer, so the page shows the CLI's
numbers. Only options that read and write nothing of the server's are taken; files come as uploads (a
config.json, a GGUF header, a trace, a quality report) into the server's own folder, named by their content."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from kvbudget import traces
from kvbudget.commands import spelling
from kvbudget.commands.estimate import EstimateRequest
from kvbudget.commands.estimate import answer as estimate_answer
from kvbudget.commands.options import Option, build, options
from kvbudget.commands.plan import CompareRequest, PlanRequest, as_json, compare_rows
from kvbudget.commands.plan import answer as plan_answer
from kvbudget.commands.simulate import SimulateRequest
from kvbudget.commands.simulate import simulation as simulation_answer
from kvbudget.errors import ConfigError, KVBudgetError
from kvbudget.files import write_file
from kvbudget.units import MIB

_TRUE, _FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one request may ask of the server."""

    config_bytes: int = 1 * MIB  # an uploaded config.json
    gguf_header_bytes: int = 32 * MIB  # the first bytes of a GGUF file: its metadata and tensor table
    gguf_file_bytes: int = 2**40  # the size the header's file claims (its tensors are never sent)
    trace_bytes: int = 16 * MIB
    report_bytes: int = 4 * MIB  # a `kvbudget quality --json` report
    uploads: int = 200  # files kept; the oldest go first
    query_chars: int = 8192
    simulate_seconds: float = 60.0
    simulate_requests: int = 50_000
    simulations_at_once: int = 2


class WebError(KVBudgetError):
    """A request the page should show next to `field` (None: at the top), with an HTTP status."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field, self.status = field, status


class Uploads:
    """Uploaded files in one folder, named by their content's hash (an upload's id is `upload:NAME`)."""

    SUFFIXES: ClassVar[dict[str, tuple[str, ...]]] = {"model": (".json", ".gguf"), "trace": (".csv", ".jsonl"),
                                                      "report": (".json",)}

    def __init__(self, folder: Path, limits: Limits):
        self.folder, self.limits = folder.resolve(), limits
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def cap(self, kind: str, filename: str) -> int:
        """Bytes an upload of this kind and name may have."""
        suffix = self._suffix(kind, filename)
        return {".gguf": self.limits.gguf_header_bytes, ".csv": self.limits.trace_bytes,
                ".jsonl": self.limits.trace_bytes}.get(suffix, self.limits.config_bytes if kind == "model"
                                                       else self.limits.report_bytes)

    def _suffix(self, kind: str, filename: str) -> str:
        suffixes = self.SUFFIXES.get(kind)
        if suffixes is None:
            raise WebError(f"upload: kind {kind!r} is not one of {', '.join(self.SUFFIXES)}", "kind")
        suffix = Path(filename).suffix.lower()
        if suffix not in suffixes:
            raise WebError(f"{filename or 'the file'}: a {kind} upload is a {' or '.join(suffixes)} file", kind)
        return suffix

    def put(self, kind: str, filename: str, data: bytes, file_size: int | None = None) -> Path:
        """Keep the bytes; a GGUF header becomes a sparse file of the size the whole file has, so that its tensor
        table reads as the file's (the tensors themselves are never sent)."""
        suffix = self._suffix(kind, filename)
        if suffix == ".gguf" and (file_size is None or not len(data) <= file_size <= self.limits.gguf_file_bytes):
            raise WebError(f"{filename}: give the GGUF file's whole size (X-File-Size), at least the bytes sent and "
                           f"at most {self.limits.gguf_file_bytes:,}", kind)
        digest = hashlib.sha256(data + str(file_size).encode()).hexdigest()[:24]
        path = self.folder / f"{kind}-{digest}{suffix}"
        with self._lock:
            if not path.exists():
                def fill(f: BinaryIO) -> None:
                    f.write(data)
                    if suffix == ".gguf":
                        f.truncate(file_size)
                write_file(str(path), fill, "upload", force=True)
                self._evict()
        return path

    def _evict(self) -> None:
        kept = sorted(self.folder.glob("*-*.*"), key=lambda p: p.stat().st_mtime)
        for old in kept[:max(0, len(kept) - self.limits.uploads)]:
            old.unlink(missing_ok=True)

    def path(self, ref: str, kind: str, field: str) -> Path:
        name = ref.removeprefix("upload:")
        if not re.fullmatch(rf"{kind}-[0-9a-f]{{24}}\.[a-z]+", name) or not (self.folder / name).is_file():
            raise WebError(f"{ref}: no such upload on this server (uploads last as long as the server; upload "
                           "the file again)", field)
        return self.folder / name


REQUESTS: dict[str, type] = {"estimate": EstimateRequest, "plan": PlanRequest, "compare": CompareRequest,
                             "simulate": SimulateRequest}


def _options(command: str) -> dict[str, tuple[Any, Option]]:
    """The options a request may give `command`, by name, with their defaults: those that read and write nothing
    of the server's (the command's model aside)."""
    return {name: (default, opt) for name, default, opt in options(REQUESTS[command])
            if opt.web and not opt.positional}


OPTIONS = {command: _options(command) for command in REQUESTS}


def _model_ref(value: str, uploads: Uploads) -> str:
    if value.startswith("upload:"):
        return str(uploads.path(value, "model", "model"))
    if value.startswith(("/", "~", ".")) or "\\" in value or ".." in value or value.endswith((".json", ".gguf")):
        raise WebError(f"{value}: the page reads catalog names, Hub ids (org/name) and uploaded files, not the "
                       "server's files; upload the config.json or GGUF instead", "model")
    return value


def request(command: str, params: Iterable[tuple[str, str]], uploads: Uploads, taken: tuple[str, ...] = ()) -> Any:
    """The command's request a web request's parameters stand for; `taken` are parameters the caller reads
    itself."""
    known_options, models = OPTIONS[command], []
    values: dict[str, Any] = {}
    seen: set[str] = set()
    for key, value in params:
        value = value.strip()
        if key in taken:
            continue
        if key == "model":
            if value:
                models.append(_model_ref(value, uploads))
            continue
        if key not in known_options:
            known = ", ".join(["model", *taken, *sorted(known_options)])
            raise WebError(f"unknown parameter {key!r} for {command}; known: {known}")
        if key in seen:
            raise WebError(f"{key}: given twice; give it once", key)
        seen.add(key)
        default, opt = known_options[key]
        if default is False:  # a switch
            if value.lower() in _TRUE:
                values[key] = True
            elif value.lower() not in _FALSE and value:
                raise WebError(f"{key}: {value!r} is not on or off (1 or 0)", key)
        elif value:
            if opt.choices is not None and value not in opt.choices:
                raise WebError(f"{key}: {value!r} is not one of {', '.join(map(str, opt.choices))}", key)
            values[key] = value
    if not models:
        raise WebError("model: choose a model (a catalog name, a Hub id or an upload)", "model")
    if command != "compare" and len(models) > 1:
        raise WebError(f"model: {command} takes one model; the compare view takes several", "model")
    if command == "compare":
        values["models"] = tuple(models)
    else:
        values["model"] = models[0]
    return build(REQUESTS[command], values)


def field_of(exc: KVBudgetError) -> str | None:
    """The field an error is about: the page's own, or the parameter the library named."""
    if isinstance(exc, WebError):
        return exc.field
    if exc.param:
        return exc.param
    return "model" if isinstance(exc, ConfigError) else None


def error_body(exc: KVBudgetError, uploads: Uploads | None = None, names: dict[str, str] | None = None
               ) -> dict[str, Any]:
    """The error in one line as the command line says it (the page takes the same names), and the field it is
    about; an upload's path on the server shows as the name it was uploaded with (`names`) or its id."""
    message = spelling.message(exc)
    for path, name in (names or {}).items():
        message = message.replace(path, name)
    if uploads is not None:
        message = message.replace(f"{uploads.folder}/", "upload:")
    return {"error": message, "field": field_of(exc)}


class Simulations:
    """At most `limits.simulations_at_once` at a time, each stopped past its time or request limit."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.simulations_at_once)

    def run(self, go: Callable[[Callable[[int], None]], Any]) -> Any:
        if not self._slots.acquire(blocking=False):
            raise WebError("simulate: the server is running other simulations; try again in a few seconds",
                           status=503)
        deadline = time.monotonic() + self.limits.simulate_seconds

        def progress(requests: int) -> None:
            if requests > self.limits.simulate_requests:
                raise WebError(f"slice: the workload has more than {self.limits.simulate_requests:,} requests, the "
                               "page's limit; give slice=START:COUNT or fewer requests", "slice")
            if time.monotonic() > deadline:
                raise WebError(f"simulate: ran past the page's {self.limits.simulate_seconds:g} s limit; simulate "
                               "fewer requests (slice) or run `kvbudget simulate` yourself", "slice")
        try:
            return go(progress)
        finally:
            self._slots.release()


def trace_path(value: str, uploads: Uploads) -> Path:
    if value.startswith("upload:"):
        return uploads.path(value, "trace", "trace")
    entry = traces.find(value)
    if entry is None or value != entry.name:
        names = ", ".join(t.name for t in traces.bundled())
        raise WebError(f"trace: {value!r} is not one of {names} or an upload", "trace")
    return Path(entry.path)


def estimate(params: list[tuple[str, str]], uploads: Uploads) -> Any:
    return estimate_answer(request("estimate", params, uploads)).to_dict()


def plan_result(params: list[tuple[str, str]], uploads: Uploads) -> Any:
    """`plan`'s answer (a Plan, or the no-budget answer as a dict) of the request's plan parameters."""
    return plan_answer(request("plan", params, uploads))


def plan(params: list[tuple[str, str]], uploads: Uploads) -> Any:
    return as_json(plan_result(params, uploads))


def compare(params: list[tuple[str, str]], uploads: Uploads) -> Any:
    return [row.__dict__ for row in compare_rows(request("compare", params, uploads))]


def guard_yaml(params: list[tuple[str, str]], uploads: Uploads) -> str:
    from kvbudget.guard.config import guard_config_yaml
    from kvbudget.planner import NoBudget

    result = plan_result(params, uploads)
    if isinstance(result, NoBudget):
        raise WebError("guard: the deployment leaves no KV budget, so there is no plan to guard; change what the "
                       "plan recommends first", "model")
    return guard_config_yaml(result)


def simulate(params: list[tuple[str, str]], uploads: Uploads, simulations: Simulations) -> Any:
    """One simulated run; `trace` names a bundled trace or an upload (none: synthetic arrivals at `rate`), and
    `guard=1` puts the guard in front with the plan of the same settings (`kvbudget plan --guard-config`)."""
    given = dict(params)
    ask = request("simulate", params, uploads, taken=("trace", "guard"))  # every parameter checked first
    chosen: dict[str, Any] = {}
    if given.get("trace"):
        chosen["trace"] = str(trace_path(given["trace"], uploads))
    if given.get("requests", "").isdigit() and int(given["requests"]) > simulations.limits.simulate_requests:
        raise WebError(f"requests: at most {simulations.limits.simulate_requests:,} on this page", "requests")
    if given.get("guard", "").lower() in _TRUE:
        plan_keys = set(OPTIONS["plan"])
        config = guard_yaml([(k, v) for k, v in params if k == "model" or k in plan_keys], uploads)
        path = uploads.folder / f"guard-{hashlib.sha256(config.encode()).hexdigest()[:24]}.yaml"
        write_file(str(path), config, "guard", force=True)
        chosen["guard_config"] = str(path)
    ask = replace(ask, **chosen)
    return simulations.run(lambda progress: simulation_answer(ask, progress=progress)).to_dict()


_REPORT_FIELDS = {"model": str, "context": int, "data": list, "matmul": str, "results": list, "verdict": str,
                  "notes": list}
_RESULT_FIELDS = {"variant": str, "tokens": int, "windows": int, "kl_mean": float, "top1_agreement": float,
                  "perplexity_change": float}


def quality_report(path: Path) -> dict[str, Any]:
    """A report `kvbudget quality --json` wrote, checked against that contract."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WebError(f"report: not the JSON report `kvbudget quality` writes ({exc})".splitlines()[0],
                       "report") from None
    if not isinstance(doc, dict):
        raise WebError("report: not the JSON report `kvbudget quality` writes (an object)", "report")
    for where, fields, obj in [("report", _REPORT_FIELDS, doc),
                               *((f"results[{i}]", _RESULT_FIELDS, r) for i, r in enumerate(doc.get("results", [])))]:
        if not isinstance(obj, dict):
            raise WebError(f"report: {where} is not an object", "report")
        for name, kind in fields.items():
            value = obj.get(name)
            if not isinstance(value, kind) and not (kind is float and isinstance(value, int)):
                raise WebError(f"report: {where}.{name} is missing or not a {kind.__name__}: not a JSON report "
                               "`kvbudget quality` wrote", "report")
    if not doc["results"]:
        raise WebError("report: it has no results", "report")
    return doc
