"""`kvbudget simulate --autoscale / --flow-control / --max-num-queued-reqs / --admission` on a fleet: the JSON is
the library's run, the summary says what the autoscaler and the front door did, and every bad value is refused in
one line before any run."""

from __future__ import annotations

import json

import pytest
from simkit import AZURE, LLAMA, cli

from kvbudget.engines.scheduling.workload import read_trace, rescale
from kvbudget.planner import plan
from kvbudget.simulation.autoscale import parse_autoscale
from kvbudget.simulation.fleet import Pool, simulate_fleet
from kvbudget.simulation.run import setup_for

FAST = ("--trace", AZURE, "--slice", "0:300", "--rate-scale", "6")
SMALL = ("--gpu", "H100", "--kv-memory", "2GiB", "--max-model-len", "8192")
POLICY = "queue:max=3,target=2,interval=5s,startup=2s"


def requests() -> list:
    return list(rescale(read_trace(AZURE), 6.0, 0, 300))


def test_autoscale_and_the_front_door_json_are_the_librarys(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--autoscale", POLICY, "--load-bandwidth",
                         "10", "--router", "least-requests", "--flow-control", "max=20,ttl=5s",
                         "--max-num-queued-reqs", "64", "--gpu-price", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    api = simulate_fleet(LLAMA, requests(), [Pool(name="main", setup=setup, max_num_queued_reqs=64)],
                         "least-requests", autoscale=parse_autoscale(POLICY, load_bandwidth=10e9),
                         flow_control="max=20,ttl=5s")
    assert api.autoscale is not None and api.front is not None
    scale, front = data["fleet"]["autoscale"], data["fleet"]["front"]
    assert scale == json.loads(json.dumps(api.autoscale.to_dict()))
    assert front == json.loads(json.dumps(api.front.to_dict())) and data["gpu_hours"] == api.gpu_hours
    assert scale["policy"]["load_bandwidth"] == 10e9 and scale["policy"]["pool"] == "main"
    weights = plan(LLAMA, gpu="H100", max_model_len=8192).to_dict()["weights_bytes"]  # bf16, one GPU
    assert scale["cold_start_s"] == {"main": weights / 10e9 + 2.0} and scale["started"] >= 1
    assert data["completed"] + sum(front["refused"].values()) == data["requests"] == 300
    assert data["cost"]["run"] == pytest.approx(2 * data["gpu_hours"])


def test_the_summary_says_what_the_autoscaler_and_the_front_door_did(capsys, tmp_path):
    picture = tmp_path / "fleet.png"
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--autoscale", POLICY,
                         "--flow-control", "max=20,ttl=5s", "--gpu-price", "2", "--plot", str(picture))
    assert code == 0, err
    assert picture.stat().st_size > 10_000  # the replicas over time, those starting among them
    text = " ".join(out.split())
    assert "autoscale queue (pool main, every 5 s): 1 to 3 replicas" in text
    assert "front door: refused" in text and "(429)" in text
    assert "cost: $2.00 per GPU-hour, up to 3 GPUs:" in text and "/hour on average (" in text


def test_a_fleet_file_names_its_autoscaler_and_the_pool_it_scales(capsys, tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("router: length:1024\nautoscale: queue:pool=long,max=3,target=2,interval=5s,startup=1s\n"
                    "pools:\n  - name: short\n    kv_memory: 2GiB\n  - name: long\n    kv_memory: 2GiB\n")
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "8192", *FAST,
                         "--fleet", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    scale = data["fleet"]["autoscale"]
    assert scale["policy"]["pool"] == "long" and scale["started"] >= 1
    assert {r["pool"] for r in data["fleet"]["replicas"] if r["started_s"] > 0} == {"long"}


def test_admission_llm_d_is_the_routers_flow_control_in_front_of_one_replica(capsys):
    """`--admission llm-d` alone: llm-d-router v0.10's flow control (a queue of 5,000 requests, 60 s each) before
    one replica, run as a fleet of one; its refusals counted with their status in the summary and the JSON."""
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--admission", "llm-d",
                         "--flow-control", "max=5,ttl=2s", "--json")
    assert code == 0, err
    front = json.loads(out)["fleet"]["front"]
    assert front["admission"] == "llm-d" and front["flow_control"]["max_requests"] == 5
    assert front["refused"]["queue-full"] > 0 and front["status"]["queue-full"] == 429
    assert all(front["status"][reason] == 429 for reason in front["refused"])
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--admission", "llm-d")
    text = " ".join(out.split())
    assert code == 0 and "a fleet of 1 replica" in text and "front door (llm-d): refused" in text, err


def test_admission_at_the_fleets_front_on_the_command_line(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--replicas", "2", "--admission",
                         "concurrency:8", "--json")
    assert code == 0, err
    front = json.loads(out)["fleet"]["front"]
    setup = setup_for(LLAMA, gpu="H100", kv_memory=2 << 30, max_model_len=8192)
    api = simulate_fleet(LLAMA, requests(), [Pool(name="main", setup=setup, replicas=2)], admission="concurrency:8")
    assert api.front is not None and front["refused"] == api.front.refused and front["admission"] == "concurrency:8"


@pytest.mark.parametrize("flags, says", [
    (("--autoscale", "fast"), "--autoscale 'fast': name one of kv, queue, llm-d, dynamo"),
    (("--autoscale", "kv:min=0"), "--autoscale: 'min=0' must be a whole number from 1 to 4,096"),
    (("--autoscale", "kv:target=2"), "--autoscale: 'target=2.0' must be a number above 0 up to 1"),
    (("--load-bandwidth", "5"), "--load-bandwidth: the speed a replica the autoscaler adds loads its weights at; "
                                "give --autoscale POLICY too"),
    (("--autoscale", "kv", "--load-bandwidth", "0"), "--load-bandwidth: '0' must be a number above 0 up to 1,000"),
    (("--flow-control", "max=0"), "--flow-control: 'max=0' must be a whole number from 1 to 1,000,000"),
    (("--flow-control", ","), "--flow-control ',': give max=N, ttl=SECONDS or both"),
    (("--max-num-queued-reqs", "0"), "--max-num-queued-reqs: '0' must be positive"),
    (("--replicas", "2", "--autoscale", "kv:max=1"), "--autoscale: pool main starts with 2 replicas, outside min 1 "
                                                     "to max 1; start within them"),
    (("--autoscale", "kv", "--max-concurrency", "4"), "--max-concurrency: a closed loop of clients"),
    (("--engine", "sglang", "--max-num-queued-reqs", "4"), "--max-num-queued-reqs: a limit of vLLM's API server "
                                                           "(from 0.29); sglang has none"),
])
def test_bad_autoscaling_and_front_door_flags_are_refused_in_one_line(capsys, flags, says):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, *flags)
    assert code == 2 and out == ""
    assert err.strip() == f"kvbudget: error: {err.strip().removeprefix('kvbudget: error: ')}" and says in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("doc, says", [
    ("autoscale: 5\npools:\n  - name: a\n", "autoscale: 5 must be a policy"),
    ("autoscale: kv:min=0\npools:\n  - name: a\n", "fleet FILE: autoscale: 'min=0' must be a whole number"),
    ("pools:\n  - name: a\n    autoscale: kv\n", "pool a: unknown key 'autoscale'"),
    ("autoscale: kv:pool=b\npools:\n  - name: a\n", "pool='b' is not one of the fleet's pools (a)"),
])
def test_bad_autoscalers_in_a_fleet_file_are_refused_in_one_line(capsys, tmp_path, doc, says):
    path = tmp_path / "fleet.yaml"
    path.write_text(doc)
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--fleet", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert says.replace("FILE", str(path)) in err


def test_an_autoscaler_in_the_file_and_on_the_command_line_is_refused(capsys, tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("autoscale: kv\npools:\n  - name: a\n")
    code, _, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--fleet", str(path), "--autoscale", "kv")
    assert code == 2 and "--autoscale: the fleet file" in err
    assert "names its autoscaler (kv); give it in one place" in err


def test_disaggregated_serving_with_an_autoscaler_of_no_pool_is_refused_in_one_line(capsys):
    code, out, err = cli(capsys, "simulate", "llama-3.1-8b", *SMALL, *FAST, "--prefill-replicas", "1",
                         "--decode-replicas", "1", "--kv-link", "nvlink", "--autoscale", "kv")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--autoscale: name the pool it scales, pool=NAME (the fleet has prefill, decode)" in err
