"""kvbudget.files: every output written whole or not at all, its target checked first, nothing left behind."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvbudget
from kvbudget.errors import KVBudgetError
from kvbudget.files import check_target, write_file, write_files

SRC = str(Path(kvbudget.__file__).resolve().parents[1])  # the kvbudget under test, for a child process


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def full_disk_after(n: int):
    """A content function that writes `n` bytes, then meets a full disk."""
    def fill(fh) -> None:
        fh.write(b"x" * n)
        raise OSError(errno.ENOSPC, "No space left on device")
    return fill


def test_a_new_file_gets_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path):
    old = os.umask(0o027)
    try:
        assert write_file(str(tmp_path / "new.csv"), "a\n", "timeline") is False
        secret = tmp_path / "secret.yaml"
        secret.write_text("old\n")
        secret.chmod(0o600)
        assert write_file(str(secret), "new\n", "guard_config", force=True) is True
    finally:
        os.umask(old)
    assert mode(tmp_path / "new.csv") == 0o640  # 0666 less the umask 027, not mkstemp's 0600
    assert mode(secret) == 0o600 and secret.read_text() == "new\n"  # never widened to 0644
    assert names(tmp_path) == {"new.csv", "secret.yaml"}


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    kept = tmp_path / "steps.csv"
    kept.write_text("precious\n")
    with pytest.raises(KVBudgetError) as caught:
        write_file(str(kept), "new\n", "timeline")
    assert caught.value.param == "timeline" and "exists" in str(caught.value) and "force" in str(caught.value)
    assert kept.read_text() == "precious\n" and names(tmp_path) == {"steps.csv"}


@pytest.mark.parametrize("where", ["folder", "missing", "below a file"])
def test_targets_that_cannot_be_written_are_refused_before_any_work(tmp_path, where):
    (tmp_path / "plain").write_text("")
    path = {"folder": tmp_path, "missing": tmp_path / "nope" / "x.csv",
            "below a file": tmp_path / "plain" / "x.csv"}[where]
    with pytest.raises(KVBudgetError) as caught:
        check_target(str(path), "timeline")
    text = str(caught.value)
    assert caught.value.param == "timeline" and "\n" not in text and str(path) in text
    assert {"folder": "is a folder", "missing": "does not exist", "below a file": "not a folder"}[where] in text
    assert names(tmp_path) == {"plain"}


def test_an_unwritable_folder_is_refused_in_one_line(unwritable_folder):
    folder = unwritable_folder
    with pytest.raises(KVBudgetError) as caught:
        write_file(str(folder / "x.csv"), "a\n", "timeline")
    assert "permission denied" in str(caught.value) and caught.value.param == "timeline"
    assert names(folder) == set()


def test_a_refusal_while_writing_leaves_nothing(tmp_path, monkeypatch):
    """The folder looked writable, then creating the temporary file fails (the old write_atomically created it
    outside its error handling: a traceback)."""
    real = os.open

    def refuse(path, flags, *args, **kw):
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(KVBudgetError) as caught:
        write_file(str(tmp_path / "x.csv"), "a\n", "per_request")
    monkeypatch.undo()
    assert str(caught.value).startswith("per_request ") and "permission denied" in str(caught.value)
    assert names(tmp_path) == set()


def test_a_full_disk_leaves_the_old_file_and_no_temporary_one(tmp_path):
    old = tmp_path / "plot.png"
    old.write_bytes(b"old picture")
    with pytest.raises(KVBudgetError) as caught:
        write_file(str(old), full_disk_after(1 << 16), "plot", force=True)
    assert "no space left" in str(caught.value) and caught.value.param == "plot"
    assert old.read_bytes() == b"old picture" and names(tmp_path) == {"plot.png"}


def device(tmp_path: Path, name: str) -> Path:
    """A link to a device, so that a writer that replaced what it writes to replaces the link, never the device
    (the old writer, run as root, replaced /dev/full itself with a regular file)."""
    if not os.path.exists(f"/dev/{name}"):
        pytest.skip(f"no /dev/{name}")
    link = tmp_path / name
    link.symlink_to(f"/dev/{name}")
    return link


def test_dev_full_is_a_full_disk_in_one_line(tmp_path):
    with pytest.raises(KVBudgetError, match="no space left"):
        write_file(str(device(tmp_path, "full")), "x" * 100_000, "timeline")
    assert names(tmp_path) == {"full"}


def test_a_device_is_written_into_not_replaced(tmp_path):
    null = device(tmp_path, "null")
    assert write_file(str(null), "discarded\n", "timeline") is False  # no --force needed
    assert null.is_symlink() and stat.S_ISCHR(null.stat().st_mode) and names(tmp_path) == {"null"}


def test_a_link_to_a_file_keeps_the_link(tmp_path):
    real, link = tmp_path / "real.yaml", tmp_path / "link.yaml"
    real.write_text("old\n")
    link.symlink_to(real)
    write_file(str(link), "new\n", "guard_config", force=True)
    assert link.is_symlink() and real.read_text() == "new\n" and names(tmp_path) == {"real.yaml", "link.yaml"}


def test_several_files_are_written_all_or_none(tmp_path):
    """alerts --out: a full disk on the dashboard leaves neither file new (before: the rules were written)."""
    rules, board = tmp_path / "rules.yaml", tmp_path / "board.json"
    with pytest.raises(KVBudgetError, match="no space left"):
        write_files([(str(rules), "groups: []\n"), (str(board), full_disk_after(10))], "out")
    assert names(tmp_path) == set()
    rules.write_text("old rules\n")
    board.write_text("old board\n")
    with pytest.raises(KVBudgetError, match="no space left"):
        write_files([(str(rules), "new\n"), (str(board), full_disk_after(10))], "out", force=True)
    assert rules.read_text() == "old rules\n" and board.read_text() == "old board\n"
    assert names(tmp_path) == {"rules.yaml", "board.json"}


def test_a_rename_that_fails_puts_back_the_files_already_renamed(tmp_path, monkeypatch):
    rules, board, fresh = tmp_path / "rules.yaml", tmp_path / "board.json", tmp_path / "fresh.txt"
    rules.write_text("old rules\n")
    board.write_text("old board\n")
    real, calls = os.replace, []

    def second_fails(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(KVBudgetError, match="Input/output error"):
        write_files([(str(rules), "new\n"), (str(fresh), "new\n"), (str(board), "new\n")], "out", force=True)
    monkeypatch.undo()
    assert rules.read_text() == "old rules\n" and board.read_text() == "old board\n"
    assert names(tmp_path) == {"rules.yaml", "board.json"}


def test_ctrl_c_while_writing_leaves_nothing(tmp_path):
    def interrupted(fh) -> None:
        fh.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_file(str(tmp_path / "x.png"), interrupted, "plot")
    assert names(tmp_path) == set()


def test_sigterm_while_writing_leaves_nothing_and_ends_the_process(tmp_path):
    """A process told to stop while it writes a large file (a killed --plot left hidden 0-byte files): the
    temporary file goes, the old file stays, and the process still ends by the signal."""
    old = tmp_path / "sim.png"
    old.write_bytes(b"old picture")
    script = textwrap.dedent(f"""
        import sys, time
        from kvbudget.files import write_file

        def slow(fh):
            fh.write(b"x" * (8 << 20))
            print("writing", flush=True)
            time.sleep(30)

        write_file({str(old)!r}, slow, "plot", force=True)
        print("not stopped", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": SRC})
    try:
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        child.send_signal(signal.SIGTERM)
        rest = child.communicate(timeout=20)[0]
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM and "not stopped" not in rest
    assert old.read_bytes() == b"old picture" and names(tmp_path) == {"sim.png"}


def test_sigterm_keeps_its_handler_outside_a_write(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    write_file(str(tmp_path / "x.csv"), "a\n", "timeline")
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_web_upload_store_writes_whole_or_not_at_all(tmp_path, monkeypatch):
    """An upload on a full disk is a one-line error naming the upload, and no `.part` file is left (before: an
    OSError, and the partial file stayed)."""
    from kvbudget import files
    from kvbudget.web.api import Limits, Uploads

    store = Uploads(tmp_path / "uploads", Limits())
    kept = store.put("model", "config.json", b'{"model_type": "llama"}')
    assert kept.read_bytes() == b'{"model_type": "llama"}'
    monkeypatch.setattr(files, "_fill", lambda fh, content: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(KVBudgetError, match="no space left") as caught:
        store.put("model", "other.json", b'{"model_type": "qwen2"}')
    assert caught.value.param == "upload" and names(tmp_path / "uploads") == {kept.name}
