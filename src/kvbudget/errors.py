"""kvbudget's errors: one tree, each message saying what was wrong, where, and how to fix it.

Messages name the library's parameters (`tp`, `kv_memory`, `block_size`), never command-line flags; an error
about one parameter starts with its name and carries it in `param`, and the CLI shows it as that flag. A message
that names other parameters in its middle marks each with `named()`: `str()` reads them as the library's names,
and each front end spells them its own way (`kvbudget.commands.spelling`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

MARK = "\x1f"  # around a parameter named inside a message: MARK name MARK metavar MARK
_NAMED = re.compile(f"{MARK}([a-z_]+){MARK}([^{MARK}]*){MARK}")


def named(param: str, metavar: str = "") -> str:
    """`param` named inside an error message: the library reads it as its name, the command line as its flag
    (followed by `metavar`, e.g. FILE, where the flag takes a value the message stands for)."""
    return f"{MARK}{param}{MARK}{metavar}{MARK}"


def spell(message: str, spelling: Callable[[str, str], str] | None = None) -> str:
    """A message with its named parameters spelled by `spelling(param, metavar)` (default: their names)."""
    if MARK not in message:
        return message
    if spelling is None:
        return _NAMED.sub(lambda m: m.group(1), message)
    return _NAMED.sub(lambda m: spelling(m.group(1), m.group(2)), message)


class KVBudgetError(ValueError):
    """Bad input. `param` is the parameter at fault when there is one (the message starts with it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __str__(self) -> str:
        return spell(super().__str__())


class ConfigError(KVBudgetError):
    """A model config (or the file holding it) that cannot be read: missing, invalid, lacking a field."""


class UnsupportedArchitectureError(ConfigError):
    """A model whose layers kvbudget, or the chosen engine, does not handle."""


class EngineRuleError(KVBudgetError):
    """A setting the engine itself would refuse: a tensor-parallel size, block size or KV dtype."""


class BudgetError(KVBudgetError):
    """A memory budget that holds nothing useful, or a model that leaves no room for the KV cache."""


class TokenizerError(KVBudgetError):
    """A tokenizer or chat template that cannot be had or applied, or a prompt that cannot be read."""


class UpstreamConfigError(KVBudgetError):
    """A guard setting about its upstreams or policy that cannot work (a bad URL, thresholds that do not rise)."""


__all__ = ["BudgetError", "ConfigError", "EngineRuleError", "KVBudgetError", "TokenizerError",
           "UnsupportedArchitectureError", "UpstreamConfigError", "named", "spell"]
