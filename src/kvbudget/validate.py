"""Checks of the values people give, in one place: each passes a good value through and raises a one-line
`KVBudgetError` naming the parameter otherwise. Text is parsed in `units` (sizes, lists of counts) and in the
commands' option readers; what a value means for a model or an engine is checked where that is known."""

from __future__ import annotations

from collections.abc import Iterable

from kvbudget.errors import KVBudgetError


def positive(value: object, param: str, what: str) -> int:
    """A positive integer (not a bool); `what` says in words what it counts."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise KVBudgetError(f"{param}: {what} must be a positive integer, got {value!r}", param=param)
    return value


def positive_ints(values: Iterable[int], param: str) -> tuple[int, ...]:
    """At least one value, each a positive integer."""
    values = tuple(values)
    if not values:
        raise KVBudgetError(f"{param}: give at least one value", param=param)
    for v in values:
        if type(v) is not int or v < 1:  # the slow path, with its precise error
            return tuple(positive(v, param, "each value") for v in values)
    return values


def positive_int(value: int, param: str) -> int:
    """One positive integer (the estimator's fast path: no tuple for a good value)."""
    if type(value) is int and value >= 1:
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
