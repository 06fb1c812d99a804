"""What serving a simulated run costs at a price per GPU-hour: the deployment's GPUs for the run's simulated
duration (idle time included: you pay for the GPUs whether requests come or not), per hour and per unit served."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from kvbudget.errors import KVBudgetError

MILLION = 1_000_000


@dataclass(frozen=True, kw_only=True)
class Cost:
    """Dollars for a run on `gpus` GPUs at `price_per_gpu_hour` each; None where the run served nothing of a kind."""

    price_per_gpu_hour: float
    gpus: int
    per_hour: float  # the deployment's GPUs for an hour
    run: float  # the deployment's GPUs for the run's simulated duration
    per_million_output_tokens: float | None
    per_million_tokens: float | None  # prompt and output tokens together
    per_thousand_requests: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run_cost(duration_s: float, prompt_tokens: int, output_tokens: int, completed: int, price_per_gpu_hour: float,
             gpus: int) -> Cost:
    """The cost of a run of `duration_s` simulated seconds that served these tokens and completed these requests."""
    _check(price_per_gpu_hour, gpus)
    per_hour = price_per_gpu_hour * gpus
    return _cost(per_hour * duration_s / 3600, per_hour, prompt_tokens, output_tokens, completed, price_per_gpu_hour,
                 gpus)


def gpu_hours_cost(gpu_hours: float, duration_s: float, prompt_tokens: int, output_tokens: int, completed: int,
                   price_per_gpu_hour: float, gpus: int) -> Cost:
    """The cost of `gpu_hours` over a run of `duration_s` (a fleet whose replicas came and went: `gpus` at its
    largest, `per_hour` its mean spend per hour of the run)."""
    _check(price_per_gpu_hour, gpus)
    run = price_per_gpu_hour * gpu_hours
    per_hour = run / duration_s * 3600 if duration_s > 0 else price_per_gpu_hour * gpus
    return _cost(run, per_hour, prompt_tokens, output_tokens, completed, price_per_gpu_hour, gpus)


def _check(price_per_gpu_hour: float, gpus: int) -> None:
    if price_per_gpu_hour <= 0 or gpus < 1:
        raise KVBudgetError(f"gpu_price {price_per_gpu_hour}: give a positive price per GPU-hour", param="gpu_price")


def _cost(run: float, per_hour: float, prompt_tokens: int, output_tokens: int, completed: int,
          price_per_gpu_hour: float, gpus: int) -> Cost:
    def per(count: int, unit: int) -> float | None:
        return run / count * unit if count > 0 else None

    return Cost(price_per_gpu_hour=price_per_gpu_hour, gpus=gpus, per_hour=per_hour, run=run,
                per_million_output_tokens=per(output_tokens, MILLION),
                per_million_tokens=per(prompt_tokens + output_tokens, MILLION),
                per_thousand_requests=per(completed, 1000))


def parse_prices(text: str) -> dict[str | None, float]:
    """'2.49' (any GPU) or 'H100-80GB=2.49,L40S=0.86' (per GPU, by the catalog's names) -> {name or None: price}."""
    from kvbudget.gpus import find_gpu

    def price(value: str, where: str) -> float:
        try:
            found = float(value)
        except ValueError:
            found = -1.0
        if not found > 0 or found == float("inf"):
            raise KVBudgetError(f"gpu_price {where!r}: {value!r} is not a positive price per GPU-hour "
                                "(e.g. 2.49, or H100-80GB=2.49,L40S=0.86)", param="gpu_price")
        return found

    if "=" not in text:
        return {None: price(text.strip(), text)}
    prices: dict[str | None, float] = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise KVBudgetError(f"gpu_price {item!r}: write GPU=PRICE, e.g. H100-80GB=2.49", param="gpu_price")
        try:
            gpu = find_gpu(name.strip()).name
        except KVBudgetError as exc:
            raise KVBudgetError(f"gpu_price {item!r}: {exc}", param="gpu_price") from None
        prices[gpu] = price(value.strip(), item)
    return prices


def price_for(prices: dict[str | None, float], gpu: str | None) -> float:
    """The price of `gpu` (a catalog name, or None for a run without one) from parse_prices' answer."""
    if None in prices:
        return prices[None]
    from kvbudget.gpus import find_gpu

    name = find_gpu(gpu).name if gpu else None
    if name not in prices:
        raise KVBudgetError(f"gpu_price: no price for {name or 'a run without a GPU named'}; give one per GPU "
                            f"simulated (priced: {', '.join(str(k) for k in prices)})", param="gpu_price")
    return prices[name]


def price_table(gpus: Iterable[str] = (), given: Mapping[str | None, float] | None = None) -> dict[str, float]:
    """The on-demand prices per GPU-hour shipped in data/prices.json (each with its provider, instance, source and
    date) as {catalog name: price}, `given` (parse_prices' answer to --gpu-price) over them: one price for every
    GPU, or per GPU. Every GPU in `gpus` (catalog names or aliases) must then have a price, else a one-line error
    asks for --gpu-price."""
    from kvbudget.gpus import find_gpu

    names = [find_gpu(gpu).name for gpu in gpus]
    if given and None in given:
        return {name: given[None] for name in names}
    table = {name: float(row["price_per_gpu_hour"]) for name, row in _price_rows().items()}
    table.update({name: price for name, price in (given or {}).items() if name is not None})
    for name in names:
        if name not in table:
            raise KVBudgetError(f"gpu_price: no price for {name}: data/prices.json has none (it prices "
                                f"{', '.join(sorted(_price_rows()))}); give one, e.g. {name}=2.49",
                                param="gpu_price")
    return table


@cache
def _price_rows() -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = json.loads(
        (resources.files("kvbudget") / "data" / "prices.json").read_text(encoding="utf-8"))["gpus"]
    return rows
