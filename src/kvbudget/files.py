"""Files kvbudget reads and writes. Reading: text streamed lazily, a file that cannot be read named in one line.
Writing: whole or not at all, and readable as any file the user creates (0666 less the umask: 0644 by default), so
that a Prometheus or a web server running as another user can read the rules and pictures."""

from __future__ import annotations

import os
from collections.abc import Iterator

from kvbudget.errors import TokenizerError


def umask_mode() -> int:
    """0o666 less the process's umask (read and restored: os.umask has no read-only form)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def publish(tmp: str, target: str) -> None:
    """Give the finished temporary file the mode a new file would get, then rename it over `target`."""
    os.chmod(tmp, umask_mode())
    os.replace(tmp, target)


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
