"""llama.cpp's compute buffer against real llama-server start-ups (tests/data/llamacpp/compute-buffers.json):
for the families whose graph kvbudget builds (graph.GRAPHED) the whole buffer, replayed through ggml's allocator,
is what each run printed; for the others, the buffer grows from n_ctx 2048 to 8192 by what the KQ masks and,
without flash attention, one layer's scores take (`attention_scratch`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvbudget
from kvbudget.engines.llamacpp import LLAMACPP, graph
from kvbudget.engines.llamacpp.engine import attention_scratch, compute_buffer, pad
from kvbudget.engines.llamacpp.releases import Release
from kvbudget.model.spec import LatentAttention
from kvbudget.units import MIB

DATA = json.loads((Path(__file__).parents[1] / "data" / "llamacpp" / "compute-buffers.json").read_text())
ROUNDING = 0.01  # two printed figures, each rounded to 0.01 MiB
MODELS = {name: kvbudget.load_model(cfg) for name, cfg in DATA["configs"].items()}
REPLAYED = [r for r in DATA["runs"] if graph.shapes_of(MODELS[r["model"]]) is not None]
ONE_SLOT = [r for r in DATA["runs"] if r["n_parallel"] == 1 and r["n_ctx"] in (2048, 8192)]
# the estimate's growth with the context, where the graph is not replayed
PAIRS = sorted({(r["model"], r["flash_attn"], r["n_ubatch"]) for r in ONE_SLOT if r not in REPLAYED})


def _printed(model: str, fa: str, ub: int, ctx: int) -> float:
    return next(r["compute_mib"] for r in ONE_SLOT if (r["model"], r["flash_attn"], r["n_ubatch"], r["n_ctx"])
                == (model, fa, ub, ctx))


def _id(run: dict) -> str:
    slots = f"-np{run['n_parallel']}{'-unified' if run['unified'] else ''}"
    return f"{run['model']}-fa-{run['flash_attn']}-ub{run['n_ubatch']}-c{run['n_ctx']}{slots}"


@pytest.mark.parametrize("run", REPLAYED, ids=_id)
def test_the_replayed_graph_reserves_what_llama_server_printed(run):
    model, flash = MODELS[run["model"]], run["flash_attn"] == "on"
    kv = LLAMACPP.server_buffers(model, run["n_ctx"], run["n_parallel"], unified=run["unified"], flash_attn=flash,
                                 n_ubatch=run["n_ubatch"])[0]
    n_tokens = min(run["n_ctx"], max(2048, run["n_ubatch"]), run["n_ubatch"])  # -b max(2048, n_ubatch)
    size, replayed = compute_buffer(model, kv.cells, n_tokens, run["n_parallel"], flash, Release(),
                                    unified=run["unified"])
    assert replayed and f"{size / MIB:.2f}" == f"{run['compute_mib']:.2f}"


def test_the_replayed_runs_cover_the_families_slots_and_odd_batches():
    families = {MODELS[r["model"]].model_type for r in REPLAYED}
    assert families == {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text"}
    assert len(REPLAYED) >= 80 and {r["unified"] for r in REPLAYED if r["n_parallel"] > 1} == {True, False}
    assert any(r["n_ubatch"] % r["n_parallel"] for r in REPLAYED)  # rounded up to a multiple of the slots
    assert any(r["n_ctx"] < r["n_ubatch"] for r in REPLAYED)  # the batch capped by the context


def test_a_quantized_cache_or_an_older_build_is_left_to_the_estimate():
    model = MODELS["smollm2-135m-instruct"]
    assert compute_buffer(model, 2048, 512, 1, True, Release(), quantized=True)[1] is False
    assert compute_buffer(model, 2048, 512, 1, True, Release(6000))[1] is False


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}-fa-{p[1]}-ub{p[2]}")
def test_the_buffer_grows_with_the_context_as_the_graph_says(pair):
    name, fa, ub = pair
    model = MODELS[name]
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
    assert "smollm2-135m-instruct" in DATA["configs"] and len(PAIRS) >= 16


def test_the_plan_takes_the_replayed_buffer():
    """The plan's activation term on llama.cpp is the replayed compute buffer of one slot of max_model_len: at 32k
    cells without flash attention mostly the scores of 32 query heads and the f32 mask, 512 x 32,768 x 33 x 4."""
    model = kvbudget.load_model("llama-3.1-8b")
    opts = kvbudget.EngineOptions(attention_backend="no-flash")
    plans = [kvbudget.plan(model, engine="llamacpp", gpu="RTX-3090", max_model_len=n, options=opts, recommend=False)
             for n in (1024, 32768)]
    act = [{t.key: t for t in p.stack}["activation"] for p in plans]
    assert [a.bytes for a in act] == [compute_buffer(model, n, 512, 1, False, Release())[0] for n in (1024, 32768)]
    assert 0 < act[1].bytes - 512 * 32768 * 33 * 4 < 0.1 * act[1].bytes
    assert act[1].estimate and "replayed" in act[1].note  # exact on the CPU backend; a GPU's differs a little


def test_the_output_buffer_is_one_row_of_float32_logits_per_sequence():
    """Every recorded start-up printed n_vocab x 4 bytes of output buffer per slot: 0.19 MiB for SmolLM2's 49,152."""
    for run in DATA["runs"]:
        vocab = MODELS[run["model"]].config["vocab_size"]
        assert run["output_mib"] == round(run["n_parallel"] * vocab * 4 / MIB, 2), run


def test_check_log_checks_a_replayed_cpu_compute_buffer_and_shows_the_others():
    """gpt-oss's graph is replayed, so its real CPU log's compute buffer (two slots, sliding and full caches) is
    checked; a build older than the graph replayed (b6209, its buffers on RPC devices) is shown beside the
    estimate."""
    logs = Path(__file__).parents[1] / "data" / "logs"
    check = LLAMACPP.check_log((logs / "llama-server-gpt-oss-swa.log").read_text(),
                               kvbudget.load_model(logs / "gpt-oss-swa.config.json"))
    rows = {r.quantity.split(" (")[0]: r for r in check.rows}
    assert rows["output buffer"].matches is True and "2 sequence(s)" in rows["output buffer"].note
    assert rows["memory: compute buffer"].matches is True and check.all_match
    old = LLAMACPP.check_log((logs / "llama-cli-b6209-arm-rpc-llama-3.1-70b-q4_0.log").read_text(),
                             kvbudget.load_model("llama-3.1-70b"))
    [shown] = [r for r in old.rows if r.quantity.startswith("memory: compute buffer")]
    assert shown.matches is None and "estimate" in shown.note
