"""Every example in the README and the docs runs, and prints what the page shows.

Conventions of the pages (docs/design/development.md says them for writers):
- ```console blocks: `$ command` lines, each followed by the output it prints (stdout and stderr together, at 80
  columns). A line `...` stands for any lines. A command that exits non-zero ends its output with
  `(exit status N)`.
- ```bash blocks: run as one script; every command must succeed.
- ```python blocks: run as one program.
- An HTML comment `<!-- example: KIND -->` on the line before a block says how it runs instead: `ci` (the README's
  two commands, which .ci/run runs from a fresh clone), `server` (each command starts a server that must still be
  up after a few seconds; then it is stopped), `cluster` (needs promtool or Ray: run by the cluster suite).
Commands run in an empty folder, one per page, in which `docs` and `tests` are the repository's, as in a clone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_FENCE = re.compile(r"(?:<!-- example: (?P<kind>[a-z-]+) -->\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.M | re.S)
RUN = {"console", "bash", "python"}


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    kind: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            if m["lang"] in RUN:
                found.append(Example(page, text[:m.start("body")].count("\n") + 1, m["lang"], m["kind"] or "",
                                     m["body"]))
    return found


ALL = examples()


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV"))}
    env.update(COLUMNS="80", HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               KVBUDGET_DOCS_EXAMPLE="1", NO_COLOR="1", TERM="dumb")
    return env


_FOLDERS: dict[Path, Path] = {}


def folder(tmp_path: Path, page: Path) -> Path:
    """One folder per page, shared by its examples in order (a file one writes, the next may read)."""
    if page not in _FOLDERS:
        for name in ("docs", "tests"):
            (tmp_path / name).symlink_to(REPO / name)
        _FOLDERS[page] = tmp_path
    return _FOLDERS[page]


def commands(body: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of a console block; continuation lines ending in \\ are joined."""
    out: list[tuple[str, list[str]]] = []
    lines = body.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise AssertionError(f"console block: output before any command: {line!r}")
        command = line[2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i].rstrip())
            i += 1
        out.append((command, expected))
    return out


def shows(expected: list[str], actual: list[str]) -> str | None:
    """None when `actual` shows every expected line in order (`...` skipping any), else what is missing."""
    segments: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == "...":
            segments.append([])
        else:
            segments[-1].append(line)
    at = 0
    for n, segment in enumerate(segments):
        if not segment:
            continue
        anchored = n == 0  # without a leading `...` the output starts with the first line shown
        for start in range(at, len(actual) - len(segment) + 1):
            if actual[start:start + len(segment)] == segment:
                at = start + len(segment)
                break
            if anchored:
                return f"the output should start with {segment[0]!r}, it starts with {actual[start]!r}"
        else:
            return f"not in the output (in this order): {segment[0]!r}"
    if segments[-1] and at != len(actual):  # without a trailing `...`, nothing after the last line shown
        return f"more output after {segments[-1][-1]!r}: {actual[at]!r}"
    return None


def run_console(example: Example, tmp_path: Path) -> None:
    cwd = folder(tmp_path, example.page)
    for command, expected in commands(example.body):
        status = 0
        if expected and (m := re.fullmatch(r"\(exit status (\d+)\)", expected[-1])):
            status, expected = int(m[1]), expected[:-1]
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=environment(tmp_path), capture_output=True,
                              text=True, timeout=300)
        actual = [line.rstrip() for line in (done.stdout + done.stderr).rstrip("\n").split("\n")]
        assert done.returncode == status, f"{example.id}: `{command}` exited {done.returncode}:\n" + "\n".join(actual)
        problem = shows(expected, actual)
        assert problem is None, f"{example.id}: `{command}`: {problem}\nit printed:\n" + "\n".join(actual)


def run_bash(example: Example, tmp_path: Path) -> None:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", example.body], cwd=folder(tmp_path, example.page),
                          env=environment(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{example.id} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def run_python(example: Example, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", example.body], cwd=folder(tmp_path, example.page),
                          env=environment(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{example.id}:\n{done.stdout}{done.stderr}"


def run_servers(example: Example, tmp_path: Path) -> None:
    """Each command starts a server: it must still be running after a few seconds (then it is stopped)."""
    cwd = folder(tmp_path, example.page)
    for command in re.sub(r"\\\n\s*", " ", example.body).splitlines():
        command = command.split(" #")[0].strip()
        if not command or command.startswith("#"):
            continue
        port = re.search(r"--listen \S*:(\d+)", command)
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=environment(tmp_path),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                if port and subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port[1]}"],
                                           capture_output=True).returncode == 0:
                    break
                time.sleep(0.3)
            assert proc.poll() is None, f"{example.id}: `{command}` stopped:\n{proc.stdout.read()}"  # type: ignore
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def _params(kinds: set[str]) -> list:
    return [pytest.param(e, id=e.id) for e in ALL if e.kind in kinds]


@pytest.mark.parametrize("example", _params({""}))
def test_example(example: Example, tmp_path: Path) -> None:
    {"console": run_console, "bash": run_bash, "python": run_python}[example.lang](example, tmp_path)


@pytest.mark.parametrize("example", _params({"server"}))
def test_server_example(example: Example, tmp_path: Path) -> None:
    run_servers(example, tmp_path)


def test_the_readme_opens_with_the_two_commands_ci_runs() -> None:
    first = [e for e in ALL if e.page.name == "README.md"][:2]
    assert [e.body.strip() for e in first] == ["pip install . && kvbudget estimate mistral-7b",
                                               "pip install '.[test]' && python -m pytest"]
    assert all(e.kind == "ci" for e in first)
    ci = (REPO / ".ci" / "run").read_text()
    assert "readme_command" in ci and "git clone" in ci  # .ci/run reads them from the README, in a fresh clone


def test_only_known_kinds_and_every_page_has_a_runnable_example() -> None:
    assert {e.kind for e in ALL} <= {"", "ci", "server", "cluster"}
    guides = sorted((REPO / "docs" / "guides").glob("*.md"))
    assert len(guides) >= 10
    for page in guides:
        assert any(e.page == page for e in ALL), f"{page.name} has no example that runs"


def test_the_checker_can_fail() -> None:
    assert shows(["a", "...", "c"], ["a", "b", "c"]) is None
    assert shows(["a", "c"], ["a", "b", "c"]) is not None
    assert shows(["b"], ["a", "b"]) is not None  # anchored at the start
    assert shows(["...", "b"], ["a", "b", "c"]) is not None  # nothing after the last line shown
    assert shows(["...", "b", "..."], ["a", "b", "c"]) is None


def test_no_development_history_where_users_read() -> None:
    history = re.compile(r"\b[Ii]ssue \d+|closing note|this session|\b20\d\d-\d\d-\d\d\b")
    for page in PAGES:
        if page.name in ("changelog.md",):
            continue
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            assert not history.search(line), f"{page.relative_to(REPO)}:{n}: {line.strip()[:100]}"


@pytest.mark.cluster
@pytest.mark.parametrize("example", _params({"cluster"}))
def test_cluster_example(example: Example, tmp_path: Path) -> None:
    {"console": run_console, "bash": run_bash, "python": run_python}[example.lang](example, tmp_path)


def test_the_errors_page_states_each_limit_as_the_code_sets_it() -> None:
    """Every constant the errors page names in its limits tables has the value the row states (a limit changed in
    the code and not on the page fails here)."""
    import importlib

    page = (REPO / "docs" / "reference" / "errors.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`kvbudget." in line]
    checked = 0
    for row in rows:
        for dotted in re.findall(r"`(kvbudget(?:\.\w+)+\.[A-Z][A-Z_]+)`", row):
            module, name = dotted.rsplit(".", 1)
            value = getattr(importlib.import_module(module), name)
            forms = {f"{value:,}", str(value)}
            if isinstance(value, float) and value.is_integer():
                forms.add(f"{int(value):,}")
            whole = int(value)
            if whole > 1 and whole & (whole - 1) == 0:
                forms |= {f"2^{whole.bit_length() - 1}", f"{whole >> 20:,} MiB"}
            if whole > 1 and (whole + 1) & whole == 0:
                forms.add(f"2^{whole.bit_length()} - 1")
            assert any(form in row for form in forms), (dotted, value, row)
            checked += 1
    assert checked >= 20, checked
