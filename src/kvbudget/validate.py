"""Checks of the values people give, in one place: each passes a good value through and raises a one-line
`KVBudgetError` naming the parameter otherwise. Text is parsed in `units` (sizes, lists of counts) and in the
commands' option readers; what a value means for a model or an engine is checked where that is known."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvbudget.errors import KVBudgetError

MAX_COUNT = 2**31 - 1  # counts (tokens, sequences, GPUs, blocks): what engines hold in an int32, past any real one
MAX_BYTES = 2**50  # sizes: 1 PiB, past any GPU, host tier or disk tier one deployment has
MAX_SECONDS = 86_400.0  # an interval (scrapes, polls, samples of a timeline): a day at most
MAX_SEED = 2**64 - 1  # a random seed (synthetic arrivals, drafts' acceptance): 64 bits


def shown(value: object) -> str:
    """A value as an error message shows it: its repr, or how long it is where that is long."""
    text = repr(value)
    if len(text) <= 40:
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return f"a number of about {round(value.bit_length() * math.log10(2)):,} digits"
    return f"{text[:30]}... ({len(text)} characters)"


def positive(value: object, param: str, what: str, most: int = MAX_COUNT) -> int:
    """A positive integer (not a bool) up to `most`; `what` says in words what it counts."""
    if type(value) is int and 0 < value <= most:
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise KVBudgetError(f"{param}: {what} must be a positive integer, got {shown(value)}", param=param)
    raise KVBudgetError(f"{param}: {what} must be at most {most:,}, got {shown(value)}", param=param)


def count(value: object, param: str, least: int = 0, most: int = MAX_COUNT, given: str | None = None) -> int:
    """An integer (not a bool) from `least` to `most` (a count that may be 0, a seed); `given`: the text it was
    read from, shown in the error."""
    if type(value) is int and least <= value <= most:
        return value
    raise KVBudgetError(f"{param}: {shown(value if given is None else given)} must be a whole number from "
                        f"{least:,} to {most:,}", param=param)


def size(value: object, param: str, least: int = 1) -> int:
    """A size in bytes: an integer from `least` to MAX_BYTES (1 PiB)."""
    if type(value) is int and least <= value <= MAX_BYTES:
        return value
    raise KVBudgetError(f"{param}: {shown(value)} must be a whole number of bytes from {least:,} to {MAX_BYTES:,} "
                        "(1 PiB)", param=param)


def number(value: object, param: str, least: float = 0.0, most: float = MAX_COUNT, above: bool = True,
           given: str | None = None) -> float:
    """A finite number (not a bool) above `least` (from it with `above=False`) up to `most`; `given`: the text it
    was read from, shown in the error."""
    v = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            v = float(value)
        except OverflowError:  # an int past float's range
            pass
    if math.isfinite(v) and (v > least if above else v >= least) and v <= most:
        return v
    low = f"above {_plain(least)}" if above else f"from {_plain(least)}"
    raise KVBudgetError(f"{param}: {shown(value if given is None else given)} must be a number {low} up to "
                        f"{_plain(most)}", param=param)


def fraction(value: object, param: str, given: str | None = None) -> float:
    """A share: a number above 0 up to 1."""
    return number(value, param, 0.0, 1.0, given=given)


def _plain(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def positive_ints(values: Iterable[int], param: str) -> tuple[int, ...]:
    """At least one value, each a positive integer."""
    values = tuple(values)
    if not values:
        raise KVBudgetError(f"{param}: give at least one value", param=param)
    for v in values:
        if type(v) is not int or not 0 < v <= MAX_COUNT:  # the slow path, with its precise error
            return tuple(positive(v, param, "each value") for v in values)
    return values


def positive_int(value: int, param: str) -> int:
    """One positive integer (the estimator's fast path: no tuple for a good value)."""
    if type(value) is int and 0 < value <= MAX_COUNT:
        return value
    return positive_ints((value,), param)[0]


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces), where a server listens (the guard, the web page)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise KVBudgetError(f"listen: {text!r} is not HOST:PORT with a port from 1 to 65535 (IPv6: [::1]:8080)",
                            param="listen")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise KVBudgetError(f"listen: {text!r}: put an IPv6 address in brackets, as [::1]:{port}", param="listen")
    return host or "0.0.0.0", int(port)
