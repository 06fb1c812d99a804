"""How an engine sizes each layer kind: a table keyed by the kind's class (model/spec.py), one rule per kind, as
vLLM's specs.py keeps one spec class per kind. A layer takes the rule of the nearest class in its own class's
ancestry, so a rule for `Attention` sizes full, sliding and chunked attention alike unless one of them has its own.
A kind an engine does not size has no rule (refuse_unchecked() refuses a model with it), or a rule that raises a
one-line UnsupportedArchitectureError saying why."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from kvbudget.errors import UnsupportedArchitectureError
from kvbudget.model.spec import LayerSpec

R = TypeVar("R")
Rule = Callable[..., R]


class KindTable(Generic[R]):
    """An engine's rules by layer-kind class; calling it with a layer (and the rule's other arguments) applies the
    layer's rule."""

    def __init__(self, engine: str, rules: Mapping[type[LayerSpec], Rule[R]]) -> None:
        self.engine = engine
        self.rules = dict(rules)

    @property
    def kinds(self) -> tuple[type[LayerSpec], ...]:
        """The kinds with a rule (a refusal included): what the engine's refuse_unchecked() lets through."""
        return tuple(self.rules)

    def rule(self, kind: type[LayerSpec]) -> Rule[R] | None:
        """The rule for `kind`: its own, else its nearest base class's; None where the engine has none."""
        return next((self.rules[c] for c in kind.__mro__ if c in self.rules), None)

    def __call__(self, layer: LayerSpec, *args: Any, **kwargs: Any) -> R:
        rule = self.rule(type(layer))
        if rule is None:
            raise UnsupportedArchitectureError(f"layer {layer.layer} keeps a {layer.kind} cache "
                                               f"({type(layer).__name__}), which kvbudget does not size for "
                                               f"{self.engine} yet")
        return rule(layer, *args, **kwargs)


def no_cache(layer: LayerSpec, *args: Any, **kwargs: Any) -> None:
    """The rule for a layer that keeps no cache of its own."""
    return None

