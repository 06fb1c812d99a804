"""`kvbudget simulate --replicas N --router NAME` and `--fleet FILE` on the command line: the fleet's JSON, its
summary, its files and picture, its cost, and the one-line refusals of a bad fleet before any simulation."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import pytest
from simkit import AZURE, LLAMA, cli

from kvbudget.engines.scheduling.workload import read_trace, rescale
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import setup_for, simulate

FAST = ("--trace", AZURE, "--slice", "0:300", "--rate-scale", "6")  # enough load that replicas queue
SMALL = ("--gpu", "H100", "--kv-memory", "2GiB", "--max-model-len", "8192")
TWO_POOLS = """\
router: length:1024
pools:
  - name: short
    replicas: 2
    kv_memory: 2GiB
    max_model_len: 4096
  - name: long
    replicas: 1
    gpu: H200
    tp: 2
"""


def requests(count: int = 300, scale: float = 6.0) -> list:
    return list(rescale(read_trace(AZURE), scale, 0, count))


def nearest_rank(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


def test_replicas_json_is_the_library_fleet(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "3", "--router",
                         "least-requests", "--json")
    assert code == 0, err
    data = json.loads(out)
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    api = simulate_fleet(LLAMA, requests(), [Pool(name="main", setup=setup, replicas=3)], "least-requests")
    assert data["fleet"]["router"] == "least-requests"
    assert [r["routed"] for r in data["fleet"]["replicas"]] == [r.routed for r in api.replicas]
    assert data["e2e_s"]["p99"] == api.e2e.p99 and data["completed"] == 300 == data["requests"]
    pool = data["fleet"]["pools"][0]
    assert (pool["name"], pool["replicas"], pool["routed"], pool["completed"]) == ("main", 3, 300, 300)
    assert pool["preemptions"] == api.preemptions == sum(r["preemptions"] for r in data["fleet"]["replicas"])
    assert pool["peak_usage"] == max(r["peak_usage"] for r in data["fleet"]["replicas"])
    assert all(r["timeline"] for r in data["fleet"]["replicas"])  # each replica's KV usage over time


def test_fleet_file_pools_take_their_own_settings_and_the_length_router(capsys, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(TWO_POOLS)
    each = tmp_path / "requests.csv"
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet),
                         "--per-request", str(each), "--json")
    assert code == 0, err
    data = json.loads(out)
    pools = {p["name"]: p for p in data["fleet"]["pools"]}
    short = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=4096)
    long = setup_for(LLAMA, gpu="H200", tp=2)  # the command line's GPU replaced, its memory planned for TP 2
    assert pools["short"]["setup"]["num_blocks"] == short.num_blocks
    assert pools["long"]["setup"]["num_blocks"] == long.num_blocks and pools["long"]["setup"]["gpu"] == "H200"
    assert [r["pool"] for r in data["fleet"]["replicas"]] == ["short", "short", "long"]
    rows = list(csv.DictReader(each.open()))
    assert len(rows) == 300
    by_id = {r.id: r for r in requests()}
    for row in rows:  # every prompt up to 1,024 tokens to the short pool, longer ones to the long one
        assert (int(row["replica"]) == 2) == (by_id[row["id"]].prompt_tokens > 1024)
    for name, replicas in (("short", {"0", "1"}), ("long", {"2"})):  # each pool's figures over its own requests
        mine = [float(row["e2e_s"]) for row in rows if row["replica"] in replicas]
        assert pools[name]["completed"] == len(mine)
        assert pools[name]["e2e_s"]["p99"] == pytest.approx(nearest_rank(mine, 0.99), abs=1e-6)
        assert pools[name]["e2e_s"]["p50"] == pytest.approx(nearest_rank(mine, 0.5), abs=1e-6)


def test_each_replica_in_the_cli_runs_as_simulate_alone(capsys, tmp_path):
    """The fleet's promise through the command line: the requests each replica answered, run alone through
    `simulate`, give the same latencies."""
    each = tmp_path / "requests.csv"
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "3", "--router", "least-kv",
                       "--per-request", str(each))
    assert code == 0, err
    rows = list(csv.DictReader(each.open()))
    by_id = {r.id: r for r in requests()}
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    for replica in ("0", "1", "2"):
        mine = [row for row in rows if row["replica"] == replica]
        assert len(mine) > 50
        alone = simulate(LLAMA, sorted((by_id[row["id"]] for row in mine), key=lambda r: r.arrival), setup=setup)
        assert sorted(float(row["e2e_s"]) for row in mine) == pytest.approx(list(alone.e2e_sorted), abs=1e-6)


def test_summary_timeline_plot_and_cost(capsys, tmp_path):
    fleet, steps, picture = tmp_path / "fleet.yaml", tmp_path / "steps.csv", tmp_path / "fleet.png"
    fleet.write_text(TWO_POOLS)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet),
                         "--timeline", str(steps), "--plot", str(picture), "--gpu-price", "H100=2.5,H200=3.5")
    assert code == 0, err
    for words in ("a fleet of 3 replicas behind the length router", "pool short: 2 x H100-80GB",
                  "pool long: 1 x H200 (2 GPUs each)", "per pool", "per replica", "Microsoft Azure"):
        assert words in out
    # 2 replicas of 1 H100 and 1 replica of 2 H200s: 2 x 2.5 + 2 x 3.5 dollars an hour
    assert "cost: at their mean $3.00 per GPU-hour x 4 GPUs = $12.00/hour" in out
    header = steps.read_text().splitlines()[0]
    assert header == "replica,time_s,tokens,kv_usage,running,waiting"
    assert {line.split(",")[0] for line in steps.read_text().splitlines()[1:]} == {"0", "1", "2"}
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "2", "--gpu-price", "2",
                         "--json")
    data = json.loads(out)
    assert data["cost"]["gpus"] == 2 and data["cost"]["run"] == pytest.approx(2 * 2 * data["duration_s"] / 3600)


def test_many_replicas_are_listed_up_to_a_bound(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, "--trace", AZURE, "--slice", "0:40",
                         "--replicas", "40")
    assert code == 0, err
    assert "the first 32 of 40; --json has every one" in out


BAD_FILES = [
    ("pools: [{name: a, kv-memory: 2GiB}]", "pool a: unknown key 'kv-memory' (write kv_memory)"),
    ("pools: [{name: a, colour: red}]", "pool a: unknown key 'colour'; a pool takes name, replicas"),
    ("pools: [{name: a, role: middle}]", "pool a: role: 'middle' must be one of both, prefill, decode"),
    ("autoscale: {min: 1}\npools: [{name: a}]", "autoscale: {'min': 1} must be a policy, e.g. kv:pool=decode,max=8"),
    ("pool: [{name: a}]", "unknown key 'pool'; a fleet file has pools, router, autoscale and kv_link"),
    ("pools: [{name: a, tp: true}]", "pool a: tp: True must be a value"),
    ("pools: [{name: a, no_prefix_caching: 1}]", "pool a: no_prefix_caching: 1 must be true or false"),
    ("pools: [{name: a, tp: 0}]", "pool a: tp: '0' must be positive"),
    ("pools: [{name: a, gpu: H999}]", "pool a: gpu: unknown GPU 'H999'"),
    ("pools: [{name: a, kv_memory: 64MiB}]", "pool a: simulate: 32 blocks of 16 tokens"),  # under one request
    ("pools: [{name: a, max_model_len: 1000}]", "pool a: request 129's prompt of 4,107 tokens does not fit"),
    ("router: length:1024\npools: [{name: a}, {name: b, max_model_len: 1024}]",
     "pool b: request 129's prompt of 4,107 tokens does not fit"),
    ("pools: [{name: a}, {name: a}]", "pool a: two pools have this name"),
    ("pools: []", "pools: give a list of 1 to 64 pools"),
    ("pools: [{replicas: 2}]", "pool 1: name: None must be a name"),
    ("pools: [{name: a, replicas: 0}]", "pool a: replicas: 0 must be a whole number from 1 to 4,096"),
    ("pools: [{name: a, replicas: 5000}]", "pool a: replicas: 5000 must be a whole number from 1 to 4,096"),
    ("router: fastest\npools: [{name: a}]", "router fastest: name one of round-robin"),
    ("router: length:1,2\npools: [{name: a}]", "2 bounds make 3 pools by length; the fleet has 1 pools"),
    ("- a", "must be a YAML mapping"),
    ("pools: [{name: a, tp: [1, 2]}]", "pool a: tp: [1, 2] must be a value"),
    ("pools: {a: 1}\n", "pools: give a list"),
    ("pools: [{name: a\n", "invalid YAML"),
]


@pytest.fixture
def no_run(monkeypatch):
    """Any simulation started fails the test: refusals come before."""
    import kvbudget.simulation.fleet as fleet

    def never(*args, **kwargs):
        raise AssertionError("a simulation started")

    monkeypatch.setattr(fleet, "simulate_fleet", never)


@pytest.mark.parametrize("text, says", BAD_FILES)
def test_bad_fleet_files_are_refused_in_one_line_before_any_run(capsys, tmp_path, no_run, text, says):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet))
    assert code == 2 and not out
    assert err.startswith(f"kvbudget: error: --fleet {fleet}: ") and err.count("\n") == 1, err
    assert says in err


@pytest.mark.parametrize("args, says", [
    (("--fleet", "missing.yaml"), "--fleet missing.yaml: cannot read it"),
    (("--router", "session"), "--router: spreads requests over replicas; give --replicas N, --prefill-replicas P, "
                              "--fleet FILE or --autoscale POLICY too"),
    (("--replicas", "0"), "--replicas: '0' must be positive"),
    (("--replicas", "5000"), "--replicas: 5000 is beyond any deployment kvbudget sizes (at most 4,096)"),
    (("--replicas", "2", "--router", "fastest"), "--router fastest: name one of"),
    (("--replicas", "2", "--router", "length:1024"), "1 bounds make 2 pools by length; the fleet has 1 pools"),
    (("--replicas", "2", "--max-concurrency", "4"), "--max-concurrency: a closed loop"),
    (("--replicas", "2", "--find-max-rate", "--slo", "ttft_p99=1s"), "--find-max-rate: searches one engine's"),
    (("--replicas", "2", "--prometheus-series", "x.test"), "--prometheus-series: writes one engine's gauges"),
    (("--replicas", "2", "--max-model-len", "1000"), "--max-model-len: request 129's prompt of 4,107 tokens"),
    (("--replicas", "2", "--gpu-price", "L40S=1"), "--gpu-price: no price for H100-80GB"),
])
def test_bad_fleet_flags_are_refused_in_one_line_before_any_run(capsys, no_run, args, says):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, *args)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert says in err


def test_a_file_and_flags_that_say_the_same_twice_are_refused(capsys, tmp_path, no_run):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(TWO_POOLS)
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet),
                       "--router", "session")
    assert code == 2 and "--router: the fleet file" in err and "names its router (length:1024)" in err
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet),
                       "--replicas", "2")
    assert code == 2 and "--replicas: the fleet file's pools say their replicas" in err
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, "--fleet", str(fleet),
                       "--calibration", "mine")
    assert code == 2 and "--calibration: a calibration is of one deployment" in err


def test_a_sweep_of_replicas_and_routers_runs_each_fleet(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--sweep", "replicas=2,3",
                         "router=round-robin,least-requests", "--gpu-price", "2", "--backend", "serial", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["settings"]["replicas"], r["settings"]["router"]) for r in rows] == [
        (2, "round-robin"), (2, "least-requests"), (3, "round-robin"), (3, "least-requests")]
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    for row in rows:
        n, router = row["settings"]["replicas"], row["settings"]["router"]
        api = simulate_fleet(LLAMA, requests(), [Pool(name="main", setup=setup, replicas=n)], router)
        assert row["result"]["e2e_s"]["p99"] == api.e2e.p99 and len(row["result"]["fleet"]["replicas"]) == n
        assert row["cost"]["gpus"] == n  # each replica's GPU priced
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "2", "--sweep",
                         "max-num-seqs=8,64", "--backend", "serial")
    assert code == 0, err
    assert "sweep (KV tokens per replica" in out and "least" not in out and "round-robin" in out


@pytest.mark.parametrize("args, says", [
    (("--sweep", "replicas=0"), "--sweep: replicas: 0 must be a whole number from 1 to 4,096"),
    (("--sweep", "router=fastest"), "--sweep: router fastest: name one of"),
    (("--sweep", "router=length:1024"), "--sweep: router length:1024: sorts requests into pools"),
    (("--replicas", "2", "--router", "fastest", "--sweep", "tp=1,2"), "--router fastest: name one of"),
    (("--fleet", "fleet.yaml", "--sweep", "tp=1,2"), "--sweep: varies one deployment, not a fleet file's pools"),
])
def test_bad_sweeps_of_fleets_are_refused_before_any_run(capsys, no_run, args, says):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", *FAST, *args)
    assert code == 2 and not out and err.count("\n") == 1, err
    assert says in err


def test_replicas_take_a_calibration_and_save_one(capsys, tmp_path, monkeypatch):
    """--calibrate (and --save-calibration) with --replicas: every replica runs the fitted time model, and the
    saved file is said on stderr as for one engine."""
    from test_calibration import _recorder_log

    monkeypatch.setenv("KVBUDGET_CALIBRATIONS", str(tmp_path / "kept"))
    log = tmp_path / "steps.jsonl"
    _recorder_log(log, lambda tokens, context: 0.004 + 2e-6 * context)
    base = ("simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate", "1", "--requests", "20",
            "--json")
    code, one, err = cli(capsys, *base, "--calibrate", str(log))
    assert code == 0, err
    code, out, err = cli(capsys, *base, "--calibrate", str(log), "--save-calibration", "l4", "--replicas", "2")
    assert code == 0 and "kept/l4.json (--save-calibration)" in err, err
    pool = json.loads(out)["fleet"]["pools"][0]
    assert pool["setup"]["time_model"] == json.loads(one)["setup"]["time_model"]
    code, again, err = cli(capsys, *base, "--calibration", "l4", "--replicas", "2")
    assert code == 0 and json.loads(again)["fleet"]["pools"][0]["setup"] == pool["setup"]


def test_the_web_page_answers_a_fleet_as_the_cli_does(capsys, tmp_path):
    from starlette.testclient import TestClient

    from kvbudget.web import api
    from kvbudget.web.app import create_app

    client = TestClient(create_app(upload_dir=tmp_path / "uploads", limits=api.Limits(simulate_replicas=4)))
    query = "model=llama-3.1-8b&gpu=H100&kv_memory=2GiB&max_model_len=8192&trace=azure-conv-2023&slice=0:300"
    r = client.get(f"/api/simulate?{query}&rate_scale=6&replicas=3&router=least-requests")
    assert r.status_code == 200, r.text
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "3", "--router",
                       "least-requests", "--json")
    assert code == 0 and r.json() == json.loads(out)
    for extra, field, says in (("&replicas=5", "replicas", "replicas: at most 4 on this page"),
                               ("&replicas=2&guard=1", "guard", "in front of a fleet it is not simulated yet"),
                               ("&router=session", "router", "router: spreads requests over replicas"),
                               ("&replicas=2&router=fastest", "router", "router fastest: name one of")):
        r = client.get(f"/api/simulate?{query}{extra}")
        assert r.status_code == 400 and r.json()["field"] == field and says in r.json()["error"], r.text


def test_each_replicas_steps_and_finishes_are_simulates_alone():
    """The hooks the fleet's files come from (--timeline, --per-request): a replica's steps and completions, with
    its index, are those `simulate` reports for the requests it was sent."""
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    sent: dict[int, list] = {}
    steps: dict[int, list] = {}
    done: dict[int, list] = {}
    simulate_fleet(LLAMA, requests(200), [Pool(name="m", setup=setup, replicas=2)], "least-kv",
                   on_route=lambda r, i: sent.setdefault(i, []).append(r),
                   on_step=lambda i, *step: steps.setdefault(i, []).append(step),
                   on_finish=lambda i, r, *times: done.setdefault(i, []).append((r.id, *times)))
    for i in (0, 1):
        mine_steps: list = []
        mine_done: list = []
        simulate(LLAMA, sent[i], setup=setup, on_step=lambda *step, into=mine_steps: into.append(step),
                 on_finish=lambda r, *times, into=mine_done: into.append((r.id, *times)))
        assert steps[i] == mine_steps and done[i] == mine_done and len(mine_done) == len(sent[i])


def test_any_fleet_file_is_read_or_refused_in_one_line():
    """Whatever a fleet file holds, reading it (and each pool's settings, as simulate reads them) gives pools or one
    KVBudgetError naming the file: never another exception."""
    import os
    import tempfile

    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kvbudget import KVBudgetError
    from kvbudget.commands.fleet import POOL_KEYS, fleet_ask
    from kvbudget.commands.simulate import SimulateRequest, simulation_ask

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=12), st.sampled_from(["1", "2GiB", "H100", "fp8", "vllm", "4k", "auto"]))
    keys = st.sampled_from(sorted(POOL_KEYS) + ["name", "replicas", "role", "colour", "kv-memory"])
    pool = st.dictionaries(keys, st.one_of(scalars, st.lists(scalars, max_size=2)), max_size=4)
    doc = st.one_of(st.dictionaries(st.sampled_from(["pools", "router", "autoscale", "x"]),
                                    st.one_of(scalars, st.lists(pool, max_size=3)), max_size=3),
                    st.lists(scalars, max_size=2), scalars)
    base = SimulateRequest(model="llama-3.1-8b", gpu="H100")
    found = simulation_ask(base, LLAMA)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "fleet.yaml")

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(doc)
    def check(data):
        with open(path, "w") as fh:
            yaml.safe_dump(data, fh)
        try:
            fleet = fleet_ask(replace(base, fleet=path), found)
        except KVBudgetError as exc:
            assert exc.param == "fleet" and "\n" not in str(exc) and str(exc).startswith(f"fleet {path}"), str(exc)
        else:
            assert 1 <= len(fleet.pools) <= 64

    check()


def test_a_fleet_file_with_prefill_and_decode_pools_of_their_own(capsys, tmp_path):
    """Disaggregated pools from a file: each its own GPU and settings, the KV moved over the file's link; the JSON
    carries each pool's role and every read; a link of zero bandwidth, a link without roles and a role no engine
    has are refused in one line before any run."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("kv_link: infiniband\nrouter: least-requests\npools:\n"
                     "  - {name: p, role: prefill, replicas: 1, gpu: H100, max_num_batched_tokens: 16384}\n"
                     "  - {name: d, role: decode, replicas: 2, gpu: H200}\n")
    code, out, _ = cli(capsys, "simulate", "llama-3.1-8b", *FAST, "--max-model-len", "8192", "--fleet", str(fleet),
                       "--json")
    assert code == 0
    got = json.loads(out)
    pools = got["fleet"]["pools"]
    assert [(p["name"], p["role"], p["setup"]["gpu"], p["setup"]["max_num_batched_tokens"]) for p in pools] == \
        [("p", "prefill", "H100-80GB", 16384), ("d", "decode", "H200", pools[1]["setup"]["max_num_batched_tokens"])]
    assert pools[1]["setup"]["max_num_batched_tokens"] != 16384
    assert got["fleet"]["kv_transfer"]["count"] == got["completed"] == 300
    assert got["fleet"]["kv_transfer"]["link"]["name"] == "infiniband"
    assert sum(r["routed"] for r in got["fleet"]["replicas"] if r["role"] == "decode") == 300
    each = tmp_path / "each.csv"  # every request once, as its client saw it: the mean end to end the JSON's
    code, _, _ = cli(capsys, "simulate", "llama-3.1-8b", *FAST, "--max-model-len", "8192", "--fleet", str(fleet),
                     "--per-request", str(each))
    rows = list(csv.DictReader(each.open()))
    assert code == 0 and len(rows) == 300 and {r["replica"] for r in rows} == {"1", "2"}
    assert math.isclose(sum(float(r["e2e_s"]) for r in rows) / 300, got["e2e_s"]["mean"], rel_tol=1e-5)
    sent = {r.id: r.arrival for r in rescale(read_trace(AZURE), 6, 0, 300)}
    assert all(math.isclose(float(r["arrival_s"]), sent[r["id"]], abs_tol=1e-6) for r in rows)
    for text, says in (("kv_link: 0GB/s", "0GB/s is not a rate in GB/s"),
                       ("kv_link: [1]", "kv_link: [1] must be a link's name or a rate"),
                       ):
        fleet.write_text(f"{text}\npools:\n  - {{name: p, role: prefill}}\n  - {{name: d, role: decode}}\n")
        code, _, err = cli(capsys, "simulate", "llama-3.1-8b", *FAST, *SMALL, "--fleet", str(fleet))
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    fleet.write_text("kv_link: roce\npools:\n  - {name: a}\n")
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", *FAST, *SMALL, "--fleet", str(fleet))
    assert code == 2 and "--kv-link: goes with prefill and decode pools" in err and len(err.strip().splitlines()) == 1
