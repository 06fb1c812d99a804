"""`simulate`: a trace or synthetic traffic through the engine's scheduler and KV allocator."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvbudget.choices import ALLOCATORS, Interconnect, parse_allocator
from kvbudget.commands.options import (
    UTILIZATION,
    AcceptanceKnobs,
    EngineKnobs,
    SpeculativeKnobs,
    StartupKnobs,
    engine_field,
    engine_options,
    force_field,
    fraction,
    kv_dtype_field,
    load,
    model_field,
    one,
    option,
    optional_one,
    part,
    positive,
    size,
    whole,
)
from kvbudget.engines import get_engine
from kvbudget.engines.scheduling.setup import MAX_DISK_READ, Simulates
from kvbudget.engines.scheduling.workload import MAX_CLIENTS, MAX_CV, MAX_REQUESTS, MAX_SEED
from kvbudget.errors import KVBudgetError, named
from kvbudget.speculative import SpecMethod, Speculative
from kvbudget.units import MIB
from kvbudget.validate import MAX_BYTES, MAX_SECONDS, shown

if TYPE_CHECKING:
    from kvbudget.engines import EngineOptions
    from kvbudget.engines.scheduling.setup import SimulationAsk
    from kvbudget.model.spec import ModelSpec
    from kvbudget.simulation.cost import Cost
    from kvbudget.simulation.fleet import FleetSimulation
    from kvbudget.simulation.run import Simulation

WORKLOAD, MEMORY = "workload (a trace, or synthetic arrivals)", "memory (as `kvbudget plan`)"
SCHEDULER, ANSWERS = "scheduler (default: the engine's for the GPU)", "answers"
FLEET = "fleet (replicas behind a router)"
MAX_DISK_GBPS = MAX_DISK_READ / 1e9  # GB/s, as --disk-read takes it


@dataclass(frozen=True, kw_only=True)
class SimulateRequest:
    """What `simulate` is asked, as given."""

    model: str = model_field()
    engine: str = engine_field("vllm")
    kv_dtype: str = kv_dtype_field()
    trace: str | None = option("Azure LLM inference trace CSV, Mooncake JSONL or our JSONL (arrival, prompt_tokens, "
                               "output_tokens[, prefix, prefix_tokens])", group=WORKLOAD, web=False)
    request_log: str | None = option("an OpenAI chat request log (JSON Lines): prompt lengths counted with the "
                                     "model's tokenizer, outputs of max_tokens (else drawn with mean "
                                     "--output-tokens), arrivals from each line's 'arrival' or at --rate",
                                     group=WORKLOAD, web=False)
    tokenizer: str | None = option("--request-log: where the tokenizer is (default: the model argument)",
                                   group=WORKLOAD, web=False)
    approximate: bool = option("--request-log: lengths from characters, labelled", False, group=WORKLOAD, web=False)
    rate: str | None = option("synthetic: requests per second (Poisson, or gamma with --cv); without it, --trace "
                              "and --request-log, the run --calibrate measured is replayed", group=WORKLOAD)
    requests: str = option("synthetic: how many requests (default 1000)", "1000", group=WORKLOAD)
    cv: str = option("synthetic: coefficient of variation of inter-arrival times (1 Poisson, >1 bursty)", "1",
                     group=WORKLOAD)
    prompt_tokens: str = option("synthetic: mean prompt length (exponential; default 161, ShareGPT's mean in the "
                                "PagedAttention paper)", "161", group=WORKLOAD)
    output_tokens: str = option("synthetic: mean output length (default 338)", "338", group=WORKLOAD)
    lengths_from_trace: str | None = option("synthetic: draw (prompt, output) pairs from this trace instead",
                                            group=WORKLOAD, web=False)
    seed: str = option("random seed of synthetic arrivals and of the drafts each simulated verification accepts "
                       "(default 0)", "0", group=WORKLOAD)
    rate_scale: str = option("replay arrivals this many times as fast (default 1)", "1", group=WORKLOAD)
    max_concurrency: str | None = option("that many clients in a closed loop, as `vllm bench serve "
                                         "--max-concurrency`: a request goes out when it has arrived and a client is "
                                         "free (its latencies counted from then)", group=WORKLOAD)
    slice: str | None = option("START:COUNT requests of the trace (e.g. 0:1000)", group=WORKLOAD)
    gpu: str | None = option("GPU from `kvbudget gpus` (its memory, bandwidth and FLOPS)", group=MEMORY)
    gpu_memory: str | None = option("memory of one GPU (overrides --gpu's)", group=MEMORY)
    kv_memory: str | None = option("KV budget per GPU instead of deriving it", group=MEMORY)
    utilization: str | None = option(UTILIZATION, group=MEMORY)
    weights: str | None = option("weight bytes per GPU (overrides the computed figure; needed where kvbudget does "
                                 "not count the family's parameters)", group=MEMORY)
    num_blocks: str | None = option("the engine's KV blocks instead of a budget", group=MEMORY)
    tp: str = option("tensor parallel size (default 1)", "1", group=MEMORY)
    pp: str = option("pipeline parallel size (default 1)", "1", group=MEMORY)
    interconnect: str | None = option("what links the tensor-parallel GPUs: " + ", ".join(Interconnect.values())
                                      + " (default: the best link the GPU has; ethernet and infiniband: across "
                                      "nodes)", group=MEMORY)
    max_model_len: str | None = option("longest request (default: the model's maximum)", group=MEMORY)
    allocator: str = option("paged (the engine's), or the PagedAttention paper's baselines "
                            + "|".join(ALLOCATORS[1:]), "paged", group=MEMORY)
    knobs: EngineKnobs = part(EngineKnobs, group=MEMORY)
    speculative: SpeculativeKnobs = part(SpeculativeKnobs, group=MEMORY)
    acceptance: AcceptanceKnobs = part(AcceptanceKnobs, group=SCHEDULER)
    startup: StartupKnobs = part(StartupKnobs, group=MEMORY)
    max_num_seqs: str | None = option("requests running at once (llama.cpp: its slots, -np; vLLM: also the "
                                      "profiling sampler's rows)", group=SCHEDULER)
    kv_unified: bool = option("llama.cpp: one cell pool shared by all slots (llama-server's default when -np is "
                              "left to auto)", False, group=SCHEDULER)
    cache_ram: str | None = option("llama.cpp: the host-RAM prompt cache in MiB (default 8192; 0 turns it off)",
                                   group=SCHEDULER)
    offload_memory: str | None = option("vLLM: host memory for the offload tier's CPU tier, over every rank (e.g. "
                                        "64GiB; native: --kv-offloading-size)", group=MEMORY)
    offload_backend: str | None = option("vLLM: native (default) or lmcache (LMCache in vLLM's process)",
                                         group=MEMORY)
    offload_disk: str | None = option("vLLM with lmcache: disk for LMCache's disk tier behind host memory, over "
                                      "every rank (needs --disk-read)", group=MEMORY)
    disk_read: str | None = option("GB/s the disk tier reads at: the drive's sequential read (e.g. 7 for a PCIe "
                                   "4.0 NVMe drive's datasheet)", group=MEMORY)
    long_prefill_token_threshold: str = option("cut prompts longer than this into chunks of it while others wait "
                                               "(default 0: off)", "0", group=SCHEDULER)
    replicas: str | None = option("that many replicas of the deployment behind --router, each simulated as one "
                                  "(default: one engine, no router)", metavar="N", group=FLEET)
    expert_parallel: bool = option("with --replicas N: the replicas are N data-parallel ranks of one expert-parallel "
                                   "group (vLLM --data-parallel-size N --enable-expert-parallel): an MoE's routed "
                                   "experts spread over them, every rank stepping together, vLLM's own balancer",
                                   False, group=FLEET)
    router: str | None = option("how a fleet's requests are spread: round-robin (the default), least-requests, "
                                "least-kv[:SECONDS] (the lowest KV usage gauge, scraped every SECONDS, default 0.05), "
                                "prefix (llm-d's precise prefix-cache scorer with its load scorers), prefix-approx[:N] "
                                "(the Gateway API Inference Extension's, from its routing history, N hashes a "
                                "replica), session (a session's requests to one replica), length:T1,T2,... (pools "
                                "by prompt length)", metavar="NAME", group=FLEET)
    fleet: str | None = option("a YAML fleet file: pools of replicas, each with its own deployment settings (gpu, "
                               "tp, engine, kv_memory, ...: the command line's are their defaults), and the router",
                               metavar="FILE", group=FLEET, web=False)
    autoscale: str | None = option("scale a fleet's replicas as the run goes: kv, queue, llm-d or dynamo, then "
                                   ":key=value,... (min, max, interval, startup, pool; kv and queue: target, window; "
                                   "llm-d: target, up, down; dynamo: up, down), e.g. kv:max=8,target=0.8,interval=30s",
                                   metavar="POLICY", group=FLEET, web=False)
    load_bandwidth: str | None = option("GB/s a replica the autoscaler adds loads its weights at (default 3.125: a "
                                        "25 Gbit/s link)", metavar="GBPS", group=FLEET, web=False)
    flow_control: str | None = option("a queue at the fleet's front, as the llm-d router's flow control (v0.10): "
                                      "[max=N][,ttl=SECONDS], left out 5,000 and 60 s, ttl=0 none (429 when full "
                                      "or past the time-to-live)", metavar="SPEC", group=FLEET, web=False)
    max_num_queued_reqs: str | None = option("vLLM (from 0.29): its API server answers 503 past this many unfinished "
                                             "requests (each replica's)", metavar="N", group=FLEET, web=False)
    max_num_queued_tokens: str | None = option("vLLM (from 0.29): its API server answers 503 once the prompts still "
                                               "in prefill reach this many tokens (each replica's)", metavar="N",
                                               group=FLEET, web=False)
    json: bool = option("print JSON (seconds, bytes) instead of tables", False, group=ANSWERS, web=False)
    timeline: str | None = option("write every step to this CSV file (time, tokens, usage, running, waiting)",
                                  group=ANSWERS, web=False)
    per_request: str | None = option("write every completed sequence to this CSV file (id, arrival, prompt and "
                                     "output tokens, TTFT, TPOT, end-to-end seconds)", group=ANSWERS, web=False)
    prometheus_series: str | None = option("write the run's KV usage and request gauges, as the engine publishes "
                                           "them, in a `promtool test rules` file, with when each alert of "
                                           "`kvbudget alerts` fires (thresholds from --guard-config when given)",
                                           metavar="FILE", group=ANSWERS, web=False)
    prometheus_interval: str = option("seconds between scrapes in --prometheus-series (default 15)", "15",
                                      group=ANSWERS)
    plot: str | None = option("write a picture (.png or .svg): KV usage, queues and latency distributions",
                              group=ANSWERS, web=False)
    force: bool = force_field()
    find_max_rate: bool = option("the highest --rate-scale meeting --slo", False, group=ANSWERS, web=False)
    slo: str | None = option("objectives for --find-max-rate, e.g. ttft_p99=2s,tpot_p99=100ms", group=ANSWERS,
                             web=False)
    sweep: Sequence[str] | None = option("a table over settings, e.g. tp=1,2 kv-dtype=auto,fp8 (rate-scale too)",
                                         many=True, metavar="NAME=V1,V2", group=ANSWERS, web=False)
    backend: str = option("where --sweep runs its simulations: process (a pool on this machine, the default), "
                          "serial, ray (a local Ray) or ray=ADDRESS (a running Ray cluster, e.g. ray=auto)",
                          "process", group=ANSWERS, web=False)
    gpu_price: str | None = option("dollars per GPU-hour (e.g. 2.49, or H100-80GB=2.49,L40S=0.86 to price each "
                                   "GPU of a sweep): adds $/hour and $ per million tokens and per thousand requests "
                                   "(the run's GPUs for its simulated time, idle time included)", metavar="PRICE",
                                   group=ANSWERS, web=False)
    calibrate: str | None = option("fit the time model to measured timings: a `vllm bench serve --save-result "
                                   "--save-detailed` JSON (per-request TTFT and ITL), the result blocks `vllm bench "
                                   "serve` prints (pasted text: their mean TTFT and TPOT), a scrape of vLLM's /metrics "
                                   "after it served --trace (its latency histograms), or a log of vLLM run with "
                                   "--scheduler-cls kvbudget.simulation.recorder.RecordingScheduler (step times)",
                                   group=ANSWERS, web=False)
    save_calibration: str | None = option("keep the time model --calibrate fits under this name, for --calibration",
                                          metavar="NAME", group=ANSWERS, web=False)
    calibration: str | None = option("the time model saved earlier by --save-calibration (a name, or its file), "
                                     "for the same model and GPU", metavar="NAME", group=ANSWERS, web=False)
    guard_config: str | None = option("put `kvbudget guard` in front of the engine with this YAML (e.g. from "
                                      "`kvbudget plan --guard-config`): its own code decides every arrival",
                                      group=ANSWERS, web=False)
    guard_poll_interval: str = option("seconds between the guard's scrapes of the usage gauge (default 1, as the "
                                      "guard's)", "1", group=ANSWERS, web=False)
    admission: str | None = option("the admission policy in front of the engine: none (the engine alone), gie "
                                   "(the llm-d router's saturation shedding: 429 at 5 waiting or 0.8 KV usage), "
                                   "llm-d (its flow control, v0.10: a queue at the gateway of 5,000 requests, 60 s "
                                   "each, 429 past either; --flow-control sets them), concurrency:N (N in flight at "
                                   "most, 429), kvbudget (the guard's levels, 503; default with --guard-config)",
                                   group=ANSWERS, web=False)
    reference: bool = option("step by step, without the fast path (same answer)", False, group=ANSWERS, web=False)
    prefill_replicas: str | None = option("disaggregated serving: this many prefill replicas of the deployment "
                                          "(with --decode-replicas and --kv-link; vLLM's NIXL connector)",
                                          group=SCHEDULER, web=False)
    decode_replicas: str | None = option("disaggregated serving: this many decode replicas of the deployment",
                                         group=SCHEDULER, web=False)
    kv_link: str | None = option("disaggregated serving: the link the KV crosses: nvlink, infiniband, roce, pcie, "
                                 "tcp, a rate (25GB/s) or NAME:RATE", group=SCHEDULER, web=False)


def workload(ask: SimulateRequest) -> Callable[[float], Iterable[Any]]:
    """A function of the rate scale giving a fresh stream of requests (a sweep or search replays it)."""
    from kvbudget.simulation import exponential_lengths, read_trace, rescale, sampled_lengths, synthetic

    if ask.request_log:
        if ask.trace:
            raise KVBudgetError(f"simulate: give {named('trace')} or {named('request_log')}, not both")
    elif not ask.trace and ask.rate is None and ask.calibrate and (measured := _measured_run(ask.calibrate)):
        first, many = _slice(ask.slice)
        return lambda scale: rescale(iter(measured), scale, first, many)
    elif bool(ask.trace) == (ask.rate is not None):
        raise KVBudgetError(f"simulate: give {named('trace', 'FILE')}, {named('request_log', 'FILE')} or "
                            f"{named('rate', 'N')} (synthetic arrivals)", param="rate")
    start, count = _slice(ask.slice)
    if ask.trace:
        path = ask.trace
        if not list(rescale(read_trace(path), 1.0, start, 1)):  # a missing, foreign or empty file fails here
            held = sum(1 for _ in read_trace(path))
            raise KVBudgetError(f"slice: starts at request {start:,}, past the end of the trace's {held:,} requests; "
                                f"give a START below {held:,}", param="slice")
        return lambda scale: rescale(read_trace(path), scale, start, count)
    cv, seed = positive(ask.cv, "cv", MAX_CV), whole(ask.seed, "seed", MAX_SEED)
    if ask.request_log:
        from kvbudget.engines.scheduling.workload import request_log
        from kvbudget.tokens import PromptCounter, check_readable

        check_readable(ask.request_log)  # before the tokenizer loads (seconds)
        counter = PromptCounter(ask.tokenizer or ask.model, ask.approximate, ask.engine)
        outputs = exponential_lengths(1, positive(ask.output_tokens, "output_tokens"))
        log, log_rate = ask.request_log, positive(ask.rate, "rate") if ask.rate is not None else None
        return lambda scale: rescale(request_log(log, counter, outputs, log_rate, seed, cv), scale, start, count)
    assert ask.rate is not None
    rate = positive(ask.rate, "rate")
    total = one(ask.requests, "requests", MAX_REQUESTS)
    if ask.lengths_from_trace:
        pool = [(r.prompt_tokens, r.output_tokens) for r in read_trace(ask.lengths_from_trace)]
        lengths = sampled_lengths(pool)
    else:
        lengths = exponential_lengths(positive(ask.prompt_tokens, "prompt_tokens"),
                                      positive(ask.output_tokens, "output_tokens"))
    return lambda scale: rescale(synthetic(rate, total, lengths, seed, cv), scale, start, count)


def _measured_run(path: str) -> tuple[Any, ...]:
    """The requests of the run --calibrate measured, where it says them: a benchmark result's, or the run the
    first printed result block rebuilds (none for a recorder log)."""
    from kvbudget.simulation.fit import BenchRun, read_calibration

    measured = read_calibration(path)
    if isinstance(measured, BenchRun):
        return measured.requests
    return () if isinstance(measured, list) else measured[0].requests()


def _calibrated(found: SimulationAsk, path: str, served: Callable[[], Iterable[Any]] | None) -> SimulationAsk:
    """`found` with the time model from calibrate: fitted to a benchmark run's requests, to vLLM's latency
    histograms for the trace it served, or to recorded steps."""
    from kvbudget.simulation.fit import (
        BenchRun,
        calibrate_requests,
        calibrate_summaries,
        initial_model,
        initial_summary_model,
        read_calibration,
    )
    from kvbudget.simulation.run import setup_of

    measured = read_calibration(path, served)
    if isinstance(measured, list):
        return replace(found, measured=measured)
    start = initial_model(measured) if isinstance(measured, BenchRun) else initial_summary_model(measured)
    try:  # the GPU's kernel model, two factors fitted; without a GPU, a three-part step from scratch
        base = setup_of(found)
    except KVBudgetError:
        base = setup_of(replace(found, time_model=start))
    if isinstance(measured, BenchRun):
        return replace(found, time_model=calibrate_requests(found.model, measured, base))
    return replace(found, time_model=calibrate_summaries(found.model, measured, base))


def _calibration(ask: SimulateRequest, found: SimulationAsk, stream: Callable[[float], Iterable[Any]]
                 ) -> SimulationAsk:
    """`found` with the time model of --calibrate (saved under --save-calibration) or --calibration."""
    from kvbudget.simulation.calibrations import calibration_target, load_calibration, save_calibration

    if ask.calibration:
        if ask.calibrate or ask.save_calibration:
            raise KVBudgetError(f"calibration: a saved calibration replaces {named('calibrate')}; give one of them",
                                param="calibration")
        return replace(found, time_model=load_calibration(ask.calibration, found.model.name, found.gpu))
    if not ask.calibrate:
        if ask.save_calibration:
            raise KVBudgetError(f"save_calibration goes with {named('calibrate', 'FILE')}", param="save_calibration")
        return found
    if ask.save_calibration:
        calibration_target(ask.save_calibration)  # a bad name or an unwritable folder fails before the fit
    fitted = _calibrated(found, ask.calibrate, (lambda: stream(1.0)) if ask.trace or ask.request_log else None)
    if ask.save_calibration:
        from kvbudget.engines.scheduling.timing import calibrate

        time_model = fitted.time_model if fitted.measured is None else calibrate(fitted.measured)
        assert time_model is not None
        save_calibration(ask.save_calibration, time_model, found.model.name, found.gpu, ask.calibrate)
        return replace(found, time_model=time_model)
    return fitted


def front_settings(ask: SimulateRequest) -> dict[str, Any]:
    """simulate()'s arguments for what stands in front of the engine: the clients of a closed loop, an admission
    policy, the guard's configuration read from its file and its poll interval."""
    chosen: dict[str, Any] = {"admission": ask.admission} if ask.admission else {}
    if ask.max_concurrency is not None:
        chosen["max_concurrency"] = one(ask.max_concurrency, "max_concurrency", MAX_CLIENTS)
    if not ask.guard_config:
        return chosen
    from kvbudget.guard.config import read

    return {"guard_config": read(ask.guard_config, "guard_config"),
            "guard_poll_interval": positive(ask.guard_poll_interval, "guard_poll_interval", MAX_SECONDS), **chosen}


def _mib(text: str | None) -> int | None:
    """--cache-ram: MiB, 0 turning the cache off."""
    return None if text is None else whole(text, "cache_ram", MAX_BYTES // MIB)


def _slice(text: str | None) -> tuple[int, int | None]:
    """--slice START:COUNT read (COUNT left out: to the end)."""
    if text is None:
        return 0, None
    first, colon, n = text.partition(":")
    if not colon or not first.strip().isdigit() or (n and not n.strip().isdigit()):
        raise KVBudgetError(f"slice {shown(text)}: write START:COUNT, e.g. 0:1000", param="slice")
    return whole(first, "slice"), one(n, "slice") if n else None


def simulation_ask(ask: SimulateRequest, model: ModelSpec) -> SimulationAsk:
    """The typed simulation request of a command's request: its text read into the engine's settings."""
    from kvbudget.engines.scheduling.setup import SimulationAsk

    seed = whole(ask.seed, "seed", MAX_SEED)  # (before the draft model loads)
    engine, options = engine_options(ask.engine, ask.knobs, ask.startup, speculative=ask.speculative)
    given = [p for p, v in (("attention_backend", options.attention_backend),
                            ("pp_layer_partition", options.pp_layer_partition)) if v]
    if given:
        raise KVBudgetError(f"{given[0]}: simulate follows the engine's scheduler and allocator on one rank: "
                            f"{named('attention_backend')} and {named('pp_layer_partition')} are for estimate and "
                            "plan", param=given[0])
    return SimulationAsk(
        model=model, engine=get_engine(engine), gpu=ask.gpu, gpu_memory=size(ask.gpu_memory, "gpu_memory"),
        kv_memory=size(ask.kv_memory, "kv_memory"), weights=size(ask.weights, "weights"),
        utilization=fraction(ask.utilization, "utilization"), num_blocks=optional_one(ask.num_blocks, "num_blocks"),
        tp=one(ask.tp, "tp"), pp=one(ask.pp, "pp"), kv_dtype=ask.kv_dtype,
        max_model_len=optional_one(ask.max_model_len, "max_model_len"), block_size=options.block_size,
        device=options.device, max_num_seqs=optional_one(ask.max_num_seqs, "max_num_seqs"),
        max_num_batched_tokens=options.max_num_batched_tokens, prefix_caching=options.prefix_caching,
        long_prefill_token_threshold=whole(ask.long_prefill_token_threshold, "long_prefill_token_threshold"),
        allocator=parse_allocator(ask.allocator),
        kv_unified=ask.kv_unified, cache_ram=_mib(ask.cache_ram), enforce_eager=options.enforce_eager,
        extensible_kv_cache=options.extensible_kv_cache, entry_point=options.entry_point,
        lora=(options.max_loras, options.max_lora_rank) if options.enable_lora else None,
        offload_memory=size(ask.offload_memory, "offload_memory"), offload_backend=ask.offload_backend,
        offload_disk=size(ask.offload_disk, "offload_disk"), disk_read=_gbps(ask.disk_read),
        engine_version=options.engine_version, speculative=seeded(ask.acceptance.apply(_speculative(options)), seed),
        interconnect=Interconnect.parse(ask.interconnect, "interconnect") if ask.interconnect is not None else None,
        expert_parallel=one(ask.replicas or "1", "replicas") if ask.expert_parallel else 1)


def seeded(spec: Speculative | None, seed: int) -> Speculative | None:
    """`spec` drawing its verifications' accepted drafts with `seed` (the run's)."""
    return None if spec is None else replace(spec, seed=seed)


def _speculative(options: EngineOptions) -> Speculative | None:
    """The speculative decoding asked: --speculative, or --num-speculative-tokens alone (the model's MTP layers)."""
    if options.speculative is None and options.num_speculative_tokens:
        return Speculative(method=SpecMethod.MTP, num_tokens=options.num_speculative_tokens)
    return options.speculative


def _gbps(text: str | None) -> float | None:
    """--disk-read in GB/s as bytes per second."""
    if text is None:
        return None
    return positive(text, "disk_read", MAX_DISK_GBPS) * 1e9


def prices(ask: SimulateRequest) -> dict[str | None, float] | None:
    """--gpu-price read: {GPU name, or None for every GPU: dollars per GPU-hour}, or None when not given."""
    from kvbudget.simulation.cost import parse_prices

    return parse_prices(ask.gpu_price) if ask.gpu_price else None


def costed(ask: SimulateRequest, sim: Simulation | FleetSimulation, found: SimulationAsk, replicas: int = 1
           ) -> Cost | None:
    """What `sim` (run as `found` asks, on `replicas` copies of it) costs at --gpu-price; None without one."""
    priced = prices(ask)
    if priced is None:
        return None
    from kvbudget.simulation.cost import price_for, run_cost

    return run_cost(sim.duration_s, sim.prompt_tokens, sim.output_tokens, sim.completed,
                    price_for(priced, found.gpu), found.tp * found.pp * replicas)


def prepared(ask: SimulateRequest) -> tuple[Callable[[float], Iterable[Any]], SimulationAsk, float]:
    """(workload by rate scale, the typed simulation request, rate scale) of a request, checked."""
    sides = disaggregated(ask)
    _check_outputs(ask)
    if ask.max_concurrency is not None:
        one(ask.max_concurrency, "max_concurrency", MAX_CLIENTS)  # before the model loads
    model = load(ask.model)
    stream = workload(ask)
    found = simulation_ask(ask, model)
    if isinstance(found.engine, Simulates):  # settings the scheduler model refuses (a release), before any fit
        found.engine.simulator().options(found)
    priced = prices(ask)  # a price that cannot be read fails before any fit or run
    if priced is not None and not ask.sweep:
        from kvbudget.simulation.cost import price_for

        price_for(priced, found.gpu)
    found = _calibration(ask, found, stream)
    scale = positive(ask.rate_scale, "rate_scale")
    positive(ask.prometheus_interval, "prometheus_interval", MAX_SECONDS)  # given or not: a bad value is refused
    positive(ask.guard_poll_interval, "guard_poll_interval", MAX_SECONDS)
    if ask.prometheus_series:
        if found.engine.queue_gauges is None:
            raise KVBudgetError(f"prometheus_series: {found.engine.name} publishes no request gauges to write",
                                param="prometheus_series")
    if ask.find_max_rate and ask.sweep:
        raise KVBudgetError(f"simulate: {named('find_max_rate')} and {named('sweep')} go separately")
    if ask.slo and not ask.find_max_rate:
        raise KVBudgetError(f"slo goes with {named('find_max_rate')}", param="slo")
    if sides is not None:  # the link read against the GPU before any run
        from kvbudget.gpus import find_gpu
        from kvbudget.interconnects import kv_link

        assert ask.kv_link is not None
        kv_link(ask.kv_link, [find_gpu(found.gpu) if found.gpu else None])
    return stream, found, scale


def _check_outputs(ask: SimulateRequest) -> None:
    """The files the request writes, checked before any work (kvbudget.files.check_target)."""
    from kvbudget.files import check_targets

    if ask.sweep or ask.find_max_rate:  # many runs: a file of one would be the last run's, silently
        for param in ("timeline", "per_request", "prometheus_series", "plot"):
            if getattr(ask, param):
                raise KVBudgetError(f"{param}: writes one run's figures; {named('sweep')} and "
                                    f"{named('find_max_rate')} make many runs: leave it out, or simulate the "
                                    "setting you chose without them", param=param)
    if ask.backend != "process" and not ask.sweep:
        raise KVBudgetError(f"backend: where {named('sweep')}'s simulations run; it goes with {named('sweep')}",
                            param="backend")
    for param in ("tokenizer", "approximate"):
        if getattr(ask, param) and not ask.request_log:
            raise KVBudgetError(f"{param} goes with {named('request_log')} (the prompts it counts)", param=param)
    if ask.plot:
        from kvbudget.plot import plot_target

        plot_target(ask.plot, ask.force)
    check_targets(((ask.timeline, "timeline"), (ask.per_request, "per_request"),
                   (ask.prometheus_series, "prometheus_series"), (ask.plot, "plot")), ask.force)


def simulation(ask: SimulateRequest, on_step: Callable[..., None] | None = None,
               progress: Callable[[int], None] | None = None, on_finish: Callable[..., None] | None = None,
               check: Callable[[], None] | None = None) -> Any:
    """One simulated run of a request (its `to_dict()` is what --json prints and the web page serves); `check`
    as `simulate`'s (it may end the run by raising)."""
    return run_prepared(ask, prepared(ask), on_step, progress, on_finish, check)


ONE_RUN = ("sweep", "find_max_rate", "max_concurrency", "prometheus_series")  # what a disaggregated fleet
#                                                                          does not take (yet)


def disaggregated(ask: SimulateRequest) -> tuple[int, int] | None:
    """(prefill, decode) replicas of --prefill-replicas and --decode-replicas, checked (None: neither given)."""
    from kvbudget.simulation.fleet import MAX_REPLICAS

    if ask.prefill_replicas is None and ask.decode_replicas is None:
        if ask.kv_link is not None:
            raise KVBudgetError(f"kv_link: goes with {named('prefill_replicas')} and {named('decode_replicas')}",
                                param="kv_link")
        return None
    for param in ("prefill_replicas", "decode_replicas", "kv_link"):
        if getattr(ask, param) is None:
            raise KVBudgetError(f"{param}: disaggregated serving needs {named('prefill_replicas', 'P')}, "
                                f"{named('decode_replicas', 'D')} and {named('kv_link', 'LINK')}", param=param)
    for param in ONE_RUN:
        if getattr(ask, param):
            raise KVBudgetError(f"{param}: not simulated with disaggregated prefill and decode yet; leave it out",
                                param=param)
    return (one(str(ask.prefill_replicas), "prefill_replicas", MAX_REPLICAS),
            one(str(ask.decode_replicas), "decode_replicas", MAX_REPLICAS))


def run_prepared(ask: SimulateRequest, ready: tuple[Callable[[float], Iterable[Any]], SimulationAsk, float],
                 on_step: Callable[..., None] | None = None, progress: Callable[[int], None] | None = None,
                 on_finish: Callable[..., None] | None = None, check: Callable[[], None] | None = None) -> Any:
    """The run of a request `prepared` has checked."""
    from kvbudget.simulation.run import setup_of, simulate

    stream, found, scale = ready
    sim = simulate(found.model, stream(scale), setup=setup_of(found), fast=not ask.reference, on_step=on_step,
                   progress=progress, on_finish=on_finish, check=check, **front_settings(ask))
    if found.speculative is None:
        return sim
    plain = simulate(found.model, stream(scale), setup=setup_of(replace(found, speculative=None)),
                     fast=not ask.reference, check=check, **front_settings(ask))  # TPOT without, beside it
    return replace(sim, tpot_without=plain.tpot)
