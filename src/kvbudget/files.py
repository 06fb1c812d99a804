"""Files kvbudget writes: whole or not at all, and readable as any file the user creates (0666 less the umask:
0644 by default), so that a Prometheus or a web server running as another user can read the rules and pictures."""

from __future__ import annotations

import os


def umask_mode() -> int:
    """0o666 less the process's umask (read and restored: os.umask has no read-only form)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def publish(tmp: str, target: str) -> None:
    """Give the finished temporary file the mode a new file would get, then rename it over `target`."""
    os.chmod(tmp, umask_mode())
    os.replace(tmp, target)
