"""Calibrations kept by name: the time model `--calibrate` fitted, saved with the model and GPU it was fitted for
and reused by later runs (`--calibration NAME`) without the measurements. Kept as JSON files in
$KVBUDGET_CALIBRATIONS, else ~/.cache/kvbudget/calibrations."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from kvbudget import validate
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.errors import KVBudgetError, spelled
from kvbudget.files import read_json

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def calibrations_dir() -> Path:
    """Where named calibrations live."""
    return Path(os.environ.get("KVBUDGET_CALIBRATIONS") or Path.home() / ".cache" / "kvbudget" / "calibrations")


def _gpu(gpu: str | None) -> str | None:
    from kvbudget.gpus import find_gpu

    return find_gpu(gpu).name if gpu else None


def calibration_path(name: str, param: str = "save_calibration") -> Path:
    """The file of calibration `name` (checked to be a plain name)."""
    if not _NAME.match(name):
        raise KVBudgetError(f"{param} {name!r}: a name of letters, digits, '.', '_' and '-' (e.g. h100-llama-8b)",
                            param=param)
    return calibrations_dir() / f"{name}.json"


def calibration_target(name: str) -> Path:
    """The file calibration `name` is saved to, its folder made and the file checked to be writable, before a fit.
    Saving under a name again replaces that calibration (the command says so)."""
    from kvbudget.files import cannot_write, check_target

    path = calibration_path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_write(exc, str(path), "save_calibration") from None
    check_target(str(path), "save_calibration", force=True)
    return path


def save_calibration(name: str, time_model: TimeModel, model: str, gpu: str | None, source: str) -> Path:
    """Keep `time_model` (fitted for `model` on `gpu` from `source`) as `name` (replacing a calibration of that
    name); returns the file written."""
    from kvbudget.files import write_file

    path = calibration_target(name)
    data = {"name": name, "model": model, "gpu": _gpu(gpu), "source": source, "time_model": time_model.to_dict()}
    write_file(str(path), json.dumps(data, indent=2) + "\n", "save_calibration", force=True)
    return path


# (absent from calibrations saved before them)
ADDED = ("token_cost", "context_cost", "pair_cost", "seq_cost", "request_latency", "experts", "expert_share",
         "request_per_token", "pace", "pace_per_seq")


def load_calibration(name: str, model: str, gpu: str | None) -> TimeModel:
    """The time model saved as `name` (or in the file `name`), refused for another model or GPU: a step time fitted
    for one does not carry over."""
    path = Path(name) if name.endswith(".json") and Path(name).is_file() else calibration_path(name, "calibration")
    if not path.is_file():
        raise KVBudgetError(f"calibration {name!r}: no such calibration in {calibrations_dir()}; save one with "
                            "--calibrate FILE --save-calibration NAME", param="calibration")
    data = read_json(path, "calibration")  # bounded, UTF-8 text
    try:
        fitted = data["time_model"]
        time_model = TimeModel(**{k: fitted[k] for k in ("weights", "per_context", "per_token", "overhead", "bound",
                                                         "basis")},
                               **{k: fitted.get(k, 0.0) for k in ADDED})
    except (ValueError, KeyError, TypeError) as exc:
        raise KVBudgetError(f"calibration {name!r}: {path} is not a saved calibration ({exc})",
                            param="calibration") from None
    for key in ("weights", "per_context", "per_token", "overhead", *ADDED):
        try:  # (seconds, or a share of the experts: a day is past any of them)
            validate.number(getattr(time_model, key), key, 0.0, validate.MAX_SECONDS, above=False)
        except KVBudgetError as exc:
            again = spelled("save_calibration after a calibration", "--calibrate FILE --save-calibration NAME")
            raise KVBudgetError(f"calibration {name!r}: {path}: time_model.{exc}; save it again ({again})",
                                param="calibration") from None
    for what, want, saved in (("model", model, data.get("model")), ("GPU", _gpu(gpu), data.get("gpu"))):
        if want != saved:
            raise KVBudgetError(f"calibration {name!r} was fitted for {what} {saved}, not {want}: calibrate this "
                                "deployment (--calibrate) or give the calibration's own", param="calibration")
    return time_model
