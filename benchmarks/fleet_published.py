"""Reproduces published fleet results (benchmarks/data/fleet/published.json) with `simulate_fleet` and prints each
published figure beside the simulated one and their difference. Validation only: nothing is fitted on them.

What runs today: llm-d's random and load-aware scheduling on its shared-prefix workloads (8 x Qwen3-32B TP 2 and
4 x Llama-3.1-70B TP 4 on H100), per load stage; DistServe's colocated goodput (OPT-13B on one A100, 512 in / 64
out). What needs a feature another slice is building prints `needs: ...` and the function it will call (`PENDING`):
disaggregated prefill/decode pools.

    python benchmarks/fleet_published.py                  # every result (a few minutes on one core)
    python benchmarks/fleet_published.py --only llm-d-precise-prefix-37 --stages 3
    python benchmarks/fleet_published.py --json out.json  # the simulated figures beside the published, as JSON

Each replica's schedule is checked against a single-replica `simulate` of what it was sent (the fleet's promise);
that run also gives each request's own latencies, so the figures can be taken per load stage as the source did.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbudget.engines.scheduling.setup import Role
from kvbudget.engines.scheduling.workload import Request
from kvbudget.model.load import load_model
from kvbudget.simulation.fleet import ApproxPrefix, Pool, PrefixAware, Replica, simulate_fleet
from kvbudget.simulation.run import setup_for, simulate

DATA = Path(__file__).resolve().parent / "data" / "fleet" / "published.json"
GAP_S = 3600.0  # idle seconds between load stages: the source waited for every answer; the check below says it did
SEED = 0
SCRAPE_S = 0.05  # GIE's metrics refresh: the gauges a load-aware picker reads
# the features a result's strategy waits for, and what the lead wires here once they are merged
PENDING = {
    "disaggregated": "simulate_fleet(model, requests, <the pd slice's prefill and decode pools>, ...)",
    "dataset": "a ShareGPT length sample as DistServe drew it (not bundled)",
}


def results() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text())["results"])


# --- routers the sources used that are not built in (plain implementations of the Router protocol) -------------


@dataclass
class RandomPick:
    """GIE's random-picker: a uniform pick per request (seeded)."""

    seed: int = SEED
    name: str = "random"
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        return replicas[self.rng.randrange(len(replicas))].index


@dataclass
class Scored:
    """GIE's scorers over the engines' scraped gauges, weighted and summed, the highest total picked (ties at
    random, as max-score-picker shuffles first): queue-scorer (max - q) / (max - min) of the waiting queues (1 when
    all equal), kv-cache-scorer 1 - KV usage."""

    weights: dict[str, float]
    seed: int = SEED
    name: str = "scored"
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        unknown = set(self.weights) - {"queue", "kv-cache"}
        if unknown:
            raise ValueError(f"scorers {sorted(unknown)}: only queue and kv-cache are modelled here")
        self.rng = random.Random(self.seed)

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        gauges = [r.gauge(now) for r in replicas]
        low, high = min(g.waiting for g in gauges), max(g.waiting for g in gauges)
        order = list(range(len(replicas)))
        self.rng.shuffle(order)

        def score(i: int) -> float:
            g = gauges[i]
            queue = 1.0 if high == low else (high - g.waiting) / (high - low)
            return self.weights.get("queue", 0.0) * queue + self.weights.get("kv-cache", 0.0) * (1.0 - g.usage)

        return replicas[max(order, key=score)].index


def router_for(strategy: dict[str, Any]) -> Any:
    kind = strategy["router"]
    if kind == "random":
        return RandomPick()
    if kind == "scored":
        return Scored(dict(strategy["weights"]))
    if kind in ("prefix", "prefix-approx"):
        w = strategy["weights"]
        weights = (w["prefix"], w["kv-cache"], w["queue"])
        if kind == "prefix":
            return PrefixAware(refresh=SCRAPE_S, seed=SEED, weights=weights)
        return ApproxPrefix(entries=strategy.get("entries", 0), refresh=SCRAPE_S, seed=SEED, weights=weights,
                            block=strategy.get("block", 0))
    return kind  # a built-in router's name


# --- workloads ---------------------------------------------------------------------------------------------------


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw (Knuth's; the rates here are at most a few hundred a second)."""
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def spread(rng: random.Random, count: int, duration: float) -> list[float]:
    """inference-perf's ConstantLoadTimer: exponential gaps scaled to sum to `duration` (the offsets from the
    start of each request)."""
    gaps = [rng.expovariate(count / duration) for _ in range(count)]
    scale = duration / sum(gaps)
    out, t = [], 0.0
    for g in gaps:
        t += g * scale
        out.append(t)
    return out


def stage_offsets(rng: random.Random, arrivals: str, rate: float, duration: float) -> list[float]:
    """The send times (seconds from the stage's start) of the int(rate x duration) requests of one stage, as
    inference-perf's timers draw them: 'constant' spreads them over the stage; 'poisson' draws each second's count
    from a Poisson law and spreads that many over the second."""
    count = int(rate * duration)
    if arrivals == "constant":
        return spread(rng, count, duration)
    out: list[float] = []
    second = 0
    while len(out) < count:
        n = poisson(rng, rate)
        if n:
            out.extend(second + t for t in spread(rng, n, 1.0))
        second += 1
    return out[:count]


@dataclass(frozen=True)
class Staged:
    """A workload sent in stages: the requests, and the stage of each (by id)."""

    requests: list[Request]
    stage_of: dict[str, int]
    starts: list[float]


def shared_prefix(workload: dict[str, Any], stages: int | None = None, seed: int = SEED) -> Staged:
    """inference-perf's shared_prefix prompts (Sept. 2025): groups x prompts_per_group prompts, each its group's
    system prompt then a question of its own, shuffled once and sent in that order round and round; each stage's
    requests at its timer's times, each stage GAP_S after the previous one's last send."""
    rng = random.Random(seed)
    system, question = workload["system_prompt_tokens"], workload["question_tokens"]
    prompts = [(g, q) for g in range(workload["groups"]) for q in range(workload["prompts_per_group"])]
    rng.shuffle(prompts)
    chosen = workload["stages"] if stages is None else workload["stages"][:stages + 1]
    requests: list[Request] = []
    stage_of: dict[str, int] = {}
    starts: list[float] = []
    start = 0.0
    for k, stage in enumerate(chosen):
        starts.append(start)
        offsets = stage_offsets(rng, workload["arrivals"], stage["rate"], stage["duration_s"])
        for t in offsets:
            g, q = prompts[len(requests) % len(prompts)]
            rid = str(len(requests))
            requests.append(Request(arrival=start + t, prompt_tokens=system + question,
                                    output_tokens=workload["output_tokens"], id=rid,
                                    prefix=((("system", g), system), (("question", g, q), question))))
            stage_of[rid] = k
        start = requests[-1].arrival + GAP_S
    return Staged(requests, stage_of, starts)


# --- running and comparing ---------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile, as inference-perf reports."""
    s = sorted(values)
    at = (len(s) - 1) * q
    lo = math.floor(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


@dataclass
class PerRequest:
    ttft: dict[str, float] = field(default_factory=dict)
    tpot: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)


def run_staged(result: dict[str, Any], strategy: dict[str, Any], stages: int | None) -> dict[str, Any]:
    """The fleet on the staged workload; each replica replayed alone (the same schedule, checked) for each
    request's latencies; the figures per stage and over the main stages."""
    d, w = result["deployment"], result["workload"]
    model = load_model(d["model"])
    setup = setup_for(model, gpu=d["gpu"], tp=d["tp"], block_size=d["block_size"],
                      num_blocks=d["kv_tokens_per_replica"] // d["block_size"])
    staged = shared_prefix(w, stages)
    sent: dict[int, list[Request]] = {}
    fleet = simulate_fleet(model, staged.requests, [Pool(name="pods", setup=setup, replicas=d["replicas"])],
                           router_for(strategy), sample_interval=SCRAPE_S,
                           on_route=lambda r, i: sent.setdefault(i, []).append(r))
    seen = PerRequest()

    def finish(r: Request, ttft: float, tpot: float | None, e2e: float) -> None:
        seen.ttft[r.id], seen.finished[r.id] = ttft, r.arrival + e2e
        if tpot is not None:
            seen.tpot[r.id] = tpot

    for rep in fleet.replicas:
        mine = sent.get(rep.index, [])
        if not mine:
            continue
        alone = simulate(model, mine, setup=rep.simulation.setup, on_finish=finish)
        if alone.e2e_sorted != rep.simulation.e2e_sorted:
            raise AssertionError(f"replica {rep.index}: its schedule differs from a run of what it was sent alone")
    if len(seen.ttft) != len(staged.requests):
        raise AssertionError(f"{len(staged.requests) - len(seen.ttft)} requests never finished")
    by_stage: dict[int, list[Request]] = {}
    for r in staged.requests:
        by_stage.setdefault(staged.stage_of[r.id], []).append(r)
    figures: dict[str, Any] = {}
    main_ttft: list[float] = []
    main_tpot: list[float] = []
    main_tokens, main_time = 0, 0.0
    for k, rs in sorted(by_stage.items()):
        end = max(seen.finished[r.id] for r in rs)
        if k + 1 < len(staged.starts) and end > staged.starts[k + 1]:
            raise AssertionError(f"stage {k} had not drained when stage {k + 1} began: raise GAP_S")
        span = end - min(r.arrival for r in rs)  # as inference-perf: the first start to the last end
        ttfts = [seen.ttft[r.id] for r in rs]
        tokens = sum(r.output_tokens for r in rs)
        stage = w["stages"][k]
        if stage.get("warmup"):
            continue
        main_ttft += ttfts
        tpots = [seen.tpot[r.id] for r in rs if r.id in seen.tpot]
        main_tpot += tpots
        main_tokens, main_time = main_tokens + tokens, main_time + span
        figures[str(float(stage["rate"]))] = {
            "output_tokens_per_s": tokens / span, "ttft_p90_s": percentile(ttfts, 0.9),
            "ttft_mean_s": sum(ttfts) / len(ttfts), "itl_mean_s": sum(tpots) / len(tpots) if tpots else 0.0}
    summary = {"output_tokens_per_s": main_tokens / main_time if main_time else 0.0,
               "ttft_p90_s": percentile(main_ttft, 0.9) if main_ttft else 0.0,
               "ttft_mean_s": sum(main_ttft) / len(main_ttft) if main_ttft else 0.0,
               "itl_mean_s": sum(main_tpot) / len(main_tpot) if main_tpot else 0.0,
               "prefix_hit_rate": sum(r.simulation.prefix_hit_tokens for r in fleet.replicas)
               / max(1, sum(r.simulation.prefix_queried_tokens for r in fleet.replicas)),
               "preemptions": fleet.preemptions}
    return {"summary": summary, "stages": figures}


def slo_rate(rates: Sequence[float], latencies: Sequence[float], slo: float) -> float | None:
    """The rate where the latency curve first crosses `slo`, by straight line between the rates either side (as
    DistServe's find_intersection); 0 when the lowest rate is already over it; None when no rate tried reaches it."""
    if latencies[0] > slo:
        return 0.0
    for (r0, y0), (r1, y1) in zip(zip(rates, latencies), zip(rates[1:], latencies[1:])):
        if y0 <= slo < y1:
            return r0 + (slo - y0) * (r1 - r0) / (y1 - y0)
    return None


def poisson_requests(rate: float, count: int, prompt: int, output: int, seed: int = SEED) -> list[Request]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        out.append(Request(arrival=t, prompt_tokens=prompt, output_tokens=output, id=str(i)))
    return out


MAX_RATE = 32.0  # requests/s: the colocated sweep's last rate


def run_colocated(result: dict[str, Any], strategy: dict[str, Any], count: int = 400) -> dict[str, Any]:
    """One colocated replica (or the strategy's prefill and decode pools) swept over Poisson rates 0.2 apart, until
    both P90s are over their SLOs: the rates within each SLO and the goodput per GPU."""
    d, w, slo = result["deployment"], result["workload"], result["slo"]
    model = load_model(d["model"])
    setup = setup_for(model, gpu=d["gpu"], tp=d["tp"], block_size=d["block_size"],
                      utilization=d["gpu_memory_utilization"], max_num_batched_tokens=d["max_num_batched_tokens"],
                      max_num_seqs=d["max_num_seqs"], prefix_caching=False)
    if "prefill" in strategy:  # disaggregated: a prefill pool and a decode pool of the deployment, the KV moved
        pools = [Pool(name="prefill", setup=setup, replicas=strategy["prefill"], role=Role.PREFILL),
                 Pool(name="decode", setup=setup, replicas=strategy["decode"], role=Role.DECODE)]
        gpus = (strategy["prefill"] + strategy["decode"]) * d["tp"]
        link = strategy["kv_link"]
    else:
        pools, gpus, link = [Pool(name="gpu", setup=setup, replicas=d["replicas"])], d["replicas"] * d["tp"], None
    rates: list[float] = []
    ttft: list[float] = []
    tpot: list[float] = []
    rate = 0.2
    while rate <= MAX_RATE + 1e-9:
        fleet = simulate_fleet(model, poisson_requests(rate, count, w["prompt_tokens"], w["output_tokens"]),
                               pools, strategy["router"], kv_link=link)
        assert fleet.ttft is not None and fleet.tpot is not None
        rates.append(rate)
        ttft.append(fleet.ttft.p90)
        tpot.append(fleet.tpot.p90)
        if ttft[-1] > slo["ttft_p90_s"] and tpot[-1] > slo["tpot_p90_s"]:
            break
        rate = round(rate + 0.2, 1)
    by_ttft, by_tpot = slo_rate(rates, ttft, slo["ttft_p90_s"]), slo_rate(rates, tpot, slo["tpot_p90_s"])
    figures = {name: value for name, value in (("rate_ttft_slo", by_ttft), ("rate_tpot_slo", by_tpot))
               if value is not None}
    if by_ttft is not None and by_tpot is not None:
        figures["goodput_per_gpu"] = min(by_ttft, by_tpot) / gpus
    return {"figures": figures, "sweep": {"rates": rates, "ttft_p90_s": ttft, "tpot_p90_s": tpot}}


def pending(strategy: dict[str, Any]) -> str:
    """What a strategy waits for, and the call that will run it."""
    text = strategy["needs"]
    kind = "disaggregated" if "disaggregated" in text or "pool" in text \
        else "dataset"
    return f"needs: {text} -> will call {PENDING[kind]}"


def diff(published: float, simulated: float) -> str:
    return f"{(simulated - published) / published:+.0%}" if published else "n/a"


def show(name: str, published: dict[str, float], simulated: dict[str, float]) -> None:
    for metric, value in published.items():
        if metric in simulated:
            print(f"    {name:<22} {metric:<20} published {value:>10.3f}  simulated {simulated[metric]:>10.3f}  "
                  f"{diff(value, simulated[metric]):>6}")


def compare(result: dict[str, Any], stages: int | None, out: dict[str, Any]) -> None:
    print(f"{result['id']}: {result['title']}")
    print(f"  source: {result['source']['url']} ({result['source']['where'].split(' (')[0]})")
    pub = result["published"]
    for name, strategy in result["strategies"].items():
        if "needs" in strategy:
            print(f"  {name}: {pending(strategy)}")
            continue
        if "stages" in pub:
            sim = run_staged(result, strategy, stages)
            out.setdefault(result["id"], {})[name] = sim
            print(f"  {name} (router {strategy['router']}): prefix hit rate {sim['summary']['prefix_hit_rate']:.1%}, "
                  f"preemptions {sim['summary']['preemptions']:,}")
            if stages is None:
                show("all main stages", pub["summary"].get(name, {}), sim["summary"])
            for stage in pub["stages"]:
                key = str(float(stage["rate"]))
                if key in sim["stages"] and name in stage["figures"]:
                    show(f"{stage['rate']:g} requests/s", stage["figures"][name], sim["stages"][key])
        else:
            sim = run_colocated(result, strategy)
            out.setdefault(result["id"], {})[name] = sim
            show(name, pub["figures"].get(name, {}), sim["figures"])
    print("  assumed: " + "; ".join(result["assumed"]))
    print()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="a result's id (repeat for several)")
    ap.add_argument("--stages", type=int, help="only the first N load stages after the warm-up")
    ap.add_argument("--json", help="write the simulated figures here")
    a = ap.parse_args(argv)
    chosen = [r for r in results() if not a.only or r["id"] in a.only]
    if a.only and len(chosen) != len(a.only):
        sys.exit(f"--only: name one of {', '.join(r['id'] for r in results())}")
    out: dict[str, Any] = {}
    for r in chosen:
        compare(r, a.stages, out)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


def requests_of(result: dict[str, Any], stages: int | None = None) -> Iterator[Request]:
    """A shared-prefix result's requests (for tests and notebooks)."""
    yield from shared_prefix(result["workload"], stages).requests


if __name__ == "__main__":
    main()
