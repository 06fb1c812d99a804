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
    assert mem_fraction_static(81559, tp, release=(0, 4)) == fraction
    assert mem_fraction_static(143771, tp, release=(0, 4)) == pytest.approx((143771 - 13 * 1024) / 143771)


@pytest.mark.parametrize("mib, tp, fraction", [
    (81559, 1, 0.835),  # H100: 512 + 8192 x 1.5 + 256 x 2 + 128 = 13,440 MiB reserved
    (23034, 1, 0.837),  # L4: 512 + 2048 x 1.5 + 16 x 2 + 128 = 3,744
    (24564, 4, 0.827),  # RTX 4090 at tp 4: 512 + 3,072 + 80 x 2 + 512 = 4,256
    (40960, 1, 0.833),  # A100-40GB: 512 + 4096 x 1.5 + 32 x 2 + 128 = 6,848
    (65536, 1, 0.795),  # a 64 GiB card: 512 + 12,288 + 512 + 128 = 13,440 (above the 10 GiB floor)
    (184320, 8, 0.853),  # 180 GiB: 512 + 16384 x 1.5 + 512 x 2 + 1,024 = 27,136
])
def test_0_5_reserves_memory_by_the_cards_defaults(mib, tp, fraction):
    assert mem_fraction_static(mib, tp, release=(0, 5)) == fraction


def test_a_real_0_4_start_up_printed_the_fraction_the_rule_gives():
    text = (LOGS / "sglang-0.4.3-llms-in-clouds-qwq-32b-tp4-l4.log").read_text()
    logged = float(re.search(r"mem_fraction_static=([\d.]+)", text).group(1))
    tp = int(re.search(r"tp_size=(\d+)", text).group(1))
    assert mem_fraction_static(23034, tp, release=(0, 4)) == logged == 0.85


def test_an_unmodelled_release_is_one_line(capsys):
    assert main(["plan", "llama-3.1-8b", "--engine", "sglang@0.3", "--gpu", "L4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0.4, 0.5" in err
