"""`kvbudget recommend` on the command line: its answer, its JSON, its exit codes and its one-line errors (each
before the search starts)."""

from __future__ import annotations

import json

import pytest
from simkit import cli

import kvbudget
from kvbudget.engines.scheduling.workload import read_trace, rescale
from kvbudget.simulation.fleet import simulate_fleet
from kvbudget.simulation.routing import Pool
from kvbudget.simulation.run import setup_for, simulate
from kvbudget.simulation.search import meets, parse_slo

BASE = ("recommend", "llama-3.1-8b", "--trace", "azure-conv-2023", "--slice", "0:300", "--max-model-len", "8192")
SMALL = ("--gpus", "H100-80GB,L40S", "--max-gpus", "2", "--tp", "1", "--kv-dtype", "auto", "--backend", "serial",
         "--no-disagg")
PRICE = ("--gpu-price", "H100-80GB=2.49,L40S=0.86")


def test_the_answer_meets_the_slo_when_simulated_alone(capsys):
    code, out, err = cli(capsys, *BASE, *SMALL, *PRICE, "--slo", "ttft_p99=2s,tpot_p99=40ms", "--json")
    assert code == 0, err
    data = json.loads(out)
    best = data["best"]["candidate"]
    model = kvbudget.load_model("llama-3.1-8b")
    setup = setup_for(model, gpu=best["gpu"], kv_dtype=best["kv_dtype"], max_model_len=8192)
    traffic = rescale(read_trace("azure-conv-2023"), count=300)
    alone = simulate(model, traffic, setup=setup) if best["replicas"] == 1 else \
        simulate_fleet(model, traffic, [Pool(name="s", setup=setup, replicas=best["replicas"])])
    assert meets(alone, parse_slo("ttft_p99=2s,tpot_p99=40ms"))
    assert data["best"]["values_s"]["ttft_p99"] == pytest.approx(alone.ttft.p99)
    assert data["candidates"] == {"listed": 4, "pruned": 0, "simulated": len(data["runners_up"]) + 1,
                                  "skipped": 4 - len(data["runners_up"]) - 1}


def test_the_table_names_the_winner_and_why_others_lost(capsys):
    code, out, err = cli(capsys, *BASE, *SMALL, *PRICE, "--slo", "ttft_p99=2s,tpot_p99=30ms")
    assert code == 0, err
    assert "cheapest meeting ttft_p99 ≤ 2 s, tpot_p99 ≤ 30 ms" in out
    assert "Runners-up" in out and "tpot_p99" in out


def test_none_meets_exits_1_saying_what_binds(capsys, tmp_path):
    code, out, err = cli(capsys, *BASE, *SMALL, *PRICE, "--slo", "ttft_p99=1ms", "--out", str(tmp_path / "d"))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbudget: no candidate meets the objectives: ttft_p99")
    assert "closest:" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_out_writes_the_deployment(capsys, tmp_path):
    code, out, err = cli(capsys, *BASE, *SMALL, *PRICE, "--slo", "ttft_p99=5s", "--out", str(tmp_path / "d"))
    assert code == 0, err
    written = json.loads((tmp_path / "d" / "deployment.json").read_text())
    assert written["model"] == "meta-llama/Llama-3.1-8B" and written["engine"] == "vllm"
    (pool,) = written["pools"]
    assert pool["role"] == "both" and pool["gpu"] == "L40S" and pool["max_model_len"] == 8192


@pytest.mark.parametrize(("extra", "message"), [
    (("--gpus", "H100-80GB,Nonesuch", *PRICE, "--slo", "ttft_p99=2s"), "--gpus 'Nonesuch'"),
    (("--gpus", "H100-80GB,A100-80GB", *PRICE, "--slo", "ttft_p99=2s"), "no price for A100-80GB"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=fast"), "--slo 'ttft_p99=fast'"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p42=2s"), "--slo ttft_p42"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--tp", "8", "--max-gpus", "4"), "--max-gpus"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--kv-dtype", ","), "--kv-dtype"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--max-gpus", "65"), "--max-gpus"),
    (("--gpus", "H100-80GB", "--gpu-price", "-1", "--slo", "ttft_p99=2s"), "--gpu-price"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--backend", "gpu"), "--backend"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--router", "nonesuch"), "router"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--kv-dtype", "auto,fp7"), "--kv-dtype 'fp7'"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--kv-link", "carrier-pigeon"), "--kv-link"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--engine", "tgi"), "--engine tgi"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--no-disagg", "--kv-link", "roce"), "--kv-link"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--out", "/nonexistent/dir/x"), "--out"),
    (("--gpus", "H100-80GB", *PRICE, "--slo", "ttft_p99=2s", "--prefix-caching", "maybe"), "--prefix-caching"),
])
def test_bad_input_is_one_line_exit_2_before_the_search(capsys, monkeypatch, extra, message):
    import kvbudget.simulation.recommend as search

    def never(*_a, **_k):
        raise AssertionError("the search started")

    monkeypatch.setattr(search, "recommend", never)
    code, out, err = cli(capsys, "recommend", "llama-3.1-8b", "--trace", "azure-conv-2023", "--slice", "0:10",
                         *extra)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbudget: error:") and message in lines[0], lines


def test_a_prompt_past_max_model_len_is_refused_before_any_run(capsys, monkeypatch):
    import kvbudget.simulation.recommend as search

    def never(*_a, **_k):
        raise AssertionError("a candidate was simulated")

    monkeypatch.setattr(search, "simulate_candidate", never)
    code, _, err = cli(capsys, "recommend", "llama-3.1-8b", "--trace", "azure-conv-2023", "--slice", "0:300",
                       "--slo", "ttft_p99=2s", *PRICE, "--max-gpus", "1", "--max-model-len", "1024",
                       "--backend", "serial")
    assert code == 2 and "--max-model-len: request" in err and len(err.strip().splitlines()) == 1


def test_without_a_price_it_asks_for_one_or_uses_the_table(capsys, monkeypatch):
    import kvbudget.simulation.cost as cost
    import kvbudget.simulation.recommend as search

    monkeypatch.setattr(search, "recommend", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("searched")))
    if not hasattr(cost, "price_table"):
        code, _, err = cli(capsys, "recommend", "llama-3.1-8b", "--trace", "azure-conv-2023", "--slo", "ttft_p99=2s")
        assert code == 2 and "--gpu-price" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(cost, "price_table", lambda gpus=(): {"H100-80GB": 2.0}, raising=False)
    code, _, err = cli(capsys, "recommend", "llama-3.1-8b", "--trace", "azure-conv-2023", "--slo", "ttft_p99=2s",
                       "--gpus", "L40S")
    assert code == 2 and "no price for L40S" in err and len(err.strip().splitlines()) == 1


def test_the_slo_is_required(capsys):
    code, _, err = cli(capsys, "recommend", "llama-3.1-8b", "--trace", "azure-conv-2023")
    assert code == 2 and "--slo" in err
