"""Prefix-cache-aware routers: `prefix` reads each replica's cache as its KV events report it (the engine's own
lookup, which changes nothing), `prefix-approx` remembers what it sent where. On traffic that shares prefixes they
find more of the cache than routers that do not look, the precise one most; every replica still runs exactly as
alone on what it was sent."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from simkit import LLAMA, close
from test_fleet import SMALL, replay

import kvbudget
from kvbudget import KVBudgetError
from kvbudget.engines.scheduling.workload import Request, read_trace, rescale
from kvbudget.simulation.fleet import ApproxPrefix, Pool, PrefixAware, Replica, parse_router, simulate_fleet
from kvbudget.simulation.run import setup_for

SGLANG = setup_for(LLAMA, engine="sglang", gpu="H100-80GB", max_model_len=8192, kv_memory=2 << 30)
GEMMA = kvbudget.load_model("gemma-2-9b")  # sliding-window layers beside full ones: vLLM's hybrid cached scheduler
HYBRID = setup_for(GEMMA, gpu="H100-80GB", max_model_len=8192, kv_memory=3 << 30)


def documents(n: int = 240, docs: int = 12, shared: int = 2000, rate: float = 8.0) -> list[Request]:
    """Questions over `docs` documents of `shared` tokens each, drawn at random (the document first, a question of
    100 to 400 tokens after it), `rate` per second; each replica's cache holds a few documents, not all."""
    rng = random.Random(5)
    return [Request(arrival=i / rate, prompt_tokens=shared + rng.randrange(100, 400),
                    output_tokens=rng.randrange(20, 80), prefix=((("doc", rng.randrange(docs)), shared),), id=str(i))
            for i in range(n)]


def mooncake() -> list[Request]:
    """800 requests from the middle of the Mooncake conversation trace (hash ids per 512 tokens: later turns repeat
    earlier ones), prompts of at most 30,000 tokens."""
    return [r for r in rescale(read_trace("mooncake-conv"), 1.0, 6000, 800) if r.prompt_tokens <= 30_000]


ROOMY = setup_for(LLAMA, gpu="H100-80GB", max_model_len=32_000, kv_memory=32 << 30)  # 262,144 tokens


@pytest.mark.parametrize("requests, setup", [(documents(300, docs=24, shared=4000), SMALL), (mooncake(), ROOMY)],
                         ids=["documents", "mooncake"])
def test_prefix_routers_find_more_of_the_cache(requests, setup):
    """Four replicas, each caching a few of the documents at once (24 of 4,000 tokens, 16,384 tokens of KV each):
    the precise router finds the most of the cache, the approximate one (which sends questions to where a
    document was evicted) less, the routers that do not look far less. On the Mooncake slice the gains are
    smaller (most of its reuse is of the one 512-token block every request starts with) but in the same order."""
    pools = [Pool(name="m", setup=setup, replicas=4)]
    fleets = {name: simulate_fleet(LLAMA, requests, pools, name)
              for name in ("round-robin", "least-requests", "prefix-approx", "prefix")}
    rates = {name: fleet.prefix_hit_rate for name, fleet in fleets.items()}
    assert rates["prefix"] > rates["prefix-approx"] > max(rates["round-robin"], rates["least-requests"])
    if setup is SMALL:  # the prefill saved shows in the time to the first token
        assert fleets["prefix"].ttft.p50 < fleets["prefix-approx"].ttft.p50 < fleets["round-robin"].ttft.p50 / 2


def test_prefix_keeps_a_document_where_it_is_cached():
    """Twelve documents over four replicas: once a document is cached somewhere, the precise router sends its
    questions there, so each document is computed on few replicas (round-robin computes it on all four)."""
    homes: dict[int, set[int]] = {}

    def seen(r: Request, i: int) -> None:
        homes.setdefault(r.prefix[0][0][1], set()).add(i)

    simulate_fleet(LLAMA, documents(), [Pool(name="m", setup=SMALL, replicas=4)], "prefix", on_route=seen)
    assert len(homes) == 12 and sum(len(h) for h in homes.values()) <= 12 * 2


@pytest.mark.parametrize("router", ["prefix", "prefix-approx", "prefix-approx:64"])
def test_each_replica_runs_exactly_as_alone(router):
    replay(router, [Pool(name="main", setup=SMALL, replicas=4)], documents(200))


@pytest.mark.parametrize("setup", [SMALL, SGLANG, HYBRID], ids=["vllm", "sglang", "vllm-hybrid"])
def test_the_lookup_is_what_the_engine_then_hits(setup):
    """A document of 2,000 tokens is cached after its first request; the lookup for the next request with it
    says 2,000 tokens (125 blocks of 16; SGLang's pages are one token), and that is the hit the engine takes."""
    first = Request(arrival=0.0, prompt_tokens=2300, output_tokens=5, prefix=((("doc", 1), 2000),), id="a")
    second = Request(arrival=60.0, prompt_tokens=2100, output_tokens=5, prefix=((("doc", 1), 2000),), id="b")
    other = Request(arrival=60.0, prompt_tokens=2100, output_tokens=5, prefix=((("doc", 2), 2000),), id="c")
    looked: list[tuple[int, int]] = []

    @dataclass
    class Look:
        name: str = "look"

        def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
            if request.id == "b":
                looked.append((replicas[0].run.sched.cached_prefix(request),
                               replicas[0].run.sched.cached_prefix(other)))
            return 0

    fleet = simulate_fleet(LLAMA if setup is not HYBRID else GEMMA, [first, second], [Pool(name="m", setup=setup)],
                           Look())
    assert looked == [(2000, 0)]
    assert fleet.replicas[0].simulation.prefix_hit_tokens == 2000
    assert fleet.prefix_hit_rate == 2000 / (2300 + 2100)


@dataclass
class Follow:
    """Routes as a recorded run did; with `look`, asks every replica's cache about the request and a few others
    first (and ignores the answers)."""

    sent: list[int]
    look: tuple[Request, ...] = ()
    name: str = "follow"
    turn: list[int] = field(default_factory=lambda: [0])

    def choose(self, request: Request, replicas: Sequence[Replica], now: float) -> int:
        for r in replicas:
            for q in (request, *self.look):
                r.run.sched.cached_prefix(q)
        self.turn[0] += 1
        return self.sent[self.turn[0] - 1]


@pytest.mark.parametrize("setup", [SMALL, SGLANG, HYBRID], ids=["vllm", "sglang", "vllm-hybrid"])
def test_looking_changes_no_schedule(setup):
    model = GEMMA if setup is HYBRID else LLAMA
    requests = documents(160, rate=12.0)
    pools = [Pool(name="m", setup=setup, replicas=3)]
    sent: list[int] = []
    simulate_fleet(model, requests, pools, "round-robin", on_route=lambda r, i: sent.append(i))
    probes = tuple(documents(12, rate=1.0)[::3])
    plain = simulate_fleet(model, requests, pools, Follow(sent))
    looked = simulate_fleet(model, requests, pools, Follow(sent, probes))
    for a, b in zip(plain.replicas, looked.replicas, strict=True):
        x, y = a.simulation, b.simulation
        assert close((x.steps, x.duration_s, x.preemptions, x.prefix_hit_tokens),
                     (y.steps, y.duration_s, y.preemptions, y.prefix_hit_tokens))
        assert close((x.e2e_sorted, x.ttft_sorted, x.peak_usage), (y.e2e_sorted, y.ttft_sorted, y.peak_usage))


def test_the_approximate_router_forgets_the_oldest_and_never_hears_of_evictions():
    """With room for 200 hashes per replica, the router remembers the last 200 blocks it sent to each replica,
    however much the replica's cache still holds; by default (GIE's autoTune) as many as the replica has GPU
    blocks: 2 GiB of KV at 128 KiB a token (32 layers, 8 KV heads of 128, bfloat16 keys and values) is 16,384
    tokens, 1,024 blocks of 16."""
    router = ApproxPrefix(entries=200)
    simulate_fleet(LLAMA, documents(60), [Pool(name="m", setup=SMALL, replicas=2)], router)
    assert sorted(len(lru) for lru in router.lru.values()) == [200, 200]
    assert set(router.where) == {h for lru in router.lru.values() for h in lru}
    roomy = ApproxPrefix()
    simulate_fleet(LLAMA, documents(60), [Pool(name="m", setup=SMALL, replicas=2)], roomy)
    assert sorted(len(lru) for lru in roomy.lru.values()) == [1024, 1024]


@pytest.mark.parametrize("text, says", [
    ("prefix:3", "name one of"),
    ("prefix-approx:0", "not a number of LRU entries above 0"),
    ("prefix-approx:many", "not a number of LRU entries"),
    ("prefix-approx:1.5", "not a number of LRU entries"),
    ("prefix-approx:4194305", "not a number of LRU entries above 0 \\(at most 4,194,304\\)"),
])
def test_bad_prefix_routers_are_refused_in_one_line(text, says):
    with pytest.raises(KVBudgetError, match=says) as err:
        parse_router(text)
    assert err.value.param == "router" and "\n" not in str(err.value)


def test_bad_prefix_routers_built_in_code_are_refused_in_one_line():
    for make, says in [(lambda: ApproxPrefix(entries=-1), "entries -1 must be a whole number of LRU entries"),
                       (lambda: ApproxPrefix(entries=True), "entries True must be"),
                       (lambda: ApproxPrefix(refresh=0.0), "must be a number above 0"),
                       (lambda: PrefixAware(refresh=-1.0), "must be a number above 0")]:
        with pytest.raises(KVBudgetError, match=says) as err:
            make()
        assert err.value.param == "router" and "\n" not in str(err.value)
