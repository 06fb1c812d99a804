"""`kvbudget quality --engine llamacpp` against the real llama.cpp: llama-perplexity (built by
scripts/setup_engines.sh) on SmolLM2-135M-Instruct's GGUF over the GPL's text, and the transformers path on the
same chunks of llama.cpp's own tokens at the same positions."""

from __future__ import annotations

import json
import struct
import urllib.request
from pathlib import Path

import harness
import numpy as np
import pytest

from kvbudget.quality import formats, ggml, llamacpp, load, measure
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


# --- the cache's bytes: llama-server's saved slot against our quantizer ---

GGML_TYPE_IDS = {"f32": 0, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20}


def _read_slot(path: Path) -> tuple[list[int], list[bytes], list[bytes], list[int]]:
    """A slot file from llama-server's `/slots/0?action=save` (llama_state_seq_save_file: magic, version, the
    tokens, then llama_kv_cache::state_write for one sequence, V not transposed under flash attention):
    (cell positions, layer 0's K rows, layer 0's V rows, [K type id, V type id])."""
    data = path.read_bytes()
    at = 0

    def take(fmt: str) -> tuple:
        nonlocal at
        values = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return values

    magic, version, n_tokens = take("<III")
    assert magic == 0x67677371 and version == 3  # 'ggsq'
    at += 4 * n_tokens
    (streams,) = take("<I")
    assert streams == 1
    (cells,) = take("<I")
    positions = []
    for _ in range(cells):
        pos, n_seq = take("<iI")
        at += 4 * n_seq
        positions.append(pos)
    v_trans, layers = take("<II")
    assert v_trans == 0
    rows: dict[str, list[bytes]] = {"k": [], "v": []}
    types = []
    for half in ("k", "v"):
        for layer in range(layers):
            type_id, row = take("<iQ")
            block = data[at:at + cells * row]
            at += cells * row
            if layer == 0:
                types.append(type_id)
                rows[half] = [block[i * row:(i + 1) * row] for i in range(cells)]
    assert at == len(data)
    return positions, rows["k"], rows["v"], types


def _saved_cache(gguf: Path, folder: Path, cache: str, rotate: bool) -> tuple[list[int], list[bytes], list[bytes]]:
    """Layer 0's K and V rows as llama-server holds them after reading the prompt, with `cache` for both."""
    prompt = PROSE.read_text()[:1500]
    env = {} if rotate else {"LLAMA_ATTN_ROT_DISABLE": "1"}
    with harness.llama_server(gguf, "-c", "1024", "-np", "1", "-t", "2", "-fa", "on", "-ctk", cache, "-ctv", cache,
                              "--slot-save-path", str(folder), env=env, logs=folder) as url:
        _post(f"{url}/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": True})
        name = f"{cache}-{int(rotate)}.bin"
        _post(f"{url}/slots/0?action=save", {"filename": name})
    positions, k, v, types = _read_slot(folder / name)
    assert types == [GGML_TYPE_IDS[cache]] * 2
    return positions, k, v


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def f32_cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slots")
    return folder, _saved_cache(load.bundled_gguf(), folder, "f32", rotate=False)


@pytest.mark.parametrize("cache", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_our_quantizers_write_the_bytes_llama_cpp_keeps_in_its_cache(f32_cache, cache):
    """Layer 0's K and V do not depend on the cache type (nothing before them reads the cache), so llama-server's
    float32 cache holds exactly what its quantized cache was given: our quantizer applied to those rows must give
    the saved slot's bytes, row for row (llama.cpp's Hadamard rotation off, LLAMA_ATTN_ROT_DISABLE=1)."""
    folder, (positions, k32, v32) = f32_cache
    got_positions, k, v = _saved_cache(load.bundled_gguf(), folder, cache, rotate=False)
    assert got_positions == positions and len(positions) > 250
    kind = ggml.TYPES[cache]
    for f32_rows, rows in ((k32, k), (v32, v)):
        values = np.frombuffer(b"".join(f32_rows), np.float32).reshape(len(f32_rows), -1)
        assert values.shape[1] == 3 * 64 and np.abs(values).max() > 0
        ours = kind.quantize(values).reshape(len(rows), -1)
        theirs = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), -1)
        assert ours.shape == theirs.shape
        assert np.array_equal(ours, theirs), f"{cache}: {(ours != theirs).any(axis=1).sum()} rows differ"


def test_the_rotated_cache_is_the_rotation_then_the_quantizer(f32_cache):
    """With llama.cpp's default rotation on, a q4_0 cache holds quantize(x·H) for each 64-value group (order 64
    for SmolLM2's K and V): our rotation in float32 then our quantizer give the saved blocks, all but those whose
    scale the last bit of a different summation order moves (measured: all of them equal)."""
    folder, (positions, k32, v32) = f32_cache
    _, k, v = _saved_cache(load.bundled_gguf(), folder, "q4_0", rotate=True)
    h = formats.hadamard(64).numpy()
    kind = ggml.TYPES["q4_0"]
    for f32_rows, rows in ((k32, k), (v32, v)):
        values = np.frombuffer(b"".join(f32_rows), np.float32).reshape(-1, 64)
        ours = kind.quantize((values @ h).astype(np.float32))
        theirs = np.frombuffer(b"".join(rows), np.uint8).reshape(ours.shape)
        same = (ours == theirs).all(axis=1).mean()
        unrotated = (kind.quantize(values) == theirs).all(axis=1).mean()
        print(f"rotated q4_0 blocks equal: {same:.4f} (without our rotation {unrotated:.4f})")
        assert same > 0.99 and unrotated < 0.5
