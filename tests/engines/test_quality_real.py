"""`kvbudget quality --engine llamacpp` against the real llama.cpp: llama-perplexity (built by
scripts/setup_engines.sh) on SmolLM2-135M-Instruct's GGUF over the GPL's text, and the transformers path on the
same chunks of llama.cpp's own tokens at the same positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbudget.quality import llamacpp, load, measure
from kvbudget.quality.formats import Variant

pytestmark = pytest.mark.engines

PROSE = Path("/usr/share/common-licenses/GPL-3")


@pytest.fixture(scope="module")
def both():
    loaded = load.load_model(load.BUNDLED)
    assert loaded.gguf is not None
    runner = llamacpp.Perplexity(loaded.gguf, PROSE.read_text(), 512, 4)
    try:
        variants = [Variant("q8_0", "q8_0"), Variant("q4_0", "q4_0")]
        engine = [runner.compare(v) for v in variants]
        chunks = [list(map(int, row)) for row in runner.tokens]
    finally:
        runner.close()
    ours = measure.compare(loaded, chunks, variants, first=256)
    return loaded, chunks, engine, ours


def test_llama_perplexity_scores_the_chunks_we_read_back(both):
    """Its base file holds 4 chunks of 512 tokens that spell the start of the text (llama.cpp's tokenizer, which
    splits some whitespace runs differently from transformers': both paths score llama.cpp's ids); both paths
    score positions 256 to 511 of each chunk."""
    loaded, chunks, engine, ours = both
    assert [len(c) for c in chunks] == [512] * 4
    text = PROSE.read_text()
    spelled = loaded.tokenizer.decode([t for c in chunks for t in c])
    assert len(spelled) > 4000 and text.startswith(spelled)
    assert all(r.tokens == 4 * 256 for r in ours)
    assert engine[0].base_perplexity == engine[1].base_perplexity


def test_transformers_and_llama_cpp_agree_on_what_each_format_costs(both):
    """With the linear layers taking their inputs as llama.cpp's matmuls do (8-bit blocks for the Q4_1 and Q8_0
    weights), both paths agree on each format's KL within 25% and on top-1 agreement within 2 points; both put
    q8_0 far below q4_0. The figures go to the README (pytest -s prints them)."""
    _, _, (e8, e4), (o8, o4) = both
    print(f"q8_0: KL llama.cpp {e8.kl_mean:.5f} ours {o8.kl_mean.value:.5f}; top-1 {e8.top1:.3f} {o8.top1.value:.3f}")
    print(f"q4_0: KL llama.cpp {e4.kl_mean:.5f} ours {o4.kl_mean.value:.5f}; top-1 {e4.top1:.3f} {o4.top1.value:.3f}")
    assert e8.kl_mean < e4.kl_mean / 10 and o8.kl_mean.value < o4.kl_mean.value / 10
    for e, o in ((e8, o8), (e4, o4)):
        assert 0.8 < e.kl_mean / o.kl_mean.value < 1.25, e.variant
        assert abs(e.top1 - o.top1.value) < 0.02, e.variant


def test_without_the_engines_matmul_rounding_q8_0_looks_ten_times_cheaper(both):
    """The same model in float32 throughout: q4_0 still agrees with llama.cpp (its own error dominates), but q8_0
    falls to about a tenth of llama.cpp's KL. llama.cpp's rounding of every matmul input turns the cache's tiny
    changes into whole rounding steps: its q8_0 figure is mostly that floor, which is why quality.matmul exists."""
    _, chunks, (e8, e4), _ = both
    plain = load.load_model(load.BUNDLED, as_engine=False)
    o8, o4 = measure.compare(plain, chunks, [Variant("q8_0", "q8_0"), Variant("q4_0", "q4_0")], first=256)
    print(f"float32 matmuls: q8_0 KL {o8.kl_mean.value:.5f}, q4_0 KL {o4.kl_mean.value:.5f}")
    assert e8.kl_mean > 5 * o8.kl_mean.value
    assert 0.7 < e4.kl_mean / o4.kl_mean.value < 1.5
