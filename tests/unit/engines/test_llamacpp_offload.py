"""llama-server's partial offload (-ngl): how many layers fit on one GPU, by llama.cpp's own order (the output
first, then the decoder layers from the last), worked by hand for Llama-3.1-70B in bf16."""

from __future__ import annotations

import kvbudget
from kvbudget.engines import get_engine
from kvbudget.planner import NoKVBudget
from kvbudget.units import GIB

LAYER = 2 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192)  # bf16 attention, MLP, two norms
CACHE = 2 * 8 * 128 * 2 * 8192  # K and V, 8 KV heads of 128 in f16, 8,192 cells
OUTPUT = 2 * (128256 * 8192 + 8192)  # the LM head and the final norm


def _fixed(gpu: str, max_len: int) -> int:
    """The compute buffer and the runtime's memory, as the plan states them for llama.cpp."""
    try:
        stack = kvbudget.plan(kvbudget.load_model("llama-3.1-70b"), engine="llamacpp", gpu=gpu, max_model_len=max_len,
                              recommend=False).stack
        terms = {t.key: t.bytes for t in stack}
    except NoKVBudget as exc:
        terms = {t.key: t.bytes for t in exc.answer.stack}
    return terms["activation"] + terms["overhead"]


def test_the_layers_that_fit_are_counted_from_the_output():
    llama = get_engine("llamacpp")
    off = llama.offload(kvbudget.load_model("llama-3.1-70b"), 24 * GIB, 8192)
    assert off is not None and off.parameter == "n_gpu_layers" and off.of == 81
    room = 24 * GIB - _fixed("RTX-4090", 8192) - OUTPUT
    assert off.value == 1 + room // (LAYER + CACHE)
    assert off.gpu_bytes == _fixed("RTX-4090", 8192) + OUTPUT + (off.value - 1) * (LAYER + CACHE)


def test_only_the_output_or_nothing():
    llama = get_engine("llamacpp")
    model = kvbudget.load_model("llama-3.1-70b")
    just_output = _fixed("RTX-4090", 8192) + OUTPUT
    assert llama.offload(model, just_output, 8192).value == 1
    assert llama.offload(model, just_output - 1, 8192) is None


def test_a_model_that_fits_needs_no_offload_and_other_engines_do_not_offload():
    assert get_engine("llamacpp").offload(kvbudget.load_model("llama-3.1-8b"), 24 * GIB, 8192) is None
    assert get_engine("vllm").offload(kvbudget.load_model("llama-3.1-70b"), 24 * GIB, 8192) is None


def test_the_plan_offers_it_where_the_model_does_not_fit():
    try:
        kvbudget.plan(kvbudget.load_model("llama-3.1-70b"), engine="llamacpp", gpu="RTX-4090", max_model_len=8192)
        raise AssertionError("70B in bf16 does not fit a 24 GB card")
    except NoKVBudget as exc:
        recs = exc.answer.recommendations
    from kvbudget.gpus import find_gpu

    card = find_gpu("RTX-4090").memory_bytes
    ngl = get_engine("llamacpp").offload(kvbudget.load_model("llama-3.1-70b"), card, 8192)
    assert ngl is not None and recs[0].parameters == {"n_gpu_layers": ngl.value} and recs[0].makes_it_fit
    assert "host memory" in recs[0].note
