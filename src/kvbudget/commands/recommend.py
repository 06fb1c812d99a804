"""`recommend`: the cheapest deployment that meets latency objectives on a traffic (simulation/recommend.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from kvbudget.commands.options import (
    AcceptanceKnobs,
    SpeculativeKnobs,
    engine_field,
    force_field,
    load,
    model_field,
    one,
    option,
    positive,
    whole,
)
from kvbudget.commands.simulate import SimulateRequest, seeded, workload
from kvbudget.errors import KVBudgetError, named
from kvbudget.speculative import MAX_SPECULATIVE_TOKENS, SpecMethod, Speculative
from kvbudget.units import parse_size
from kvbudget.validate import MAX_SEED, shown

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment
    from kvbudget.engines.scheduling.workload import Request
    from kvbudget.simulation.recommend import Recommendation, Space

SEARCH, ANSWERS = "search space (each a list: every value is tried)", "answers"
DEFAULT_GPUS = ("H100-80GB", "A100-80GB", "L40S")  # searched where --gpus is not given (those priced)
# the simulate command's workload options, offered the same way (commands/simulate.py workload reads them)
WORKLOAD_FIELDS = ("trace", "rate", "requests", "cv", "prompt_tokens", "output_tokens", "lengths_from_trace", "seed",
                   "rate_scale", "slice")


def _simulate_option(name: str) -> Any:
    """A field of `simulate`'s request, offered here as there."""
    f = next(f for f in fields(SimulateRequest) if f.name == name)
    return field(default=f.default, metadata=f.metadata)


def _speculative_option(name: str, knobs: type = SpeculativeKnobs) -> Any:
    """A speculative decoding option of estimate, plan and simulate, offered here among the search space's."""
    f = next(f for f in fields(knobs) if f.name == name)
    return field(default=f.default, metadata={"option": replace(f.metadata["option"], group=SEARCH)})


@dataclass(frozen=True, kw_only=True)
class RecommendRequest:
    """What `recommend` is asked, as given."""

    model: str = model_field()
    engine: str = engine_field("vllm")
    slo: str | None = option("the objectives every candidate must meet, e.g. ttft_p99=2s,tpot_p99=50ms "
                             "(ttft|tpot|e2e _ p50|p90|p99|mean|max)", required=True, group=ANSWERS)
    trace: str | None = _simulate_option("trace")
    rate: str | None = _simulate_option("rate")
    requests: str = _simulate_option("requests")
    cv: str = _simulate_option("cv")
    prompt_tokens: str = _simulate_option("prompt_tokens")
    output_tokens: str = _simulate_option("output_tokens")
    lengths_from_trace: str | None = _simulate_option("lengths_from_trace")
    seed: str = _simulate_option("seed")
    rate_scale: str = _simulate_option("rate_scale")
    slice: str | None = _simulate_option("slice")
    max_model_len: str | None = _simulate_option("max_model_len")
    gpus: str | None = option("GPUs to choose from, by `kvbudget gpus` names (default: H100-80GB, A100-80GB and L40S, "
                              "those priced)", metavar="GPU,...", group=SEARCH)
    max_gpus: str = option("GPUs one candidate may take in all (default 8)", "8", metavar="N", group=SEARCH)
    tp: str = option("tensor parallel sizes (default 1,2,4,8)", "1,2,4,8", metavar="N,...", group=SEARCH)
    pp: str = option("pipeline parallel sizes (default 1)", "1", metavar="N,...", group=SEARCH)
    max_num_seqs: str | None = option("max_num_seqs values (default: the engine's for the GPU)", metavar="N,...",
                                      group=SEARCH)
    max_num_batched_tokens: str | None = option("max_num_batched_tokens values (default: the engine's for the "
                                                "GPU)", metavar="N,...", group=SEARCH)
    gpu_memory_utilization: str | None = option("the engine's memory fractions (default: the engine's)",
                                                metavar="F,...", group=SEARCH)
    kv_dtype: str = option("KV cache dtypes (default auto,fp8; one other than the model's is flagged: check its "
                           "quality on your data)", "auto,fp8", metavar="DTYPE,...", group=SEARCH)
    prefix_caching: str = option("on, off or both (default on)", "on", choices=("on", "off", "both"), group=SEARCH)
    offload_memory: str | None = option("host memory for a KV offload tier per replica, over every rank; 0 is none "
                                        "(e.g. 0,64GiB; default none)", metavar="SIZE,...", group=SEARCH)
    speculative: str | None = _speculative_option("speculative")
    num_speculative_tokens: str | None = option(
        f"draft tokens per step to try, 0 to {MAX_SPECULATIVE_TOKENS}, 0 being none (e.g. 0,2,4; default: none); "
        "without --speculative: the model's own MTP layers (method mtp)", metavar="K,...", group=SEARCH)
    draft_model: str | None = _speculative_option("draft_model")
    acceptance: str | None = _speculative_option("acceptance", AcceptanceKnobs)
    acceptance_from: str | None = _speculative_option("acceptance_from", AcceptanceKnobs)
    no_disagg: bool = option("co-located replicas only (default: also a prefill and a decode pool)", False,
                             group=SEARCH)
    no_expert_parallel: bool = option("an MoE model: no expert-parallel groups (default: also 2 or more replicas "
                                      "as the data-parallel ranks of one group sharing the routed experts)", False,
                                      group=SEARCH)
    kv_link: str = option("the link a disaggregated candidate's KV crosses: nvlink, infiniband (default), roce, "
                          "pcie, tcp, a rate (25GB/s) or NAME:RATE", "infiniband", group=SEARCH)
    router: str = option("how several replicas share the traffic (as `simulate --router`; default round-robin)",
                         "round-robin", metavar="NAME", group=SEARCH)
    gpu_price: str | None = option("dollars per GPU-hour (2.49 for every GPU, or H100-80GB=2.49,L40S=0.86; default: "
                                   "the dated table shipped with kvbudget)", metavar="PRICE", group=ANSWERS)
    exhaustive: bool = option("simulate every candidate that starts, not only those up to the cheapest that meets "
                              "the objectives (a fuller front; slower)", False, group=ANSWERS)
    backend: str = option("where the simulations run: process (a pool on this machine, the default), serial, ray "
                          "or ray=ADDRESS", "process", group=ANSWERS, web=False)
    json: bool = option("print JSON instead of tables", False, group=ANSWERS, web=False)
    out: str | None = option("write the chosen deployment's files into this folder", metavar="DIR", group=ANSWERS,
                             web=False)
    force: bool = force_field()


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A request read and checked: what the search takes."""

    ask: Any  # SimulationAsk
    requests: tuple[Request, ...]
    slo: dict[str, float]
    space: Space
    prices: dict[str | None, float]


def _counts(text: str | None, param: str) -> tuple[int | None, ...]:
    return (None,) if text is None else tuple(one(v, param) for v in text.split(","))


def _fractions(text: str | None) -> tuple[float | None, ...]:
    from kvbudget.commands.options import fraction

    return (None,) if text is None else tuple(fraction(v, "gpu_memory_utilization") for v in text.split(","))


def _offloads(text: str | None) -> tuple[int | None, ...]:
    if text is None:
        return (None,)
    return tuple(None if v.strip() in ("0", "none") else parse_size(v.strip(), "offload_memory")
                 for v in text.split(","))


def _speculative_tokens(ask: RecommendRequest) -> tuple[int, ...]:
    """--num-speculative-tokens read (0: no speculative decoding), with --speculative and --draft-model checked
    against it; (0,) where none is asked."""
    if ask.num_speculative_tokens is None:
        if ask.speculative is not None or ask.draft_model is not None:
            given = "speculative" if ask.speculative is not None else "draft_model"
            raise KVBudgetError(f"num_speculative_tokens: give the draft tokens per step to try with {named(given)}, "
                                f"e.g. 0,2,4 (0 to {MAX_SPECULATIVE_TOKENS}; 0: none)",
                                param="num_speculative_tokens")
        return (0,)
    tokens = tuple(dict.fromkeys(whole(v, "num_speculative_tokens", MAX_SPECULATIVE_TOKENS)
                                 for v in ask.num_speculative_tokens.split(",")))
    if ask.speculative is None and ask.draft_model is not None:
        raise KVBudgetError(f"draft_model: goes with {named('speculative')} eagle, eagle3 or draft-model",
                            param="draft_model")
    if ask.speculative is not None:
        SpecMethod.parse(ask.speculative, "speculative").check_draft(ask.draft_model is not None)
    return tokens


def _speculatives(ask: RecommendRequest, tokens: tuple[int, ...]) -> tuple[Speculative | None, ...]:
    """The search's speculative decoding axis: one setting per draft-token count (None for 0); the draft model
    loaded here, after every cheap check."""
    drafting = max(tokens)
    if not drafting:
        AcceptanceKnobs(acceptance=ask.acceptance, acceptance_from=ask.acceptance_from).apply(None)
        return (None,)
    knobs = SpeculativeKnobs(speculative=ask.speculative, num_speculative_tokens=str(drafting),
                             draft_model=ask.draft_model)
    from kvbudget.engines import EngineOptions

    options = knobs.options(EngineOptions())
    base = options.speculative or Speculative(method=SpecMethod.MTP, num_tokens=options.num_speculative_tokens)
    base = AcceptanceKnobs(acceptance=ask.acceptance, acceptance_from=ask.acceptance_from).apply(base) or base
    base = seeded(base, whole(ask.seed, "seed", MAX_SEED)) or base
    return tuple(base.with_tokens(k) for k in tokens)


def _check_kv_dtypes(dtypes: tuple[str, ...]) -> None:
    from kvbudget.dtypes import KV_DTYPE_CHOICES

    for d in dtypes:
        if d not in KV_DTYPE_CHOICES:
            raise KVBudgetError(f"kv_dtype {shown(d)}: name KV dtypes among {', '.join(KV_DTYPE_CHOICES)}",
                                param="kv_dtype")


def _check_link(text: str, gpus: tuple[str, ...]) -> None:
    """--kv-link read against the GPUs: refused where no GPU can take it (a GPU that alone cannot, e.g. NVLink on
    a card without it, has its disaggregated candidates pruned with the reason)."""
    from kvbudget.gpus import find_gpu
    from kvbudget.interconnects import kv_link

    first: KVBudgetError | None = None
    for gpu in gpus:
        try:
            kv_link(text, [find_gpu(gpu)])
            return
        except KVBudgetError as exc:
            first = first or exc
    assert first is not None
    raise first


def _gpus(text: str) -> tuple[str, ...]:
    from kvbudget.gpus import find_gpu

    names = []
    for name in text.split(","):
        try:
            names.append(find_gpu(name.strip()).name)
        except KVBudgetError as exc:
            raise KVBudgetError(f"gpus {shown(name.strip())}: {exc}", param="gpus") from None
    return tuple(names)


def prices_for(text: str | None, gpus: tuple[str, ...] | None) -> tuple[dict[str | None, float], tuple[str, ...]]:
    """(prices by GPU, the GPUs to search): --gpu-price where given, else the shipped table; without --gpus, the
    default GPUs that are priced (with per-GPU prices: those priced)."""
    from kvbudget.simulation.cost import parse_prices, price_for, price_table

    prices: dict[str | None, float] = dict(parse_prices(text)) if text else \
        {name: price for name, price in price_table().items()}  # (the dated table shipped: data/prices.json)
    if gpus is None:
        if None in prices:  # one price for every GPU
            gpus = DEFAULT_GPUS
        elif text:  # the GPUs priced on the command line
            gpus = tuple(g for g in prices if g is not None)
        else:  # the default GPUs the table prices
            gpus = tuple(g for g in DEFAULT_GPUS if g in prices)
        if not gpus:
            raise KVBudgetError(f"gpus: none of {', '.join(DEFAULT_GPUS)} is priced; give {named('gpus')} and "
                                f"{named('gpu_price')}", param="gpus")
    for gpu in gpus:
        try:
            price_for(prices, gpu)
        except KVBudgetError as exc:
            raise KVBudgetError(f"{exc}; or leave {gpu} out of {named('gpus')}", param="gpu_price") from None
    return prices, gpus


def prepared(ask: RecommendRequest) -> Prepared:
    """The request read, every value checked, the traffic read, before any plan or simulation."""
    from kvbudget.commands.simulate import simulation_ask
    from kvbudget.engines.scheduling.setup import Simulates
    from kvbudget.simulation.parallel import check_backend
    from kvbudget.simulation.percentiles import check_metric
    from kvbudget.simulation.recommend import MAX_SEARCH_REQUESTS, Space, candidates, check_speculates
    from kvbudget.simulation.routing import parse_router
    from kvbudget.simulation.search import parse_slo

    if ask.slo is None:
        raise KVBudgetError("slo: give the objectives, e.g. ttft_p99=2s,tpot_p99=50ms", param="slo")
    slo = parse_slo(ask.slo)
    for name in slo:
        check_metric(name)
    check_backend(ask.backend)
    parse_router(ask.router)
    if ask.out:
        _check_out(ask.out, ask.force)
    prices, gpus = prices_for(ask.gpu_price, _gpus(ask.gpus) if ask.gpus else None)
    cached = {"on": (True,), "off": (False,), "both": (True, False)}[ask.prefix_caching]
    tokens = _speculative_tokens(ask)
    space = Space(gpus=gpus, max_gpus=one(ask.max_gpus, "max_gpus"),
                  tp=tuple(one(v, "tp") for v in ask.tp.split(",")), pp=tuple(one(v, "pp") for v in ask.pp.split(",")),
                  max_num_seqs=_counts(ask.max_num_seqs, "max_num_seqs"),
                  max_num_batched_tokens=_counts(ask.max_num_batched_tokens, "max_num_batched_tokens"),
                  gpu_memory_utilization=_fractions(ask.gpu_memory_utilization),
                  kv_dtypes=tuple(dict.fromkeys(v.strip() for v in ask.kv_dtype.split(",") if v.strip())),
                  prefix_caching=cached, offload_memory=_offloads(ask.offload_memory),
                  speculative=(None,) * len(tokens), disaggregated=not ask.no_disagg,
                  expert_parallel=not ask.no_expert_parallel)  # (the axis: after the model)
    _check_kv_dtypes(space.kv_dtypes)
    candidates(space)  # an empty or too large space fails here
    if not space.disaggregated and ask.kv_link != "infiniband":
        raise KVBudgetError(f"kv_link: the link of disaggregated candidates; {named('no_disagg')} leaves them out",
                            param="kv_link")
    if space.disaggregated:
        _check_link(ask.kv_link, gpus)
    stream = workload(SimulateRequest(model=ask.model, **{k: getattr(ask, k) for k in WORKLOAD_FIELDS}))
    model = load(ask.model)
    found = simulation_ask(SimulateRequest(model=ask.model, engine=ask.engine, max_model_len=ask.max_model_len),
                           model)
    if not isinstance(found.engine, Simulates):
        raise KVBudgetError(f"engine {found.engine.name}: recommend simulates each candidate, and kvbudget "
                            "simulates vLLM, SGLang and llama.cpp", param="engine")
    found.engine.simulator().options(found)  # a release the scheduler model does not take fails here
    check_speculates(found, max(tokens) > 0)
    space = replace(space, speculative=_speculatives(ask, tokens))
    for spec in space.speculative:  # a method the engine does not run fails here, not once per candidate
        if spec is not None:
            found.engine.refuse_unchecked(model, replace(found.engine_options(), speculative=spec))
    scale = positive(ask.rate_scale, "rate_scale")
    requests = []
    for r in stream(scale):
        requests.append(r)
        if len(requests) > MAX_SEARCH_REQUESTS:
            raise KVBudgetError(f"slice: the traffic holds more than {MAX_SEARCH_REQUESTS:,} requests, which each "
                                f"candidate replays; give {named('slice', 'START:COUNT')} (e.g. 0:2000)",
                                param="slice")
    return Prepared(ask=found, requests=tuple(requests), slo=slo, space=space, prices=prices)


def recommendation(ask: RecommendRequest, ready: Prepared, progress: Callable[[int, int], None] | None = None,
                   check: Callable[[], None] | None = None) -> Recommendation:
    """The search of a prepared request (`check` as `recommend`'s: the serial backend only)."""
    from kvbudget.simulation.recommend import recommend

    return recommend(ready.ask, ready.requests, ready.slo, ready.space, ready.prices, router=ask.router,
                     kv_link=ask.kv_link, backend=ask.backend, exhaustive=ask.exhaustive, progress=progress,
                     check=check)


def deployment_dict(d: Deployment) -> dict[str, Any]:
    """A deployment as JSON: its fields, roles by their names."""
    out = asdict(d)
    for pool, plan in zip(out["pools"], d.pools, strict=True):
        pool["role"] = plan.role.value
        pool["speculative"] = plan.speculative.to_dict() if plan.speculative else None
    return out


def deployment_json(d: Deployment) -> str:
    """The deployment as the deployment.json that --out writes."""
    return json.dumps(deployment_dict(d), indent=1) + "\n"


def _deployment_path(folder: str) -> str:
    import os

    return os.path.join(folder, "deployment.json")


def _check_out(folder: str, force: bool) -> None:
    """--out: a folder, or one to make in a folder that exists; its files checked as every written file is."""
    import os

    from kvbudget.files import check_target

    if os.path.isdir(folder):
        check_target(_deployment_path(folder), "out", force)
        if os.listdir(folder) and not force:  # (the files depend on the answer: none may be replaced unasked)
            raise KVBudgetError(f"out {shown(folder)}: the folder has files already; give a new or empty folder, "
                                "or --force to replace the deployment's files in it", param="out")
    elif os.path.exists(folder) or not os.path.isdir(os.path.dirname(os.path.abspath(folder))):
        raise KVBudgetError(f"out {shown(folder)}: give a folder, or a new one inside a folder that exists",
                            param="out")


def write_out(ask: RecommendRequest, found: Recommendation) -> list[str]:
    """The chosen deployment's files under --out (kvbudget.deploy.write_all: the engine's command lines, the
    manifests, the guard's config and the alerts, each pool planned as it was simulated) and the deployment itself
    as JSON; the paths written."""
    import os

    from kvbudget.deploy import write_all
    from kvbudget.files import write_file

    assert ask.out is not None and found.best is not None
    os.makedirs(ask.out, exist_ok=True)
    deployment = found.deployment()
    setup = found.setups[found.best.candidate.setting]
    paths = list(write_all(deployment, ask.out, setup_for_pool=lambda pool: setup, force=ask.force, param="out"))
    path = _deployment_path(ask.out)
    write_file(path, deployment_json(deployment).encode(), "out", ask.force)
    return [*paths, path]
