"""The part of llama.cpp's compute buffer that grows with the context (`attention_scratch`), against real
llama-server start-ups (tests/data/llamacpp/compute-buffers.json): from n_ctx 2048 to 8192 the buffer each run
printed grows by what the KQ masks and, without flash attention, one layer's scores take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvbudget
from kvbudget.engines.llamacpp.engine import attention_scratch, pad
from kvbudget.engines.llamacpp.releases import Release
from kvbudget.model.spec import LatentAttention
from kvbudget.units import MIB

DATA = json.loads((Path(__file__).parents[1] / "data" / "llamacpp" / "compute-buffers.json").read_text())
PAIRS = sorted({(r["model"], r["flash_attn"], r["n_ubatch"]) for r in DATA["runs"]})
ROUNDING = 0.01  # two printed figures, each rounded to 0.01 MiB


def _printed(model: str, fa: str, ub: int, ctx: int) -> float:
    return next(r["compute_mib"] for r in DATA["runs"] if (r["model"], r["flash_attn"], r["n_ubatch"], r["n_ctx"])
                == (model, fa, ub, ctx))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-fa-{p[1]}-ub{p[2]}")
def test_the_buffer_grows_with_the_context_as_the_graph_says(pair):
    name, fa, ub = pair
    model = kvbudget.load_model(DATA["configs"][name])
    flash, release = fa == "on", Release()
    grown = (attention_scratch(model, pad(8192, release.padding(flash)), ub, flash, release)
             - attention_scratch(model, pad(2048, release.padding(flash)), ub, flash, release)) / MIB
    logged = _printed(name, fa, ub, 8192) - _printed(name, fa, ub, 2048)
    if any(isinstance(layer, LatentAttention) for layer in model.layers) and not flash:
        assert abs(grown / logged - 1) < 0.02  # MLA without flash attention: other tensors grow too (known)
    else:
        assert abs(grown - logged) <= ROUNDING, (grown, logged)


def test_the_data_covers_both_attention_paths_and_a_real_model():
    assert {r["flash_attn"] for r in DATA["runs"]} == {"on", "off"}
    assert "smollm2-135m-instruct" in DATA["configs"] and len(PAIRS) >= 40


def test_the_plan_counts_it():
    """On the plan: 32k cells without flash attention add the scores of 32 query heads, 512 x 32,768 x 33 x 4."""
    model = kvbudget.load_model("llama-3.1-8b")
    opts = kvbudget.EngineOptions(attention_backend="no-flash")
    base = kvbudget.plan(model, engine="llamacpp", gpu="RTX-3090", max_model_len=1024, options=opts, recommend=False)
    long = kvbudget.plan(model, engine="llamacpp", gpu="RTX-3090", max_model_len=32768, options=opts, recommend=False)
    act = {p: {t.key: t.bytes for t in p.stack}["activation"] for p in (base, long)}
    assert act[long] - act[base] == 512 * (32768 - 1024) * (32 * 4 + 4)


def test_the_output_buffer_is_one_row_of_float32_logits_per_sequence():
    """Every recorded start-up (one slot) printed n_vocab x 4 bytes of output buffer: 0.19 MiB for SmolLM2's 49,152."""
    for run in DATA["runs"]:
        vocab = kvbudget.load_model(DATA["configs"][run["model"]]).config["vocab_size"]
        assert run["output_mib"] == round(vocab * 4 / MIB, 2), run


def test_check_log_checks_the_output_buffer_and_shows_the_compute_buffer():
    from kvbudget.engines.llamacpp.engine import LLAMACPP

    logs = Path(__file__).parents[1] / "data" / "logs"
    check = LLAMACPP.check_log((logs / "llama-server-gpt-oss-swa.log").read_text(),
                               kvbudget.load_model(logs / "gpt-oss-swa.config.json"))
    rows = {r.quantity.split(" (")[0]: r for r in check.rows}
    assert rows["output buffer"].matches is True and "2 sequence(s)" in rows["output buffer"].note
    assert rows["memory: compute buffer"].matches is None and check.all_match
