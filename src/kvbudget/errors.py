"""kvbudget's errors: one tree, each message saying what was wrong, where, and how to fix it.

Messages name the library's parameters (`tp`, `kv_memory`, `block_size`), never command-line flags; an error
about one parameter starts with its name and carries it in `param`, and the CLI shows it as that flag. A message
that names other parameters in its middle marks each with `named()` (other words front ends say differently with
`spelled()`): `str()` reads the library's words, and the command line and the web page its own
(`kvbudget.commands.spelling`).
"""

from __future__ import annotations

import re

MARK = "\x1f"  # around words that front ends spell their own way: MARK library MARK command line MARK
_SPELLED = re.compile(f"{MARK}([^{MARK}]*){MARK}([^{MARK}]*){MARK}")


def flag(param: str) -> str:
    """The command line's flag for a parameter: `kv_memory` is `--kv-memory`."""
    return "--" + param.replace("_", "-")


def spelled(library: str, command_line: str) -> str:
    """Words of a message that the library and the command line (and the web page, which takes its names) say
    differently."""
    return f"{MARK}{library}{MARK}{command_line}{MARK}"


def named(param: str, metavar: str = "", value: bool | None = None) -> str:
    """`param` named inside a message: the library reads its name (`param=value` for a switch's value), the
    command line its flag (`--no-param` for False), followed by `metavar` where the flag takes a value."""
    if value is not None:
        return spelled(f"{param}={value}", flag(param if value else f"no_{param}"))
    return spelled(param, f"{flag(param)} {metavar}" if metavar else flag(param))


def spell(message: str, command_line: bool = False) -> str:
    """A message in the library's words, or the command line's."""
    if MARK not in message:
        return message
    return _SPELLED.sub(lambda m: m.group(2 if command_line else 1), message)


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
           "UnsupportedArchitectureError", "UpstreamConfigError", "flag", "named", "spell", "spelled"]
