"""`recommend` on the page: the search within the page's limits (`api.Limits.recommend_*`), its answer, and the
chosen deployment's files, kept in memory and downloaded as one zip (nothing is written on the server)."""

from __future__ import annotations

import io
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbudget.commands import spelling
from kvbudget.errors import KVBudgetError
from kvbudget.web.api import Job, Limits, Uploads, WebError, request, trace_path

if TYPE_CHECKING:
    from kvbudget.deploy import DeployFile
    from kvbudget.simulation.recommend import Recommendation


@dataclass(frozen=True)
class Found:
    """A search's answer as the page gets it (what `kvbudget recommend --json` prints, with `files`: the chosen
    deployment's files) and those files, for the download."""

    answer: dict[str, Any]
    files: tuple[DeployFile, ...]


def recommend(params: list[tuple[str, str]], uploads: Uploads, job: Job) -> Found:
    """`kvbudget recommend --json` within the page's limits (`Limits.recommend_*`, each refused in one line
    before the search), run serially in this worker, `job.check` ending it past its time; `trace` names a bundled
    trace or an upload (none: synthetic arrivals at `rate`)."""
    from kvbudget.commands.options import one
    from kvbudget.commands.recommend import prepared, recommendation
    from kvbudget.model.weights import model_weights
    from kvbudget.simulation.recommend import candidates

    limits, given = job.work.limits, dict(params)
    ask = request("recommend", params, uploads, taken=("trace",))  # every parameter checked first
    if one(ask.max_gpus, "max_gpus") > limits.recommend_max_gpus:
        raise WebError(f"max_gpus: at most {limits.recommend_max_gpus} on this page (run `kvbudget recommend` for "
                       "more)", "max_gpus")
    most = limits.recommend_requests
    if ask.requests.isdigit() and (len(ask.requests) > 9 or int(ask.requests) > most) and not given.get("trace"):
        raise WebError(f"requests: at most {most:,} on this page", "requests")
    ask = replace(ask, backend="serial", trace=str(trace_path(given["trace"], uploads)) if given.get("trace")
                  else None)
    ready = prepared(ask)  # the CLI's checks: the objectives, GPUs, prices, the space, the traffic
    listed = len(candidates(ready.space))
    if listed > limits.recommend_candidates:
        raise WebError(f"max_gpus: the search space holds {listed:,} candidates, more than the "
                       f"{limits.recommend_candidates:,} this page searches; lower max_gpus, or give fewer GPUs or "
                       "fewer values per setting (or run `kvbudget recommend`)", "max_gpus")
    if len(ready.requests) > most:
        raise WebError(f"slice: the traffic holds {len(ready.requests):,} requests, more than the {most:,} each "
                       f"candidate replays on this page; give slice=START:COUNT (e.g. 0:{most})", "slice")
    found = recommendation(ask, ready, lambda done, total: job.check(), check=job.check)  # (and between runs)
    answer = found.to_dict()
    written: tuple[DeployFile, ...] = ()
    if found.best is not None:
        try:
            written = chosen_files(found, model_weights(ready.ask.model).total_bytes)
        except KVBudgetError as exc:  # the answer stands; the files cannot be written for it
            answer["files_error"] = spelling.message(exc)
    answer["files"] = [f.__dict__ for f in written]
    return Found(answer, written)


def chosen_files(found: Recommendation, model_bytes: int) -> tuple[DeployFile, ...]:
    """What `kvbudget recommend --out DIR` writes for `found`'s chosen deployment: `kvbudget.deploy.files`, each
    pool planned as it was simulated, and deployment.json."""
    from kvbudget.commands.recommend import deployment_json
    from kvbudget.deploy import DeployFile, files

    assert found.best is not None
    deployment = found.deployment()
    setup = found.setups[found.best.candidate.setting]
    return (*files(deployment, {pool.role: setup for pool in deployment.pools}, model_bytes),
            DeployFile(name="deployment.json", text=deployment_json(deployment), what="the chosen deployment, as "
                       "JSON (kvbudget.deployment.Deployment)", apply="keep it: every other file was written from it"))


def zipped(written: Iterable[DeployFile]) -> bytes:
    """The files as one zip, built in memory (fixed dates: the same files give the same bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for f in written:
            info = zipfile.ZipInfo(f.name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if f.name.endswith(".sh") else 0o644) << 16
            archive.writestr(info, f.text, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


class Searches:
    """The last `limits.recommend_answers` searches' answers by their parameters, so that the download of their
    files does not search again (a search is deterministic: the same parameters give the same answer)."""

    def __init__(self, limits: Limits):
        self.limits, self._kept, self._lock = limits, OrderedDict[tuple[tuple[str, str], ...], Found](), \
            threading.Lock()

    @staticmethod
    def key(params: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v.strip()) for k, v in params if v.strip()))

    def get(self, params: list[tuple[str, str]]) -> Found | None:
        with self._lock:
            return self._kept.get(self.key(params))

    def put(self, params: list[tuple[str, str]], found: Found) -> Found:
        with self._lock:
            self._kept[self.key(params)] = found
            while len(self._kept) > self.limits.recommend_answers:
                self._kept.popitem(last=False)
        return found


# the options the page's other controls give (the deployment's model, engine and context; the traffic and router)
SHARED = ("engine", "max_model_len", "router", "trace", "rate", "requests", "cv", "prompt_tokens", "output_tokens",
          "lengths_from_trace", "seed", "rate_scale", "slice")


def form() -> list[dict[str, Any]]:
    """The search's own controls, from RecommendRequest's description (the CLI's --help): each option's name, help,
    default, choices and whether it is a switch."""
    from kvbudget.web.api import OPTIONS

    return [{"name": name, "help": opt.help() if callable(opt.help) else opt.help,
             "default": None if default is False else default, "choices": opt.choices, "switch": default is False,
             "required": opt.required}
            for name, (default, opt) in OPTIONS["recommend"].items() if name not in SHARED]
