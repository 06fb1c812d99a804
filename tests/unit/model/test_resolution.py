"""Where a model comes from (issue 15): an existing path before the catalog, the catalog before the Hub; offline
Hub ids fail at once with the catalog entry for the same model; near misses of catalog names are suggested."""

from __future__ import annotations

import json

import pytest

from kvbudget import catalog, load_model
from kvbudget.cli import main
from kvbudget.errors import ConfigError


def test_an_existing_folder_wins_over_the_catalog_name(tmp_path, monkeypatch):
    cfg = json.loads(catalog.find("llama-3.2-1b").path.read_text())
    (tmp_path / "qwen3-8b").mkdir()
    (tmp_path / "qwen3-8b" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    assert load_model("qwen3-8b").num_layers == 16  # the folder's Llama-3.2-1B, not the catalog's 36-layer Qwen3-8B
    assert load_model("qwen3-8b").source.endswith("config.json")


def test_offline_hub_id_names_the_catalog_model(offline, capsys):
    assert main(["estimate", "meta-llama/Llama-3.1-8B-Instruct"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE is set" in err and "did you mean llama-3.1-8b?" in err


def test_offline_tokens_fail_the_same_way(offline, capsys):
    assert main(["tokens", "meta-llama/Llama-3.1-8B-Instruct", "/usr/share/common-licenses/Apache-2.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE is set" in err and "did you mean llama-3.1-8b?" in err


@pytest.mark.parametrize(("typed", "meant"), [("mistral7b", "mistral-7b"), ("llama-3-8b", "llama-3.1-8b"),
                                              ("qwen-2.5-7b", "qwen2.5-7b"), ("gemma2-9b", "gemma-2-9b")])
def test_near_misses_are_suggested(typed, meant):
    with pytest.raises(ConfigError, match=f"did you mean {meant}"):
        load_model(typed)


def test_no_suggestion_for_a_name_like_none_of_them():
    assert catalog.similar("gpt2") == [] and catalog.did_you_mean("gpt2") == ""


def test_the_help_states_the_order(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("an existing file (config.json or .gguf) or folder, else a catalog name (kvbudget models), else a Hub "
            "id") in out
