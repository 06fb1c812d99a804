"""The published fleet results (benchmarks/data/fleet/published.json): each is validation data with its source,
commit and licence, its inputs and its figures in the shape benchmarks/fleet_published.py reads; the workloads are
rebuilt as the sources' load generator sent them. Nothing here simulates (fast)."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path

import pytest

from kvbudget.gpus import find_gpu
from kvbudget.model.load import load_model

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "benchmarks" / "data" / "fleet" / "published.json"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fleet_published

    yield fleet_published
    sys.path.remove(str(ROOT / "benchmarks"))


def results() -> list[dict]:
    return json.loads(DATA.read_text())["results"]


def numbers(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from numbers(v)
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield tree


def test_every_result_is_validation_data_with_its_source_licence_and_assumptions():
    rs = results()
    assert len(rs) >= 3 and len({r["id"] for r in rs}) == len(rs)
    for r in rs:
        assert r["split"] == "validate", r["id"]
        src = r["source"]
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["repository"].count("/") == 1
        assert src["path"] and src["url"].startswith("https://") and src["where"]
        assert r["licence"]
        for other in r["also"]:
            assert re.fullmatch(r"[0-9a-f]{40}", other["commit"]) and other["where"]
        assert r["assumed"] and all(isinstance(a, str) and a for a in r["assumed"])


def test_every_deployment_names_a_catalog_model_and_gpu():
    for r in results():
        d = r["deployment"]
        load_model(d["model"])
        find_gpu(d["gpu"])
        assert d["engine"] == "vllm" and d["tp"] >= 1


def test_every_strategy_runs_on_a_router_or_says_what_it_needs():
    for r in results():
        for name, s in r["strategies"].items():
            assert ("router" in s) != ("needs" in s), (r["id"], name)
            if s.get("router") == "scored":
                assert set(s["weights"]) <= {"queue", "kv-cache"}


def test_published_figures_are_positive_numbers_for_the_strategies_listed():
    for r in results():
        pub = r["published"]
        assert all(v >= 0 and math.isfinite(v) for v in numbers(pub)), r["id"]
        tables = [pub["summary"], *(s["figures"] for s in pub["stages"])] if "stages" in pub else [pub["figures"]]
        for table in tables:
            assert set(table) <= set(r["strategies"]) | {"chatbot"}, r["id"]
            for figures in table.values():
                assert set(figures) <= set(pub["metrics"]) | {"goodput_ratio_min", "goodput_ratio_max"}


def test_staged_results_publish_one_table_per_main_stage():
    for r in results():
        if "stages" not in r["published"]:
            continue
        stages = r["workload"]["stages"]
        assert stages[0]["warmup"] and not any(s.get("warmup") for s in stages[1:])
        assert [s["rate"] for s in r["published"]["stages"]] == [s["rate"] for s in stages[1:]]


def test_figures_are_the_sources_as_read():
    """Spot checks typed from the sources by hand (the report tables at a378f5b, the DistServe blog)."""
    by = {r["id"]: r for r in results()}
    r73 = by["llm-d-precise-prefix-73"]["published"]
    assert r73["summary"]["random-scheduling"]["ttft_p90_s"] == 92.551
    assert r73["summary"]["precise-scheduling"]["output_tokens_per_s"] == 8730.0
    sixty = next(s for s in r73["stages"] if s["rate"] == 60)
    assert sixty["figures"]["load-scheduling"]["ttft_mean_s"] == 58.497
    r37 = by["llm-d-precise-prefix-37"]["published"]
    assert r37["summary"]["load-scheduling"]["output_tokens_per_s"] == 3018.3
    assert by["llm-d-precise-prefix-37"]["deployment"]["kv_tokens_per_replica"] == 461_376
    ds = by["distserve-colocated-vs-2p1d"]
    assert ds["published"]["figures"]["colocated"] == {"rate_ttft_slo": 3.0, "rate_tpot_slo": 1.6,
                                                       "goodput_per_gpu": 1.6}
    assert ds["slo"] == {"ttft_p90_s": 0.4, "tpot_p90_s": 0.04}


def test_shared_prefix_workload_is_sent_as_inference_perf_sent_it(bench):
    """73-capacity: 150 groups x 5 prompts of 6,000 + 1,200 tokens; each stage int(rate x duration) requests;
    the 750 prompts come round in one fixed order; a stage starts after the previous one's last send."""
    w = next(r for r in results() if r["id"] == "llm-d-precise-prefix-73")["workload"]
    staged = bench.shared_prefix(w, stages=3)
    want = [15 * 50, 3 * 20, 10 * 20, 15 * 20]
    counts = [sum(1 for r in staged.requests if staged.stage_of[r.id] == k) for k in range(4)]
    assert counts == want
    rs = staged.requests
    assert all(r.prompt_tokens == 7200 and r.output_tokens == 1000 and r.shared_tokens == 7200 for r in rs)
    assert all(r.prefix[0][0][1] == r.prefix[1][0][1] for r in rs)  # the question belongs to the system prompt's group
    assert len({r.prefix for r in rs[:750]}) == 750 and [r.prefix for r in rs[750:1060]] == [r.prefix for r in rs[:310]]
    assert len({r.prefix[0] for r in rs[:750]}) == 150
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(rs))
    for k in range(1, 4):
        first = min(r.arrival for r in rs if staged.stage_of[r.id] == k)
        last_before = max(r.arrival for r in rs if staged.stage_of[r.id] == k - 1)
        assert first - last_before >= bench.GAP_S
        assert staged.starts[k] == pytest.approx(last_before + bench.GAP_S)


def test_a_stage_spans_its_duration(bench):
    import random

    rng = random.Random(1)
    for arrivals in ("constant", "poisson"):
        offsets = bench.stage_offsets(rng, arrivals, 10.0, 20.0)
        assert len(offsets) == 200 and offsets == sorted(offsets)
        assert 0 < offsets[0] and offsets[-1] <= 20.0 + 1e-9
    assert bench.stage_offsets(rng, "constant", 10.0, 20.0)[-1] == pytest.approx(20.0)


class Fake:
    def __init__(self, index: int, usage: float, waiting: int):
        self.index, self._g = index, type("G", (), {"usage": usage, "waiting": waiting})()

    def gauge(self, now):
        return self._g


def test_gie_scorers_add_queue_and_free_kv(bench):
    """queue (max - q) / (max - min) plus 1 - usage: A = 1 + 0.1, B = 0 + 0.9, so A; with the KV weight 3,
    A = 1 + 0.3, B = 2.7, so B."""
    a, b = Fake(0, usage=0.9, waiting=0), Fake(1, usage=0.1, waiting=5)
    assert bench.Scored({"queue": 1.0, "kv-cache": 1.0}).choose(None, [a, b], 0.0) == 0
    assert bench.Scored({"queue": 1.0, "kv-cache": 3.0}).choose(None, [a, b], 0.0) == 1
    with pytest.raises(ValueError, match="prefix"):
        bench.Scored({"prefix": 1.0})


def test_random_pick_is_seeded_and_spread(bench):
    fakes = [Fake(i, 0.0, 0) for i in range(4)]
    picks = [bench.RandomPick().choose(None, fakes, 0.0) for _ in range(3)]
    assert len(set(picks)) == 1  # the same seed, the same first pick
    one = bench.RandomPick()
    spread = [one.choose(None, fakes, 0.0) for _ in range(400)]
    assert all(60 < spread.count(i) < 140 for i in range(4))


def test_slo_rate_interpolates_where_the_curve_crosses(bench):
    # between 2 (0.3 s) and 3 (0.5 s) the line crosses 0.4 s at 2.5
    assert bench.slo_rate([1, 2, 3, 4], [0.1, 0.3, 0.5, 0.9], 0.4) == pytest.approx(2.5)
    assert bench.slo_rate([1, 2], [0.5, 0.6], 0.4) == 0.0
    assert bench.slo_rate([1, 2], [0.1, 0.2], 0.4) is None


def test_numpy_linear_percentile(bench):
    # numpy.percentile([1, 2, 3, 4], 90) = 3 + 0.7 x (4 - 3)
    assert bench.percentile([4, 1, 3, 2], 0.9) == pytest.approx(3.7)
    assert bench.percentile([5.0], 0.9) == 5.0
