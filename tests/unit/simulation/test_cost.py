"""--gpu-price: what a simulated run costs, worked by hand, and its bad input."""

from __future__ import annotations

import json

import pytest
from simkit import AZURE, cli

from kvbudget import KVBudgetError
from kvbudget.simulation.cost import parse_prices, price_for, run_cost


def test_cost_worked_by_hand():
    """Two GPUs at $2 an hour for an hour: $4; 1M prompt and 1M output tokens, 2,000 requests."""
    c = run_cost(3600, 1_000_000, 1_000_000, 2000, 2.0, 2)
    assert (c.per_hour, c.run) == (4.0, 4.0)
    assert (c.per_million_tokens, c.per_million_output_tokens, c.per_thousand_requests) == (2.0, 4.0, 2.0)
    assert run_cost(1800, 0, 0, 0, 1.0, 1).per_million_tokens is None  # nothing served: no price per unit


def test_prices_by_gpu_use_the_catalogs_names():
    assert parse_prices("2.49") == {None: 2.49}
    prices = parse_prices("h100=2.49, L40S=0.86")
    assert prices == {"H100-80GB": 2.49, "L40S": 0.86}
    assert price_for(prices, "H100-80GB") == 2.49 and price_for({None: 1.5}, None) == 1.5
    with pytest.raises(KVBudgetError, match="no price for L4") as err:
        price_for(prices, "L4")
    assert err.value.param == "gpu_price"


@pytest.mark.parametrize("text, message", [("abc", "'abc' is not a positive price"), ("-1", "not a positive"),
                                           ("inf", "not a positive"), ("H999=2", "unknown GPU 'H999'"),
                                           ("H100-80GB", "not a positive"), ("=2", "write GPU=PRICE")])
def test_bad_prices_name_the_flag(text, message):
    with pytest.raises(KVBudgetError, match=message) as err:
        parse_prices(text)
    assert err.value.param == "gpu_price"


def test_simulate_prices_its_run(capsys):
    """The JSON's cost is the run's GPUs (tp 2) for its simulated duration at the price, per unit served; the table
    says the same; a search prices its best run."""
    argv = ("simulate", "llama-3.1-8b", "--gpu", "H100", "--tp", "2", "--trace", AZURE, "--slice", "0:200")
    code, out, err = cli(capsys, *argv, "--gpu-price", "2.5", "--json")
    assert code == 0, err
    run = json.loads(out)
    cost = run["cost"]
    assert cost["per_hour"] == 5.0 and cost["run"] == pytest.approx(5.0 * run["duration_s"] / 3600)
    tokens = run["prompt_tokens"] + run["output_tokens"]
    assert cost["per_million_tokens"] == pytest.approx(cost["run"] / tokens * 1e6)
    assert cost["per_thousand_requests"] == pytest.approx(cost["run"] / run["completed"] * 1000)
    code, out, err = cli(capsys, *argv, "--gpu-price", "2.5")
    assert code == 0 and "$2.50 per GPU-hour x 2 GPUs = $5.00/hour" in out.replace("\n", " ")
    code, out, err = cli(capsys, *argv, "--find-max-rate", "--slo", "ttft_p99=500ms", "--gpu-price", "2.5", "--json")
    found = json.loads(out)
    assert code == 0 and found["cost"]["run"] == pytest.approx(5.0 * found["best"]["duration_s"] / 3600)


def test_a_sweep_prices_each_gpu_and_refuses_an_unpriced_one_before_running(capsys):
    argv = ("simulate", "llama-3.1-8b", "--trace", AZURE, "--slice", "0:100", "--sweep", "gpu=H100-80GB,L40S",
            "--backend", "serial")
    code, out, err = cli(capsys, *argv, "--gpu-price", "H100-80GB=2.49,L40S=0.86", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["cost"]["price_per_gpu_hour"] for r in rows] == [2.49, 0.86]
    code, out, err = cli(capsys, *argv, "--gpu-price", "H100-80GB=2.49")
    assert code == 2 and out == "" and err.count("\n") == 1 and "no price for L40S" in err
