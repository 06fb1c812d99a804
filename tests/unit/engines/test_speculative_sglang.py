"""SGLang's drafters in memory, from SGLang 0.5.3's source (engines/sglang/speculative.py; not run here). Expected
figures by hand: Llama-3.1-8B keeps 131,072 B per token; an EAGLE head of one Llama-3.1-8B layer 4,096 B."""

from __future__ import annotations

import pytest

from kvbudget.engines import EngineOptions, get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import GIB

TARGET = load_model("llama-3.1-8b")
HEAD = load_model({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 1,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                   "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}, name="eagle-head")
SGLANG = get_engine("sglang")


def spec(method: SpecMethod, k: int = 3, draft=None) -> EngineOptions:
    return EngineOptions(speculative=Speculative(method=method, num_tokens=k, draft=draft))


def test_the_pool_gets_headroom_and_the_drafter_a_pool_of_its_own():
    # 10 GiB / 131,072 B = 81,920 tokens; headroom 48 x (3 x 1 + 4) + 100 = 436; the head's pool 82,356 x 4,096 B
    capacity = SGLANG.capacity(TARGET, 10 * GIB, 8192, options=spec(SpecMethod.EAGLE, draft=HEAD))
    assert capacity.kv_cache_tokens == 81920 + 436
    assert any(f"{82356 * 4096 / GIB:.2f} GiB (4,096 B per token)" in note for note in capacity.notes)


def test_ngram_adds_no_pool():
    assert SGLANG.capacity(TARGET, 10 * GIB, 8192, options=spec(SpecMethod.NGRAM)).kv_cache_tokens == 81920


@pytest.mark.parametrize(("method", "draft", "fraction"), [(None, None, 0.836), (SpecMethod.EAGLE, HEAD, 0.811),
                                                           (SpecMethod.DRAFT_MODEL, TARGET, 0.761),
                                                           (SpecMethod.NGRAM, None, 0.836)])
def test_the_default_fraction_leaves_the_drafter_room(method, draft, fraction):
    # an 80 GiB card at tp 1: 512 + 1.5 x 8192 + 2 x 256 + 1024 / 8 = 13,440 MiB reserved, 2,048 more for EAGLE,
    # 6,144 more for a draft model: round((81,920 - reserved) / 81,920, 3)
    options = spec(method, draft=draft) if method else EngineOptions()
    assert SGLANG.serving(80 * GIB, 8192, options).memory_fraction == fraction


def test_other_releases_are_refused():
    options = EngineOptions(engine_version=(0, 4, 6), speculative=Speculative(method=SpecMethod.NGRAM, num_tokens=2))
    with pytest.raises(KVBudgetError) as caught:
        SGLANG.allocate(TARGET, options=options)
    assert caught.value.param == "speculative"
