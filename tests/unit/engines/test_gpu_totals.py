"""Each engine sizes from the total it reads (issue 55): vLLM takes its share of torch's total
(torch.cuda.mem_get_info), SGLang picks its default mem_fraction_static from nvidia-smi's memory.total or rocminfo's
pool (get_gpu_memory_capacity in python/sglang/srt/utils.py), so a torch total in the catalog never moves SGLang's
default fraction."""

from __future__ import annotations

import pytest

from kvbudget.engines import EngineOptions
from kvbudget.engines.sglang.engine import SGLangEngine
from kvbudget.engines.sglang.releases import mem_fraction_static
from kvbudget.gpus import find_gpu, gpu_card
from kvbudget.units import GIB, MIB

# nvidia-smi's memory.total in MiB as public nvidia-smi tables print it (an H100 80GB HBM3: 81,559 MiB; an H200:
# 143,771 MiB, e.g. beside vLLM's 'Free memory on device (116.87/139.81 GiB)' in one report), written here by hand
NVIDIA_SMI_MIB = {"H100-80GB": 81559, "H200": 143771}


@pytest.mark.parametrize("name", sorted(NVIDIA_SMI_MIB))
@pytest.mark.parametrize("release", [(0, 4, 6), (0, 4, 9), (0, 5, 3)])
def test_sglang_picks_its_default_fraction_from_nvidia_smis_total_not_torchs(name, release):
    card = find_gpu(name)
    assert card.memory_bytes < NVIDIA_SMI_MIB[name] * MIB  # the card's torch total is in the catalog
    serving = SGLangEngine().serving(card.memory_bytes, 4096, EngineOptions(engine_version=release),
                                     gpu_name=card.name, tp=1)
    assert serving.memory_fraction == mem_fraction_static(NVIDIA_SMI_MIB[name], 1, release=release)


def test_sglang_reads_rocminfos_pool_on_an_mi300x():
    """rocminfo's first pool on an MI300X is its nominal 192 GiB (196,608 MiB), torch sees 191.69 GiB: at 0.5.3, tp 1,
    512 + 16,384 x 1.5 + 512 x 2 + 128 = 26,240 MiB reserved, round(170,368 / 196,608, 3) = 0.867."""
    card = find_gpu("MI300X")
    serving = SGLangEngine().serving(card.memory_bytes, 4096, EngineOptions(engine_version=(0, 5, 3)),
                                     gpu_name=card.name, tp=1)
    assert serving.memory_fraction == 0.867


def test_a_memory_given_is_the_total_sglang_reads():
    """With --gpu-memory the figure given is all there is: SGLang's default fraction is taken of it."""
    card = gpu_card("H200", 100 * GIB)
    serving = SGLangEngine().serving(card.memory_bytes, 4096, EngineOptions(engine_version=(0, 5, 3)),
                                     gpu_name=card.name, tp=1)
    assert serving.memory_fraction == mem_fraction_static(100 * 1024, 1, release=(0, 5, 3))
