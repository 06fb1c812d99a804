"""How the command line names the library's parameters: `tp` is `--tp`, and an error about it reads as the flag
people typed. The web page shows the same names, so both front ends render errors with `message()`."""

from __future__ import annotations

from kvbudget.errors import KVBudgetError, flag, spell

__all__ = ["flag", "message"]

def message(exc: KVBudgetError) -> str:
    """The error as one line in command-line terms: the parameter at fault shown as its flag, and the words the
    message spells for each front end (every parameter it names) as the command line says them."""
    raw = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    line = raw.splitlines()[0] if raw else type(exc).__name__
    if exc.param and line.startswith(exc.param):
        line = flag(exc.param) + line[len(exc.param):]
    return spell(line, command_line=True)

