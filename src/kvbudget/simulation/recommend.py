"""`recommend`: the cheapest deployment that meets latency objectives on a traffic, found by simulating it.

    >>> found = recommend(ask, requests, parse_slo("ttft_p99=2s,tpot_p99=50ms"), Space(gpus=("H100-80GB", "L40S")),
    ...                   {"H100-80GB": 2.49, "L40S": 0.86})
    >>> found.best.candidate, found.deployment()

The search, in four steps, each exact:
1. `candidates` lists every configuration of the `Space` the user allows: a GPU, tensor and pipeline parallel
   sizes, the engine's settings (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, KV dtype, prefix
   caching, a host offload tier, speculative decoding's draft tokens per step), and how many replicas serve
   together (co-located, or a prefill and a decode pool joined by a KV link), at most `max_gpus` GPUs in all.
2. Each distinct engine setting is planned once (`setup_of`, the exact memory plan): a setting the engine would
   refuse to start (the weights do not fit, the heads do not split, no room for one request) prunes every candidate
   made of it, and is never simulated; the reason is kept.
3. What is left is simulated on the whole traffic at its own rate (`simulate`, or `simulate_fleet` for several
   replicas), cheapest per hour first. Once a candidate meets every objective, nothing that costs more per hour
   is simulated (it cannot be the cheapest); every candidate that costs as much or less is. No other skip is made:
   latency is not monotone in resources (a larger batch can lengthen a step), so "a richer one failed" proves
   nothing and is not used.
4. The answer: the cheapest candidate meeting the objectives (ties: fewer GPUs, then the model's own KV dtype, then
   no speculative decoding (its gain rests on an acceptance rate), then the widest margin), the Pareto front of
   those simulated, and why each other one lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kvbudget import validate
from kvbudget.engines.scheduling.setup import Role
from kvbudget.errors import KVBudgetError
from kvbudget.simulation.cost import Cost, gpu_hours_cost
from kvbudget.simulation.percentiles import check_metric

if TYPE_CHECKING:
    from kvbudget.deployment import Deployment
    from kvbudget.engines.scheduling.setup import Setup, SimulationAsk
    from kvbudget.engines.scheduling.workload import Request
    from kvbudget.interconnects import KVLink

MAX_SEARCH_REQUESTS = 100_000  # requests one search replays per candidate (the traffic is held in memory)
BATCH = 16  # candidates simulated together (whole cost levels) before checking whether one met the objectives

# (space.py's, where callers have long found them)
from kvbudget.simulation.space import MAX_CANDIDATES as MAX_CANDIDATES  # noqa: E402
from kvbudget.simulation.space import MAX_SEARCH_GPUS as MAX_SEARCH_GPUS  # noqa: E402
from kvbudget.simulation.space import TP_SIZES as TP_SIZES  # noqa: E402
from kvbudget.simulation.space import Candidate as Candidate  # noqa: E402
from kvbudget.simulation.space import Space as Space  # noqa: E402
from kvbudget.simulation.space import candidates as candidates  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What one candidate's simulation gave, as the search keeps it (small: it crosses process boundaries)."""

    requests: int
    completed: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    gpu_hours: float
    values: dict[str, float | None]  # each objective's metric, and ttft/tpot/e2e p50 and p99
    missed: tuple[str, ...]  # what it failed of the objectives (search.missed)
    preemptions: int
    stopped: bool = False  # ended early, an objective certainly missed: no figures


SHOWN = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99")


def simulate_candidate(model: Any, requests: Sequence[Request], candidate: Candidate, setup: Setup,
                       slo: Mapping[str, float], router: str, link: KVLink | None, stop: bool = True,
                       check: Callable[[], None] | None = None) -> Measured:
    """One candidate through the traffic: one engine, or a fleet of its replicas (a module-level function of
    plain data, for a process pool or Ray). `stop`: end the run once an objective is certainly missed (its figures
    are then left out); `check` as `simulate`'s (called every few ms; what it raises ends the search)."""
    from kvbudget.simulation.earlystop import EarlyStop, Missed
    from kvbudget.simulation.fleet import simulate_fleet
    from kvbudget.simulation.routing import Pool
    from kvbudget.simulation.run import simulate
    from kvbudget.simulation.search import missed, shown

    c = candidate
    if c.disaggregated:
        pools = [Pool(name="prefill", setup=setup, replicas=c.prefill_replicas, role=Role.PREFILL),
                 Pool(name="decode", setup=setup, replicas=c.decode_replicas, role=Role.DECODE)]
    else:
        pools = [Pool(name="serve", setup=setup, replicas=c.replicas)]
    # (several sequences a request: a percentile counts requests, the hook sequences; no early stop then)
    watch = EarlyStop(requests, slo) if stop and all(r.n == 1 and not r.beam_search for r in requests) else None
    try:
        if c.expert_parallel:
            from kvbudget.simulation.expertgroup import simulate_expert_group

            sim: Any = simulate_expert_group(model, iter(requests), setup, on_finish=watch, check=check)
            gpu_hours = sim.gpu_hours
        elif c.replica_count == 1:
            sim = simulate(model, iter(requests), setup=setup, on_finish=watch, check=check)
            gpu_hours = c.gpus * sim.duration_s / 3600
        else:
            sim = simulate_fleet(model, iter(requests), pools, router, kv_link=link, on_finish=watch, check=check)
            gpu_hours = sim.gpu_hours
    except Missed:
        assert watch is not None and watch.stopped is not None
        name, past, limit = watch.stopped
        unit = getattr(limit, "unit", "ms" if limit < 1 else "s")
        why = f"{name} > {shown(limit, unit)} (already {past:,} of {len(requests):,} requests past it)"
        return Measured(requests=len(requests), completed=0, duration_s=0.0, prompt_tokens=0, output_tokens=0,
                        gpu_hours=0.0, values={}, missed=(why,), preemptions=0, stopped=True)
    return Measured(requests=sim.requests, completed=sim.completed, duration_s=sim.duration_s,
                    prompt_tokens=sim.prompt_tokens, output_tokens=sim.output_tokens, gpu_hours=gpu_hours,
                    values={name: sim.metric(name) for name in dict.fromkeys([*slo, *SHOWN])},
                    missed=missed(sim, slo), preemptions=sim.preemptions)


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """Candidates never simulated because the engine would not start their setting (or split it)."""

    setting: str  # one replica's setting in words
    reason: str  # the planner's or the engine's one-line error
    candidates: int


@dataclass(frozen=True, kw_only=True)
class Tried:
    """A simulated candidate with its price and what it cost per unit served."""

    candidate: Candidate
    measured: Measured
    price_per_hour: float  # the candidate's GPUs for an hour
    cost: Cost
    # each objective's value as a range: the error band of the metric's mean (bands.band_for: held-out runs judge
    # means) around it; None where no runs judge the setup's times
    bands: dict[str, tuple[float, float] | None]
    slo: dict[str, float] = field(repr=False)

    @property
    def met(self) -> bool:
        return not self.measured.missed

    @property
    def worst(self) -> float:
        """The largest value / limit over the objectives (above 1: missed; inf: one has no value)."""
        ratios = [(v / limit if v is not None else math.inf) for limit, v in
                  ((lim, self.measured.values.get(n)) for n, lim in self.slo.items())]
        return max(ratios) if self.measured.completed == self.measured.requests else math.inf

    @property
    def tokens_per_s_per_gpu(self) -> float:
        m = self.measured
        return (m.prompt_tokens + m.output_tokens) / m.duration_s / self.candidate.gpus if m.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.to_dict(), "label": self.candidate.label(), "met": self.met,
                "missed": list(self.measured.missed), "values_s": self.measured.values,
                "bands_s": {k: list(v) if v else None for k, v in self.bands.items()},
                "price_per_hour": self.price_per_hour, "cost": self.cost.to_dict(),
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "completed": self.measured.completed,
                "requests": self.measured.requests, "preemptions": self.measured.preemptions}


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """A search's answer: the cheapest candidate meeting the objectives (None: none did), the front, the rest."""

    model: str
    hub_id: str  # what the engine loads
    engine: str
    slo: dict[str, float]
    router: str
    kv_link: str | None
    listed: int  # candidates of the space
    pruned: tuple[Pruned, ...]
    skipped: int  # not simulated: they cost more per hour than a candidate that met the objectives
    tried: tuple[Tried, ...]  # simulated, cheapest first
    best: Tried | None
    setups: dict[tuple[Any, ...], Setup] = field(repr=False, compare=False)
    utilization: dict[tuple[Any, ...], float] = field(repr=False, compare=False)  # each setting's memory fraction
    model_dtype: str = ""

    @cached_property
    def front(self) -> tuple[Tried, ...]:
        """The simulated candidates that served every request and that no other beats on all of tokens per second
        per GPU, the worst objective's share of its limit, and cost per million tokens (the chosen one always);
        cheapest first. In the order of those keys, a candidate beaten is beaten by one already kept."""
        served = [(-t.tokens_per_s_per_gpu, t.worst, t.cost.per_million_tokens or math.inf, i, t)
                  for i, t in enumerate(self.tried) if t.measured.completed == t.measured.requests]
        kept: list[tuple[float, float, float, int, Tried]] = []
        for row in sorted(served, key=lambda r: r[:4]):
            if row[4] is self.best or not any(all(a <= b for a, b in zip(k[:3], row[:3], strict=True))
                                              and k[:3] != row[:3] for k in kept):
                kept.append(row)
        return tuple(row[4] for row in sorted(kept, key=lambda r: r[3]))

    @property
    def runners_up(self) -> tuple[tuple[Tried, str], ...]:
        """Every other simulated candidate and why it lost: the objectives it missed (value > limit), or what it
        costs more, or on a tie of cost, more GPUs or a thinner margin."""
        out = []
        for t in self.tried:
            if t is self.best:
                continue
            out.append((t, self.why_lost(t)))
        return tuple(out)

    def why_lost(self, t: Tried) -> str:
        if not t.met:
            return "; ".join(t.measured.missed)
        assert self.best is not None
        more = t.price_per_hour - self.best.price_per_hour
        if more > 1e-9:
            return f"costs ${more:,.2f}/hour more"
        if t.candidate.gpus > self.best.candidate.gpus:
            return f"same cost, {t.candidate.gpus - self.best.candidate.gpus} more GPUs"
        if _quantized(t.candidate) and not _quantized(self.best.candidate):
            return f"same cost, KV dtype {t.candidate.kv_dtype} (its quality to check) against the model's own"
        if t.candidate.speculative is not None and self.best.candidate.speculative is None:
            return f"same cost, speculative decoding ({t.candidate.speculative.label()}: its acceptance to check)"
        return (f"same cost, thinner margin (worst objective at {t.worst:.0%} of its limit, "
                f"against {self.best.worst:.0%})")

    @property
    def closest(self) -> Tried | None:
        """Where none met the objectives: the candidate that came nearest (the lowest worst share of a limit)."""
        return min(self.tried, key=lambda t: (t.worst, t.price_per_hour), default=None)

    @property
    def binding(self) -> str:
        """Where none met the objectives, in words: what binds, and the closest candidate."""
        if not self.tried:
            reasons = "; ".join(f"{p.setting}: {p.reason}" for p in self.pruned[:3])
            return f"no candidate can start (memory binds): {reasons}"
        near = self.closest
        assert near is not None
        return f"{'; '.join(near.measured.missed)} (closest: {near.candidate.label()})"

    def quality_checks(self) -> tuple[str, ...]:
        """For each KV dtype other than the model's among the answers: the `kvbudget quality` command to run."""
        dtypes = dict.fromkeys(t.candidate.kv_dtype for t in (self.best, *self.front) if t is not None)
        return tuple(f"kv {d}: check quality on your data: kvbudget quality PATH/TO/{self.hub_id} --data "
                     f"YOUR_PROMPTS.jsonl --kv-dtype {d} --engine {self.engine}"
                     for d in dtypes if d not in ("auto", self.model_dtype))

    def deployment(self) -> Deployment:
        """The winner as a `Deployment` (KVBudgetError where none met the objectives)."""
        from kvbudget.deployment import Deployment, PoolPlan
        from kvbudget.simulation.search import shown

        if self.best is None:
            raise KVBudgetError(f"slo: no candidate meets it: {self.binding}", param="slo")
        c = self.best.candidate
        setup = self.setups[c.setting]
        spec = c.speculative
        if spec is not None and spec.draft_id is not None:  # a catalog name as the Hub id the engine loads
            from kvbudget.catalog import find

            entry = find(spec.draft_id)
            spec = replace(spec, draft_id=entry.hf_id) if entry else spec
        plan = PoolPlan(gpu=c.gpu, tp=c.tp, pp=c.pp, max_num_seqs=setup.max_num_seqs,
                        max_num_batched_tokens=setup.max_num_batched_tokens, max_model_len=setup.max_model_len,
                        gpu_memory_utilization=self.utilization[c.setting], kv_dtype=c.kv_dtype,
                        prefix_caching=c.prefix_caching, offload_bytes=c.offload_memory,
                        replicas=1 if c.expert_parallel else c.replicas or 1, speculative=spec,
                        expert_ranks=c.replicas if c.expert_parallel else 1)
        pools = ((replace(plan, role=Role.PREFILL, replicas=c.prefill_replicas),
                  replace(plan, role=Role.DECODE, replicas=c.decode_replicas)) if c.disaggregated else (plan,))
        objectives = ", ".join(f"{k} <= {shown(v, getattr(v, 'unit', 's'))}" for k, v in self.slo.items())
        notes = (f"chosen by kvbudget recommend for {objectives}",
                 *((f"speculative decoding {spec.label()}: acceptance {spec.acceptance_source}; the time it buys "
                    "rests on it: measure it on your traffic",) if spec else ()),
                 *self.quality_checks())
        return Deployment(model=self.hub_id, engine=self.engine, pools=pools, router=self.router,
                          kv_link=self.kv_link if c.disaggregated else None, notes=notes)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "hub_id": self.hub_id, "engine": self.engine, "slo_s": dict(self.slo),
                "router": self.router, "kv_link": self.kv_link,
                "candidates": {"listed": self.listed, "pruned": sum(p.candidates for p in self.pruned),
                               "simulated": len(self.tried), "skipped": self.skipped},
                "best": self.best.to_dict() if self.best else None,
                "binding": None if self.best else self.binding,
                "front": [t.to_dict() for t in self.front],
                "runners_up": [{**t.to_dict(), "why": why} for t, why in self.runners_up],
                "pruned": [p.__dict__ for p in self.pruned], "quality_checks": list(self.quality_checks())}


Progress = Callable[[int, int], None]


def recommend(ask: SimulationAsk, requests: Sequence[Request], slo: Mapping[str, float], space: Space,
              prices: Mapping[str | None, float], *, router: str = "round-robin", kv_link: str = "infiniband",
              backend: str = "process", exhaustive: bool = False, progress: Progress | None = None,
              batch: int = BATCH, early_stop: bool = True, check: Callable[[], None] | None = None
              ) -> Recommendation:
    """Search `space` for the cheapest candidate whose simulation of `requests` meets `slo`. `ask` holds the
    model, engine and every setting not searched (its gpu, tp, pp and searched settings are replaced per
    candidate); `prices` as `cost.parse_prices` gives them (every GPU of the space priced); `exhaustive`: simulate
    every candidate that starts, not only those up to the winner's cost (a fuller front, more time); `check()`,
    called every few ms of every simulation, ends the search by raising (the serial backend only: it runs here)."""
    from kvbudget.simulation.cost import price_for
    from kvbudget.simulation.parallel import check_backend, run_all

    for name in slo:
        check_metric(name)
    check_backend(backend)
    if check is not None and backend != "serial":
        raise KVBudgetError(f"backend {backend}: a search with a check runs serially; give serial", param="backend")
    validate.positive(batch, "batch", "candidates")
    if not requests:
        raise KVBudgetError("trace: the traffic holds no request; give a longer slice or another trace",
                            param="trace")
    price = {gpu: price_for(dict(prices), gpu) for gpu in space.gpus}  # an unpriced GPU fails before any plan
    check_speculates(ask, any(s is not None for s in space.speculative))
    listed = candidates(space, searches_expert_groups(ask))
    setups, utilization, pruned, links = _plan(ask, listed, kv_link)
    alive = [c for c in listed if c.setting in setups and (not c.disaggregated or (c.gpu, c.setting) in links)]
    _check_lengths(requests, setups.values())
    alive.sort(key=lambda c: (_cost_of(c, price), c.gpus))

    def call(c: Candidate, stop: bool) -> tuple[Any, ...]:  # simulate_candidate's arguments
        link = links.get((c.gpu, c.setting)) if c.disaggregated else None
        return (ask.model, requests, c, setups[c.setting], dict(slo), router, link, stop,
                *((check,) if check is not None else ()))

    tried: list[Tried] = []
    done, met_at = 0, math.inf
    while done < len(alive) and (exhaustive or _cost_of(alive[done], price) <= met_at + 1e-9):
        end = done + 1
        while end < len(alive) and (exhaustive or end - done < batch or _cost_of(alive[end], price) ==
                                    _cost_of(alive[end - 1], price)):
            end += 1
        chunk = alive[done:end]
        results = run_all(simulate_candidate, [call(c, early_stop) for c in chunk], backend,
                          _shifted(progress, done, len(alive)))
        for c, m in zip(chunk, results, strict=True):
            t = _tried(c, m, price[c.gpu], setups[c.setting], slo)
            tried.append(t)
            if t.met:
                met_at = min(met_at, t.price_per_hour)
        done = end
    meeting = [t for t in tried if t.met]
    stopped = [i for i, t in enumerate(tried) if t.measured.stopped]
    if not meeting and stopped:  # none met: the runs cut short, run whole, for their figures and the closest
        whole = run_all(simulate_candidate, [call(tried[i].candidate, False) for i in stopped], backend)
        for i, m in zip(stopped, whole, strict=True):
            c = tried[i].candidate
            tried[i] = _tried(c, m, price[c.gpu], setups[c.setting], slo)
    best = min(meeting, key=lambda t: (t.price_per_hour, t.candidate.gpus, _quantized(t.candidate),
                                       t.candidate.speculative is not None, t.worst), default=None)
    from kvbudget.catalog import find

    entry = find(ask.model.name)
    return Recommendation(model=ask.model.name, hub_id=entry.hf_id if entry else ask.model.name,
                          engine=ask.engine.name, slo=dict(slo), router=router,
                          kv_link=kv_link if space.disaggregated else None, listed=len(listed),
                          pruned=tuple(pruned), skipped=len(alive) - done, tried=tuple(tried), best=best,
                          setups=setups, utilization=utilization, model_dtype=ask.model.dtype)


def searches_expert_groups(ask: SimulationAsk) -> bool:
    """Whether the model has routed experts to spread and the engine's expert-parallel groups are simulated."""
    from kvbudget.engines.scheduling.setup import Simulates
    from kvbudget.errors import ConfigError
    from kvbudget.model.params import count_parameters

    if not (ask.engine.expert_parallel and isinstance(ask.engine, Simulates)
            and ask.engine.simulator().expert_groups):
        return False
    try:
        return any(g.part == "experts" for g in count_parameters(ask.model).groups)
    except ConfigError:
        return False


def check_speculates(ask: SimulationAsk, drafting: bool) -> None:
    """Refuse speculative decoding in a search on an engine whose drafting the simulator does not follow (each such
    candidate would be pruned, unsimulated)."""
    from kvbudget.engines.scheduling.setup import Simulates

    if drafting and not (isinstance(ask.engine, Simulates) and ask.engine.simulator().speculates):
        raise KVBudgetError(f"speculative: recommend simulates each candidate, and kvbudget's simulator does not "
                            f"follow {ask.engine.name}'s drafting; leave it out or give another engine",
                            param="speculative")


def _check_lengths(requests: Sequence[Request], setups: Iterable[Setup]) -> None:
    """Refuse, before any run, a prompt past a setup's max_model_len (the engine rejects it: every run would stop
    there)."""
    longest = max(requests, key=lambda r: r.prompt_tokens)
    for setup in setups:
        if longest.prompt_tokens + 1 > setup.max_model_len:
            raise KVBudgetError(f"max_model_len: request {longest.id or '?'}'s prompt of {longest.prompt_tokens:,} "
                                f"tokens does not fit max_model_len {setup.max_model_len:,} (the engine rejects it); "
                                "raise max_model_len or filter the trace", param="max_model_len")


def _quantized(c: Candidate) -> bool:
    """Whether the candidate stores KV in a dtype other than the model's (a tie goes to the model's own)."""
    return c.kv_dtype != "auto"


def _shifted(progress: Progress | None, done: int, total: int) -> Progress | None:
    """A chunk's progress as the whole search's."""
    if progress is None:
        return None
    report = progress
    return lambda k, _n: report(done + k, total)


def _cost_of(c: Candidate, price: Mapping[str, float]) -> float:
    return price[c.gpu] * c.gpus


def _tried(c: Candidate, m: Measured, price: float, setup: Setup, slo: Mapping[str, float]) -> Tried:
    from kvbudget.simulation.bands import band_for

    bands: dict[str, tuple[float, float] | None] = {}
    for name in slo:
        band, value = band_for(setup, name.split("_")[0]), m.values.get(name)
        bands[name] = band.around(value) if band is not None and value is not None else None
    cost = gpu_hours_cost(m.gpu_hours, m.duration_s, m.prompt_tokens, m.output_tokens, m.completed, price, c.gpus)
    return Tried(candidate=c, measured=m, price_per_hour=price * c.gpus, cost=cost, bands=bands, slo=dict(slo))


def _plan(ask: SimulationAsk, listed: Iterable[Candidate], kv_link: str
          ) -> tuple[dict[tuple[Any, ...], Setup], dict[tuple[Any, ...], float], list[Pruned], dict[Any, KVLink]]:
    """Each distinct setting planned once: its setup and memory fraction, or why the engine would not start it;
    and the KV link of each GPU whose setting can be split into prefill and decode."""
    from kvbudget.engines import EngineOptions
    from kvbudget.gpus import find_gpu
    from kvbudget.interconnects import kv_link as read_link
    from kvbudget.simulation.run import setup_of

    setups: dict[tuple[Any, ...], Setup] = {}
    utilization: dict[tuple[Any, ...], float] = {}
    refused: dict[tuple[Any, ...], str] = {}
    links: dict[Any, KVLink] = {}
    split_refused: dict[tuple[Any, ...], str] = {}
    counts: dict[tuple[Any, ...], int] = {}
    split_counts: dict[tuple[Any, ...], int] = {}
    for c in listed:
        key = c.setting
        if key not in setups and key not in refused:
            try:
                setups[key] = setup = setup_of(replace(
                    ask, gpu=c.gpu, tp=c.tp, pp=c.pp, max_num_seqs=c.max_num_seqs,
                    max_num_batched_tokens=c.max_num_batched_tokens, utilization=c.gpu_memory_utilization,
                    kv_dtype=c.kv_dtype, prefix_caching=c.prefix_caching, offload_memory=c.offload_memory,
                    speculative=c.speculative, expert_parallel=key[-1]))
                card = find_gpu(c.gpu)
                utilization[key] = c.gpu_memory_utilization or ask.engine.serving(
                    card.memory_bytes, setup.max_model_len, EngineOptions(speculative=c.speculative),
                    gpu_name=card.name, tp=c.tp,
                    model=ask.model).memory_fraction
            except KVBudgetError as exc:
                refused[key] = str(exc)
        if key in refused:
            counts[key] = counts.get(key, 0) + 1
            continue
        if c.disaggregated and (c.gpu, key) not in links:
            if key not in split_refused:
                why = setups[key].simulator.disaggregation(setups[key])
                if why is None:
                    try:
                        links[(c.gpu, key)] = read_link(kv_link, [find_gpu(c.gpu)])
                    except KVBudgetError as exc:
                        why = str(exc)
                if why is not None:
                    split_refused[key] = why
            if key in split_refused:
                split_counts[key] = split_counts.get(key, 0) + 1
    pruned = [Pruned(setting=_setting_label(k), reason=refused[k], candidates=n) for k, n in counts.items()]
    pruned += [Pruned(setting=_setting_label(k) + ", disaggregated", reason=split_refused[k], candidates=n)
               for k, n in split_counts.items()]
    return setups, utilization, pruned, links


def _setting_label(key: tuple[Any, ...]) -> str:
    gpu, tp, pp, seqs, tokens, util, kv, cached, offload, spec, ranks = key
    one = Candidate(gpu=gpu, tp=tp, pp=pp, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                    gpu_memory_utilization=util, kv_dtype=kv, prefix_caching=cached, offload_memory=offload,
                    speculative=spec, replicas=ranks, expert_parallel=ranks > 1)
    return one.label().removeprefix("1 x ")
