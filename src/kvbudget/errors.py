"""kvbudget's errors: one tree, each message saying what was wrong, where, and how to fix it.

Messages name the library's parameters (`tp`, `kv_memory`, `block_size`), never command-line flags; an error
about one parameter starts with its name and carries it in `param`, and the CLI shows it as that flag.
"""

from __future__ import annotations


class KVBudgetError(ValueError):
    """Bad input. `param` is the parameter at fault when there is one (the message starts with it)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


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
           "UnsupportedArchitectureError", "UpstreamConfigError"]
