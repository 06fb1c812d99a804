"""TGI's warm-up rule per release (engines/tgi/releases.py), worked by hand from flash_causal_lm.py's `warmup` on a
card of 80 GiB with the other terms given: the KV budget is each era's share of the total or of what stays free."""

from __future__ import annotations

import pytest

import kvbudget
from kvbudget.engines.tgi.releases import era, parse_release
from kvbudget.errors import EngineRuleError
from kvbudget.units import GIB

TOTAL, WEIGHTS, ACTIVATION, OVERHEAD = 80 * GIB, 15 * GIB, 2 * GIB, GIB // 2
USED = WEIGHTS + ACTIVATION + OVERHEAD


def _kv(version: str, utilization: float | None = None) -> int:
    options = kvbudget.EngineOptions(engine_version=parse_release(version))
    p = kvbudget.plan(kvbudget.load_model("llama-3.1-8b"), engine="tgi", options=options, gpu_memory=TOTAL,
                      max_model_len=8192, weights=WEIGHTS, activation=ACTIVATION, overhead=OVERHEAD,
                      utilization=utilization, recommend=False)
    return {t.key: t.bytes for t in p.stack}["kv"]


@pytest.mark.parametrize(("version", "expected"), [
    ("1.4.0", TOTAL - USED),  # all that is free after the warm-up
    ("1.4.1", 0.95 * (TOTAL - USED)),  # "leave 5% for some wiggle room"
    ("2.3.1", 0.95 * (TOTAL - USED)),
    ("2.4.0", 0.90 * (TOTAL - USED)),  # TGI_WIGGLE_ROOM 0.90
    ("3.0.2", 0.95 * TOTAL - USED),  # the wiggle room now a share of the total
    ("3.1.0", 0.93 * TOTAL - USED),
    ("3.3.7", 0.90 * TOTAL - USED),
])
def test_each_era_sizes_the_cache_by_its_own_rule(version, expected):
    assert abs(_kv(version) - expected) <= 1


def test_a_given_memory_fraction_is_scaled_as_the_release_scales_it():
    """CUDA_MEMORY_FRACTION 0.8: from 3.0 times the wiggle room (0.8 x 0.9 of the total), before it the wiggle room
    takes its share of what the fraction leaves free."""
    assert abs(_kv("3.3", 0.8) - (0.8 * 0.9 * TOTAL - USED)) <= 1
    assert abs(_kv("2.4", 0.8) - 0.9 * (0.8 * TOTAL - USED)) <= 1


def test_the_newest_read_is_the_default_and_unread_releases_are_refused():
    assert era(None) == era(parse_release("3.3.7"))
    for text in ("0.8.2", "3.4", "4.0", "three"):
        with pytest.raises(EngineRuleError, match="0.9.0 to 3.3.7"):
            parse_release(text)
