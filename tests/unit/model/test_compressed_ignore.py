"""A compressed-tensors checkpoint's `ignore` list: the modules it names stay in the model's dtype."""

from __future__ import annotations

import copy

import pytest

from kvbudget import load_model
from kvbudget.errors import ConfigError
from kvbudget.model.weights import MAX_IGNORE_ENTRIES, analytic_weights

INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}}}}
# Llama-3.1-8B's attention by hand: q and o 4,096 x 4,096, k and v 4,096 x 1,024 (8 KV heads of 128), 32 layers
ATTENTION = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
INT4_BYTES = 0.5 + 2 / 128  # packed 4-bit values and a 16-bit scale per group of 128


def llama(ignore: list[object] | None):
    config = copy.deepcopy(load_model("llama-3.1-8b").config)
    config["quantization_config"] = {**INT4, **({"ignore": ignore} if ignore is not None else {})}
    return load_model(config)


def total(ignore: list[object] | None) -> int:
    return analytic_weights(llama(ignore)).total_bytes


@pytest.mark.parametrize("ignore", [["lm_head", "re:.*self_attn.*"],  # Kimi-K2.5's form
                                    [f"model.layers.{i}.self_attn.{p}_proj" for i in range(32) for p in "qkvo"],
                                    ["re:language_model.model.layers.*self_attn.*"]])  # inside a multimodal model
def test_attention_the_ignore_list_names_stays_bfloat16(ignore):
    base = total(["lm_head"])
    assert abs(total(ignore) - base - ATTENTION * (2 - INT4_BYTES)) <= 2
    assert "attention left in bfloat16 by its ignore list" in analytic_weights(llama(ignore)).basis


def test_one_named_layer_leaves_only_that_layer_unquantized():
    one_layer = ATTENTION // 32
    assert abs(total(["model.layers.0.self_attn.o_proj"]) - total(None) - one_layer * (2 - INT4_BYTES)) <= 2


def test_entries_that_name_no_counted_part_change_nothing():
    assert total(["lm_head", "re:.*vision_tower.*", "re:.*self_attn.q_proj"]) == total(None)
    assert total(["re:.*mlp\\.(gate|up|down)_proj.*"]) > total(None)  # Llama's MLP is its dense MLP


@pytest.mark.parametrize(("ignore", "says"), [
    (["re:.*self_attn(.*"], "is not a regular expression"),
    ([7], "each entry must be a module name or 're:' regex"),
    ([""], "of 1 to 1,000 characters"),
    (["x" * 1001], "of 1 to 1,000 characters"),
    ("re:.*", "must be a list"),
    (["lm_head"] * (MAX_IGNORE_ENTRIES + 1), f"at most {MAX_IGNORE_ENTRIES:,}")])
def test_a_bad_ignore_list_is_one_line_naming_the_field(ignore, says):
    with pytest.raises(ConfigError, match="quantization_config.ignore") as err:
        analytic_weights(llama(ignore))
    assert says in str(err.value) and "\n" not in str(err.value) and err.value.param == "model"
