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
    assert err.count("\n") == 1 and "0.4.3-0.4.6 and 0.4.8-0.5.10" in err
    assert err.startswith("kvbudget: error: --engine sglang@0.3:")  # the flag the person wrote


@pytest.mark.parametrize("text, release", [("0.4.4", (0, 4, 4)), ("0.4.4.post2", (0, 4, 4)), ("0.4.3.post4", (0, 4, 3)),
                                           ("0.4", (0, 4, 6)), ("0.5", (0, 5, 3)), ("0.5.10", (0, 5, 10)),
                                           ("0.4.8", (0, 4, 8)), ("0.5.2", (0, 5, 2)), ("0.4.10.post2", (0, 4, 10)),
                                           ("0.4.2", None), ("0.4.7", None), ("0.5.11", None), ("0.6", None),
                                           ("x", None)])
def test_a_release_maps_to_the_rule_read_for_it_or_is_refused(text, release):
    """server_args.py changed its rule in 0.4.6, 0.4.7, 0.4.8, 0.5.3 and 0.5.10: only the releases whose source was
    read are answered (0.4.7's was not)."""
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


def test_0_5_10_leaves_memory_for_piecewise_cuda_graphs():
    """0.5.10's server_args.py adds 8 MiB per piecewise capture size up to chunked_prefill_size, or 1.5 GiB for an MLA
    model, before the 10 GiB floor; 0.5.5 to 0.5.9 capture them only when asked (--enable-piecewise-cuda-graph). The
    sizes by hand: 4-32 by 4 (8), 48-256 by 16 (14), 288-512 by 32 (8), 576-1,024 by 64 (8), 1,280-4,096 by 256 (12),
    then 4,608 on by 512 (8 to 8,192; 24 to 16,384)."""
    from kvbudget.engines.sglang.releases import piecewise_mib

    assert [piecewise_mib(mib, 1, (0, 5, 10), mla=False) for mib in (18000, 40960, 81559, 200000)] == [
        8 * 42, 8 * 50, 8 * 58, 8 * 74]  # chunks of 2,048, 4,096, 8,192 and 16,384
    assert piecewise_mib(81559, 8, (0, 5, 10), mla=True) == 1536
    assert piecewise_mib(81559, 1, (0, 5, 9), mla=False) == piecewise_mib(81559, 1, (0, 5, 3), mla=False) == 0
    # an H100 (nvidia-smi's 81,559 MiB) at tp 1: 13,440 MiB as in 0.5.3, and 464 more
    assert mem_fraction_static(81559, 1, release=(0, 5, 10), piecewise=464) == round((81559 - 13904) / 81559, 3) == 0.83
    # an H200 at tp 8 serving an MLA model: 512 + 8,192 x 1.5 + 512 x 2 + 1,024 + 1,536 = 16,384
    assert mem_fraction_static(143771, 8, release=(0, 5, 10), piecewise=1536) == 0.886
    assert mem_fraction_static(143771, 8, release=(0, 5, 9)) == 0.897


@pytest.mark.parametrize("model, gpu, captured", [
    ("llama-3.1-8b", "H100-80GB", 464),  # a text model on an NVIDIA card: chunks of 8,192, 58 sizes
    ("deepseek-v2-lite", "H100-80GB", 1536),  # MLA
    ("llama-3.1-8b", "MI300X", 0),  # off on AMD (is_hip)
    ("gemma-3-4b", "H100-80GB", 0),  # off for a multimodal model
    ("qwen3-next-80b-a3b", "H100-80GB", 0),  # an architecture 0.5.10 turns them off for
])
def test_the_plan_leaves_the_piecewise_reserve_where_0_5_10_captures_them(model, gpu, captured):
    from kvbudget import load_model
    from kvbudget.engines import EngineOptions
    from kvbudget.engines.sglang.engine import SGLangEngine
    from kvbudget.engines.sglang.releases import multimodal_factor
    from kvbudget.gpus import find_gpu
    from kvbudget.model.params import vision_tower

    spec, card = load_model(model), find_gpu(gpu)

    def fraction(release):
        return SGLangEngine().serving(card.memory_bytes, 4096, EngineOptions(engine_version=release),
                                      gpu_name=card.name, tp=1, model=spec)

    newer, older = fraction((0, 5, 10)), fraction((0, 5, 9))
    factor, _ = multimodal_factor(vision_tower(spec), (0, 5, 10))
    mib = {"H100-80GB": 81559, "MI300X": 196608}[gpu]  # what nvidia-smi / rocminfo report, which SGLang reads
    assert newer.memory_fraction == pytest.approx(
        mem_fraction_static(mib, 1, release=(0, 5, 10), piecewise=captured) * factor)
    assert (newer.memory_fraction < older.memory_fraction) == bool(captured)
    assert ("piecewise CUDA graphs" in newer.memory_knob) == bool(captured)


def test_kimi_k2_5_on_mi355x_logged_the_fraction_the_0_5_rules_give():
    """SGLang 0.5.8 on 8 x MI355X (github.com/ajith-sirra-amd/Issues, Kimi-K2.5-MI355X-SGLANG-ERROR.md): 209.98 GiB
    free after 73.58 of weights and a pool of 160.63 GiB, so weights and pool took (73.58 + 160.63) / 283.56 = 0.826
    of the memory free before loading. By hand from 0.5.8's server_args.py: rocminfo's 288 GiB = 294,912 MiB; at tp 8
    512 + 16,384 x 1.5 + 512 x 2 + 1,024 = 27,136 MiB reserved, so round(267,776 / 294,912, 3) = 0.908; Kimi-K2.5's
    MoonViT (27 layers of 1,152, configs/kimi_k25.py) is 1.4238 ViT-L/14s: x 0.95 x 0.95762."""
    from kvbudget.engines.sglang.releases import multimodal_factor

    fraction = mem_fraction_static(288 * 1024, 8, release=(0, 5, 8))
    factor, _ = multimodal_factor((27, 1152), (0, 5, 8))
    assert fraction == 0.908
    assert fraction * factor == pytest.approx((73.58 + 160.63) / 283.56, abs=0.0002)


@pytest.mark.parametrize("model, tp, context, release, cut", [
    ("llama-3.1-8b", 1, 32768, (0, 5, 3), 0.85),  # multi-head: aiter, and a context over 8,192
    ("llama-3.1-8b", 1, 8192, (0, 5, 8), 1.0),  # aiter, but a context of 8,192
    ("deepseek-v3", 8, 32768, (0, 5, 8), 0.85),  # MLA, 128 KV heads / 8 = 16 a rank: aiter
    ("deepseek-v3", 4, 32768, (0, 5, 8), 1.0),  # 32 a rank: triton
    ("kimi-k2", 8, 262144, (0, 5, 8), 1.0),  # 64 / 8 = 8 a rank: triton (the MI355X log's fraction has no cut)
    ("deepseek-v2-lite", 1, 32768, (0, 5, 10), 0.85),  # 16 KV heads at tp 1
    ("llama-3.1-8b", 1, 32768, (0, 4, 6), 1.0),  # 0.4.6's model_runner.py has no such cut
    ("llama-3.1-8b", 2, 32768, (0, 4, 8), 0.85),  # 0.4.8's has (model_runner.py)
])
def test_amd_cuts_the_fraction_where_sglang_picks_aiter(model, tp, context, release, cut):
    """SGLang 0.4.8-0.5.10 on AMD: aiter attention by default for multi-head models and MLA models with 16 or 128
    KV heads a rank, and mem_fraction_static x 0.85 (default or given) for a context over 8,192. By hand on an
    MI300X (rocminfo's 192 GiB = 196,608 MiB) at tp 1: 512 + 16,384 x 1.5 + 512 x 2 + 128 = 26,240 MiB reserved,
    round(170,368 / 196,608, 3) = 0.867."""
    from kvbudget import load_model
    from kvbudget.engines import EngineOptions
    from kvbudget.engines.sglang.engine import SGLangEngine
    from kvbudget.gpus import find_gpu

    card = find_gpu("MI300X")
    serving = SGLangEngine().serving(card.memory_bytes, context, EngineOptions(engine_version=release),
                                     gpu_name=card.name, tp=tp, model=load_model(model))
    assert serving.memory_fraction == pytest.approx(mem_fraction_static(196608, tp, release=release) * cut)
    assert serving.given_fraction_scale == pytest.approx(cut)  # a fraction you give is cut too
    assert ("aiter" in serving.memory_knob) == (cut != 1)
    if (model, tp, release) == ("llama-3.1-8b", 1, (0, 5, 3)):
        assert serving.memory_fraction == pytest.approx(0.867 * 0.85)
    nvidia = SGLangEngine().serving(card.memory_bytes, context, EngineOptions(engine_version=release),
                                    gpu_name="H100-80GB", tp=tp, model=load_model(model))
    assert nvidia.given_fraction_scale == 1.0  # CUDA cards get flashinfer / fa3 / triton: no cut


@pytest.mark.parametrize("mib, tp, fraction", [
    (81559, 4, 0.856),  # H100 at tp 4: (9.5 + 4 / 2) GiB = 11,776 MiB reserved; round(69,783 / 81,559, 3)
    (32607, 1, 0.909),  # RTX 5090: (2.8 + 0.1) GiB = 2,969.6 MiB
    (143771, 8, 0.886),  # H200 at tp 8: (12 + 4) GiB = 16,384 MiB
    (196608, 8, 0.833),  # MI300X (rocminfo's 192 GiB): 32 GiB whatever the parallel size
])
def test_0_4_8_to_0_5_2_reserve_memory_in_tiers(mib, tp, fraction):
    """server_args.py of 0.4.8, 0.4.9, 0.4.10, 0.5.1 and 0.5.2 (the same block in each): reserved GiB under 35 GiB
    2.8 + p / 10, under 90 GiB 9.5 + p / 2, under 160 GiB 12 + p / 2, else 32, with p = tp x pp."""
    for release in ((0, 4, 8), (0, 4, 9), (0, 4, 10), (0, 5, 1), (0, 5, 2)):
        assert mem_fraction_static(mib, tp, release=release) == fraction


def test_the_multimodal_cut_moved_from_the_runner_to_the_defaults():
    """0.4.8's model_runner.py multiplies any fraction by 0.90; 0.4.9's server_args.py the default only; 0.4.10's
    adjust_mem_fraction_for_vlm weighs the tower (Gemma-3's SigLIP, 27 layers of 1,152: 0.90974)."""
    from kvbudget.engines.sglang.releases import multimodal_factor

    siglip = (27, 1152)
    assert multimodal_factor(siglip, (0, 4, 8)) == (0.90, True)
    assert multimodal_factor(siglip, (0, 4, 9)) == (0.90, False)
    factor, scales_given = multimodal_factor(siglip, (0, 4, 10))
    assert factor == pytest.approx(0.90974, abs=1e-5) and not scales_given


@pytest.mark.parametrize("release", ["0.4.8", "0.4.9", "0.5.2"])
def test_launch_flags_of_releases_whose_flags_were_not_read_are_refused(release):
    """0.4.8-0.5.2 are planned now (their memory rule was read), but launch_server's flags were read in 0.4.6 and
    0.5.3 only: a command for them is refused in one line rather than written with a neighbour's flags."""
    from kvbudget.deployment import Deployment, PoolPlan
    from kvbudget.engines import get_engine
    from kvbudget.errors import KVBudgetError

    p = PoolPlan(gpu="H100-80GB", tp=2, max_num_seqs=128, max_num_batched_tokens=4096, max_model_len=16384,
                 gpu_memory_utilization=0.85)
    with pytest.raises(KVBudgetError, match="give 0.4.6 or 0.5") as err:
        get_engine("sglang").command(p, Deployment(model="m", engine="sglang", release=release, pools=(p,)))
    assert "\n" not in str(err.value) and err.value.param == "release"
