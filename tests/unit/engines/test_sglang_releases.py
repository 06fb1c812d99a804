"""SGLang's default mem_fraction_static per release (engines/sglang/releases.py), worked by hand from
python/sglang/srt/server_args.py of 0.4.6 and 0.5.3, and against a real 0.4.3 start-up log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbudget.cli import main
from kvbudget.engines.sglang.releases import mem_fraction_static

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"


@pytest.mark.parametrize("tp, fraction", [(1, 0.88), (2, 0.87), (4, 0.85), (8, 0.81), (16, 0.79)])
def test_0_4_goes_by_the_tensor_parallel_size_on_80_gib_cards(tp, fraction):
    assert mem_fraction_static(81559, tp, release=(0, 4, 6)) == fraction
    assert mem_fraction_static(143771, tp, release=(0, 4, 6)) == pytest.approx((143771 - 13 * 1024) / 143771)


@pytest.mark.parametrize("mib, tp, fraction", [
    (81559, 1, 0.835),  # H100: 512 + 8192 x 1.5 + 256 x 2 + 128 = 13,440 MiB reserved
    (23034, 1, 0.837),  # L4: 512 + 2048 x 1.5 + 16 x 2 + 128 = 3,744
    (24564, 4, 0.827),  # RTX 4090 at tp 4: 512 + 3,072 + 80 x 2 + 512 = 4,256
    (40960, 1, 0.833),  # A100-40GB: 512 + 4096 x 1.5 + 32 x 2 + 128 = 6,848
    (65536, 1, 0.795),  # a 64 GiB card: 512 + 12,288 + 512 + 128 = 13,440 (above the 10 GiB floor)
    (184320, 8, 0.853),  # 180 GiB: 512 + 16384 x 1.5 + 512 x 2 + 1,024 = 27,136
])
def test_0_5_reserves_memory_by_the_cards_defaults(mib, tp, fraction):
    assert mem_fraction_static(mib, tp, release=(0, 5, 3)) == fraction


def test_a_real_0_4_start_up_printed_the_fraction_the_rule_gives():
    text = (LOGS / "sglang-0.4.3-llms-in-clouds-qwq-32b-tp4-l4.log").read_text()
    logged = float(re.search(r"mem_fraction_static=([\d.]+)", text).group(1))
    tp = int(re.search(r"tp_size=(\d+)", text).group(1))
    assert mem_fraction_static(23034, tp, release=(0, 4, 3)) == logged == 0.85


def test_an_unmodelled_release_is_one_line(capsys):
    assert main(["plan", "llama-3.1-8b", "--engine", "sglang@0.3", "--gpu", "L4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0.4.3-0.4.6 and 0.5.3-0.5.10" in err
    assert err.startswith("kvbudget: error: --engine sglang@0.3:")  # the flag the person wrote


@pytest.mark.parametrize("text, release", [("0.4.4", (0, 4, 4)), ("0.4.4.post2", (0, 4, 4)), ("0.4.3.post4", (0, 4, 3)),
                                           ("0.4", (0, 4, 6)), ("0.5", (0, 5, 3)), ("0.5.10", (0, 5, 10)),
                                           ("0.4.2", None), ("0.4.8", None), ("0.5.2", None), ("0.5.11", None),
                                           ("0.6", None), ("x", None)])
def test_a_release_maps_to_the_rule_read_for_it_or_is_refused(text, release):
    """server_args.py changed its rule in 0.4.6, 0.4.7, 0.4.8, 0.4.10, 0.5.2 and 0.5.3: only the releases whose
    source was read are answered."""
    from kvbudget.engines.sglang.releases import parse_release

    assert parse_release(text) == release


def test_before_0_4_6_the_table_holds_on_every_card():
    """0.4.3.post4 and 0.4.5 pick by tensor parallel size whatever the card (an H200 gets 0.88 at tp 1); 0.4.6 leaves
    13 GiB on cards above 80 GiB."""
    for release in ((0, 4, 3), (0, 4, 4), (0, 4, 5)):
        assert mem_fraction_static(143771, 1, release=release) == 0.88
        assert mem_fraction_static(143771, 8, release=release) == 0.81
    assert mem_fraction_static(143771, 1, release=(0, 4, 6)) == pytest.approx(130459 / 143771)


def test_a_multimodal_models_fraction_per_release():
    """model_runner.py of 0.4.3/0.4.4 multiplies by 0.95, of 0.4.5/0.4.6 by 0.90, a given fraction too; 0.5.3's
    server_args.py scales its default only, by 0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8, 1.05):
    Gemma-3's SigLIP (27 layers of 1,152) is 1.4238 ViT-L/14s, so 0.95 x 0.95762 = 0.90974."""
    from kvbudget.engines.sglang.releases import multimodal_factor

    siglip = (27, 1152)
    assert multimodal_factor(siglip, (0, 4, 4)) == (0.95, True)
    assert multimodal_factor(siglip, (0, 4, 6)) == (0.90, True)
    factor, scales_given = multimodal_factor(siglip, (0, 5, 3))
    assert factor == pytest.approx(0.90974, abs=1e-5) and not scales_given
    assert multimodal_factor((48, 1664), (0, 5, 3))[0] == pytest.approx(0.95 * 0.8)
    assert multimodal_factor(None, (0, 4, 4)) == (1.0, False)


def test_the_plan_takes_the_multimodal_fraction_and_scales_a_given_one_on_0_4():
    from kvbudget import EngineOptions, load_model, plan

    model = load_model("gemma-3-4b")  # the -it config: a vision_config beside the text model

    def share(version, utilization=None):
        p = plan(model, engine="sglang", gpu="H200", max_model_len=8192, utilization=utilization,
                 options=EngineOptions(engine_version=version), recommend=False)
        return {t.key: t for t in p.stack}["share"]

    h200 = share((0, 4, 4)).bytes / 0.836
    assert share((0, 4, 4)).name == "engine share (0.836)"
    assert share((0, 4, 4), 0.8).name == "engine share (0.76)" and "times 0.95" in share((0, 4, 4), 0.8).note
    assert share((0, 5, 3), 0.8).name == "engine share (0.8)"  # 0.5 leaves a given fraction alone
    assert abs(share((0, 5, 3)).bytes / h200 - round((143771 - 13440) / 143771, 3) * 0.909738) < 1e-5
