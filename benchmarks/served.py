"""Replays the public end-to-end vLLM runs in benchmarks/data/served/ through `kvbudget.simulate` with its default
time model (no calibration) and compares mean, p50 and p90 TTFT, TPOT and end-to-end latency with what the real
runs measured. None of these runs is in the data the step times are fitted on (src/kvbudget/data/steptimes/).
Used by bench_step_times.py and tests/unit/simulation/test_step_times.py.

`python benchmarks/served.py` prints the held-out table: the runs published only as `benchmark_serving.py` /
`vllm bench serve` blocks (fixed-length random prompts, sent at once), on GPUs the step times were not fitted on,
by GPU, basis, tensor parallel size and load: median |error| and median signed error of mean TTFT, TPOT and E2E.

`python benchmarks/served.py --decode-steps` sets the decode steps the held-out runs' own engine logs show (the
10-second statistics lines pasted after a block, where nothing but decoding ran) beside the simulated step of the same
batch and context, and fits the gap per GPU and tensor parallel size as a line over the sequences (about 2 seconds).

`python benchmarks/served.py --silicon` replays aiconfigurator's silicon runs instead (data/served/silicon.json:
1,149 vLLM rows on H100, H200, B200 and B300, each a closed loop of its concurrency, as aiperf sent them) and
prints the same figures by GPU, release, model and weights, TP and concurrency, an overall line and the rows left
out with why (about 4 minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbudget.engines.scheduling.timing import TimeModel
from kvbudget.engines.scheduling.workload import Request
from kvbudget.errors import KVBudgetError
from kvbudget.model.load import load_model
from kvbudget.simulation import simulate

DATA = Path(__file__).resolve().parent / "data" / "served"
METRICS = ("ttft", "tpot", "e2e")
# the runs left out of the comparison, and why (the real run's figures are of the requests that survived)
OVERLOAD = "client timeouts failed {:.0%} of the requests: the measured latencies are of the survivors"
ACROSS_NODES = "tensor parallel across {} nodes (Ray over the network) with no link recorded for the run"
# the held-out table's load groups: requests sent at once, up to this many (the last group: more)
AT_ONCE = (1, 50, 200)
LOADS = ("1 at once", *(f"{a + 1}-{b} at once" for a, b in itertools.pairwise(AT_ONCE)), f"> {AT_ONCE[-1]} at once")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One real run (or one load stage of it) beside its simulation."""

    run: str
    stage: int
    gpu: str
    model: str
    tp: int
    rate: float  # requests per second offered
    saturated: bool  # the real run queued: its mean TTFT is over a second
    real: dict[str, dict[str, float]]  # metric -> stat (mean, p50, p90) -> seconds
    simulated: dict[str, dict[str, float]]
    basis: str
    excluded: str = ""  # why it is not compared
    load: str = ""  # the load as the table groups it (held-out runs: "N at once")

    def error(self, metric: str, stat: str = "mean") -> float:
        real = self.real[metric].get(stat)
        return self.simulated[metric][stat] / real - 1 if real else float("nan")


@dataclass
class _Collect:
    """Per-request latencies from `simulate`'s on_finish, by the stage the request came in."""

    stage_of: Callable[[Request], int]
    by_stage: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def __call__(self, r: Request, ttft: float, tpot: float | None, e2e: float) -> None:
        d = self.by_stage.setdefault(self.stage_of(r), {"ttft": [], "tpot": [], "e2e": [], "out": []})
        d["ttft"].append(ttft)
        d["e2e"].append(e2e)
        d["out"].append(r.output_tokens)
        if tpot is not None:
            d["tpot"].append(tpot)


def stats(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"mean": statistics.fmean(s), "p50": s[len(s) // 2], "p90": s[min(len(s) - 1, int(0.9 * len(s)))]}


def runs() -> list[dict[str, Any]]:
    return json.loads((DATA / "runs.json").read_text(encoding="utf-8"))["runs"]


def model_of(name: str) -> Any:
    config = DATA / f"{name}.config.json"
    return load_model(str(config) if config.exists() else name, name=name)


def _quantile(q: dict[str, float], u: float) -> float:
    """The prompt-length quantile function, interpolated between the published points."""
    points = [(0.0, q["min"]), (0.01, q["p1"]), (0.05, q["p5"]), (0.10, q["p10"]), (0.25, q["p25"]),
              (0.50, q["median"]), (0.75, q["p75"]), (0.90, q["p90"]), (0.95, q["p95"]), (0.99, q["p99"]),
              (1.0, q["max"])]
    for (u0, v0), (u1, v1) in itertools.pairwise(points):
        if u <= u1:
            return v0 + (v1 - v0) * (u - u0) / (u1 - u0)
    return points[-1][1]


def inference_perf_requests(run: dict[str, Any]) -> Iterator[Request]:
    """inference-perf's shared-prefix workload at constant rate, stage after stage: its prompts are fixed in
    advance (a system prompt and a question each; `distinct_prompts` of them) and sent in turn, so after the first
    round the prefix cache holds them; their lengths follow the first stage's measured quantiles, every output the
    profile's length (ignore_eos)."""
    n = run["distinct_prompts"]
    lengths = [round(_quantile(run["stages"][0]["prompt_tokens"], (k + 0.5) / n)) for k in range(n)]
    start, i = 0.0, 0
    for k, stage in enumerate(run["stages"]):
        for j in range(round(stage["rate"] * stage["duration_s"])):
            prompt = lengths[i % n]
            yield Request(arrival=start + j / stage["rate"], prompt_tokens=prompt, output_tokens=run["output_tokens"],
                          prefix=((("prompt", i % n), prompt),), id=f"{k}:{i}")
            i += 1
        start += stage["duration_s"]


def _bench_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / run["requests_file"]).read_text(encoding="utf-8").splitlines()]


def bench_requests(run: dict[str, Any]) -> list[Request]:
    """LLMServingSim's bench run: each request's arrival, prompt and output length as vLLM served it."""
    rows = _bench_rows(run)
    t0 = min(r["queued_ts"] for r in rows)
    return sorted((Request(arrival=r["queued_ts"] - t0, prompt_tokens=r["input_toks"], output_tokens=r["output_toks"],
                           id=r["request_id"]) for r in rows), key=lambda r: r.arrival)


def bench_measured(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    rows = _bench_rows(run)
    ttft = [r["first_token_ts"] - r["queued_ts"] for r in rows]
    e2e = [r["last_token_ts"] - r["queued_ts"] for r in rows]
    tpot = [(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows if r["output_toks"] > 1]
    return {"ttft": stats(ttft), "tpot": stats(tpot), "e2e": stats(e2e)}


def release_engine(run: dict[str, Any]) -> str:
    """The engine as simulate names the run's release ("vLLM 0.10.1.1" -> "vllm@0.10"): its defaults and, where
    they differ, its host costs (scheduling overlapped with the GPU from 0.14)."""
    words = str(run.get("engine", "")).split()
    parts = words[-1].split(".") if len(words) == 2 and words[0] == "vLLM" else []
    return f"vllm@{parts[0]}.{parts[1]}" if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else "vllm"


def settings(run: dict[str, Any], time_model: TimeModel | None = None) -> dict[str, Any]:
    """simulate's settings for the run: its engine's, as the run states them."""
    out = dict(engine=release_engine(run), gpu=run["gpu"], tp=run["tp"], max_num_seqs=run["max_num_seqs"],
               max_num_batched_tokens=run["max_num_batched_tokens"], max_model_len=run["max_model_len"],
               prefix_caching=run["prefix_caching"], time_model=time_model)
    if run.get("interconnect") and time_model is None:  # the link its start-up log shows (runs.json's evidence)
        out["interconnect"] = run["interconnect"]
    if run.get("num_gpu_blocks"):
        out["num_blocks"] = run["num_gpu_blocks"]
    return out


def default_time_model(run: dict[str, Any]) -> TimeModel:
    """The time model simulate picks for the run's GPU and model without calibration."""
    from kvbudget.simulation import setup_for

    return setup_for(model_of(run["model"]), **settings(run)).time_model


def replay(run: dict[str, Any], time_model: TimeModel | None = None,
           earlier: list[dict[str, Any]] | None = None) -> list[Case]:
    """The run's cases: its real figures beside the simulation's. A printed block is replayed on a fresh server,
    or after `earlier` (its `server_history`), the runs whose prompts the prefix cache may still hold."""
    model = model_of(run["model"])
    kw = settings(run, time_model)
    if "load" in run:
        return [_replay_block(run, model, kw, earlier or [])]
    if "requests_file" in run:
        collect = _Collect(lambda r: 0)
        reqs = bench_requests(run)
        sim = simulate(model, iter(reqs), on_finish=collect, **kw)
        rate = len(reqs) / reqs[-1].arrival
        real = bench_measured(run)
        simulated = _figures(collect.by_stage[0], tpot_from_means=False)
        return [Case(run=run["id"], stage=0, gpu=run["gpu"], model=run["model"], tp=run["tp"], rate=rate,
                     saturated=real["ttft"]["mean"] > 1.0, real=real, simulated=simulated,
                     basis=sim.setup.time_model.basis)]
    collect = _Collect(lambda r: int(r.id.split(":")[0]))
    sim = simulate(model, inference_perf_requests(run), on_finish=collect, **kw)
    out = []
    for k, stage in enumerate(run["stages"]):
        m = stage["measured"]
        real = {"ttft": m["ttft_s"], "e2e": m["e2e_s"],
                "tpot": {"mean": (m["e2e_s"]["mean"] - m["ttft_s"]["mean"]) / (run["output_tokens"] - 1)}}
        failed = stage["failed"] / stage["requests"]
        out.append(Case(run=run["id"], stage=k, gpu=run["gpu"], model=run["model"], tp=run["tp"], rate=stage["rate"],
                        saturated=real["ttft"]["mean"] > 1.0, real=real,
                        simulated=_figures(collect.by_stage[k], tpot_from_means=True),
                        basis=sim.setup.time_model.basis, excluded=OVERLOAD.format(failed) if failed > 0.01 else ""))
    return out


def block_requests(run: dict[str, Any]) -> list[Request]:
    """A printed `benchmark_serving.py` block of the random dataset at an unlimited rate: every request sent at
    once, each of the run's mean prompt and output length (the block's totals over its requests: the random
    prompts re-tokenize a few tokens off, and without --ignore-eos an output may stop early). Prompt i is the
    dataset's i-th whatever the run (RANDOM_PROMPT), so runs on one server share what its prefix cache holds."""
    n = run["requests"]
    prompt, output = round(run["input_tokens"] / n), max(1, round(run["output_tokens"] / n))
    return [Request(arrival=0.0, prompt_tokens=prompt, output_tokens=output, id=str(i),
                    prefix=(((RANDOM_PROMPT, i), prompt),)) for i in range(n)]


# the prefix-cache content id of the random dataset's i-th prompt, with i: vllm/benchmarks/datasets.py (0.10.1.1)
# seeds numpy with 0 and, at fixed lengths, draws no random number for them, so every run draws the same offsets
# and its i-th prompt starts with the same tokens as every other run's i-th (of any length) on the same model
RANDOM_PROMPT = "benchmark_serving.py's random prompt"
TIMED_FROM = 50_000.0  # seconds: when the timed requests go out, long after the test run has ended
SERVER_RUNS_APART = 2 * TIMED_FROM  # seconds between the runs replayed one after another on one server


def server_history(run: dict[str, Any], every: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The published runs that went before `run` on its server, oldest first: the same test (settings), the same
    API server process on the same day (`server_pid`, and the date of the engine's log lines), earlier by the
    time of their first log line. Their prompts are what the prefix cache may still hold when `run` starts."""
    def key(r: dict[str, Any]) -> tuple[str, Any, str] | None:
        log = r.get("engine_log")
        return (r["id"].rsplit("-", 1)[0], r.get("server_pid"), log[0]["at"][:5]) if log and "server_pid" in r \
            else None

    mine = key(run)
    if mine is None:
        return []
    start = run["engine_log"][0]["at"]
    return sorted((r for r in every if r is not run and key(r) == mine and r["engine_log"][0]["at"] < start),
                  key=lambda r: r["engine_log"][0]["at"])


def with_test_run(requests: list[Request]) -> list[Request]:
    """`benchmark_serving.py` and `vllm bench serve` first send the first request alone as a test and wait for it
    (serve.py: "Starting initial single prompt test run..."), then time the rest: with prefix caching on, the
    timed first request finds its prompt cached. The test run (id "test") at 0, the timed ones at TIMED_FROM."""
    first = requests[0]
    test = Request(arrival=0.0, prompt_tokens=first.prompt_tokens, output_tokens=first.output_tokens,
                   prefix=first.prefix, id="test")
    return [test, *(replace(r, arrival=r.arrival + TIMED_FROM) for r in requests)]


def _replay_block(run: dict[str, Any], model: Any, kw: dict[str, Any], earlier: list[dict[str, Any]]) -> Case:
    load = run["load"]
    if load["request_rate"] is not None or load["max_concurrency"] is not None:
        raise ValueError(f"{run['id']}: only requests sent at once are replayed (request_rate and max_concurrency "
                         "unset)")
    def stage(r: Request) -> int:  # the run's own timed requests only (not its test run, not earlier runs')
        return -1 if r.id == "test" or r.id.startswith("earlier ") else 0

    collect = _Collect(stage)
    reqs = block_requests(run)
    sent = [*(replace(r, arrival=r.arrival + k * SERVER_RUNS_APART, id=f"earlier {k}:{r.id}")
              for k, h in enumerate(earlier) for r in with_test_run(block_requests(h))),
            *(replace(r, arrival=r.arrival + len(earlier) * SERVER_RUNS_APART) for r in with_test_run(reqs))]
    try:
        sim = simulate(model, iter(sent), on_finish=collect, **kw)
        note = ""
    except KVBudgetError as e:  # the release's budget refuses what the real run started with: the newest rules'
        if kw["engine"] == "vllm":
            raise
        collect = _Collect(stage)
        sim = simulate(model, iter(sent), on_finish=collect, **{**kw, "engine": "vllm"})
        note = f"; memory by the newest release's rules ({kw['engine']}'s: {str(e).partition(': ')[2][:60]}...)"
    m, out = run["measured"], reqs[0].output_tokens
    # the block prints no end-to-end latency: the mean is TTFT + TPOT x (output - 1), derived alike on both sides
    real = {"ttft": m["ttft_s"], "tpot": m["tpot_s"],
            "e2e": {"mean": m["ttft_s"]["mean"] + m["tpot_s"]["mean"] * (out - 1)}}
    figures = _figures(collect.by_stage[0], tpot_from_means=False)
    figures["e2e"]["mean"] = figures["ttft"]["mean"] + figures["tpot"]["mean"] * (out - 1)
    failed = run["failed"] / (run["failed"] + run["requests"])
    excluded = (ACROSS_NODES.format(run["nodes"]) if run.get("nodes", 1) > 1 and not run.get("interconnect")
                else OVERLOAD.format(failed) if failed > 0.01 else "")
    group = LOADS[sum(run["requests"] > b for b in AT_ONCE)]
    return Case(run=run["id"], stage=0, gpu=run["gpu"], model=run["model"], tp=run["tp"], rate=math.inf,
                saturated=real["ttft"]["mean"] > 1.0, real=real, simulated=figures,
                basis=sim.setup.time_model.basis + note, excluded=excluded, load=group)


def _figures(d: dict[str, list[float]], tpot_from_means: bool) -> dict[str, dict[str, float]]:
    out = {"ttft": stats(d["ttft"]), "e2e": stats(d["e2e"]), "tpot": stats(d["tpot"])}
    if tpot_from_means:  # as the real run's figure is derived: (mean e2e - mean ttft) / (output - 1)
        out["tpot"] = {"mean": (out["e2e"]["mean"] - out["ttft"]["mean"]) / (statistics.fmean(d["out"]) - 1)}
    return out


def measured_gpu_runs() -> list[dict[str, Any]]:
    """The runs on the GPUs whose kernels were measured (per-request logs and load stages; bench_step_times.py)."""
    return [run for run in runs() if "load" not in run]


def all_cases(time_model: TimeModel | None = None) -> list[Case]:
    return [c for run in measured_gpu_runs() for c in replay(run, time_model)]


def heldout_cases(time_model: TimeModel | None = None, history: bool = False) -> list[Case]:
    """The runs published as printed bench blocks, on GPUs the step times were not fitted on; with `history`, each
    replayed after the runs that went before it on its server (`server_history`)."""
    every = runs()
    return [c for run in every if "load" in run
            for c in replay(run, time_model, server_history(run, every) if history else None)]


def basis_kind(case: Case) -> str:
    return "measured" if case.basis.startswith(f"kernels measured on {case.gpu}") else "transferred"


METRIC_LABEL = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def heldout_table(cases: list[Case]) -> list[str]:
    """Markdown rows: per group (GPU, basis, TP, load) the runs compared, then median |error| and median signed
    error of mean TTFT, TPOT and E2E; the runs left out, with why, below."""
    groups: dict[tuple[str, str, int, str], list[Case]] = {}
    for c in cases:
        if not c.excluded:
            groups.setdefault((c.gpu, basis_kind(c), c.tp, c.load), []).append(c)
    head = " | ".join(f"{METRIC_LABEL[m]} abs. | {METRIC_LABEL[m]} signed" for m in METRICS)
    lines = [f"| GPU | basis | TP | load | runs | {head} |", "|---" * (5 + 2 * len(METRICS)) + "|"]
    for (gpu, kind, tp, load), group in sorted(groups.items(), key=lambda g: (g[0][0], g[0][2], LOADS.index(g[0][3]))):
        cells = []
        for m in METRICS:
            errors = [c.error(m) for c in group]
            cells += [f"{statistics.median(abs(e) for e in errors):.0%}", f"{statistics.median(errors):+.0%}"]
        lines.append(f"| {gpu} | {kind} | {tp} | {load} | {len(group)} | {' | '.join(cells)} |")
    left = [c for c in cases if c.excluded]
    for reason in sorted({c.excluded for c in left}):
        ids = [c.run for c in left if c.excluded == reason]
        lines.append(f"\nLeft out ({len(ids)}): {reason}: {', '.join(ids)}")
    return lines


# the engine's statistics lines published with a block (runs.json "engine_log": vLLM 0.10's server logs one every
# 10 seconds, v1/metrics/loggers.py): an interval whose closing line shows no prompt tokens, none waiting and as many
# sequences running as the line before decoded one token for each of them at every step, so its seconds per step
# are the sequences over the generation throughput, as the server's output processor counted the tokens (no HTTP,
# no client)
POOL_BLOCK_TOKENS = 16  # vLLM's block on these GPUs; runs.json's num_gpu_blocks is the log's KV tokens over it


@dataclass(frozen=True, kw_only=True)
class DecodeStep:
    """A logged interval of pure decoding beside the simulated decode step of the same batch and context."""

    run: str
    gpu: str
    tp: int
    at: str  # the closing log line's time
    sequences: int
    context: float  # tokens of context per sequence: the pool's share in use (the two lines' mean) over them
    real: float  # seconds per step
    simulated: float

    @property
    def gap_per_sequence(self) -> float:
        """Seconds per sequence per step the simulation is short (negative: long)."""
        return (self.real - self.simulated) / self.sequences


def logged_decode_steps(run: dict[str, Any]) -> list[tuple[str, int, float, float]]:
    """The run's pure-decode intervals: (closing line's time, sequences, tokens of context per sequence, seconds
    per step). The context is read from the pool's use, so it includes each sequence's partly filled last block."""
    pool = (run.get("num_gpu_blocks") or 0) * POOL_BLOCK_TOKENS
    out = []
    for before, line in itertools.pairwise(run.get("engine_log", [])):
        n = line["running"]
        if (pool and n > 0 and before["running"] == n and before["waiting"] == line["waiting"] == 0
                and line["prompt_tokens_per_s"] == 0 and line["generation_tokens_per_s"] > 0):
            context = (before["kv_usage"] + line["kv_usage"]) / 2 * pool / n
            out.append((line["at"], n, context, n / line["generation_tokens_per_s"]))
    return out


def decode_steps(run: dict[str, Any], time_model: TimeModel | None = None) -> list[DecodeStep]:
    """The run's logged pure-decode intervals beside the step its default time model (or `time_model`) gives
    the same sequences over the same context."""
    logged = logged_decode_steps(run)
    if not logged:
        return []
    tm = time_model or default_time_model(run)
    return [DecodeStep(run=run["id"], gpu=run["gpu"], tp=run["tp"], at=at, sequences=n, context=context, real=real,
                       simulated=tm.step_seconds(n, round(context * n))) for at, n, context, real in logged]


def gap_line(steps: list[DecodeStep]) -> tuple[float, float]:
    """The least-squares line through the intervals' gaps (real - simulated step) against their sequences:
    (seconds per step, seconds per sequence per step)."""
    if len({d.sequences for d in steps}) < 2:
        raise ValueError("a line needs intervals of at least two batch sizes")
    slope, intercept = statistics.linear_regression([d.sequences for d in steps], [d.real - d.simulated for d in steps])
    return intercept, slope


def decode_table(steps: list[DecodeStep]) -> list[str]:
    """Markdown rows: each interval's sequences, context, real and simulated step, and the gap per sequence; below,
    per GPU and tensor parallel size, the gap as a line over the sequences."""
    lines = ["| run | GPU | TP | at | sequences | context | step real / sim (ms) | error | gap per sequence |",
             "|---" * 9 + "|"]
    order = sorted(steps, key=lambda d: (d.gpu, d.tp, d.sequences, d.context))
    for d in order:
        lines.append(f"| {d.run} | {d.gpu} | {d.tp} | {d.at} | {d.sequences} | {d.context:,.0f} | "
                     f"{d.real * 1e3:.2f} / {d.simulated * 1e3:.2f} | {d.simulated / d.real - 1:+.0%} | "
                     f"{d.gap_per_sequence * 1e6:.0f} µs |")
    for (gpu, tp), group in itertools.groupby(order, key=lambda d: (d.gpu, d.tp)):
        group = list(group)
        if len({d.sequences for d in group}) > 1:
            fixed, per_seq = gap_line(group)
            lines.append(f"\n{gpu} TP {tp} ({len(group)} intervals): the simulated step is short by "
                         f"{fixed * 1e3:.2f} ms + {per_seq * 1e6:.0f} µs a sequence")
    return lines


# aiconfigurator's silicon runs (data/served/silicon.json, scripts/extract_silicon_runs.py): each row a closed loop
# of `concurrency` clients sending fixed-length requests, as aiperf sent them
MEASURED_ROUNDS = 20  # aiperf's requests per client (MULTI_ROUND); its measured phase starts with all N at once
REPLAYED_TOKENS = 8_000_000  # output tokens one row's replay simulates at most: aiperf's 20 rounds where they fit
# (all but the largest rows), else fewer, at least MIN_ROUNDS; keeps all rows to a few minutes
MIN_ROUNDS = 2  # the first round (all sent at once) and at least one that stands for the other 19
# the weights as silicon.json spells them -> the quantization_config the catalog model is given ("catalog": its own)
WEIGHTS: dict[str, dict[str, Any] | str | None] = {
    "bf16": None, "fp8": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "mxfp4": "catalog",
    # Kimi-K2.5's own: compressed-tensors int4 in groups of 32, symmetric (its config.json's text_config)
    "int4": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                                           "symmetric": True}}}}}
UNTIMED = {"nvfp4": "NVFP4 weights: kvbudget counts no NVFP4 checkpoint and times no FP4 GEMM"}
SILICON_GROUPS = ("GPU", "release", "model / weights", "TP", "concurrency")


def silicon_runs() -> list[dict[str, Any]]:
    return json.loads((DATA / "silicon.json").read_text(encoding="utf-8"))["runs"]


def silicon_model(run: dict[str, Any]) -> Any:
    """The catalog model with the run's weights: its config given the checkpoint's quantization."""
    from kvbudget import catalog
    from kvbudget.model.load import read_json

    entry = catalog.find(run["model"])
    assert entry is not None, run["model"]
    config = read_json(entry.file_path)
    quantization = WEIGHTS[run["weights"]]
    if quantization != "catalog":
        config.pop("quantization_config", None)
        if quantization is not None:
            config["quantization_config"] = quantization
    return load_model(config, name=run["model"])


def silicon_settings(run: dict[str, Any]) -> dict[str, Any]:
    """simulate's settings for a row: its release where it names one (else the newest), and the engine limits
    aiconfigurator's generator sets (rule_plugin/benchmark/vllm.rule): max_num_seqs the concurrency,
    max_num_batched_tokens concurrency + ISL + 1500, max_model_len ISL + OSL + 1500. Prefix caching off: aiperf's
    synthetic prompts share no prefix, so it changes no time, and without it sliding-window models (gpt-oss) take
    the simulator's fast path (the same figures, 16 times sooner on a gpt-oss-120b row)."""
    c = run["concurrency"]
    return dict(engine=release_engine({"engine": f"vLLM {run['release']}"}), gpu=run["gpu"],
                tp=run["tp"], kv_dtype=run["kv_dtype"], max_num_seqs=c, max_num_batched_tokens=c + run["isl"] + 1500,
                max_model_len=run["isl"] + run["osl"] + 1500, prefix_caching=False)


def silicon_rounds(run: dict[str, Any], most: int = MEASURED_ROUNDS) -> int:
    """Requests per client a row's replay sends: aiperf's 20 (or `most`) within REPLAYED_TOKENS output tokens."""
    return min(most, max(MIN_ROUNDS, REPLAYED_TOKENS // (run["concurrency"] * run["osl"])))


def replay_silicon(run: dict[str, Any], rounds: int | None = None) -> Case:
    """One row replayed: `concurrency` clients, `rounds` requests each (default `silicon_rounds`) of ISL prompt and
    OSL output tokens, all given at time 0 and sent as clients free up. Its means stand for aiperf's 20 rounds: the
    first round's requests (sent at once, as aiperf's measured phase starts) count once, the later rounds' for the
    19 after it (the loop settles slowly: on four rows, 3 rounds put mean TTFT 15-25% above 20 rounds' and TPOT
    up to 10% below); end to end is TTFT + TPOT x (OSL - 1) on both sides."""
    c, osl = run["concurrency"], run["osl"]
    rounds = rounds or silicon_rounds(run)
    m = run["measured"]
    real = {"ttft": {"mean": m["ttft_s"]}, "tpot": {"mean": m["tpot_s"]},
            "e2e": {"mean": m["ttft_s"] + m["tpot_s"] * (osl - 1)}}
    case = dict(run=run["id"], stage=0, gpu=run["gpu"], model=run["model"], tp=run["tp"], rate=math.inf,
                saturated=m["ttft_s"] > 1.0, real=real, load=f"{c} clients")
    if run["weights"] in UNTIMED:
        return Case(**case, simulated=real, basis="", excluded=UNTIMED[run["weights"]])
    from kvbudget.errors import KVBudgetError

    later = (MEASURED_ROUNDS - 1) / (rounds - 1) if rounds > 1 else 0.0
    sums = {"ttft": 0.0, "tpot": 0.0, "weight": 0.0}

    def finish(r: Request, ttft: float, tpot: float | None, e2e: float) -> None:
        w = 1.0 if int(r.id) < c else later
        sums["ttft"] += w * ttft
        sums["tpot"] += w * (tpot or 0.0)
        sums["weight"] += w

    reqs = (Request(arrival=0.0, prompt_tokens=run["isl"], output_tokens=osl, id=str(i)) for i in range(c * rounds))
    try:
        sim = simulate(silicon_model(run), reqs, on_finish=finish, max_concurrency=c, **silicon_settings(run))
    except KVBudgetError as e:  # the plan refuses the deployment (weights and cache do not fit, say)
        return Case(**case, simulated=real, basis="", excluded=f"kvbudget refuses it: {e}")
    ttft, tpot = sums["ttft"] / sums["weight"], sums["tpot"] / sums["weight"]
    simulated = {"ttft": {"mean": ttft}, "tpot": {"mean": tpot}, "e2e": {"mean": ttft + tpot * (osl - 1)}}
    return Case(**case, simulated=simulated, basis=sim.setup.time_model.basis)


def silicon_group(run: dict[str, Any], by: str) -> str:
    return {"GPU": run["gpu"], "release": run["release"] or "not recorded",
            "model / weights": f"{run['model']} {run['weights']}", "TP": str(run["tp"]),
            "concurrency": _concurrency_bin(run["concurrency"])}[by]


def _concurrency_bin(c: int) -> str:
    """Powers of two: 1, 2, 3-4, 5-8, ..., 257-512."""
    top = 1 << (c - 1).bit_length()
    return str(c) if top <= 2 else f"{top // 2 + 1}-{top}"


def silicon_table(cases: list[Case], runs_by_id: dict[str, dict[str, Any]], by: str) -> list[str]:
    """Markdown rows: per group of `by` the rows compared, then median |error| and median signed error of mean
    TTFT, TPOT and E2E."""
    groups: dict[str, list[Case]] = {}
    for c in cases:
        if not c.excluded:
            groups.setdefault(silicon_group(runs_by_id[c.run], by), []).append(c)
    head = " | ".join(f"{METRIC_LABEL[m]} abs. | {METRIC_LABEL[m]} signed" for m in METRICS)
    lines = [f"| {by} | runs | {head} |", "|---" * (2 + 2 * len(METRICS)) + "|"]
    def order(key: str) -> tuple[bool, int, str]:  # numbers and ranges of numbers by their value, then the rest
        number = key.split("-")[-1]
        return (not number.isdigit(), int(number) if number.isdigit() else 0, key)

    for key, group in sorted(groups.items(), key=lambda g: order(g[0])):
        cells = []
        for m in METRICS:
            errors = [c.error(m) for c in group]
            cells += [f"{statistics.median(abs(e) for e in errors):.0%}", f"{statistics.median(errors):+.0%}"]
        lines.append(f"| {key} | {len(group)} | {' | '.join(cells)} |")
    return lines


def silicon_report(cases: list[Case], runs_by_id: dict[str, dict[str, Any]]) -> list[str]:
    """The tables by GPU, release, model and weights, TP and concurrency; the overall line; the rows left out."""
    out: list[str] = []
    for by in SILICON_GROUPS:
        out += [*silicon_table(cases, runs_by_id, by), ""]
    compared = [c for c in cases if not c.excluded]
    if compared:
        out.append(f"all ({len(compared)} rows): " + "; ".join(
            f"{METRIC_LABEL[m]} median |error| {statistics.median(abs(c.error(m)) for c in compared):.0%}, "
            f"{sum(c.error(m) < 0 for c in compared)} short" for m in METRICS))
    if compared:
        out.append(band_coverage(compared))
    left = [c for c in cases if c.excluded]
    for reason in sorted({c.excluded for c in left}):
        n = sum(c.excluded == reason for c in left)
        out.append(f"Left out ({n}): {reason}")
    return out


def band_coverage(cases: list[Case]) -> str:
    """How many of `cases` (none of them among the runs the bands are sized on) have their real mean inside the
    band `simulate` prints beside the simulated one (src/kvbudget/data/latency_bands.json, the measured basis:
    these GPUs' kernels are measured)."""
    from kvbudget.simulation.bands import Band, Basis, _data

    entry = _data()["bands"][Basis.MEASURED.value]
    parts = []
    for m in METRICS:
        have = [c for c in cases if m in c.real and m in c.simulated and math.isfinite(c.error(m))]
        if not have or entry.get(m) is None:
            continue
        b = Band.from_dict(entry[m])
        # the band bounds (real - simulated) / simulated; a case's error is simulated / real - 1
        inside = sum(b.lower <= 1 / (1 + c.error(m)) - 1 <= b.upper for c in have)
        parts.append(f"{METRIC_LABEL[m]} {inside} of {len(have)} ({inside / len(have):.0%})")
    return "inside the band simulate prints (measured basis, sized on runs.json, none of these rows): " + \
        ", ".join(parts)


def silicon_main(most: int) -> None:
    runs = silicon_runs()
    cases = [replay_silicon(run, silicon_rounds(run, most)) for run in runs]
    fewer = sum(silicon_rounds(run, most) < MEASURED_ROUNDS for run in runs if run["weights"] not in UNTIMED)
    print(f"aiconfigurator's silicon runs: {len(runs)} rows; {most} requests per client replayed, "
          f"fewer (at least {MIN_ROUNDS}) in {fewer} rows past {REPLAYED_TOKENS:,} output tokens\n")
    print("\n".join(silicon_report(cases, {run["id"]: run for run in runs})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--silicon", action="store_true", help="replay aiconfigurator's silicon runs instead "
                       "(data/served/silicon.json)")
    which.add_argument("--decode-steps", action="store_true", help="compare the decode steps the held-out runs' "
                       "engine logs show (sequences over generation throughput) with the simulated step instead")
    which.add_argument("--server-history", action="store_true", help="replay each printed block after the runs "
                       "that went before it on its server (their prompts in the prefix cache), not on a fresh one")
    parser.add_argument("--rounds", type=int, default=MEASURED_ROUNDS,
                        help="with --silicon: requests per client at most (default aiperf's 20)")
    args = parser.parse_args()
    if not MIN_ROUNDS <= args.rounds <= MEASURED_ROUNDS:
        parser.error(f"--rounds: {args.rounds} is outside {MIN_ROUNDS} to {MEASURED_ROUNDS} (aiperf's rounds)")
    if args.silicon:
        silicon_main(args.rounds)
        return
    if args.decode_steps:
        print("\n".join(decode_table([d for run in runs() if "load" in run for d in decode_steps(run)])))
        return
    cases = heldout_cases(history=args.server_history)
    print("\n".join(heldout_table(cases)))
    engine = {run["id"]: run["engine"] for run in runs()}
    compared = [c for c in cases if not c.excluded]
    for release in [None, *sorted({engine[c.run] for c in compared})]:
        group = [c for c in compared if release in (None, engine[c.run])]
        print(f"\n{release or 'all'} ({len(group)} runs):", "; ".join(
            f"{METRIC_LABEL[m]} median |error| {statistics.median(abs(c.error(m)) for c in group):.0%}, "
            f"{sum(c.error(m) < 0 for c in group)} short" for m in METRICS))


if __name__ == "__main__":
    main()
