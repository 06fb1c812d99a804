"""Files kvbudget reads and writes. Reading: text streamed lazily, a file that cannot be read named in one line; a
JSON or YAML document read whole only within MAX_DOCUMENT_BYTES and MAX_NESTING, and only if it is UTF-8 text; the
lines of JSON Lines and traces (`read_lines`) one at a time, each within a bound and UTF-8, and each JSON line
parsed as a document is (`parse_json_text`).

Writing, every file through `write_files`: a target is checked before the work that fills it starts
(`check_target`: its folder exists and can be written, it is not a folder, and an existing file is replaced only when
asked); then each file goes to a temporary file beside its target, flushed to the disk and renamed over it, so that
a reader sees the old file or the new one, never half of one. A new file is readable as any file the user creates
(0666 less the umask: 0644 by default, so that a Prometheus or a web server running as another user can read the
rules and pictures); a replaced one keeps its mode (a 0600 file stays 0600). Several files are written all or none.
On any failure, Ctrl-C or SIGTERM, no temporary file is left and the targets are as they were; a failure is one
`KVBudgetError` naming the parameter and the path. A target that exists and is not a regular file (/dev/null,
/dev/stdout, a pipe) is written into directly."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from itertools import accumulate
from typing import Any, BinaryIO

from kvbudget.errors import KVBudgetError, TokenizerError, named

Content = str | bytes | Callable[[BinaryIO], None]  # text (UTF-8), bytes, or a function writing the file

_WHY = {errno.ENOSPC: "no space left on the device; free some, or write elsewhere",
        errno.EDQUOT: "over the disk quota; free some, or write elsewhere",
        errno.EACCES: "permission denied; write to a folder you may write in",
        errno.EPERM: "permission denied; write to a folder you may write in",
        errno.EROFS: "the file system is read-only; write elsewhere",
        errno.EISDIR: "it is a folder; name a file in it",
        errno.ENOENT: "its folder does not exist; create it first",
        errno.ENOTDIR: "part of its folder is a file, not a folder; name an existing folder",
        errno.ENAMETOOLONG: "the name is too long; use a shorter one"}

MAX_DOCUMENT_BYTES = 16 << 20  # 16 MiB: a config.json is under 20 KB, a guard YAML, calibration or report under 1 MB
MAX_NESTING = 64  # levels of [ and {: a config nests 3 (rope_scaling in text_config), a guard YAML 4
_JSON_STRINGS = r'"(?:[^"\\]|\\.)*"'  # compiled (and cached) by re on first use


def cannot_write(exc: OSError, path: str, param: str) -> KVBudgetError:
    """An OSError met writing `path` as one line naming `param`, what went wrong and what to do."""
    why = _WHY.get(exc.errno or 0) or (exc.strerror or str(exc))
    return KVBudgetError(f"{param} {path}: cannot write it: {why}", param=param)


def check_target(path: str, param: str, force: bool = False) -> str:
    """Refuse, before any work, a file that could not be written to `path` (the value of `param`): an empty name, a
    folder, a missing folder or one that cannot be written in, or an existing file unless `force`. Returns the file
    that will be written (symbolic links followed)."""
    if not path:
        raise KVBudgetError(f"{param}: give a file name", param=param)
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise cannot_write(OSError(errno.EISDIR, "is a folder"), path, param)
    if os.path.exists(target) and not _regular(target):  # /dev/null, a pipe: written into, nothing replaced
        if not os.access(target, os.W_OK):
            raise cannot_write(OSError(errno.EACCES, "permission denied"), path, param)
        return target
    target = os.path.realpath(target)  # a link to a file: the file is replaced, the link kept
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        shown = folder if os.path.islink(os.path.abspath(path)) else os.path.dirname(path)  # as the user named it
        raise KVBudgetError(f"{param} {path}: its folder {shown} {what}; create it first", param=param)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise cannot_write(OSError(errno.EACCES, "permission denied"), path, param)
    if not force and _regular(target):
        raise KVBudgetError(f"{param} {path}: the file exists; give {named('force')} to replace it, or another "
                            "name", param=param)
    return target


def check_targets(targets: Sequence[tuple[str | None, str]], force: bool = False) -> None:
    """`check_target` for each (path, parameter) given (a None path is an output not asked for), and no two outputs
    to the same file."""
    seen: dict[str, str] = {}
    for path, param in targets:
        if path is None:
            continue
        target = check_target(path, param, force)
        if target in seen:
            raise KVBudgetError(f"{param} {path}: {named(seen[target])} writes the same file; give each its own",
                                param=param)
        seen[target] = param


def write_file(path: str, content: Content, param: str, force: bool = False) -> bool:
    """Write one file whole or not at all (see the module); True when it replaced an existing file."""
    return write_files([(path, content)], param, force)[0]


def write_files(outputs: Sequence[tuple[str, Content]], param: str, force: bool = False) -> tuple[bool, ...]:
    """Write every (path, content) whole, or none of them: all the temporary files first, then the renames (one
    that fails puts back what the earlier ones replaced). For each, True when it replaced an existing file."""
    targets = [check_target(path, param, force) for path, _ in outputs]
    existed = tuple(_regular(t) for t in targets)
    temps: list[str] = []
    backups: dict[str, str] = {}
    done: list[str] = []
    current = ""  # the path being written, for the error
    with _unwinding_on_sigterm(param, outputs[0][0] if outputs else ""):
        try:
            for target, (path, content) in zip(targets, outputs, strict=True):
                current = path
                temps.append("" if os.path.exists(target) and not _regular(target) else _temporary(target))
                with open(temps[-1] or target, "r+b" if temps[-1] else "wb") as fh:  # /dev/null, a pipe: into it
                    _fill(fh, content)
                    fh.flush()
                    if temps[-1]:
                        os.fsync(fh.fileno())
            for target, tmp, (path, _) in zip(targets, temps, outputs, strict=True):
                current = path
                if tmp and len(outputs) > 1 and _regular(target):  # kept until every rename has succeeded
                    _backup(target, backups)
                if tmp:
                    os.replace(tmp, target)
                    done.append(target)
            _sync_folders(targets)
        except BaseException as exc:
            _put_back(done, backups)
            if isinstance(exc, OSError):
                raise cannot_write(exc, current, param) from None
            raise
        finally:
            for name in (*temps, *backups.values()):
                if name:
                    _remove(name)
    return existed


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _temporary(target: str, link: bool = False) -> str:
    """A new file in the target's folder, named after it (`.NAME.kvbudget-XXXXXXXX.tmp`): created with 0666 less
    the umask (the kernel applies it), or the mode of the file it replaces; with `link`, a second name of the
    existing target (a backup that costs no space)."""
    folder, name = os.path.split(target)
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.kvbudget-{os.urandom(4).hex()}.tmp")
        try:
            if link:
                os.link(target, tmp)
                return tmp
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            if _regular(target):
                os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        finally:
            os.close(fd)
        return tmp
    raise OSError(errno.EEXIST, "no free temporary name")


def _fill(fh: BinaryIO, content: Content) -> None:
    if isinstance(content, str):
        fh.write(content.encode("utf-8"))
    elif isinstance(content, bytes):
        fh.write(content)
    else:
        content(fh)


def _backup(target: str, backups: dict[str, str]) -> None:
    """A second name for `target` until a set of files is in place (none where the file system has no links)."""
    try:
        backups[target] = _temporary(target, link=True)
    except OSError:
        pass


def _put_back(done: list[str], backups: dict[str, str]) -> None:
    """Undo the renames of a set of files that failed part way: originals back, new files gone."""
    for target in done:
        try:
            if target in backups:
                os.replace(backups.pop(target), target)
            else:
                os.unlink(target)
        except OSError:
            pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sync_folders(targets: list[str]) -> None:
    """The renames flushed too (best effort: some file systems cannot open a folder)."""
    for folder in dict.fromkeys(os.path.dirname(t) for t in targets):
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


class _Terminated(BaseException):
    """SIGTERM arrived while files were being written: unwinds the write so that its temporary files go."""


@contextmanager
def _unwinding_on_sigterm(param: str, path: str) -> Iterator[None]:
    """While files are written in the main thread, SIGTERM raises instead of ending the process on the spot; once
    the write has cleaned up, the signal is delivered again to whatever handled it before (by default: the process
    ends, as it would have). Ctrl-C needs nothing: KeyboardInterrupt unwinds already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return
    got: list[int] = []

    def unwind(signum: int, _frame: object) -> None:
        if not got:  # once: the cleanup itself is not interrupted
            got.append(signum)
            raise _Terminated

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    if got:
        signal.raise_signal(signal.SIGTERM)
        raise KVBudgetError(f"{param} {path}: not written: the process was told to stop (SIGTERM)", param=param)


MAX_TEXT_BYTES = 64 << 20  # a text read whole (a prompt, quality's data): the longest context, 2^24 tokens, is ~64 MiB


def read_text(path: str, what: str = "text") -> str:
    """A whole UTF-8 text file (a prompt, a document), or standard input for -, at most MAX_TEXT_BYTES (a file's size
    checked before reading)."""
    import sys

    size = 0
    try:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data: bytes | str = stream.read(MAX_TEXT_BYTES + 1) if stream else sys.stdin.read(MAX_TEXT_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                data = fh.read(MAX_TEXT_BYTES + 1) if size <= MAX_TEXT_BYTES else b""
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if size > MAX_TEXT_BYTES or len(data) > MAX_TEXT_BYTES:
        raise TokenizerError(f"{'standard input' if path == '-' else path}: over {MAX_TEXT_BYTES:,} bytes; kvbudget "
                             f"reads {what} of up to 64 MiB (about the longest context any model takes); give a "
                             "part of it")
    try:
        return data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not UTF-8 text") from None


def iter_lines(path: str) -> Iterator[str]:
    """Lines of a (possibly huge) file, read lazily."""
    try:
        with open(path, encoding="utf-8", errors="strict") as fh:
            yield from fh
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def check_readable(*paths: str) -> None:
    """Fail as reading would (one line naming the file), before a tokenizer takes seconds to load."""
    for path in paths:
        if path == "-":
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TokenizerError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def too_deep(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether [ and { (outside double-quoted strings) nest deeper than `limit`: JSON's parser, and YAML's for flow
    collections, recurse once per level (100,000 of them were a RecursionError)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = re.sub(r"[^\[\]{}]", "", re.sub(_JSON_STRINGS, "", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0) > limit


def read_document(path: str | os.PathLike[str], param: str, kind: str = "JSON",
                  error: type[KVBudgetError] = KVBudgetError) -> str:
    """The whole text of a document file: at most MAX_DOCUMENT_BYTES (checked before reading), UTF-8, no NUL bytes
    (a binary file), nested at most MAX_NESTING deep; else an `error` naming the file and `param`."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_DOCUMENT_BYTES:
                raise error(f"{path}: {size:,} bytes; kvbudget reads {kind} files of up to "
                                    f"{MAX_DOCUMENT_BYTES:,} bytes (16 MiB)", param=param)
            raw = fh.read(MAX_DOCUMENT_BYTES + 1)  # a file that grows while read stops here too
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc}); check the path and "
                            "permissions", param=param) from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise error(f"{path}: over {MAX_DOCUMENT_BYTES:,} bytes (16 MiB)", param=param)
    text = _text(raw, str(path), param, f"{kind} file", error)
    _check_nesting(text, str(path), param, f"{kind} file", error)
    return text


def read_tail(path: str, param: str, most: int) -> tuple[str, bool]:
    """The last `most` bytes of a regular file (a log whose latest lines matter), as text (bytes that are not UTF-8
    replaced), and whether the file was longer; else an error naming the file and `param`. A pipe or device is
    refused, not read until it ends."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise KVBudgetError(f"{param} {path}: not a regular file; give a log file", param=param)
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - most))
            raw = fh.read(most)
    except OSError as exc:
        raise KVBudgetError(f"{param} {path}: cannot read it ({exc.strerror or exc})", param=param) from None
    return raw.decode("utf-8", errors="replace"), size > most


def read_lines(path: str | os.PathLike[str], param: str, kind: str = "JSON Lines",
               most: int = MAX_DOCUMENT_BYTES, error: type[KVBudgetError] = KVBudgetError
               ) -> Generator[str, None, None]:
    """The lines of a text file (each with its newline), read one at a time: a line of JSON Lines is a document,
    so each is at most `most` bytes (a longer one is refused once that many are read, never read whole), UTF-8
    without NUL bytes; else an `error` naming the file, the line and `param`."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc}); check the path and permissions",
                    param=param) from None
    with fh:
        number = 0
        while True:
            number += 1
            try:
                raw = fh.readline(most + 1)
            except OSError as exc:
                raise error(f"{path}:{number}: cannot read it ({exc.strerror or exc})", param=param) from None
            if not raw:
                return
            if len(raw) > most and not raw.endswith(b"\n"):  # `most` bytes and its newline pass
                raise error(f"{path}:{number}: a line longer than {most:,} bytes; no {kind} file kvbudget reads "
                            "has one (a binary file?)", param=param)
            yield _text(raw, f"{path}:{number}", param, f"{kind} file", error)


def parse_json_text(text: str, where: str, param: str | None = None, kind: str = "JSON file",
                    error: type[KVBudgetError] = KVBudgetError) -> Any:
    """One JSON value from text (a document's, or one line of JSON Lines), nested at most MAX_NESTING deep; else
    an `error` starting with `where` (the file, or its line) and naming `param`."""
    _check_nesting(text, where, param, kind, error)
    return _loads(text, where, param, error)


def read_json(path: str | os.PathLike[str], param: str, error: type[KVBudgetError] = KVBudgetError) -> Any:
    """A JSON document from a file (read_document's bounds), its errors naming the file and `param`."""
    return _loads(read_document(path, param, error=error), str(path), param, error, document=True)


def _text(raw: bytes, where: str, param: str | None, kind: str, error: type[KVBudgetError]) -> str:
    """UTF-8 bytes as text; NUL bytes, which no text file holds, and other bytes refused as a binary file."""
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "NUL byte")
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text (a binary file?); give a {kind}", param=param) from None


def _check_nesting(text: str, where: str, param: str | None, kind: str, error: type[KVBudgetError]) -> None:
    if too_deep(text):
        raise error(f"{where}: nests [ and {{ more than {MAX_NESTING} levels deep; no {kind} kvbudget reads "
                    "needs that many", param=param)


def _loads(text: str, where: str, param: str | None, error: type[KVBudgetError], document: bool = False) -> Any:
    """json.loads, its errors one line starting with `where` (a file's line and column; in one line of text, or
    a line of JSON Lines, the column)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if document or "\n" in text.strip() else f"column {exc.colno}"
        raise error(f"{where}: invalid JSON at {at}: {exc.msg}", param=param) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        why = (f"a number of over {sys.get_int_max_str_digits():,} digits" if "digits" in str(exc)
               else str(exc).splitlines()[0])
        raise error(f"{where}: invalid JSON: {why}", param=param) from None
    except RecursionError:  # nesting the bracket count cannot see; never expected after too_deep
        raise error(f"{where}: nests too deep to read", param=param) from None


def read_yaml(path: str | os.PathLike[str], param: str) -> Any:
    """A YAML document from a file (read_document's bounds; safe_load: no Python objects)."""
    import yaml

    text = read_document(path, param, "YAML")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KVBudgetError(f"{path}: invalid YAML: {exc}".splitlines()[0], param=param) from None
    except RecursionError:  # block nesting by indentation, which too_deep does not count
        raise KVBudgetError(f"{path}: nests too deep to read; no YAML file kvbudget reads needs more than "
                            f"{MAX_NESTING} levels", param=param) from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise KVBudgetError(f"{path}: invalid YAML ({exc})".splitlines()[0], param=param) from None
