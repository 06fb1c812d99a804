"""data/prices.json: every row a catalog GPU with its price, provider, instance, source and date; the reader's
answer and its one-line error for a GPU the table does not price."""

from __future__ import annotations

import datetime
import json
from importlib import resources

import pytest

from kvbudget import KVBudgetError
from kvbudget.gpus import find_gpu
from kvbudget.simulation.cost import parse_prices, price_table

DOC = json.loads((resources.files("kvbudget") / "data" / "prices.json").read_text(encoding="utf-8"))
FIELDS = {"price_per_gpu_hour", "provider", "instance", "gpus_in_instance", "instance_price_per_hour", "region",
          "source", "via", "date", "date_kind"}


def test_the_table_says_prices_move_and_how_to_override():
    assert "--gpu-price" in DOC["about"] and "move" in DOC["about"]
    assert (DOC["currency"], DOC["unit"]) == ("USD", "per GPU-hour, on demand")


@pytest.mark.parametrize("name", sorted(DOC["gpus"]))
def test_each_row_is_a_catalog_gpu_with_a_dated_source(name):
    row = DOC["gpus"][name]
    assert set(row) == FIELDS
    assert find_gpu(name).name == name  # the catalog's own spelling, so --gpu-price and --gpus agree
    assert 0.05 <= row["price_per_gpu_hour"] <= 50  # a GPU-hour, not an instance-hour or a month
    assert type(row["gpus_in_instance"]) is int and row["gpus_in_instance"] in (1, 2, 4, 8)
    assert row["price_per_gpu_hour"] == pytest.approx(row["instance_price_per_hour"] / row["gpus_in_instance"],
                                                      abs=5e-5)
    assert row["source"].startswith("https://") and row["via"].startswith("https://")
    assert row["date_kind"] in ("read", "stated")
    assert datetime.date(2025, 1, 1) <= datetime.date.fromisoformat(row["date"]) <= datetime.date.today()
    assert row["provider"] and row["instance"] and row["region"]


def test_reader_answers_the_catalog_names_and_accepts_aliases():
    table = price_table(["h100", "H200"])
    assert table["H100-80GB"] == DOC["gpus"]["H100-80GB"]["price_per_gpu_hour"]
    assert set(table) == set(DOC["gpus"])


def test_an_unpriced_gpu_asks_for_gpu_price_in_one_line():
    unpriced = next(g for g in ("L40S", "T4", "MI300X") if g not in DOC["gpus"])
    with pytest.raises(KVBudgetError, match=f"no price for {unpriced}: data/prices.json has none") as err:
        price_table(["H100-80GB", unpriced])
    assert err.value.param == "gpu_price" and "\n" not in str(err.value)


def test_gpu_price_overrides_the_table():
    unpriced = next(g for g in ("L40S", "T4", "MI300X") if g not in DOC["gpus"])
    table = price_table(["H100-80GB", unpriced], given=parse_prices(f"h100=1.5,{unpriced}=0.86"))
    assert (table["H100-80GB"], table[unpriced]) == (1.5, 0.86)
    assert table["H200"] == DOC["gpus"]["H200"]["price_per_gpu_hour"]  # the rest as shipped
    assert price_table(["H200", unpriced], given=parse_prices("2")) == {"H200": 2.0, unpriced: 2.0}
