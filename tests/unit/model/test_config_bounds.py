"""Config fields typed and plausible (issue 50): a config whose numbers no real model has is refused in one line
naming the field and the range, before anything is built from it, whatever the source (a file, the catalog, a GGUF
file's metadata)."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from kvbudget import catalog, estimate, load_model
from kvbudget.cli import main
from kvbudget.errors import ConfigError
from kvbudget.model.config import parse_config

LLAMA_2_7B = json.loads(catalog.find("llama-2-7b").path.read_text())  # 32 layers, 32 heads, 4096 wide


def _with(**fields):
    return dict(LLAMA_2_7B, **fields)


@pytest.mark.parametrize(("fields", "words"), [
    ({"head_dim": -128}, "head_dim is -128; kvbudget takes 1 to 4,096"),
    ({"max_position_embeddings": -5}, "max_position_embeddings is -5; kvbudget takes 1 to 16,777,216"),
    ({"num_hidden_layers": 10_000_000}, "num_hidden_layers is 10,000,000; kvbudget takes 1 to 1,000 (the largest "
                                        "real model has 126)"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers is 1,000,000,000,000; kvbudget takes 1 to 1,000"),
    ({"num_hidden_layers": 10**400}, "num_hidden_layers is a number of 401 digits"),
    ({"num_attention_heads": 10**400}, "num_attention_heads is a number of 401 digits"),
    ({"num_key_value_heads": 64}, "num_key_value_heads is 64, which does not divide num_attention_heads (32)"),
    ({"num_key_value_heads": 5}, "num_key_value_heads is 5, which does not divide num_attention_heads (32)"),
    ({"head_dim": 128.0}, "head_dim is 128.0; it must be a whole number from 1 to 4,096"),
    ({"sliding_window": "4k"}, "sliding_window is '4k'; it must be a whole number"),
    ({"vocab_size": True}, "vocab_size is True; it must be a whole number"),
    ({"hidden_size": 16}, "layer 0's key head dim comes out as 0"),  # 16 // 32 heads
    ({"layer_types": [["full_attention"]] * 32}, "'layer_types' must list 32 names"),
])
def test_implausible_fields_are_refused_naming_the_field(fields, words):
    with pytest.raises(ConfigError, match="^x.json: ") as exc:
        parse_config(_with(**fields), source="x.json")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_the_cli_says_it_in_one_line_with_status_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with(head_dim=-128)))
    assert main(["estimate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "head_dim is -128" in err and "-128.00 KiB" not in err


def test_infinity_and_overflowing_numbers_in_a_file_are_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    text = json.dumps(_with(num_hidden_layers=0)).replace('"num_hidden_layers": 0', '"num_hidden_layers": 1e400')
    path.write_text(text)  # JSON reads 1e400 as inf
    assert main(["estimate", str(path)]) == 2
    assert "num_hidden_layers is inf; it must be a whole number" in capsys.readouterr().err


def test_ten_million_layers_are_refused_at_once_in_little_memory():
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="num_hidden_layers is 10,000,000"):
        parse_config(_with(num_hidden_layers=10_000_000))
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 0.5 and peak < 1 << 20


def test_a_per_layer_override_out_of_range_is_refused():
    """Sizes the builders derive (Gemma 4's per_layer_config) are checked as the fields are."""
    cfg = json.loads(catalog.find("gemma-4-26b-a4b").path.read_text())
    text = cfg.get("text_config", cfg)
    text["per_layer_config"] = {"0": {"head_dim": -4}}
    with pytest.raises(ConfigError, match="layer 0's key head dim comes out as -4; it must be a whole number from 1"):
        parse_config(cfg)


def test_every_catalog_model_is_within_the_limits():
    """The limits leave every real model in: each catalog entry still loads and estimates."""
    for entry in catalog.entries():
        spec = load_model(entry.name)
        assert estimate(spec).bytes_per_token > 0, entry.name
