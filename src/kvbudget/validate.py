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
