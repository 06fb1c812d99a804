"""vLLM's drafters in memory (engines/vllm/speculative.py, from vLLM 0.32's source). Every expected figure is worked
out by hand from the configs: Llama-3.1-8B keeps 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131,072 B
per token, Llama-3.2-1B 16 x 8 x 64 x 2 x 2 = 32,768 B."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbudget.commands.options import SpeculativeKnobs, engine_options
from kvbudget.engines import EngineOptions, get_engine
from kvbudget.engines.vllm import speculative as drafters
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import GIB

TARGET = load_model("llama-3.1-8b")
DRAFT = load_model("llama-3.2-1b")
VLLM = get_engine("vllm")
# An EAGLE head for Llama-3.1-8B as EAGLE checkpoints declare it: one Llama decoder layer at the target's width
EAGLE_HEAD = load_model({"model_type": "llama", "architectures": ["LlamaForCausalLMEagle"], "hidden_size": 4096,
                         "intermediate_size": 14336, "num_hidden_layers": 1, "num_attention_heads": 32,
                         "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                         "torch_dtype": "bfloat16", "tie_word_embeddings": False}, name="eagle-llama3.1-8b")


def spec(method: SpecMethod, k: int = 4, draft=None) -> EngineOptions:
    return EngineOptions(speculative=Speculative(method=method, num_tokens=k, draft=draft))


def per_token(options: EngineOptions) -> int:
    return sum(g.layers * g.bytes_per_token for g in VLLM.allocate(TARGET, options=options).groups)


def test_a_draft_models_layers_add_their_bytes_to_every_token():
    assert per_token(EngineOptions()) == 131072
    assert per_token(spec(SpecMethod.DRAFT_MODEL, draft=DRAFT)) == 131072 + 32768


def test_the_pool_holds_blocks_of_both_models_pages():
    # one group (UniformTypeKVCacheSpecs): a block of 16 tokens holds a page of all 48 layers = 16 x 163,840 B
    capacity = VLLM.capacity(TARGET, 10 * GIB, 8192, options=spec(SpecMethod.DRAFT_MODEL, draft=DRAFT))
    assert capacity.num_blocks == 10 * GIB // (16 * 163840) == 4096
    assert capacity.kv_cache_tokens == 4096 * 16


def test_an_eagle_head_adds_one_layer_of_the_targets_size():
    assert per_token(spec(SpecMethod.EAGLE, draft=EAGLE_HEAD)) == 131072 + 4096


@pytest.mark.parametrize("method", [SpecMethod.NGRAM, SpecMethod.SUFFIX])
def test_ngram_and_suffix_add_no_cache(method):
    without = VLLM.capacity(TARGET, 10 * GIB, 8192)
    assert per_token(spec(method)) == 131072
    assert VLLM.capacity(TARGET, 10 * GIB, 8192, options=spec(method)).num_blocks == without.num_blocks == 5120


@pytest.mark.parametrize(("method", "slots"), [(SpecMethod.NGRAM, 0), (SpecMethod.SUFFIX, 0), (SpecMethod.EAGLE, 3),
                                               (SpecMethod.EAGLE3, 3), (SpecMethod.DRAFT_MODEL, 3),
                                               (SpecMethod.MTP, 3)])
def test_lookahead_slots_follow_vllms_num_lookahead_tokens(method, slots):
    draft = DRAFT if method.needs_draft_model else None
    assert drafters.lookahead(spec(method, 3, draft)) == slots


def test_a_draft_models_weights_are_loaded_whole():
    # Llama-3.2-1B (tied embeddings): 128,256 x 2,048 embeddings + 16 layers of (2 x 2048^2 attention q/o,
    # 2 x 2048 x 512 k/v, 3 x 2048 x 8192 MLP, 2 x 2048 norms) + a 2,048 final norm = 1,235,814,400 parameters, bf16
    weights = drafters.drafter_weights(TARGET, Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=2, draft=DRAFT), 1)
    assert weights is not None and weights[0] == 1_235_814_400 * 2


def test_an_eagle_head_shares_the_targets_embeddings_and_lm_head():
    # one layer: 2 x 4096^2 (q, o) + 2 x 4096 x 1024 (k, v) + 3 x 4096 x 14336 (MLP) + 2 x 4096 norms, and the
    # final norm: 218,116,096 parameters in bf16; the 128,256 x 4,096 embeddings and head are the target's
    head = Speculative(method=SpecMethod.EAGLE, num_tokens=2, draft=EAGLE_HEAD)
    weights = drafters.drafter_weights(TARGET, head, 1)
    assert weights is not None and weights[0] == 218_116_096 * 2


def test_ngram_loads_no_weights_and_plan_counts_the_drafters():
    assert VLLM.loaded_bytes(TARGET, spec(SpecMethod.NGRAM), 1) == VLLM.loaded_bytes(TARGET, EngineOptions(), 1)
    with_draft = VLLM.loaded_bytes(TARGET, spec(SpecMethod.DRAFT_MODEL, draft=DRAFT), 1)
    plain = VLLM.loaded_bytes(TARGET, EngineOptions(), 1)
    assert with_draft is not None and plain is not None and with_draft[0] - plain[0] == 1_235_814_400 * 2


# --- refusals: one line, the parameter named ------------------------------------------------------------------

def refusal(**given) -> KVBudgetError:
    with pytest.raises(KVBudgetError) as caught:
        _, options = engine_options("vllm", speculative=SpeculativeKnobs(**given))
        VLLM.allocate(TARGET, options=options)
    return caught.value


@pytest.mark.parametrize(("given", "param", "says"), [
    ({"speculative": "medusa", "num_speculative_tokens": "2"}, "speculative", "is not one of"),
    ({"speculative": "ngram"}, "num_speculative_tokens", "give the draft tokens per step"),
    ({"speculative": "ngram", "num_speculative_tokens": "65"}, "num_speculative_tokens", "at most 64"),
    ({"speculative": "eagle", "num_speculative_tokens": "2"}, "draft_model", "name it"),
    ({"speculative": "ngram", "num_speculative_tokens": "2", "draft_model": "llama-3.2-1b"}, "draft_model",
     "takes no draft model"),
    ({"draft_model": "llama-3.2-1b"}, "draft_model", "goes with"),
    ({"speculative": "draft-model", "num_speculative_tokens": "2", "draft_model": "llama-2-7b"}, "draft_model",
     "vocab_size 32,000, the target's 128,256"),
])
def test_bad_speculative_settings_are_refused_in_one_line(given, param, says):
    error = refusal(**given)
    assert error.param == param and says in str(error) and "\n" not in str(error)


@pytest.mark.parametrize(("engine", "says"), [("tgi", "takes none"), ("vllm@0.25", "takes mtp")])
def test_a_method_the_engine_or_release_does_not_run_is_refused(engine, says):
    name, options = engine_options(engine, speculative=SpeculativeKnobs(speculative="ngram",
                                                                        num_speculative_tokens="2"))
    with pytest.raises(KVBudgetError) as caught:
        get_engine(name).allocate(TARGET, options=options)
    assert caught.value.param == "speculative" and says in str(caught.value)


def test_num_speculative_tokens_alone_still_means_mtp():
    _, options = engine_options("vllm", speculative=SpeculativeKnobs(num_speculative_tokens="2"))
    assert options.speculative is None and options.num_speculative_tokens == 2


# --- plan's advice --------------------------------------------------------------------------------------------

def test_plan_says_what_the_drafter_costs_in_requests():
    from kvbudget.planner import plan

    # a 10 GiB KV budget, requests of 8,192 tokens. Without the drafter: 10 GiB / (16 x 131,072 B) = 5,120 blocks,
    # 512 per request: 10 at once. With a draft model: 10 GiB / (16 x 163,840 B) = 4,096 blocks, and each running
    # request holds 8,192 + 4 lookahead slots, 513 blocks: 4,096 / 513 at once.
    result = plan(TARGET, gpu="H100-80GB", kv_memory=10 * GIB, max_model_len=8192,
                  options=spec(SpecMethod.DRAFT_MODEL, 4, DRAFT))
    advice = result.drafter
    assert advice is not None and advice.fits
    assert advice.requests_without == 10
    assert advice.requests_with == pytest.approx(4096 / 513)
    assert advice.lookahead_slots == 4 and advice.bytes_per_token == 32768
    assert advice.weights_bytes == 1_235_814_400 * 2
    assert result.to_dict()["speculative"]["cost"] == pytest.approx(1 - 4096 / 513 / 10)


def test_plan_without_a_drafter_has_no_advice():
    from kvbudget.planner import plan

    result = plan(TARGET, gpu="H100-80GB", kv_memory=10 * GIB, max_model_len=8192)
    assert result.drafter is None and result.to_dict()["speculative"] is None


# --- simulate: the value reaches the simulation's options, never dropped --------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_simulate_gets_the_value_and_refuses_what_it_does_not_follow(engine):
    from kvbudget.commands.options import build
    from kvbudget.commands.simulate import SimulateRequest, simulation_ask
    from kvbudget.simulation.run import setup_of

    model = load_model(Path(__file__).parents[2] / "data" / "logs" / "smollm2-135m-instruct.config.json") \
        if engine == "llamacpp" else TARGET
    ask = simulation_ask(build(SimulateRequest, {"model": "x", "engine": engine, "gpu": "H100-80GB",
                                                 "speculative": "ngram", "num_speculative_tokens": "3"}), model)
    assert ask.speculative == Speculative(method=SpecMethod.NGRAM, num_tokens=3)
    assert ask.engine_options().speculative == ask.speculative
    if engine != "vllm":  # vLLM's drafting is the simulator's own work (issue 54, time)
        with pytest.raises(KVBudgetError) as caught:
            setup_of(ask)
        assert caught.value.param == "speculative"


# --- the commands: the same options in estimate, plan, compare and simulate ------------------------------------

def test_compare_counts_the_drafter_for_every_model(capsys):
    import json

    from kvbudget.cli import main

    assert main(["compare", "llama-3.1-8b", "llama-3.2-3b", "--speculative", "draft-model",
                 "--num-speculative-tokens", "3", "--draft-model", "llama-3.2-1b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # Llama-3.2-3B: 28 layers x 8 KV heads x 128 x 2 x 2 = 114,688 B per token, + the draft's 32,768
    assert [row["bytes_per_token"] for row in rows] == [131072 + 32768, 114688 + 32768]


@pytest.mark.parametrize("command", [["estimate", "llama-3.1-8b"], ["plan", "llama-3.1-8b", "--gpu", "H100-80GB"],
                                     ["compare", "llama-3.1-8b", "llama-3.2-1b"],
                                     ["simulate", "llama-3.1-8b", "--gpu", "H100-80GB", "--rate", "1"]])
def test_every_command_refuses_bad_speculative_settings_in_one_line(command, capsys):
    from kvbudget.cli import main

    assert main([*command, "--speculative", "eagle", "--num-speculative-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--draft-model" in err


def test_speculative_mtp_is_num_speculative_tokens_alone():
    model = load_model("qwen3.5-27b")  # one MTP layer in its config
    legacy = VLLM.allocate(model, options=EngineOptions(num_speculative_tokens=2))
    asked = VLLM.allocate(model, options=spec(SpecMethod.MTP, 2))
    plain = VLLM.allocate(model)
    assert asked.groups == legacy.groups != plain.groups
