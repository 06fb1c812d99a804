"""What `kvbudget web` answers: every /api/ answer is a command's request answered by the library.

A request's parameters are the command's own options (`/api/estimate?model=llama-3.1-8b&tp=2` asks what
`kvbudget estimate llama-3.1-8b --tp 2 --json` asks): both front ends build the same typed request from the same
description of its fields (`kvbudget.commands`) and print or serve the same answer, so the page shows the CLI's
numbers. Only options that read and write nothing of the server's are taken; files come as uploads (a
config.json, a GGUF header, a trace, a quality report) into the server's own folder, named by their content."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from kvbudget import traces
from kvbudget.commands import spelling
from kvbudget.commands.estimate import EstimateRequest
from kvbudget.commands.estimate import answer as estimate_answer
from kvbudget.commands.fleet import is_fleet
from kvbudget.commands.options import Option, build, options
from kvbudget.commands.plan import CompareRequest, PlanRequest, as_json, compare_rows
from kvbudget.commands.plan import answer as plan_answer
from kvbudget.commands.recommend import RecommendRequest
from kvbudget.commands.simulate import SimulateRequest
from kvbudget.commands.simulate import simulation as simulation_answer
from kvbudget.errors import ConfigError, KVBudgetError
from kvbudget.files import read_json, write_file
from kvbudget.units import MIB

_TRUE, _FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one request, and all of them together, may ask of the server."""

    config_bytes: int = 1 * MIB  # an uploaded config.json
    gguf_header_bytes: int = 32 * MIB  # the first bytes of a GGUF file: its metadata and tensor table
    gguf_file_bytes: int = 2**40  # the size the header's file claims (its tensors are never sent)
    trace_bytes: int = 16 * MIB
    report_bytes: int = 4 * MIB  # a `kvbudget quality --json` report
    uploads: int = 200  # files kept; the oldest go first
    query_chars: int = 8192
    simulate_seconds: float = 60.0  # checked every few ms of a run
    simulate_requests: int = 50_000
    simulate_replicas: int = 64  # a fleet's replicas: every arrival advances each one's clock
    simulations_at_once: int = 2
    # `recommend` on a shared server: far stricter than the CLI's (5,000 candidates, 100,000 requests, 64 GPUs, no
    # time limit, a process pool), so that one search holds one core for a minute at most
    recommend_seconds: float = 60.0  # a search's wall time, checked every few ms of each simulation
    recommend_candidates: int = 100  # candidates a search may list
    recommend_requests: int = 2_000  # requests each candidate replays
    recommend_max_gpus: int = 8  # GPUs one candidate may take
    recommends_at_once: int = 1  # searches at once (each also holds one of the simulations' slots), serially
    recommend_answers: int = 8  # searches kept in memory, so that their files download without a second search
    heavy_at_once: int = 4  # answers being worked out at once, of every kind (simulations among them)
    queued_at_most: int = 32  # requests waiting for one of those (the page asks up to ten at once)
    queue_seconds: float = 15.0  # the longest one waits before a 503
    uploads_at_once: int = 4  # uploads being received at once (each held in memory up to its cap)
    retry_after_s: int = 5  # what a 503 for a busy or stopping server tells the client to wait
    header_timeout: float = 10.0  # seconds for a request line and headers (slow clients are closed: 408)
    body_timeout: float = 60.0  # seconds for a request body (an upload) after its headers
    max_header_bytes: int = 64 * 1024  # request line and headers (431)
    max_connections: int = 512  # open at once, well below the usual 1,024 file descriptors (503, closed)
    shutdown_grace_s: float = 5.0  # on SIGTERM/SIGINT: how long answers in progress may take to finish


# the limits the page shows (/api/choices)
PAGE_LIMITS = ("simulate_seconds", "simulate_requests", "config_bytes", "gguf_header_bytes", "trace_bytes",
               "report_bytes", "recommend_seconds", "recommend_candidates", "recommend_requests", "recommend_max_gpus")


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
        self.spellings = {str(folder.absolute()), str(self.folder)}  # the folder's names, given and resolved
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
                             "simulate": SimulateRequest, "recommend": RecommendRequest}


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
        if not key:
            raise WebError("a parameter without a name (=VALUE in the query); name it, as in tp=2")
        if key not in known_options:
            known = ", ".join(["model", *taken, *sorted(known_options)])
            raise WebError(f"unknown parameter {key!r} for {command}; known: {known}", key)
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
    if command == "compare" and len(models) < 2:
        raise WebError("model: compare two models or more (give model= once for each)", "model")
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


_DIRECTORIES = re.compile(r"(?<![\w:/.~-])(?:/[^\s/'\"]+)+/(?=[^\s/'\"])")  # /a/b/ of /a/b/file


def error_body(exc: KVBudgetError, uploads: Uploads | None = None, names: dict[str, str] | None = None
               ) -> dict[str, Any]:
    """The error in one line as the command line says it (the page takes the same names), and the field it is
    about; an upload's path on the server shows as the name it was uploaded with (`names`) or its id, and any
    other absolute path as its file name alone: no answer shows where the server keeps its files."""
    return {"error": scrubbed(spelling.message(exc), uploads, names), "field": field_of(exc)}


def scrubbed(message: str, uploads: Uploads | None = None, names: dict[str, str] | None = None) -> str:
    """`message` without the server's folders (see `error_body`)."""
    for path, name in (names or {}).items():
        message = message.replace(path, name)
    if uploads is not None:
        for folder in uploads.spellings:
            message = message.replace(f"{folder}{os.sep}", "upload:")
    return _DIRECTORIES.sub("", message)


class Job:
    """One heavy request in progress: `check()` (called every few ms by a simulation) ends it by raising once its
    client has left, the server is stopping or its time is up; `progress(requests)` bounds a simulation's
    requests."""

    def __init__(self, work: Work, seconds: float, past: WebError | None = None):
        self.work, self.deadline, self.left = work, time.monotonic() + seconds, threading.Event()
        self.past = past  # what running past the deadline says (None: a simulation's line)

    def check(self) -> None:
        limits = self.work.limits
        if self.work.stopping.is_set():
            raise WebError("the server is stopping; try again when it is back", status=503)
        if self.left.is_set():
            raise WebError("the client left; the answer was not finished", status=499)
        if time.monotonic() > self.deadline:
            if self.past is not None:
                raise self.past
            raise WebError(f"simulate: ran past the page's {limits.simulate_seconds:g} s limit; simulate fewer "
                           "requests (slice) or run `kvbudget simulate` yourself", "slice")

    def progress(self, requests: int) -> None:
        if requests > self.work.limits.simulate_requests:
            raise WebError(f"slice: the workload has more than {self.work.limits.simulate_requests:,} requests, "
                           "the page's limit; give slice=START:COUNT or fewer requests", "slice")
        self.check()


def search_past(limits: Limits) -> WebError:
    return WebError(f"recommend: the search ran past the page's {limits.recommend_seconds:g} s limit; search fewer "
                    "candidates (fewer GPUs, max_gpus, tp or kv_dtype values) or fewer requests (slice), or run "
                    "`kvbudget recommend` yourself", "max_gpus")


class Work:
    """The answers being worked out: at most `limits.heavy_at_once` at a time, of every kind, and of them at most
    `limits.simulations_at_once` simulations. A request over the first waits its turn (the page asks a few at
    once), at most `limits.queued_at_most` of them and for `limits.queue_seconds`; any other is refused at once
    (503). `stop()` (the server stopping) ends the simulations in progress and refuses new work."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._heavy = threading.BoundedSemaphore(limits.heavy_at_once)
        self._simulations = threading.BoundedSemaphore(limits.simulations_at_once)
        self._searches = threading.BoundedSemaphore(limits.recommends_at_once)
        self._receiving = threading.BoundedSemaphore(limits.uploads_at_once)
        self._queued = 0
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def _refuse_if_stopping(self) -> None:
        if self.stopping.is_set():
            raise WebError("the server is stopping; try again when it is back", status=503)

    @contextmanager
    def receiving(self) -> Iterator[None]:
        """A slot for receiving one upload's bytes (at most `limits.uploads_at_once` at a time: each holds up to
        its cap in memory); none free: 503."""
        self._refuse_if_stopping()
        if not self._receiving.acquire(blocking=False):
            raise WebError(f"the server is receiving {self.limits.uploads_at_once} uploads, its limit; try again "
                           "in a few seconds", status=503)
        try:
            yield
        finally:
            self._receiving.release()

    @asynccontextmanager
    async def slot(self, simulation: bool = False, search: bool = False) -> AsyncIterator[Job]:
        """A slot for one answer, held until the work ends (raises WebError 503 when none comes); a search
        (`recommend`) also holds one of the simulations' slots, and its job the search's time limit."""
        self._refuse_if_stopping()
        if search and not self._searches.acquire(blocking=False):
            raise WebError(f"recommend: the server is running {self.limits.recommends_at_once} search(es), its "
                           "limit; try again in a minute", status=503)
        try:
            async with self._simulation(simulation or search):
                await self._take()
                try:
                    yield (Job(self, self.limits.recommend_seconds, search_past(self.limits)) if search
                           else Job(self, self.limits.simulate_seconds))
                finally:
                    self._heavy.release()
        finally:
            if search:
                self._searches.release()

    @asynccontextmanager
    async def _simulation(self, held: bool) -> AsyncIterator[None]:
        if held and not self._simulations.acquire(blocking=False):
            raise WebError("simulate: the server is running other simulations; try again in a few seconds",
                           status=503)
        try:
            yield
        finally:
            if held:
                self._simulations.release()

    async def _take(self) -> None:
        limits = self.limits
        if self._heavy.acquire(blocking=False):
            return
        if self._queued >= limits.queued_at_most:
            raise WebError(f"the server is working out {limits.heavy_at_once} answers and has "
                           f"{limits.queued_at_most} waiting, its limits; try again in a few seconds", status=503)
        self._queued += 1
        try:
            give_up = time.monotonic() + limits.queue_seconds
            while not self._heavy.acquire(blocking=False):  # (polled: no lock bound to one event loop)
                self._refuse_if_stopping()
                if time.monotonic() > give_up:
                    raise WebError(f"the server stayed busy for {limits.queue_seconds:g} s; try again in a few "
                                   "seconds", status=503)
                await asyncio.sleep(0.02)
        finally:
            self._queued -= 1


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


def simulate(params: list[tuple[str, str]], uploads: Uploads, job: Job) -> Any:
    """One simulated run; `trace` names a bundled trace or an upload (none: synthetic arrivals at `rate`), and
    `guard=1` puts the guard in front with the plan of the same settings (`kvbudget plan --guard-config`)."""
    given = dict(params)
    ask = request("simulate", params, uploads, taken=("trace", "guard"))  # every parameter checked first
    chosen: dict[str, Any] = {}
    if given.get("trace"):
        chosen["trace"] = str(trace_path(given["trace"], uploads))
    most = job.work.limits.simulate_requests
    if given.get("requests", "").isdigit() and len(given["requests"]) < 12 and int(given["requests"]) > most:
        raise WebError(f"requests: at most {most:,} on this page", "requests")
    if given.get("guard", "").lower() in _TRUE:
        plan_keys = set(OPTIONS["plan"])
        config = guard_yaml([(k, v) for k, v in params if k == "model" or k in plan_keys], uploads)
        path = uploads.folder / f"guard-{hashlib.sha256(config.encode()).hexdigest()[:24]}.yaml"
        write_file(str(path), config, "guard", force=True)
        chosen["guard_config"] = str(path)
    ask = replace(ask, **chosen)
    if is_fleet(ask):
        return _fleet(ask, job)
    return simulation_answer(ask, progress=job.progress, check=job.check).to_dict()


def _fleet(ask: SimulateRequest, job: Job) -> Any:
    """A fleet of `replicas` behind `router` (`kvbudget simulate --replicas N --router NAME`), within the page's
    limit of replicas; the guard stands in front of one engine only."""
    from kvbudget.commands.fleet import fleet_dict, fleet_simulation
    from kvbudget.commands.options import one

    most = job.work.limits.simulate_replicas
    if ask.replicas is not None and one(ask.replicas, "replicas") > most:
        raise WebError(f"replicas: at most {most:,} on this page (run `kvbudget simulate` for more)", "replicas")
    if ask.guard_config:
        raise WebError("guard: stands in front of one engine; in front of a fleet it is not simulated yet: turn "
                       "it off, or leave replicas empty", "guard")
    return fleet_dict(fleet_simulation(ask, progress=job.progress, check=job.check)[0])


_REPORT_FIELDS = {"model": str, "context": int, "data": list, "matmul": str, "results": list, "verdict": str,
                  "notes": list}
_RESULT_FIELDS = {"variant": str, "tokens": int, "windows": int, "kl_mean": float, "top1_agreement": float,
                  "perplexity_change": float}


def quality_report(path: Path) -> dict[str, Any]:
    """A report `kvbudget quality --json` wrote, checked against that contract."""
    doc = read_json(path, "report")  # bounded: UTF-8, its size, nesting and numbers
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
