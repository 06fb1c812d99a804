"""A trace's reuse curve (the prompt tokens an LRU prefix cache of each size serves) and the host-tier advice
`plan --trace` gives from it. Expected figures are worked out by hand or by a plain LRU cache written here."""

from __future__ import annotations

import json
import random
from collections import OrderedDict

import pytest

from kvbudget.cli import main
from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.reuse import CANDIDATES, ReuseCurve, advise, prefill_seconds, reuse_curve

GiB = 1 << 30


def req(pieces: list[int], size: int = 512, rest: int = 0, out: int = 0) -> Request:
    prefix = tuple((p, size) for p in pieces)
    return Request(arrival=0.0, prompt_tokens=size * len(pieces) + rest, output_tokens=out, prefix=prefix)


def test_a_prefix_hits_exactly_when_the_cache_holds_everything_used_since():
    a, b = req([1, 2]), req([3], out=100)
    curve = reuse_curve([a, b, a], "t")
    # since A's first piece: its second (512), B's piece (512) and output (100); with itself: 1,636 tokens
    assert curve.hit_tokens(1636) == 1024
    assert curve.hit_tokens(1635) == 0  # the first piece is gone, so the whole prefix misses
    assert (curve.requests, curve.prompt_tokens, curve.reusing, curve.mean_hit) == (3, 2560, 1, 1024)
    assert curve.share(10**9) == pytest.approx(1024 / 2560)


def test_a_piece_reused_after_another_prefix_is_not_a_hit():
    first, other, again = req([1, 2]), req([1, 9, 2]), req([1, 9])
    curve = reuse_curve([first, other, again], "t")
    # `other` reuses piece 1 only (its 2 follows 9, not 1); `again` reuses 1 and 9
    assert curve.reusable == 512 + 1024
    assert curve.reusing == 2


def lru_hits(requests: list[Request], capacity: int) -> int:
    """A plain LRU cache of (prefix chain, piece) items and the unique rest of each request."""
    held: OrderedDict[object, int] = OrderedDict()
    hits = 0

    def put(key: object, n: int) -> None:
        held[key] = n
        held.move_to_end(key)
        while sum(held.values()) > capacity:
            held.popitem(last=False)

    for i, r in enumerate(requests):
        chain: tuple = ()
        hitting = True
        for pid, n in r.prefix:
            chain = (*chain, pid, n)
            hitting = hitting and chain in held
            hits += n if hitting else 0
            put(chain, n)
        for j, fresh in enumerate((r.prompt_tokens - r.shared_tokens, r.output_tokens)):
            if fresh:
                put(("fresh", i, j), fresh)
    return hits


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_curve_agrees_with_a_plain_lru_cache_at_every_size(seed):
    rng = random.Random(seed)
    requests = []
    for _ in range(120):
        depth = rng.randint(1, 5)
        pieces = [rng.randint(0, 3) for _ in range(depth)]  # few ids: prefixes repeat, often in part
        requests.append(req(pieces, size=rng.choice([64, 64, 128]), rest=rng.randint(0, 50),
                            out=rng.randint(0, 80)))
    curve = reuse_curve(requests, "t")
    for capacity in (0, 100, 300, 700, 1500, 4000, 100_000):
        assert curve.hit_tokens(capacity) == lru_hits(requests, capacity), capacity


def test_a_trace_without_prefixes_is_refused():
    with pytest.raises(Exception, match="names no shared prefixes"):
        reuse_curve([Request(arrival=0, prompt_tokens=10, output_tokens=1)], "azure")


def flat(share_at: dict[int, float], prompt: int = 1000) -> ReuseCurve:
    """A curve serving share_at[c] of `prompt` tokens from capacity c on."""
    needs = tuple(sorted(share_at))
    served = tuple(round(share_at[c] * prompt) for c in needs)
    return ReuseCurve(trace="t", requests=10, prompt_tokens=prompt, needs=needs, served=served, reusing=10)


def test_the_smallest_size_with_most_of_the_gain_is_recommended():
    # the GPU holds 100 tokens; a tier holds 1 token per KiB of host memory
    curve = flat({50: 0.02, 2 * 16_777_216: 0.10, 4 * 16_777_216: 0.30, 8 * 16_777_216: 0.31})
    advice = advise(curve, gpu_tokens=100, tier_tokens=lambda m: m // 1024, load_seconds=lambda n: 0.01,
                    recompute_seconds=lambda n: 0.1, basis="b")
    # 16 GiB holds 16,777,216 tokens: 64 GiB (4x) gets 0.30 - 0.02 of the largest tier's 0.31 - 0.02 (>= 90%)
    assert advice.recommended == 64 * GiB
    assert [s.memory for s in advice.sizes] == list(CANDIDATES)
    assert advice.gpu_share == 0.02


def test_no_tier_is_recommended_for_little_reuse_or_a_slow_link():
    little = flat({50: 0.02, 10**12: 0.06})
    advice = advise(little, gpu_tokens=100, tier_tokens=lambda m: m, load_seconds=lambda n: 0.01,
                    recompute_seconds=lambda n: 0.1, basis="b")
    assert advice.recommended is None and "5% more" in advice.reason
    much = flat({50: 0.02, 10**9: 0.5})
    slow = advise(much, gpu_tokens=100, tier_tokens=lambda m: m, load_seconds=lambda n: 0.2,
                  recompute_seconds=lambda n: 0.1, basis="b")
    assert slow.recommended is None and "longer than computing it again" in slow.reason


def test_prefill_in_chunks_attends_over_what_came_before():
    model = TimeModel(weights=0.0, per_context=0.0, per_token=0.0, overhead=1.0, bound="sum", pair_cost=1.0)
    # two chunks of 2 tokens: pairs 3 and 2 x 2 + 3 = 7, each beyond its context (2, then 4): 1 + 3 = 4 in all
    assert prefill_seconds(model, 4, 2) == 2 * 1.0 + (3 - 2) + (7 - 4)
    assert prefill_seconds(model, 4, None) == 1.0 + (10 - 4)


def test_plan_recommends_a_tier_from_a_trace(tmp_path, capsys):
    lines = []
    for i in range(400):  # ten system prompts of 30,000 tokens, each asked again and again
        lines.append({"arrival": i * 0.1, "prompt_tokens": 30_100, "output_tokens": 10,
                      "prefix": f"system-{i % 10}", "prefix_tokens": 30_000})
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "32768", "--trace", str(trace),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    advice = out["host_tier_advice"]
    # a prefix comes back after its own request's rest and output (110) and the nine others' requests (9 x 30,110):
    # an LRU cache needs 301,100 tokens to keep it. L4's pool holds far less, so the GPU alone serves none;
    # 32 GiB holds 262,144 tokens of 128 KiB, 64 GiB 524,288: the smallest tier that serves them all
    assert advice["gpu_tokens"] < 301_100 and advice["gpu_share"] == 0
    assert advice["recommended"] == 64 * GiB
    assert advice["reusable_share"] == pytest.approx(390 * 30_000 / (400 * 30_100))
    rec = next(r for r in out["recommendations"] if "offload_memory" in r["parameters"])
    assert rec["parameters"] == {"offload_memory": "64GiB"} and rec["cost"] == "host memory"


@pytest.mark.parametrize("argv, message", [
    (["--trace", "azure-conv-2023"], "names no shared prefixes"),
    (["--engine", "tgi", "--trace", "mooncake-conv"], "no KV tier beyond the GPU for tgi"),
    (["--offload-backend", "lmcache"], "give --offload-memory too"),
])
def test_plan_refuses_in_one_line(capsys, argv, message):
    assert main(["plan", "llama-3.1-8b", "--gpu", "H100", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
