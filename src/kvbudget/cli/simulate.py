"""`kvbudget simulate`: a trace or synthetic traffic through vLLM's scheduler and KV allocator."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kvbudget.cli.common import (
    add_engine_knobs,
    add_model_engine,
    console,
    engine_options,
    one,
    optional_one,
    size,
    write_atomically,
    wrote,
)
from kvbudget.cli.common import load as common_load
from kvbudget.engines import get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.units import format_bytes


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay traffic through the engine's scheduler and KV allocator")
    add_model_engine(p, "vllm")
    w = p.add_argument_group("workload (a trace, or synthetic arrivals)")
    w.add_argument("--trace", help="Azure LLM inference trace CSV, Mooncake JSONL or our JSONL "
                                   "(arrival, prompt_tokens, output_tokens[, prefix, prefix_tokens])")
    w.add_argument("--request-log", help="an OpenAI chat request log (JSON Lines): prompt lengths counted with the "
                                         "model's tokenizer, outputs of max_tokens (else drawn with mean "
                                         "--output-tokens), arrivals from each line's 'arrival' or at --rate")
    w.add_argument("--tokenizer", help="--request-log: where the tokenizer is (default: the model argument)")
    w.add_argument("--approximate", action="store_true", help="--request-log: lengths from characters, labelled")
    w.add_argument("--rate", help="synthetic: requests per second (Poisson, or gamma with --cv)")
    w.add_argument("--requests", default="1000", help="synthetic: how many requests (default 1000)")
    w.add_argument("--cv", default="1", help="synthetic: coefficient of variation of inter-arrival times "
                                             "(1 Poisson, >1 bursty)")
    w.add_argument("--prompt-tokens", default="161", help="synthetic: mean prompt length (exponential; default "
                                                          "161, ShareGPT's mean in the PagedAttention paper)")
    w.add_argument("--output-tokens", default="338", help="synthetic: mean output length (default 338)")
    w.add_argument("--lengths-from-trace", help="synthetic: draw (prompt, output) pairs from this trace instead")
    w.add_argument("--seed", default="0", help="synthetic: random seed (default 0)")
    w.add_argument("--rate-scale", default="1", help="replay arrivals this many times as fast (default 1)")
    w.add_argument("--slice", help="START:COUNT requests of the trace (e.g. 0:1000)")
    m = p.add_argument_group("memory (as `kvbudget plan`)")
    m.add_argument("--gpu", help="GPU from `kvbudget gpus` (its memory, bandwidth and FLOPS)")
    m.add_argument("--gpu-memory", help="memory of one GPU (overrides --gpu's)")
    m.add_argument("--kv-memory", help="KV budget per GPU instead of deriving it")
    m.add_argument("--weights", help="weight bytes per GPU (overrides the computed figure; needed where kvbudget "
                                     "does not count the family's parameters)")
    m.add_argument("--num-blocks", help="the engine's KV blocks instead of a budget")
    m.add_argument("--tp", default="1", help="tensor parallel size (default 1)")
    m.add_argument("--pp", default="1", help="pipeline parallel size (default 1)")
    m.add_argument("--max-model-len", help="longest request (default: the model's maximum)")
    m.add_argument("--allocator", default="paged", help="paged (the engine's), or the PagedAttention paper's "
                                                        "baselines contiguous-max|contiguous-pow2|contiguous-oracle")
    add_engine_knobs(m)
    s = p.add_argument_group("scheduler (default: the engine's for the GPU)")
    s.add_argument("--max-num-seqs", help="requests running at once (llama.cpp: its slots, -np)")
    s.add_argument("--kv-unified", action="store_true", help="llama.cpp: one cell pool shared by all slots "
                   "(llama-server's default when -np is left to auto)")
    s.add_argument("--cache-ram", help="llama.cpp: the host-RAM prompt cache in MiB (default 8192; 0 turns it off)")
    s.add_argument("--long-prefill-token-threshold", default="0", help="cut prompts longer than this into chunks "
                                                                         "of it while others wait (default 0: off)")
    o = p.add_argument_group("answers")
    o.add_argument("--json", action="store_true", help="print JSON (seconds, bytes) instead of tables")
    o.add_argument("--timeline", help="write every step to this CSV file (time, tokens, usage, running, waiting)")
    o.add_argument("--per-request", help="write every completed sequence to this CSV file (id, arrival, prompt "
                                         "and output tokens, TTFT, TPOT, end-to-end seconds)")
    o.add_argument("--prometheus-series", metavar="FILE", help="write the run's KV usage and request gauges, as "
                   "the engine publishes them, in a `promtool test rules` file, with when each alert of `kvbudget "
                   "alerts` fires (thresholds from --guard-config when given)")
    o.add_argument("--prometheus-interval", default="15", help="seconds between scrapes in --prometheus-series "
                                                               "(default 15)")
    o.add_argument("--plot", help="write a picture (.png or .svg): KV usage, queues and latency distributions")
    o.add_argument("--find-max-rate", action="store_true", help="the highest --rate-scale meeting --slo")
    o.add_argument("--slo", help="objectives for --find-max-rate, e.g. ttft_p99=2s,tpot_p99=100ms")
    o.add_argument("--sweep", nargs="+", metavar="NAME=V1,V2", help="a table over settings, e.g. tp=1,2 "
                                                                   "kv-dtype=auto,fp8 (rate-scale too)")
    o.add_argument("--backend", default="process", help="where --sweep runs its simulations: process (a pool on "
                                                         "this machine, the default), serial, ray (a local Ray) or "
                                                         "ray=ADDRESS (a running Ray cluster, e.g. ray=auto)")
    o.add_argument("--calibrate", help="fit the time model to measured timings: a `vllm bench serve "
                                       "--save-result --save-detailed` JSON (per-request TTFT and ITL), a scrape of "
                                       "vLLM's /metrics after it served --trace (its latency histograms), or a "
                                       "log of vLLM run with --scheduler-cls kvbudget.simulation.recorder."
                                       "RecordingScheduler (step times)")
    o.add_argument("--guard-config", help="put `kvbudget guard` in front of the engine with this YAML (e.g. from "
                                          "`kvbudget plan --guard-config`): its own code decides every arrival")
    o.add_argument("--guard-poll-interval", default="1", help="seconds between the guard's scrapes of the usage "
                                                              "gauge (default 1, as the guard's)")
    o.add_argument("--reference", action="store_true", help="step by step, without the fast path (same answer)")
    p.set_defaults(run=run)


def _workload(args: argparse.Namespace) -> Callable[[float], Iterable[Any]]:
    """A function of the rate scale giving a fresh stream of requests (a sweep or search replays it)."""
    from kvbudget.simulation import (
        exponential_lengths,
        read_trace,
        rescale,
        sampled_lengths,
        synthetic,
    )

    if args.request_log:
        if args.trace:
            raise KVBudgetError("simulate: give --trace or --request-log, not both")
    elif bool(args.trace) == bool(args.rate):
        raise KVBudgetError("simulate: give --trace FILE, --request-log FILE or --rate N (synthetic arrivals)")
    start, count = 0, None
    if args.slice:
        first, colon, n = args.slice.partition(":")
        try:
            start, count = int(first or 0), int(n) if n else None
        except ValueError:
            raise KVBudgetError(f"--slice {args.slice!r}: write START:COUNT, e.g. 0:1000") from None
        if not colon or start < 0 or (count is not None and count < 1):
            raise KVBudgetError(f"--slice {args.slice!r}: write START:COUNT, e.g. 0:1000")
    if args.trace:
        path = args.trace
        list(rescale(read_trace(path), 1.0, 0, 1))  # a missing or foreign file fails before any run
        return lambda scale: rescale(read_trace(path), scale, start, count)
    cv, seed = _positive(args.cv, "--cv"), int(args.seed)
    if args.request_log:
        from kvbudget.simulation.workload import request_log
        from kvbudget.tokens import PromptCounter, check_readable

        check_readable(args.request_log)  # before the tokenizer loads (seconds)
        counter = PromptCounter(args.tokenizer or args.model, args.approximate, args.engine)
        outputs = exponential_lengths(1, _positive(args.output_tokens, "--output-tokens"))
        log, log_rate = args.request_log, _positive(args.rate, "--rate") if args.rate else None
        return lambda scale: rescale(request_log(log, counter, outputs, log_rate, seed, cv), scale, start, count)
    rate = _positive(args.rate, "--rate")
    n = one(args.requests, "--requests")
    if args.lengths_from_trace:
        pool = [(r.prompt_tokens, r.output_tokens) for r in read_trace(args.lengths_from_trace)]
        lengths = sampled_lengths(pool)
    else:
        lengths = exponential_lengths(_positive(args.prompt_tokens, "--prompt-tokens"),
                                      _positive(args.output_tokens, "--output-tokens"))
    return lambda scale: rescale(synthetic(rate, n, lengths, seed, cv), scale, start, count)


def _calibrated(model: Any, path: str, settings: dict[str, Any], served: Callable[[], Iterable[Any]] | None
                ) -> dict[str, Any]:
    """The time model from --calibrate: fitted to a benchmark run's requests, to vLLM's latency histograms for
    the trace it served, or to recorded steps."""
    from kvbudget.simulation import setup_for
    from kvbudget.simulation.fit import BenchRun, calibrate_requests, initial_model, read_calibration

    found = read_calibration(path, served)
    if not isinstance(found, BenchRun):
        return {"measured": found}
    base = setup_for(model, **settings, time_model=initial_model(found))
    return {"time_model": calibrate_requests(model, found, base)}


def _guard(args: argparse.Namespace) -> dict[str, Any]:
    if not args.guard_config:
        return {}
    from kvbudget.cli.common import read_yaml

    return {"guard_config": read_yaml(args.guard_config, "--guard-config"),
            "guard_poll_interval": _positive(args.guard_poll_interval, "--guard-poll-interval")}


def _mib(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise KVBudgetError(f"--cache-ram: {text!r} must be a whole number of MiB (0 turns the cache off)")
    return int(text)


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise KVBudgetError(f"{what}: {text!r} must be a number above 0")
    return value


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    options = engine_options(args)
    if options.engine_version or options.attention_backend or options.pp_layer_partition:
        raise KVBudgetError("simulate follows vLLM 0.32's scheduler and allocator on one rank: --engine vllm@VERSION, "
                            "--attention-backend and --pp-layer-partition are for estimate and plan")
    return {"engine": args.engine, "gpu": args.gpu, "gpu_memory": size(args.gpu_memory, "--gpu-memory"),
            "kv_memory": size(args.kv_memory, "--kv-memory"), "weights": size(args.weights, "--weights"),
            "num_blocks": optional_one(args.num_blocks, "--num-blocks"),
            "tp": one(args.tp, "--tp"), "pp": one(args.pp, "--pp"), "kv_dtype": args.kv_dtype,
            "max_model_len": optional_one(args.max_model_len, "--max-model-len"), "block_size": options.block_size,
            "device": options.device, "max_num_seqs": optional_one(args.max_num_seqs, "--max-num-seqs"),
            "max_num_batched_tokens": options.max_num_batched_tokens, "prefix_caching": options.prefix_caching,
            "long_prefill_token_threshold": int(args.long_prefill_token_threshold), "allocator": args.allocator,
            "kv_unified": args.kv_unified, "cache_ram": _mib(args.cache_ram)}


def _prepared(args: argparse.Namespace) -> tuple[Any, Callable[[float], Iterable[Any]], dict[str, Any], float]:
    """(model, workload by rate scale, settings, rate scale) of the arguments, checked."""
    model = common_load(args.model)
    workload = _workload(args)
    settings = _settings(args)
    if args.calibrate:
        settings.update(_calibrated(model, args.calibrate, settings,
                                    (lambda: workload(1.0)) if args.trace or args.request_log else None))
    scale = _positive(args.rate_scale, "--rate-scale")
    if args.prometheus_series:
        _positive(args.prometheus_interval, "--prometheus-interval")
        if get_engine(args.engine).queue_gauges is None:
            raise KVBudgetError(f"--prometheus-series: {args.engine} publishes no request gauges to write")
    if args.find_max_rate and args.sweep:
        raise KVBudgetError("simulate: --find-max-rate and --sweep go separately")
    if args.slo and not args.find_max_rate:
        raise KVBudgetError("--slo goes with --find-max-rate")
    return model, workload, settings, scale


def simulation(args: argparse.Namespace, on_step: Callable[..., None] | None = None,
               progress: Callable[[int], None] | None = None, on_finish: Callable[..., None] | None = None) -> Any:
    """One simulated run of the arguments (its `to_dict()` is what --json prints, and what `kvbudget web` serves)."""
    from kvbudget.simulation import setup_for, simulate

    model, workload, settings, scale = _prepared(args)
    setup = setup_for(model, **settings)
    return simulate(model, workload(scale), setup=setup, fast=not args.reference, on_step=on_step,
                    progress=progress, on_finish=on_finish, **_guard(args))


def run(args: argparse.Namespace) -> int:
    from kvbudget.simulation import find_max_rate, parse_slo, parse_sweep, setup_for

    if args.sweep or args.find_max_rate:
        if args.sweep:
            from kvbudget.simulation.parallel import check_backend

            check_backend(args.backend)
        model, workload, settings, scale = _prepared(args)
        if args.sweep:
            return _sweep(args, model, settings, parse_sweep(args.sweep))
        if not args.slo:
            raise KVBudgetError("--find-max-rate needs --slo, e.g. ttft_p99=2s,tpot_p99=100ms")
        slo = parse_slo(args.slo)
        found = find_max_rate(model, workload, slo, start=scale, setup=setup_for(model, **settings),
                              fast=not args.reference, **_guard(args))
        if args.json:
            print(json.dumps({"rate_scale": found.rate_scale, "slo": slo, "tried": found.tried,
                              "best": found.best.to_dict() if found.best else None}, indent=2))
        else:
            _print_search(found, slo)
        return 0
    rows: list[str] = []
    on_step = None
    if args.timeline:
        rows.append("time_s,tokens,kv_usage,running,waiting")
        on_step = lambda t, tokens, usage, r, w: rows.append(f"{t:.6f},{tokens},{usage:.6f},{r},{w}")  # noqa: E731
    done: list[str] = []
    on_finish = None
    if args.per_request:
        done.append("id,arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s")
        on_finish = lambda r, ttft, tpot, e2e: done.append(  # noqa: E731
            f"{r.id},{r.arrival:.6f},{r.prompt_tokens},{r.output_tokens},{ttft:.6f},"
            f"{'' if tpot is None else f'{tpot:.6f}'},{e2e:.6f}")
    progress = _progress() if not args.json and sys.stderr.isatty() else None
    sim = simulation(args, on_step=on_step, progress=progress, on_finish=on_finish)
    if progress is not None:
        print(file=sys.stderr)
    if args.timeline:
        write_atomically(args.timeline, "\n".join(rows) + "\n", "--timeline")
    if args.per_request:
        write_atomically(args.per_request, "\n".join(done) + "\n", "--per-request")
    if args.prometheus_series:
        _write_series(args, sim)
    if args.plot:
        from kvbudget.plot import plot_simulation

        plot_simulation(sim, args.plot, _credit(args))
        wrote(args.plot, "--plot")
    if args.json:
        print(json.dumps(sim.to_dict(), indent=2))
    else:
        _print(sim, args)
    return 0


def _write_series(args: argparse.Namespace, sim: Any) -> None:
    from kvbudget.guard.alerts import promtool_test, thresholds_of

    thresholds = thresholds_of(_guard(args)["guard_config"]) if args.guard_config else {}
    text, fired = promtool_test(sim.setup.engine, [(s.time, s.usage, s.running, s.waiting) for s in sim.timeline],
                                sim.duration_s, _positive(args.prometheus_interval, "--prometheus-interval"),
                                thresholds)
    write_atomically(args.prometheus_series, text, "--prometheus-series")
    when = "; ".join(f"{f.alert} {_clock(f.start_s)}-{_clock(f.end_s) if f.end_s is not None else 'end'}"
                     for f in fired) or "no alert fires"
    print(f"kvbudget: alerts of `kvbudget alerts` in this run: {when}", file=sys.stderr)


def _clock(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m{s:02d}s"


def _progress() -> Callable[[int], None]:
    def show(n: int) -> None:
        print(f"\rsimulated {n:,} requests", end="", file=sys.stderr, flush=True)
    return show


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def _short(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def _print(sim: Any, args: argparse.Namespace) -> None:
    from rich.table import Table

    s = sim.setup
    out = console()
    budget = f"{format_bytes(s.kv_memory_bytes)} KV, " if s.kv_memory_bytes else ""
    out.print(f"[bold]{s.model}[/bold] on {s.engine} ({s.allocator}), {s.gpu or 'no GPU named'}: {budget}"
              f"{s.describe()}")
    out.print(f"{sim.requests:,} requests ({sim.completed:,} completed) in {sim.duration_s:,.1f} s simulated, "
              f"{sim.steps:,} steps: {sim.requests_per_s:,.2f} requests/s, {sim.output_tokens_per_s:,.0f} output "
              "tokens/s")
    t = Table(title=f"latency (times: {s.time_model.basis})")
    for col in ("", "p50", "p90", "p99", "mean", "max"):
        t.add_column(col, justify="right" if col else "left")
    for name, pct in (("time to first token", sim.ttft), ("time per output token", sim.tpot),
                      ("end to end", sim.e2e)):
        if pct is not None:
            t.add_row(name, *(_ms(getattr(pct, k)) for k in ("p50", "p90", "p99", "mean", "max")))
    out.print(t)
    mem = sim.memory
    hit = f"{sim.prefix_hit_rate:.1%}" if sim.prefix_hit_rate is not None else "-"
    rest = s.free_label
    out.print(f"KV cache: peak usage {sim.peak_usage:.1%}, time-averaged {sim.mean_usage:.1%}; slots: token states "
              f"{mem.token_states:.1%}, reserved ahead {mem.reservation:.1%}, internal fragmentation "
              f"{mem.internal:.1%}, {rest} {mem.other:.1%}")
    out.print(f"queues: peak running {sim.peak_running:,}, peak waiting {sim.peak_waiting:,}; preemptions "
              f"{sim.preemptions:,} ({sim.preempted_requests:,} requests, {sim.recomputed_tokens:,} tokens "
              f"recomputed); prefix-cache hits {hit} of prompt tokens")
    if sim.failed:
        out.print(f"[red]failed: {sim.failed:,} requests got an error from the engine[/red] (its KV memory ran "
                  "out: llama.cpp's unified pool fails every busy request when one token no longer fits)")
    if sim.guard is not None:
        g = sim.guard
        out.print(f"guard: forwarded {sum(g.forwarded.values()):,} (untouched {g.forwarded[0]:,}, at the cap level "
                  f"{g.forwarded[1]:,}, forced to one sample {g.forwarded[2]:,}), rejected {g.rejected:,} with 503; "
                  f"caps shortened {g.capped:,} requests by {g.tokens_cut:,} output tokens; its predicted usage "
                  f"peaked at {g.peak_predicted:.0%}")
    for note in sim.notes:
        out.print(f"note: {note}")
    if args.request_log and args.approximate:
        out.print("note: prompt lengths are approximate (characters / 4), not counted with the tokenizer")
    if _credit(args):
        out.print(f"trace: {_credit(args)}")


def _credit(args: argparse.Namespace) -> str:
    """The credit a bundled trace's licence asks for wherever results from it are shown (also for a copy of one)."""
    import os

    from kvbudget.traces import find

    found = [find(os.path.basename(p)) for p in (args.trace, args.lengths_from_trace) if p]
    return "; ".join(dict.fromkeys(f"{t.credit} ({t.licence})" for t in found if t))


def _print_search(found: Any, slo: dict[str, float]) -> None:
    out = console()
    objectives = ", ".join(f"{k} ≤ {_ms(v)}" for k, v in slo.items())
    if found.best is None:
        out.print(f"no rate scale down to {min(s for s, _ in found.tried):.4g}x meets {objectives}")
        return
    b = found.best
    out.print(f"highest rate scale meeting {objectives}: [bold]{found.rate_scale:.3g}x[/bold] "
              f"({b.requests_per_s:,.2f} requests/s served; TTFT p99 {_ms(b.ttft.p99 if b.ttft else None)}, "
              f"TPOT p99 {_ms(b.tpot.p99 if b.tpot else None)}) after {len(found.tried)} simulations")
    for note in b.notes:
        out.print(f"note: {note}")


def sweep_point(args: argparse.Namespace, model: Any, settings: dict[str, Any],
                combo: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One configuration of a sweep, (its settings, its simulation without the timeline); a module-level function
    of plain data, so that a process pool or a Ray worker can run it (the workload is rebuilt there)."""
    from kvbudget.simulation import simulate

    combo = dict(combo)
    run_scale = combo.pop("rate_scale", _positive(args.rate_scale, "--rate-scale"))
    sim = simulate(model, _workload(args)(run_scale), fast=not args.reference, **_guard(args),
                   **{**settings, **combo})
    return {**combo, "rate_scale": run_scale}, replace(sim, timeline=())


def _task_progress(done: int, total: int) -> None:
    width = 30
    bar = "#" * (width * done // total)
    print(f"\rsweep [{bar:<{width}}] {done}/{total} configurations", end="", file=sys.stderr, flush=True)


def _sweep(args: argparse.Namespace, model: Any, settings: dict[str, Any], combos: list[dict[str, Any]]) -> int:
    from rich import box
    from rich.table import Table

    from kvbudget.simulation.parallel import run_all

    swept_scale = any("rate_scale" in c for c in combos)
    calls = [(args, model, settings, combo) for combo in combos]
    shown = not args.json and sys.stderr.isatty()
    results = run_all(sweep_point, calls, args.backend, _task_progress if shown else None)
    if shown:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps([{"settings": c, "result": s.to_dict()} for c, s in results],
                         indent=2))
        return 0
    keys = [k for k in results[0][0] if k != "rate_scale" or swept_scale]
    t = Table(title=f"{model.name}: sweep (KV tokens, p99 latencies" + (", times estimated)" if results[0][1].notes
                                                                         else ")"),
              box=box.SIMPLE_HEAD, padding=(0, 1, 0, 1), pad_edge=False, collapse_padding=True)
    for k in keys:
        t.add_column({"rate_scale": "rate"}.get(k, k.replace("_", "-")), no_wrap=True)
    for col in ("tokens", "TTFT", "TPOT", "E2E", "req/s", "peak", "preempt"):
        t.add_column(col, justify="right", no_wrap=True)
    for combo, sim in results:
        t.add_row(*(str(combo[k]).removeprefix("contiguous-") for k in keys), f"{sim.setup.token_slots:,}",
                  _short(sim.ttft.p99 if sim.ttft else None), _short(sim.tpot.p99 if sim.tpot else None),
                  _short(sim.e2e.p99 if sim.e2e else None), f"{sim.requests_per_s:,.2f}", f"{sim.peak_usage:.0%}",
                  f"{sim.preemptions:,}")
    console().print(t)
    return 0
