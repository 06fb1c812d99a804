"""Every registered engine sizes or refuses every layer kind model/spec.py defines: the kinds are found from the
spec classes themselves (each subclass of LayerSpec that names its own kind), each met in a catalog model, and an
engine either sizes a model with it or refuses in one line (UnsupportedArchitectureError / EngineRuleError)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from kvbudget import load_model
from kvbudget.catalog import entries
from kvbudget.engines import ENGINES, Allocation, get_engine
from kvbudget.errors import EngineRuleError, UnsupportedArchitectureError
from kvbudget.model import spec
from kvbudget.model.spec import LayerSpec, ModelSpec


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


KINDS = sorted({c for c in _subclasses(LayerSpec) if c.__module__ == spec.__name__ and "kind" in vars(c)},
               key=lambda c: c.kind)


@functools.cache
def examples() -> dict[type, ModelSpec]:
    """The first catalog model with a layer of each kind (exactly that class)."""
    found: dict[type, ModelSpec] = {}
    for entry in entries():
        model = load_model(entry.name)
        for layer in model.layers:
            found.setdefault(type(layer), model)
    return found


def test_the_kinds_are_every_layer_class_that_names_its_kind():
    assert len(KINDS) >= 9
    assert {k.kind for k in KINDS} >= {"full_attention", "sliding_window", "chunked_local", "latent_attention",
                                       "indexer_keys", "compressed", "recurrent_state", "no_cache", "shared_kv"}


def test_every_kind_is_met_in_a_catalog_model():
    assert [k.__name__ for k in KINDS if k not in examples()] == []


def _sizes_or_refuses(engine: str, model: ModelSpec) -> Allocation | None:
    try:
        return get_engine(engine).allocate(model)
    except (UnsupportedArchitectureError, EngineRuleError) as exc:
        text = str(exc)
        assert text and "\n" not in text, text
        return None


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_engine_sizes_or_refuses_every_kind(engine, kind):
    """On the catalog model with the kind, and on that model cut down to its layers of the kind: sized (the
    kinds the engine lists in layer_kinds) or refused in one line (any other kind is always refused)."""
    model = examples()[kind]
    for case in (model, replace(model, layers=tuple(s for s in model.layers if type(s) is kind))):
        found = _sizes_or_refuses(engine, case)
        if not issubclass(kind, get_engine(engine).layer_kinds):
            assert found is None, f"{engine} sized {kind.__name__}, which is not among its layer kinds"
        if found is not None:
            assert isinstance(found, Allocation)
