"""`recommend` with speculative decoding as a search axis: a candidate with a drafter is planned and simulated with
it (checked against the public API run alone), a drafter that leaves no room prunes its candidates with the
engine's reason, the label and the JSON say it, the winner's deployment carries it, and the command line refuses a
bad axis in one line before any search."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from simkit import cli

import kvbudget
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.setup import SimulationAsk
from kvbudget.simulation import exponential_lengths, synthetic
from kvbudget.simulation.recommend import Candidate, Space, candidates, recommend
from kvbudget.simulation.run import setup_of, simulate
from kvbudget.simulation.search import parse_slo
from kvbudget.speculative import SpecMethod, Speculative

PRICES = {"H100-80GB": 2.49, "L4": 0.8}


@pytest.fixture(scope="module")
def model():
    return kvbudget.load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def ask(model):
    return SimulationAsk(model=model, engine=get_engine("vllm"), max_model_len=8192)


@pytest.fixture(scope="module")
def traffic():
    return tuple(synthetic(20, 30, exponential_lengths(500, 100), seed=3))


def drafting(draft: str, k: int) -> Speculative:
    return Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=k, draft=kvbudget.load_model(draft), draft_id=draft)


def test_the_default_space_has_no_speculative_axis():
    plain = Space(gpus=("H100",), max_gpus=2, tp=(1,), kv_dtypes=("auto",))
    assert plain.speculative == (None,)
    assert all(c.speculative is None for c in candidates(plain))


def test_each_speculative_setting_is_a_candidate_of_its_own():
    two, four = drafting("llama-3.2-1b", 2), drafting("llama-3.2-1b", 4)
    space = Space(gpus=("H100",), max_gpus=1, tp=(1,), kv_dtypes=("auto", "fp8"), speculative=(None, two, four),
                  disaggregated=False)
    listed = candidates(space)
    assert len(listed) == 6 and len({c.setting for c in listed}) == 6
    assert {c.label() for c in listed} == {
        "1 x H100-80GB", "1 x H100-80GB, draft-model k=2", "1 x H100-80GB, draft-model k=4",
        "1 x H100-80GB, kv fp8", "1 x H100-80GB, kv fp8, draft-model k=2", "1 x H100-80GB, kv fp8, draft-model k=4"}


def test_an_empty_speculative_axis_is_refused():
    with pytest.raises(kvbudget.KVBudgetError, match="num_speculative_tokens: the search space is empty"):
        Space(gpus=("H100",), speculative=())


def test_a_drafted_candidate_is_simulated_with_its_drafter(ask, traffic):
    spec = drafting("llama-3.2-1b", 2)
    space = Space(gpus=("H100",), max_gpus=1, tp=(1,), kv_dtypes=("auto",), speculative=(None, spec),
                  disaggregated=False)
    found = recommend(ask, traffic, parse_slo("ttft_p99=30s"), space, PRICES, backend="serial", exhaustive=True,
                      early_stop=False)
    by_spec = {t.candidate.speculative: t for t in found.tried}
    assert set(by_spec) == {None, spec}
    for s, tried in by_spec.items():
        alone = simulate(ask.model, iter(traffic), setup=setup_of(replace(ask, gpu="H100-80GB", speculative=s)))
        assert tried.measured.values["tpot_p99"] == pytest.approx(alone.metric("tpot_p99"))
        assert tried.measured.duration_s == pytest.approx(alone.duration_s)
    # the drafter changes the run (its KV and its time): the two are not the same simulation
    assert by_spec[spec].measured.duration_s != by_spec[None].measured.duration_s
    assert found.setups[by_spec[spec].candidate.setting].drafting is not None
    # a tie of cost goes to the candidate without a drafter (its gain rests on an assumed acceptance)
    assert found.best is not None and found.best.candidate.speculative is None
    assert found.why_lost(by_spec[spec]).startswith("same cost, speculative decoding (draft-model k=2")


def test_a_drafter_that_leaves_no_room_prunes_its_candidates(ask, traffic):
    """An 8B drafter beside an 8B target on a 24 GB L4: the engine would not start, so never simulated."""
    space = Space(gpus=("L4",), max_gpus=1, tp=(1,), kv_dtypes=("auto",),
                  speculative=(None, drafting("llama-3.1-8b", 2)), disaggregated=False)
    found = recommend(ask, traffic, parse_slo("ttft_p99=30s"), space, PRICES, backend="serial")
    assert [t.candidate.speculative for t in found.tried] == [None]
    (pruned,) = found.pruned
    assert pruned.setting == "L4, draft-model k=2" and "no KV budget" in pruned.reason


def test_the_winner_carries_its_drafter_into_the_deployment_and_json(ask, traffic):
    spec = drafting("llama-3.2-1b", 3)
    space = Space(gpus=("H100",), max_gpus=1, tp=(1,), kv_dtypes=("auto",), speculative=(spec,),
                  disaggregated=False)
    found = recommend(ask, traffic, parse_slo("ttft_p99=30s"), space, PRICES, backend="serial")
    assert found.best is not None and found.best.candidate.speculative == spec
    (pool,) = found.deployment().pools
    assert pool.speculative is not None and pool.speculative.num_tokens == 3
    assert pool.speculative.method is SpecMethod.DRAFT_MODEL
    assert pool.speculative.draft_id == kvbudget.catalog.find("llama-3.2-1b").hf_id  # what the engine loads
    assert any("acceptance assumed" in n for n in found.deployment().notes)
    data = json.loads(json.dumps(found.to_dict()))
    assert data["best"]["candidate"]["speculative"] == {"method": "draft-model", "num_speculative_tokens": 3,
                                                         "draft_model": "llama-3.2-1b"}


def test_a_candidate_without_a_drafter_shows_none_in_json():
    assert Candidate(gpu="H100-80GB").to_dict()["speculative"] is None


BASE = ("recommend", "llama-3.1-8b", "--rate", "2", "--requests", "20", "--max-model-len", "8192", "--gpus",
        "H100-80GB", "--max-gpus", "1", "--tp", "1", "--kv-dtype", "auto", "--backend", "serial", "--no-disagg",
        "--gpu-price", "2.49", "--slo", "ttft_p99=30s")


def test_the_command_searches_the_draft_token_counts(capsys):
    code, out, err = cli(capsys, *BASE, "--speculative", "draft-model", "--draft-model", "llama-3.2-1b",
                         "--num-speculative-tokens", "0,2", "--exhaustive", "--json")
    assert code == 0, err
    data = json.loads(out)
    shown = [data["best"]["candidate"]["speculative"], *(r["candidate"]["speculative"] for r in data["runners_up"])]
    assert sorted(shown, key=lambda s: s is not None) == [
        None, {"method": "draft-model", "num_speculative_tokens": 2, "draft_model": "llama-3.2-1b"}]


@pytest.mark.parametrize(("args", "message"), [
    (("--speculative", "eagle3", "--draft-model", "llama-3.2-1b"),
     "--num-speculative-tokens: give the draft tokens per step to try with --speculative"),
    (("--draft-model", "llama-3.2-1b", "--num-speculative-tokens", "2"),
     "--draft-model: goes with --speculative"),
    (("--speculative", "eagle3", "--num-speculative-tokens", "2"), "--draft-model: speculative method eagle3"),
    (("--speculative", "ngram", "--num-speculative-tokens", "2,65"),
     "--num-speculative-tokens: '65' must be a whole number from 0 to 64"),
    (("--speculative", "ngram", "--num-speculative-tokens", "x"),
     "--num-speculative-tokens: 'x' is not a whole number from 0 to 64"),
    (("--num-speculative-tokens", "2", "--engine", "llamacpp"), "does not follow llamacpp's drafting"),
])
def test_a_bad_speculative_axis_is_one_line_before_the_search(capsys, args, message):
    code, out, err = cli(capsys, *BASE, *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err


def test_a_drafter_the_engine_refuses_is_refused_once_before_the_search(capsys):
    """vLLM's draft_model needs the target's vocabulary size (Llama 3's 128,256; Qwen2.5's 152,064): refused once,
    not pruned candidate by candidate."""
    code, out, err = cli(capsys, *BASE, "--speculative", "draft-model", "--draft-model", "qwen2.5-7b",
                         "--num-speculative-tokens", "0,2")
    assert code == 2, (out, err)
    assert err.strip().count("\n") == 0 and "--draft-model qwen2.5-7b: vocab_size" in err, err


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_an_engine_whose_drafting_is_not_simulated_is_refused_before_planning(capsys, engine):
    """Estimate and plan size SGLang's and llama-server's drafters, but simulate follows vLLM's drafting alone:
    every drafted candidate would be pruned, so the search is refused instead."""
    code, out, err = cli(capsys, *BASE, "--engine", engine, "--speculative", "ngram", "--num-speculative-tokens", "0,2")
    assert code == 2, (out, err)
    assert err.strip().count("\n") == 0 and f"does not follow {engine}'s drafting" in err, err
    ask = SimulationAsk(model=kvbudget.load_model("llama-3.1-8b"), engine=get_engine(engine), max_model_len=8192)
    space = Space(gpus=("H100",), max_gpus=1, tp=(1,), kv_dtypes=("auto",),
                  speculative=(Speculative(method=SpecMethod.NGRAM, num_tokens=2),), disaggregated=False)
    with pytest.raises(kvbudget.KVBudgetError) as exc:
        recommend(ask, tuple(synthetic(2, 5, exponential_lengths(100, 10), seed=1)), parse_slo("ttft_p99=1s"),
                  space, PRICES, backend="serial")
    assert exc.value.param == "speculative"
