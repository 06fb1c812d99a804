"""`simulate` for a fleet: `replicas` copies of the deployment, or the pools of a fleet file, behind a `router`.

A fleet file is YAML, read strictly (every key known, every value checked, before any simulation):

    router: length:2048            # optional; as --router (default round-robin)
    pools:                         # in order: the length router's pools go from short to long
      - name: short
        replicas: 4
        gpu: L40S                  # any of simulate's deployment settings, by their names; the command line's
        max_model_len: 4096        # settings are every pool's defaults
      - name: long
        replicas: 2
        tp: 2

Each pool's settings replace the command line's in the request, which is then read as one `simulate` reads it
(`simulation_ask`), so a pool's values are refused with the same words, prefixed with the file and the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from kvbudget.commands.options import build, one, options
from kvbudget.commands.simulate import MEMORY, SCHEDULER, SimulateRequest, prepared, prices, simulation_ask
from kvbudget.errors import KVBudgetError, named
from kvbudget.validate import count, shown

if TYPE_CHECKING:
    from kvbudget.engines.scheduling.setup import SimulationAsk
    from kvbudget.simulation.cost import Cost
    from kvbudget.simulation.fleet import FleetSimulation, Pool, Router

MAX_POOLS = 64  # pools in a fleet file: each is planned before the run (milliseconds each), and printed a line each
MAX_NAME = 64  # characters in a pool's name (it heads a table row)
SHOWN_REPLICAS = 32  # replicas the summary lists one by one; more are in --json
POOL_KEYS = frozenset({"engine", "kv_dtype"} | {name for name, _, opt in options(SimulateRequest)
                                                 if opt.group in (MEMORY, SCHEDULER)})
SWITCHES = frozenset(name for name, default, _ in options(SimulateRequest) if isinstance(default, bool))
ROLES = ("both", "prefill", "decode")  # a pool's `role` in a fleet file (Role's values)
# simulate's settings that make no sense for a fleet (yet), each with why
NOT_FOR_FLEETS = {
    "prometheus_series": "writes one engine's gauges, and a fleet has one engine per replica: leave it out (plot and "
                         "json show each replica's)",
    "find_max_rate": "searches one engine's highest rate; not a fleet's yet: simulate the fleet at a few rate_scale "
                     "values instead",
    "slo": "goes with find_max_rate, which a fleet does not take yet: leave it out",
    "max_concurrency": "a closed loop of clients in front of one engine, not yet in front of a fleet: leave it out",
}


@dataclass(frozen=True, kw_only=True)
class PoolAsk:
    """One pool of a fleet as asked: its name, replicas, and the simulation its replicas each run."""

    name: str
    replicas: int
    found: SimulationAsk
    role: str = "both"  # both, or one side of disaggregated prefill and decode (Role's value)


@dataclass(frozen=True, kw_only=True)
class FleetAsk:
    """A fleet as asked: its pools in order, and its router (a name, as parse_router reads it)."""

    pools: tuple[PoolAsk, ...]
    router: str
    source: str  # where the pools came from, for errors: "replicas" or the fleet file's path
    autoscale: str | None = None  # the autoscaler's policy (parse_autoscale's text), from the flag or the file
    kv_link: str | None = None  # what moves the KV from prefill to decode pools (interconnects.kv_link's text)


# each makes a fleet (of one replica where no more are asked for)
FRONT = ("autoscale", "load_bandwidth", "flow_control", "max_num_queued_reqs", "max_num_queued_tokens")


def is_fleet(ask: SimulateRequest) -> bool:
    """Whether the request runs as a fleet: replicas, expert-parallel ranks, a router, a front door (the llm-d
    router's flow control among them) or disaggregated sides asked for."""
    from kvbudget.choices import Admission

    return ask.replicas is not None or ask.expert_parallel or ask.fleet is not None or ask.router is not None or \
        ask.admission == Admission.LLMD or any(getattr(ask, name) is not None for name in (*FRONT, *SIDES))


SIDES = ("prefill_replicas", "decode_replicas", "kv_link")  # disaggregated prefill and decode from the flags


def scaling(ask: SimulateRequest, policy: str | None = None) -> dict[str, Any]:
    """simulate_fleet's autoscaler and front door from a request (the autoscaler's policy from the fleet file where
    it has one), each read and refused in one line before any run."""
    from kvbudget.commands.simulate import front_settings
    from kvbudget.simulation.autoscale import parse_autoscale, read_load_bandwidth
    from kvbudget.simulation.fleet import MAX_REPLICAS
    from kvbudget.simulation.front import parse_flow_control

    text = policy or ask.autoscale
    if ask.load_bandwidth is not None and text is None:
        raise KVBudgetError(f"load_bandwidth: the speed a replica the autoscaler adds loads its weights at; give "
                            f"{named('autoscale', 'POLICY')} too", param="load_bandwidth")
    bandwidth = None if ask.load_bandwidth is None else read_load_bandwidth(ask.load_bandwidth)
    chosen = dict(front_settings(ask))
    chosen.pop("max_concurrency", None)  # (refused for fleets in check_request)
    if text is not None:
        chosen["autoscale"] = parse_autoscale(text, load_bandwidth=bandwidth, most=MAX_REPLICAS)
    if ask.flow_control is not None:
        chosen["flow_control"] = parse_flow_control(ask.flow_control)
    return chosen


def queue_limits(ask: SimulateRequest) -> tuple[int | None, int | None]:
    """vLLM's --max-num-queued-reqs and --max-num-queued-tokens as each pool of the fleet takes them."""
    from kvbudget.commands.options import optional_one

    return (optional_one(ask.max_num_queued_reqs, "max_num_queued_reqs"),
            optional_one(ask.max_num_queued_tokens, "max_num_queued_tokens"))


def check_request(ask: SimulateRequest) -> None:
    """What a fleet request cannot have, refused in one line before any work."""
    if ask.fleet is not None and ask.replicas is not None:
        raise KVBudgetError(f"replicas: the fleet file's pools say their replicas; give {named('fleet')} or "
                            f"{named('replicas')}, not both", param="replicas")
    if ask.router is not None and ask.replicas is None and ask.fleet is None and ask.autoscale is None and \
            ask.prefill_replicas is None and ask.decode_replicas is None:
        raise KVBudgetError(f"router: spreads requests over replicas; give {named('replicas', 'N')}, "
                            f"{named('prefill_replicas', 'P')}, {named('fleet', 'FILE')} or "
                            f"{named('autoscale', 'POLICY')} too", param="router")
    if ask.replicas is not None:
        from kvbudget.simulation.fleet import MAX_REPLICAS

        one(ask.replicas, "replicas", MAX_REPLICAS)
    if ask.expert_parallel:
        if ask.replicas is None or one(ask.replicas, "replicas") < 2:
            raise KVBudgetError(f"expert_parallel: the ranks are the replicas; give {named('replicas', 'N')} with N "
                                "of 2 or more", param="expert_parallel")
        for param in ("router", "fleet", "autoscale", "prefill_replicas", "decode_replicas", "admission",
                      "flow_control", "max_num_queued_reqs", "max_num_queued_tokens"):
            if getattr(ask, param, None) is not None:
                raise KVBudgetError(f"{param}: not with {named('expert_parallel')} (one group behind vLLM's own "
                                    "balancer) yet", param=param)
    for param, why in NOT_FOR_FLEETS.items():
        if getattr(ask, param):
            raise KVBudgetError(f"{param}: {why}", param=param)
    if ask.prefill_replicas is not None or ask.decode_replicas is not None:
        for param in ("replicas", "fleet"):
            if getattr(ask, param) is not None:
                raise KVBudgetError(f"{param}: {named('prefill_replicas')} and {named('decode_replicas')} make the "
                                    f"fleet's two pools; give them or {named(param)}, not both", param=param)
        from kvbudget.commands.simulate import disaggregated

        disaggregated(ask)  # both sides and the link given, each read
    elif ask.kv_link is not None and ask.fleet is None:
        raise KVBudgetError(f"kv_link: goes with {named('prefill_replicas')} and {named('decode_replicas')}, or a "
                            f"{named('fleet')} file whose pools have roles", param="kv_link")
    scaling(ask)
    queue_limits(ask)
    if ask.fleet is not None:
        for param in ("calibrate", "calibration", "save_calibration"):
            if getattr(ask, param):
                raise KVBudgetError(f"{param}: a calibration is of one deployment; a fleet file's pools may differ: "
                                    f"give {named('replicas', 'N')} instead of {named('fleet')}", param=param)


FLEET_SWEEPS = ("replicas", "router")  # what --sweep varies of a fleet
NOT_SETUP = frozenset({"rate_scale", *FLEET_SWEEPS})  # a sweep's settings that are not the deployment's


def sweep_figures(sim: FleetSimulation) -> tuple[int, float]:
    """A fleet's row of a sweep's table: a replica's KV tokens, and the highest replica's peak KV usage."""
    return sim.pools[0].setup.token_slots, max(r.simulation.peak_usage for r in sim.replicas)


def sweep_notes(sim: FleetSimulation) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for r in sim.replicas for n in r.simulation.notes))


def sweeps_fleets(ask: SimulateRequest, combos: Sequence[dict[str, Any]]) -> bool:
    """Whether a sweep's configurations are fleets: replicas or a router given, or swept."""
    return is_fleet(ask) or any(key in combo for combo in combos for key in FLEET_SWEEPS)


def check_sweep(ask: SimulateRequest, combos: Sequence[dict[str, Any]]) -> None:
    """A sweep of fleets, refused in one line before any run where it cannot be: a fleet file's pools (only
    `replicas` copies of the deployment are swept), what a fleet does not take, and every configuration's replicas
    and router read first."""
    from kvbudget.simulation.fleet import MAX_REPLICAS, parse_router

    if ask.fleet is not None:
        raise KVBudgetError(f"sweep: varies one deployment, not a fleet file's pools; give {named('replicas', 'N')} "
                            f"instead of {named('fleet')}, or sweep {', '.join(FLEET_SWEEPS)}", param="sweep")
    check_request(ask)

    def router(text: str) -> None:
        if text.strip().startswith("length"):
            raise KVBudgetError(f"router {text}: sorts requests into pools, and a sweep's fleet has one; give a "
                                f"fleet file with {named('fleet')} (without {named('sweep')})", param="router")
        parse_router(text)

    if ask.router is not None:
        router(ask.router)
    for combo in combos:
        try:
            if "replicas" in combo:
                count(combo["replicas"], "replicas", 1, MAX_REPLICAS)
            if "router" in combo:
                router(combo["router"])
        except KVBudgetError as exc:
            raise KVBudgetError(f"sweep: {exc.args[0]}", param="sweep") from None


def fleet_point(ask: SimulateRequest, found: SimulationAsk, combo: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One configuration of a sweep of fleets, (its settings, its run without the replicas' timelines): `replicas`
    copies of `found` with the configuration's settings, behind its router. A module-level function of plain data,
    as `sweep_point` (the workload rebuilt where it runs)."""
    from kvbudget.commands.options import positive
    from kvbudget.commands.simulate import workload
    from kvbudget.simulation.fleet import Pool, simulate_fleet
    from kvbudget.simulation.run import setup_of
    from kvbudget.simulation.search import ask_with

    combo = dict(combo)
    scale = combo.pop("rate_scale", positive(ask.rate_scale, "rate_scale"))
    replicas = combo.pop("replicas", None) or one(ask.replicas or "1", "replicas")
    router = combo.pop("router", None) or ask.router or "round-robin"
    point = ask_with(found, combo)
    reqs, tokens = queue_limits(ask)
    pools = [Pool(name="main", setup=setup_of(point), replicas=replicas, gpus=point.tp * point.pp,
                  max_num_queued_reqs=reqs, max_num_queued_tokens=tokens)]
    sim = simulate_fleet(found.model, workload(ask)(scale), pools, router, fast=not ask.reference, **scaling(ask))
    bare = tuple(replace(r, simulation=replace(r.simulation, timeline=())) for r in sim.replicas)
    return {**combo, "replicas": replicas, "router": router, "rate_scale": scale}, replace(sim, replicas=bare)


def _flat(request: Any) -> dict[str, Any]:
    """A request's options by name (a part's in its place), as `build` takes them."""
    values: dict[str, Any] = {}
    for f in fields(request):
        if "part" in f.metadata:
            values.update(_flat(getattr(request, f.name)))
        else:
            values[f.name] = getattr(request, f.name)
    return values


def _value(value: Any, key: str, where: str) -> Any:
    """A pool's setting as the request holds it: a switch's true or false, else its text (numbers as written)."""
    if key in SWITCHES:
        if not isinstance(value, bool):
            raise KVBudgetError(f"{where}: {key}: {shown(value)} must be true or false", param="fleet")
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise KVBudgetError(f"{where}: {key}: {shown(value)} must be a value (a number or text), not a "
                            f"{'switch' if isinstance(value, bool) else type(value).__name__}", param="fleet")
    return str(value)


def _pool(entry: Any, i: int, path: str) -> tuple[str, int, dict[str, Any]]:
    """(name, replicas, settings) of the i-th pool of a fleet file, every key checked."""
    where = f"fleet {path}: pool {i + 1}"
    if not isinstance(entry, dict):
        raise KVBudgetError(f"{where}: must be a mapping of settings (name, replicas, gpu, ...)", param="fleet")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        raise KVBudgetError(f"{where}: name: {shown(name)} must be a name of 1 to {MAX_NAME} printable characters",
                            param="fleet")
    where = f"fleet {path}: pool {name}"
    from kvbudget.simulation.fleet import MAX_REPLICAS

    replicas = entry.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise KVBudgetError(f"{where}: replicas: {shown(replicas)} must be a whole number from 1 to "
                            f"{MAX_REPLICAS:,}", param="fleet")
    settings: dict[str, Any] = {}
    for key, value in entry.items():
        if key in ("name", "replicas"):
            continue
        if key == "role":
            if value not in ROLES:
                raise KVBudgetError(f"{where}: role: {shown(value)} must be one of {', '.join(ROLES)}",
                                    param="fleet")
            settings[key] = value
            continue
        if key not in POOL_KEYS:
            hint = (f" (write {key.replace('-', '_')})" if isinstance(key, str) and key.replace("-", "_") in POOL_KEYS
                    else "")
            raise KVBudgetError(f"{where}: unknown key {shown(key)}{hint}; a pool takes name, replicas and "
                                "simulate's deployment settings (gpu, tp, engine, kv_dtype, kv_memory, max_num_seqs, "
                                "max_num_batched_tokens, max_model_len, ...)", param="fleet")
        settings[key] = _value(value, key, where)
    return name, replicas, settings


def read_fleet_file(path: str) -> tuple[list[tuple[str, int, dict[str, Any]]], str | None, str | None, str | None]:
    """The pools of a fleet file ((name, replicas, settings) each, in order; a pool's `role` among its settings),
    its router, its autoscaler's policy and its kv_link (None: not given)."""
    try:
        import yaml  # noqa: F401  (only whether it is installed)
    except ImportError:
        raise KVBudgetError("fleet needs PyYAML: pip install 'kvbudget[guard]'", param="fleet") from None
    from kvbudget.files import read_yaml

    try:
        doc = read_yaml(path, "fleet")  # within the size and nesting bounds, UTF-8 text, safe_load
    except KVBudgetError as exc:
        raise KVBudgetError(f"fleet {exc.args[0]}", param="fleet") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise KVBudgetError(f"fleet {path}: must be a YAML mapping with pools (a list) and router", param="fleet")
    for key in doc:
        if key not in ("pools", "router", "autoscale", "kv_link"):
            raise KVBudgetError(f"fleet {path}: unknown key {shown(key)}; a fleet file has pools, router, "
                                "autoscale and kv_link", param="fleet")
    router = doc.get("router")
    if router is not None and (not isinstance(router, str) or not router.strip()):
        raise KVBudgetError(f"fleet {path}: router: {shown(router)} must be a router's name, e.g. least-requests",
                            param="fleet")
    link = doc.get("kv_link")
    if link is not None and (isinstance(link, bool) or not isinstance(link, str | int | float)):
        raise KVBudgetError(f"fleet {path}: kv_link: {shown(link)} must be a link's name or a rate, e.g. "
                            "infiniband or 25GB/s", param="fleet")
    policy = doc.get("autoscale")
    if policy is not None:
        from kvbudget.simulation.autoscale import parse_autoscale

        if not isinstance(policy, str) or not policy.strip():
            raise KVBudgetError(f"fleet {path}: autoscale: {shown(policy)} must be a policy, e.g. "
                                "kv:pool=decode,max=8", param="fleet")
        try:
            parse_autoscale(policy)
        except KVBudgetError as exc:
            raise KVBudgetError(f"fleet {path}: {exc.args[0]}", param="fleet") from None
    pools = doc.get("pools")
    if not isinstance(pools, list) or not 1 <= len(pools) <= MAX_POOLS:
        raise KVBudgetError(f"fleet {path}: pools: give a list of 1 to {MAX_POOLS} pools, each with a name",
                            param="fleet")
    read = [_pool(entry, i, path) for i, entry in enumerate(pools)]
    names = [name for name, _, _ in read]
    for name in names:
        if names.count(name) > 1:
            raise KVBudgetError(f"fleet {path}: pool {name}: two pools have this name; give each its own",
                                param="fleet")
    return read, router, policy, None if link is None else str(link)


def fleet_ask(ask: SimulateRequest, found: SimulationAsk) -> FleetAsk:
    """The fleet a request asks for: `replicas` copies of the deployment `found` (as `prepared` read it), or the
    fleet file's pools, each the request with the pool's settings read as simulate reads them."""
    if ask.fleet is None and ask.prefill_replicas is not None:
        from kvbudget.commands.simulate import disaggregated

        sides = disaggregated(ask)
        assert sides is not None
        return FleetAsk(pools=(PoolAsk(name="prefill", replicas=sides[0], found=found, role="prefill"),
                               PoolAsk(name="decode", replicas=sides[1], found=found, role="decode")),
                        router=ask.router or "round-robin", source="replicas", autoscale=ask.autoscale,
                        kv_link=ask.kv_link)
    if ask.fleet is None:
        return FleetAsk(pools=(PoolAsk(name="main", replicas=one(ask.replicas or "1", "replicas"), found=found),),
                        router=ask.router or "round-robin", source="replicas", autoscale=ask.autoscale)
    read, router, policy, link = read_fleet_file(ask.fleet)
    if router is not None and ask.router is not None:
        raise KVBudgetError(f"router: the fleet file {ask.fleet} names its router ({router}); give it in one place",
                            param="router")
    if policy is not None and ask.autoscale is not None:
        raise KVBudgetError(f"autoscale: the fleet file {ask.fleet} names its autoscaler ({policy}); give it in one "
                            "place", param="autoscale")
    if link is not None and ask.kv_link is not None:
        raise KVBudgetError(f"kv_link: the fleet file {ask.fleet} names its link ({link}); give it in one place",
                            param="kv_link")
    base = _flat(ask)
    pools = []
    for name, replicas, settings in read:
        role = settings.pop("role", "both")
        try:
            pool_found = simulation_ask(build(SimulateRequest, {**base, **settings}), found.model)
        except KVBudgetError as exc:
            raise _in_pool(exc, ask.fleet, name) from None
        pools.append(PoolAsk(name=name, replicas=replicas, found=pool_found, role=role))
    return FleetAsk(pools=tuple(pools), router=router or ask.router or "round-robin", source=ask.fleet,
                    autoscale=policy or ask.autoscale, kv_link=link or ask.kv_link)


def _in_pool(exc: KVBudgetError, path: str, pool: str) -> KVBudgetError:
    """A pool's error as one line naming the file and the pool (its parameter a key of the pool)."""
    raw = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return type(exc)(f"fleet {path}: pool {pool}: {raw.splitlines()[0]}", param="fleet")


def pools_of(fleet: FleetAsk, limits: tuple[int | None, int | None] = (None, None)) -> tuple[list[Pool], Router]:
    """The fleet's pools, each planned (a pool that cannot hold one request of its max_model_len refused, naming
    it), and its router; `limits`: vLLM's queue limits every pool takes (queue_limits)."""
    from kvbudget.engines.scheduling.setup import Role, Simulates
    from kvbudget.simulation.fleet import Pool, check_pools, parse_router
    from kvbudget.simulation.run import setup_of

    pools = []
    for p in fleet.pools:
        try:
            if isinstance(p.found.engine, Simulates):
                p.found.engine.simulator().options(p.found)
            pools.append(Pool(name=p.name, setup=setup_of(p.found), replicas=p.replicas, role=Role(p.role),
                              gpus=p.found.tp * p.found.pp, max_num_queued_reqs=limits[0],
                              max_num_queued_tokens=limits[1]))
        except KVBudgetError as exc:
            if fleet.source == "replicas":
                raise
            raise _in_pool(exc, fleet.source, p.name) from None
    check_pools(pools)
    try:
        router = parse_router(fleet.router, pools)
    except KVBudgetError as exc:
        if fleet.source == "replicas" or fleet.router is None:
            raise
        raise KVBudgetError(f"fleet {fleet.source}: {exc.args[0]}", param="fleet") from None
    return pools, router


def check_lengths(requests: Iterable[Any], pools: Sequence[Pool], router: Router, source: str) -> None:
    """Refuse, before the run, a pool that the router may send a request of the workload it cannot hold (a prompt
    past its max_model_len, which the engine rejects): one pass over the workload, keeping only the longest prompt
    each pool may get (the length router's pools by their bounds, every pool under the other routers)."""
    from kvbudget.simulation.fleet import Length

    bounds = router.bounds if isinstance(router, Length) else ()
    longest = [(0, "")] * (len(bounds) + 1)
    for r in requests:
        k = next((i for i, b in enumerate(bounds) if r.prompt_tokens <= b), len(bounds))
        if r.prompt_tokens > longest[k][0]:
            longest[k] = (r.prompt_tokens, r.id)
    for i, pool in enumerate(pools):
        tokens, rid = longest[min(i, len(bounds))] if bounds else longest[0]
        if tokens + 1 > pool.setup.max_model_len:
            where = f"fleet {source}: pool {pool.name}" if source != "replicas" else "max_model_len"
            raise KVBudgetError(f"{where}: request {rid or '?'}'s prompt of {tokens:,} tokens does not fit its "
                                f"max_model_len {pool.setup.max_model_len:,} (the engine rejects it) and the router "
                                f"{router.name} may send it there; raise max_model_len or filter the trace",
                                param="fleet" if source != "replicas" else "max_model_len")


def fleet_prepared(ask: SimulateRequest) -> tuple[Callable[[float], Iterable[Any]], FleetAsk, list[Pool], Router,
                                                 float]:
    """(workload by rate scale, the fleet asked, its pools planned, its router, rate scale), every setting checked
    and every pool planned before any simulation."""
    check_request(ask)
    stream, found, scale = prepared(replace(ask, gpu_price=None))  # each pool's GPU priced below
    fleet = fleet_ask(ask, found)
    pools, router = pools_of(fleet, queue_limits(ask))
    fleet_gpus(ask, fleet)  # every pool's GPU priced, before the run
    check_lengths(stream(scale), pools, router, fleet.source)
    return stream, fleet, pools, router, scale


def fleet_simulation(ask: SimulateRequest, progress: Callable[[int], None] | None = None,
                     check: Callable[[], None] | None = None, **hooks: Any) -> tuple[FleetSimulation, FleetAsk]:
    """One simulated run of a fleet request, and the fleet it asked for; `hooks`: simulate_fleet's on_step,
    on_finish."""
    from kvbudget.simulation.fleet import simulate_fleet

    stream, fleet, pools, router, scale = fleet_prepared(ask)
    if pools[0].setup.expert_group is not None:
        from kvbudget.simulation.expertgroup import simulate_expert_group

        return simulate_expert_group(fleet.pools[0].found.model, stream(scale), pools[0].setup, progress=progress,
                                     check=check, **hooks), fleet
    sim = simulate_fleet(fleet.pools[0].found.model, stream(scale), pools, router, fast=not ask.reference,
                         progress=progress, check=check, kv_link=fleet.kv_link, **scaling(ask, fleet.autoscale),
                         **hooks)
    return sim, fleet


def fleet_gpus(ask: SimulateRequest, fleet: FleetAsk) -> list[tuple[int, float]]:
    """(GPUs, dollars per GPU-hour) of each pool at --gpu-price (empty without one)."""
    priced = prices(ask)
    if priced is None:
        return []
    from kvbudget.simulation.cost import price_for

    return [(p.replicas * p.found.tp * p.found.pp, price_for(priced, p.found.gpu)) for p in fleet.pools]


def fleet_cost(ask: SimulateRequest, sim: FleetSimulation, fleet: FleetAsk) -> Cost | None:
    """What the fleet's run costs at --gpu-price: every replica's GPUs for the fleet's whole run (a replica that
    finished early is paid for until the last one does); the price per GPU-hour the mean over them."""
    gpus = fleet_gpus(ask, fleet)
    if not gpus:
        return None
    from kvbudget.simulation.cost import run_cost

    total = sum(n for n, _ in gpus)
    if sim.autoscale is not None:  # replicas came and went: each pool's GPU-hours at its price
        price = dict(zip((p.name for p in fleet.pools), (each for _, each in gpus), strict=True))
        pool_gpus = {p.name: p.gpus for p in sim.pools}
        hours = {name: sum(pool_gpus[name] * (r.stopped_s - r.started_s) for r in sim.replicas if r.pool == name)
                 / 3600 for name in price}
        spent = sum(hours[name] * price[name] for name in price)
        return sim.cost(spent / sim.gpu_hours if sim.gpu_hours else gpus[0][1])
    return run_cost(sim.duration_s, sim.prompt_tokens, sim.output_tokens, sim.completed,
                    sum(n * price for n, price in gpus) / total, total)


def pool_figures(sim: FleetSimulation) -> dict[str, dict[str, Any]]:
    """Each pool's figures over its replicas: requests routed and completed, latency percentiles over all its
    requests, peak KV usage (the highest replica's), mean KV usage (the replicas' time-averaged usage, averaged),
    preemptions, and the share of prompt tokens its prefix caches served."""
    from array import array

    from kvbudget.simulation.percentiles import Percentiles

    out: dict[str, dict[str, Any]] = {}
    for pool in sim.pools:
        mine = [r for r in sim.replicas if r.pool == pool.name]
        runs = [r.simulation for r in mine]

        def merged(field: str, runs: list[Any] = runs) -> dict[str, float] | None:
            values = array("d")
            for s in runs:
                values.extend(getattr(s, field))
            pct = Percentiles.of(values)
            return None if pct is None else dict(pct.__dict__)

        queried = sum(s.prefix_queried_tokens for s in runs)
        out[pool.name] = {
            "replicas": len(mine), "routed": sum(r.routed for r in mine), "completed": sum(s.completed for s in runs),
            "ttft_s": merged("ttft_sorted"), "tpot_s": merged("tpot_sorted"), "e2e_s": merged("e2e_sorted"),
            "peak_usage": max(s.peak_usage for s in runs), "mean_usage": sum(s.mean_usage for s in runs) / len(runs),
            "preemptions": sum(s.preemptions for s in runs),
            "prefix_hit_rate": sum(s.prefix_hit_tokens for s in runs) / queried if queried else None}
    return out


def fleet_dict(sim: FleetSimulation, cost: Cost | None = None) -> dict[str, Any]:
    """What --json prints for a fleet: the fleet's run (FleetSimulation.to_dict), each pool with its figures, and
    the cost where priced."""
    out = sim.to_dict()
    figures = pool_figures(sim)
    out["fleet"]["pools"] = [{**p, **figures[p["name"]]} for p in out["fleet"]["pools"]]
    if cost is not None:
        out["cost"] = cost.to_dict()
    return out


__all__ = ["FleetAsk", "PoolAsk", "check_request", "fleet_ask", "fleet_cost", "fleet_dict", "fleet_prepared",
           "fleet_simulation", "is_fleet", "pool_figures", "pools_of", "read_fleet_file"]
