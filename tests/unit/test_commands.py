"""The typed requests of tokens, check-log and quality, answered without the command line: each bad value is
refused naming its parameter, before any tokenizer or model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvbudget import KVBudgetError
from kvbudget.commands import checklog, quality, tokens
from kvbudget.errors import named

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
LOG = str(LOGS / "vllm-issue-12330-llama-3-8b-a100-40gb.log")


def test_tokens_answers_a_request(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("word " * 400)
    said: list[str] = []
    result = tokens.answer(tokens.TokensRequest(model="llama-3.1-8b", files=(str(doc),), approximate=True),
                           loading=said.append)
    assert result.approximate and result.prompt_tokens > 400 // 4 and said == []  # nothing loads: no notice
    assert result.to_dict()["prompt_tokens"] == result.prompt_tokens


@pytest.mark.parametrize("ask, param", [
    (dict(engine="vlm"), "engine"),
    (dict(files=("a.jsonl", "b.txt")), "files"),
    (dict(files=("a.json", "b.txt")), "files"),
])
def test_tokens_refuses_before_the_tokenizer_loads(tmp_path, ask, param):
    for name in ("a.jsonl", "a.json", "b.txt"):
        (tmp_path / name).write_text("{}\n")
    if "files" in ask:
        ask["files"] = tuple(str(tmp_path / f) for f in ask["files"])
    loaded: list[str] = []
    with pytest.raises(KVBudgetError) as exc:
        tokens.answer(tokens.TokensRequest(model="llama-3.1-8b", **{"files": (str(tmp_path / "b.txt"),), **ask}),
                      loading=loaded.append)
    assert exc.value.param == param and loaded == [] and "--" not in str(exc.value)


def test_check_log_answers_a_request():
    result = checklog.answer(checklog.CheckLogRequest(log=LOG, model="llama-3.1-8b", tp=1))
    assert result.check.all_match and result.model.name == "llama-3.1-8b"
    assert result.to_dict()["settings"]["tp"] == 1


@pytest.mark.parametrize("ask, param", [
    (dict(tp=0), "tp"), (dict(max_num_batched_tokens=-1), "max_num_batched_tokens"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens"), (dict(pp_layer_partition="x"), "pp_layer_partition"),
])
def test_check_log_names_the_setting_at_fault(ask, param):
    with pytest.raises(KVBudgetError) as exc:
        checklog.answer(checklog.CheckLogRequest(log=LOG, model="llama-3.1-8b", **ask))
    assert exc.value.param == param and str(exc.value).startswith(param)


def test_check_log_asks_for_the_model_in_library_words():
    """A log naming no model is checked as far as it goes without one, and the request is told, in the library's
    words (the parameter marked for each front end to spell), which model to give."""
    result = checklog.answer(checklog.CheckLogRequest(log=LOG))
    assert result.model is None and result.to_dict()["partial"]
    assert result.missing.startswith("check-log: the log names no model path")
    assert f"pass {named('model')} (a catalog name" in result.missing


@pytest.mark.parametrize("ask, param", [
    (dict(windows=0), "windows"), (dict(context=0), "context"), (dict(generate=-1), "generate"),
    (dict(needle=-1), "needle"), (dict(max_model_len=0), "max_model_len"), (dict(data=()), "data"),
    (dict(data=("/no/such.txt",)), "data"), (dict(plot="/nonexistent/q.png"), "plot"), (dict(engine="vlm"), "engine"),
    (dict(gpu_memory="lots"), "gpu_memory"), (dict(kv_dtype=("q9_0",)), "kv_dtype"),
])
def test_quality_refuses_before_torch_loads(tmp_path, ask, param):
    text = tmp_path / "text.txt"
    text.write_text("some text\n")
    torch_before = "torch" in sys.modules
    with pytest.raises(KVBudgetError) as exc:
        quality.answer(quality.QualityRequest(model="smollm2-135m-instruct", **{"data": (str(text),), **ask}))
    assert exc.value.param == param and "--" not in str(exc.value)
    assert ("torch" in sys.modules) == torch_before
