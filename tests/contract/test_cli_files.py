"""Every file a command writes: checked before the work, replaced only with --force (or said where replacing is
the point), one line and exit 2 when it cannot be written, nothing left behind."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvbudget
from kvbudget.cli import main

SRC = str(Path(kvbudget.__file__).resolve().parents[1])  # the kvbudget under test, for a child process
SIM = ["simulate", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192", "--rate", "5", "--requests", "30"]
PLAN = ["plan", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "8192"]


def run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def one_error(err: str, *words: str) -> None:
    assert err.count("\n") == 1 and err.startswith("kvbudget: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize(("argv", "flag"), [
    (SIM, "--timeline"), (SIM, "--per-request"), (SIM, "--prometheus-series"), (PLAN, "--guard-config")])
def test_an_existing_output_is_replaced_only_with_force(tmp_path, capsys, argv, flag):
    out = tmp_path / "out.txt"
    out.write_text("precious\n")
    out.chmod(0o600)
    code, err = run(capsys, [*argv, flag, str(out)])
    assert code == 2 and out.read_text() == "precious\n"
    one_error(err, f"{flag} {out}", "exists", "--force")
    code, err = run(capsys, [*argv, flag, str(out), "--force"])
    assert code == 0 and f"kvbudget: replaced {out} ({flag})" in err and out.read_text() != "precious\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and names(tmp_path) == {"out.txt"}


def test_alerts_replace_their_files_only_with_force(tmp_path, capsys):
    assert run(capsys, ["alerts", "--out", str(tmp_path)])[0] == 0
    (tmp_path / "kvbudget-alerts.yaml").write_text("mine\n")
    code, err = run(capsys, ["alerts", "--out", str(tmp_path)])
    assert code == 2 and (tmp_path / "kvbudget-alerts.yaml").read_text() == "mine\n"
    one_error(err, "--out", "--force")
    code, err = run(capsys, ["alerts", "--out", str(tmp_path), "--force"])
    assert code == 0 and err.count("kvbudget: replaced") == 2
    assert names(tmp_path) == {"kvbudget-alerts.yaml", "kvbudget-dashboard.json"}


def test_alerts_on_a_full_disk_write_neither_file(tmp_path, capsys, monkeypatch):
    """The rules were written and the dashboard not: now both or neither, the old ones kept."""
    from kvbudget import files

    real = files._fill

    def dashboard_fills_the_disk(fh, content):
        if isinstance(content, str) and content.startswith("{"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, content)

    monkeypatch.setattr(files, "_fill", dashboard_fills_the_disk)
    code, err = run(capsys, ["alerts", "--out", str(tmp_path)])
    assert code == 2 and names(tmp_path) == set()
    one_error(err, "--out", "no space left")


def test_a_timeline_into_a_missing_folder_is_refused_before_the_simulation(tmp_path, capsys, monkeypatch):
    import kvbudget.commands.simulate as command

    def no_work(*args, **kw):
        raise AssertionError("the work started")

    monkeypatch.setattr(command, "load", no_work)  # the model is the first thing the work reads
    started = time.perf_counter()
    for flag, path, words in (("--timeline", tmp_path / "missing" / "x.csv", ("does not exist",)),
                              ("--per-request", tmp_path, ("is a folder",)),
                              ("--plot", tmp_path / "x.pdf", (".png or .svg",))):
        code, err = run(capsys, [*SIM, flag, str(path)])
        assert code == 2
        one_error(err, flag, *words)
    assert time.perf_counter() - started < 1.0
    code, err = run(capsys, [*SIM, "--timeline", str(tmp_path / "a.csv"), "--per-request", str(tmp_path / "a.csv")])
    assert code == 2
    one_error(err, "--per-request", "--timeline writes the same file")


def test_plan_outputs_are_checked_before_the_plan(tmp_path, capsys, monkeypatch):
    import kvbudget.commands.plan as command

    monkeypatch.setattr(command, "load", lambda *a: pytest.fail("the work started"))
    code, err = run(capsys, [*PLAN, "--guard-config", str(tmp_path / "no" / "g.yaml")])
    assert code == 2
    one_error(err, "--guard-config", "does not exist")


def test_an_unwritable_folder_is_one_line(unwritable_folder, capsys):
    folder = unwritable_folder
    code, err = run(capsys, [*PLAN, "--guard-config", str(folder / "g.yaml")])
    assert code == 2 and names(folder) == set()
    one_error(err, "--guard-config", "permission denied")


def test_a_full_device_is_one_line(tmp_path, capsys):
    """/dev/full through a link: a writer that replaced its target (the old one did, /dev/full itself as root)
    replaces the link here, never the device."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    full = tmp_path / "full"
    full.symlink_to("/dev/full")
    code, err = run(capsys, [*SIM, "--timeline", str(full)])
    assert code == 2 and full.is_symlink() and names(tmp_path) == {"full"}
    one_error(err, f"--timeline {full}", "no space left")


def test_plots_are_replaced_only_with_force(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    png.write_bytes(b"old")
    code, err = run(capsys, [*PLAN, "--plot", str(png)])
    assert code == 2 and png.read_bytes() == b"old"
    one_error(err, "--plot", "exists")
    code, err = run(capsys, [*PLAN, "--plot", str(png), "--force"])
    assert code == 0 and png.read_bytes().startswith(b"\x89PNG") and f"replaced {png}" in err
    assert names(tmp_path) == {"plan.png"}


def test_ctrl_c_while_writing_leaves_nothing(tmp_path, capsys, monkeypatch):
    from kvbudget import files

    def interrupted(fh, content):
        fh.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "_fill", interrupted)
    code, err = run(capsys, [*PLAN, "--guard-config", str(tmp_path / "g.yaml")])
    assert code == 130 and err == "kvbudget: interrupted\n" and names(tmp_path) == set()


def test_a_plot_killed_with_sigterm_leaves_no_hidden_file(tmp_path):
    """`kvbudget plan --plot` told to stop while matplotlib writes (slowed here, as a large picture is)."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    script = textwrap.dedent(f"""
        import sys, time
        import matplotlib.figure
        from kvbudget.cli import main

        def slow_savefig(self, fh, **kw):
            fh = open(fh, "wb") if isinstance(fh, str) else fh
            fh.write(b"\\x89PNG" + b"x" * (4 << 20))
            print("writing", flush=True)
            time.sleep(30)

        matplotlib.figure.Figure.savefig = slow_savefig
        sys.exit(main({[*PLAN, "--plot", str(png)]!r}))
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env={**os.environ, "PYTHONPATH": SRC}, cwd=tmp_path)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        while line and line != "writing\n":
            line = child.stdout.readline()
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM and names(tmp_path) == set()


def test_quality_refuses_an_existing_plot_before_the_model_loads(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import types

    stub = types.ModuleType("kvbudget.quality.report")  # the measurements (torch) never load
    stub.run = lambda *a, **kw: pytest.fail("the work started")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvbudget.quality.report", stub)
    text, png = tmp_path / "prose.txt", tmp_path / "q.png"
    text.write_text("Some prose to measure.\n")
    png.write_bytes(b"old")
    code, err = run(capsys, ["quality", "smollm2-135m-instruct", "--data", str(text), "--plot", str(png)])
    assert code == 2 and png.read_bytes() == b"old"
    one_error(err, f"--plot {png}", "exists", "--force")
