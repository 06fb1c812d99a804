"""llama.cpp's --model-draft in memory (engines/llamacpp/engine.py; the build llama-cpp-python 0.3.36 vendors). The
expected bytes are worked out by hand from SmolLM2-135M's config (30 layers, 3 KV heads of 64): an f16 cell holds
3 x 64 x 2 bytes of K and as many of V per layer, 768 B, 23,040 B over 30 layers; a q8_0 K row of 192 values is 6
blocks of 34 bytes, 204 B. The figures match what a live llama-server logged
(tests/engines/test_speculative_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbudget.engines import EngineOptions, get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.speculative import SpecMethod, Speculative

SMOLLM2 = load_model(Path(__file__).parents[2] / "data" / "logs" / "smollm2-135m-instruct.config.json")
LLAMACPP = get_engine("llamacpp")


def drafting(draft=SMOLLM2) -> EngineOptions:
    return EngineOptions(speculative=Speculative(method=SpecMethod.DRAFT_MODEL, num_tokens=8, draft=draft))


def test_the_draft_keeps_a_cache_of_the_same_cells_at_f16():
    # llama-server -c 3000 -np 3 -ctk q8_0 -ctv q8_0: 1,024 cells per slot; target (204 + 204) x 30 = 12,240 B per
    # cell; the draft f16 whatever -ctk: 23,040 B per cell, 67.50 MiB over three slots
    plain = LLAMACPP.allocate(SMOLLM2, "q8_0")
    with_draft = LLAMACPP.allocate(SMOLLM2, "q8_0", options=drafting())
    assert plain.sequence_bytes(1024) == 12240 * 1024
    assert with_draft.sequence_bytes(1024) == (12240 + 23040) * 1024
    assert round(3 * 23040 * 1024 / 2**20, 2) == 67.50


def test_ngram_adds_nothing():
    ngram = EngineOptions(speculative=Speculative(method=SpecMethod.NGRAM, num_tokens=4))
    assert LLAMACPP.allocate(SMOLLM2, options=ngram).sequence_bytes(2048) == 23040 * 2048


@pytest.mark.parametrize(("options", "param", "says"), [
    (EngineOptions(speculative=Speculative(method=SpecMethod.EAGLE3, num_tokens=2, draft=SMOLLM2)), "speculative",
     "takes draft-model, ngram"),
    (EngineOptions(engine_version=(5000,), speculative=Speculative(method=SpecMethod.NGRAM, num_tokens=2)),
     "speculative", "takes none"),
])
def test_methods_and_builds_not_modelled_are_refused(options, param, says):
    with pytest.raises(KVBudgetError) as caught:
        LLAMACPP.allocate(SMOLLM2, options=options)
    assert caught.value.param == param and says in str(caught.value)


def test_a_draft_of_another_vocabulary_is_refused():
    other = load_model("llama-3.2-1b")  # 128,256 tokens against SmolLM2's 49,152: more than 128 apart
    with pytest.raises(KVBudgetError) as caught:
        LLAMACPP.allocate(SMOLLM2, options=drafting(other))
    assert caught.value.param == "draft_model" and "differs by more than 128" in str(caught.value)
