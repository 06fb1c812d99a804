"""Start-up stays light: every module a command loads is listed, and none on the deny list may appear (the speed
itself is measured in benchmarks/bench_estimate.py, not asserted here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvbudget.engines import BUILT_IN

HEAVY = {"rich", "huggingface_hub", "numpy", "torch", "transformers", "yaml", "starlette", "prometheus_client"}
OTHER_SUBSYSTEMS = {"kvbudget.planner", "kvbudget.comparison", "kvbudget.budget", "kvbudget.guard",
                    "kvbudget.simulation", "kvbudget.tokens", "kvbudget.web",
                    "kvbudget.quality", "kvbudget.checklog", "kvbudget.hub", "kvbudget.plot", "kvbudget.gpus"}
ENGINE_MODULES = {module for module, _ in BUILT_IN.values()}
# standard library the paths below have no use for (decimal came with fractions, socket with the Hub client,
# shutil with argparse's own terminal-width lookup; a catalog name is read without pathlib)
UNNEEDED_STDLIB = {"importlib.resources", "fractions", "decimal", "tempfile", "difflib", "socket", "pathlib",
                   "shutil"}


def imported(code: str) -> set[str]:
    """Every module loaded once `code` has run in a fresh interpreter (sys.modules at its end; `-X importtime`
    misses modules loaded through importlib.import_module, as the engines and commands are)."""
    probe = f"{code}\nimport sys\nsys.stderr.write('\\n'.join(['<modules>', *sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    names = set(done.stderr.split("<modules>\n", 1)[1].splitlines())
    assert "encodings" in names  # the listing is there at all
    return names


def command(*argv: str) -> set[str]:
    return imported(f"from kvbudget.cli import main\nmain({list(argv)!r})")


def top(names: set[str], wanted: set[str]) -> set[str]:
    """The names in `wanted` that were imported, or whose submodules were."""
    return {w for w in wanted if any(n == w or n.startswith(w + ".") for n in names)}


def test_import_kvbudget_imports_nothing_else():
    names = imported("import kvbudget")
    assert {n for n in names if n.startswith("kvbudget")} == {"kvbudget"}
    assert top(names, HEAVY | {"argparse", "typing", "dataclasses", "json"}) == set()


def test_the_library_loads_only_the_engine_it_runs():
    names = imported("import kvbudget; kvbudget.estimate(kvbudget.load_model('mistral-7b'), 'vllm')")
    assert top(names, ENGINE_MODULES) == {"kvbudget.engines.vllm"}
    assert top(names, HEAVY | OTHER_SUBSYSTEMS | UNNEEDED_STDLIB | {"argparse"}) == set()


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_estimate_json_imports_only_its_own_path(engine):
    names = command("estimate", "mistral-7b", "--engine", engine, "--json")
    assert top(names, ENGINE_MODULES) == {f"kvbudget.engines.{engine}"}
    assert top(names, HEAVY | OTHER_SUBSYSTEMS | UNNEEDED_STDLIB) == set()
    assert top(names, {"kvbudget.cli.plan", "kvbudget.cli.guard", "kvbudget.cli.simulate", "kvbudget.cli.web"}) == set()


def test_estimate_table_adds_rich_and_nothing_more():
    names = command("estimate", "mistral-7b")
    assert "rich" in names
    # rich's own table layout uses fractions (and so decimal)
    assert top(names, (HEAVY - {"rich"}) | OTHER_SUBSYSTEMS | (UNNEEDED_STDLIB - {"fractions", "decimal"})) == set()


def test_help_still_lists_every_command(capsys):
    from kvbudget.cli import MODULE_OF, main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in MODULE_OF)
