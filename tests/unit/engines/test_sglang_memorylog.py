"""SGLang's pool against the rule its source sizes it by, read from a real start-up log's memory lines."""

from __future__ import annotations

from pathlib import Path

import kvbudget
from kvbudget.engines.base import EngineOptions, LogRow
from kvbudget.engines.sglang import SGLANG
from kvbudget.engines.sglang.memorylog import memory_rows
from kvbudget.units import GIB

LOG = (Path(__file__).resolve().parents[2] / "data" / "logs" / "sglang-0.4.3-llms-in-clouds-qwq-32b-tp4-l4.log")
CELL = 64 * 2 * 8 // 4 * 128 * 2  # Qwen2.5-32B at tp 4: 64 layers x K and V x 2 KV heads per rank x 128 x bf16


def _rows(text: str) -> dict[str, LogRow]:
    return {r.quantity: r for r in memory_rows(text, 46_611, CELL, int(15.26 * GIB))}


def test_the_real_pool_is_what_the_rule_gives():
    """6.09 - 21.63 x (1 - 0.85) = 2.85 GiB over 65,536 B per token: 46,611 tokens, as the log allocated."""
    rows = _rows(LOG.read_text())
    pool = rows["memory: pool by SGLang's rule"]
    assert pool.matches is True and "6.09 - 21.63 x (1 - 0.85)" in pool.note
    assert rows["memory: weights as loaded"].logged == "15.54 GB" and rows["memory: weights as loaded"].matches is None


def test_another_fraction_is_a_mismatch():
    """The same log with another mem_fraction_static than the one its pool was sized with does not agree."""
    rows = _rows(LOG.read_text().replace("mem_fraction_static=0.85", "mem_fraction_static=0.84"))
    assert rows["memory: pool by SGLang's rule"].matches is False


def test_the_share_is_of_the_memory_free_before_loading():
    """Read as a share of the card (the memory in use before loading counted in), the pool would be larger than
    the one allocated: the rule's measurement before loading is what decides."""
    text = LOG.read_text().replace("Load weight begin. avail mem=21.63 GB", "Load weight begin. avail mem=22.49 GB")
    assert _rows(text)["memory: pool by SGLang's rule"].matches is False


def test_a_log_without_memory_lines_has_no_memory_rows():
    assert memory_rows("KV Cache is allocated. #tokens: 100, K size: 0.01 GB, V size: 0.01 GB", 100, CELL, None) == []


def test_check_log_shows_the_rows():
    check = SGLANG.check_log(LOG.read_text(), kvbudget.load_model("qwen2.5-32b"))
    assert any(r.quantity == "memory: pool by SGLang's rule" and r.matches for r in check.rows)


def test_the_plan_takes_the_share_of_what_is_free_before_loading():
    """The fitted memory in use before loading is the catalog's L4 less what the log measured then (the fit
    case), and the plan's pool for that start-up is then off by its weights alone (15.54 loaded, 15.26 counted)."""
    from kvbudget.engines.sglang.engine import PRELOAD
    from kvbudget.gpus import find_gpu

    assert round(find_gpu("L4").memory_bytes / GIB - 21.63, 2) == round(PRELOAD / GIB, 2)
    p = kvbudget.plan(kvbudget.load_model("qwen2.5-32b"), engine="sglang", gpu="L4", tp=4, max_model_len=32768,
                      options=EngineOptions(engine_version=(0, 4, 3)), recommend=False)
    kv = {t.key: t.bytes for t in p.stack}["kv"] / GIB
    assert abs(kv - (2.85 + 15.54 - 15.26)) < 0.02
