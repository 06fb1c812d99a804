"""Fixtures shared by the simulation tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def extractor():
    """scripts/extract_step_profiles.py as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[3] / "scripts" / "extract_step_profiles.py"
    spec = importlib.util.spec_from_file_location("extract_step_profiles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
