"""Every model `kvbudget models` lists plans: its weights are counted and it fits a catalog GPU (issue 55, item 5)."""

from __future__ import annotations

import json

import pytest

import kvbudget
from kvbudget import catalog, load_model
from kvbudget.cli import main
from kvbudget.commands.plan import low_end_shortfall
from kvbudget.errors import KVBudgetError
from kvbudget.gpus import gpus
from kvbudget.simulation.steptimes import step_work

# A request of 8,192 tokens (or the model's own maximum where shorter): what fits is then a question of the weights;
# the models' own maxima (up to 10M tokens) are one of KV capacity, which `plan` answers at any length.
REQUEST = 8192
# Beyond the largest single card: H200s under tensor parallelism, then pipeline stages as well.
SPREAD = ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4))
NEW_FAMILIES = ("gemma-3n-e2b", "gemma-4-26b-a4b", "kimi-linear-48b-a3b", "deepseek-v4-flash", "deepseek-v4-pro")


def holds(model, checked: bool = False, **where) -> bool:
    """Whether `model` fits there with one request (`checked`: also at the low end of the KV budget's error band, as
    `plan --check` asks); a refusal other than "no room" fails the test."""
    try:
        plan = kvbudget.plan(model, max_model_len=min(REQUEST, model.max_position_embeddings or REQUEST),
                             recommend=False, **where)
    except KVBudgetError as refused:
        assert "leave no KV budget" in str(refused), f"{model.name} refused on {where}: {refused}"
        return False
    assert plan.weights.total_params > 0
    return plan.fits and (not checked or low_end_shortfall(plan) is None)


def smallest(model, checked: bool = False) -> dict:
    """The smallest catalog GPU that holds `model` (`checked`: as `plan --check` asks), else the fewest H200s."""
    for card in sorted(gpus(), key=lambda g: g.memory_bytes):
        if holds(model, checked, gpu=card.name):
            return {"gpu": card.name}
    for tp, pp in SPREAD:
        if holds(model, checked, gpu="H200", tp=tp, pp=pp):
            return {"gpu": "H200", "tp": tp, "pp": pp}
    raise AssertionError(f"{model.name}: no catalog GPU and no {SPREAD[-1][0] * SPREAD[-1][1]} H200s hold it")


@pytest.mark.parametrize("name", [e.name for e in catalog.entries()])
def test_every_catalog_model_plans(name, capsys):
    """Planned on the smallest catalog GPU that holds it, at the low end of its budget's error band too (or H200s
    under --tp / --pp); `plan --check` exits 0."""
    where = smallest(load_model(name), checked=True)
    argv = ["plan", name, "--max-model-len", str(min(REQUEST, load_model(name).max_position_embeddings or REQUEST)),
            "--check", "--json", *(f"--{k.replace('_', '-')}={v}" for k, v in where.items())]
    assert main(argv) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["weights"]["parameters"]["total"] > 0


def test_the_families_counted_last_fit_where_their_size_says():
    """What their checkpoints hold decides the card: Gemma 3n E2B (4.4B in bf16) on a 16 GB T4; Gemma 4 26B-A4B
    (25.8B in bf16, 48 GiB) beyond 40 GB cards; DeepSeek-V4-Flash (FP4 experts, 151 GiB) on one 180 GB B200, not a
    141 GB H200; DeepSeek-V4-Pro (FP4 experts, 813 GiB) on eight H200s."""
    assert smallest(load_model("gemma-3n-e2b")) == {"gpu": "T4"}
    gemma4 = load_model("gemma-4-26b-a4b")
    assert not holds(gemma4, gpu="A100-40GB") and holds(gemma4, gpu="H100-80GB")
    flash = load_model("deepseek-v4-flash")
    assert not holds(flash, gpu="H200") and holds(flash, gpu="B200")
    assert smallest(load_model("deepseek-v4-pro")) == {"gpu": "H200", "tp": 8, "pp": 1}


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_the_simulator_gets_step_work(name):
    """simulate times steps from the counted parts (kernels, not the roofline): the weights each step reads, the
    share of the experts one token runs, the experts' format."""
    model = load_model(name)
    where = smallest(model)
    work = step_work(model, kvbudget.plan(model, max_model_len=REQUEST, recommend=False, **where))
    assert work is not None and work.weight_bytes > 0 and work.hidden > 0
    share = {"gemma-4-26b-a4b": 8 / 128, "kimi-linear-48b-a3b": 8 / 256, "deepseek-v4-flash": 6 / 256,
             "deepseek-v4-pro": 6 / 384}.get(name, 0.0)
    assert work.expert_share == pytest.approx(share)
    assert (work.expert_format.value == "w4a16_mxfp4") == name.startswith("deepseek-v4")


@pytest.mark.parametrize("name, argv", [
    ("gemma-3n-e2b", ["--gpu", "L4"]),
    ("gemma-4-26b-a4b", ["--gpu", "H100-80GB", "--no-prefix-caching"]),
    ("kimi-linear-48b-a3b", ["--gpu", "H200", "--max-model-len", "32k"]),
])
def test_estimate_plan_and_simulate_answer(name, argv, capsys):
    assert main(["estimate", name, "--context", "4k", "--batch", "1"]) == 0
    assert main(["plan", name, *argv, "--check"]) == 0
    capsys.readouterr()
    assert main(["simulate", name, *argv, "--trace", "azure-conv-2023", "--slice", "0:20"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "20 requests (20 completed)" in out and "(times: kernel" in out and "roofline" not in out, out
