"""How the command line names the library's parameters: `tp` is `--tp`, and an error about it reads as the flag
people typed. The web page shows the same names, so both front ends render errors with `message()`."""

from __future__ import annotations

from kvbudget.errors import KVBudgetError, spell

# Library hints that name a parameter by value, and the flag that says the same on the command line.
_HINTS = {"(approximate=True)": "(--approximate)", "(template=False)": "(--no-template)",
          "give max_model_len": "pass --max-model-len", "give gpu_memory": "pass --gpu-memory SIZE",
          "kvbudget.gpus.gpus() lists them": "kvbudget gpus lists them",
          "'upstreams' in the config": "'upstreams' in --config",
          "activation overrides": "--activation overrides", "overhead overrides": "--overhead overrides",
          "given (utilization)": "--utilization", "given (weights)": "--weights", "given (kv_memory)": "--kv-memory",
          "given (activation)": "--activation", "given (overhead)": "--overhead",
          "(measured / time_model)": "(--calibrate FILE)", "(prefix_caching=False)": "(--no-prefix-caching)",
          "(max_num_seqs, -np)": "(--max-num-seqs)",
          "give the trace the server served (trace)":
          "give the trace the server served (--trace FILE)", "(max_model_len)": "(--max-model-len)",
          "(weights)": "(--weights SIZE)"}  # after "given (weights)"


def flag(param: str) -> str:
    """The command line's flag for a parameter."""
    return "--" + param.replace("_", "-")


def _flag_with(param: str, metavar: str) -> str:
    return f"{flag(param)} {metavar}" if metavar else flag(param)


def message(exc: KVBudgetError) -> str:
    """The error as one line in command-line terms: the parameter at fault shown as its flag, and every parameter
    the message names too."""
    raw = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    line = raw.splitlines()[0] if raw else type(exc).__name__
    if exc.param and line.startswith(exc.param):
        line = flag(exc.param) + line[len(exc.param):]
    return text(spell(line, _flag_with))


def text(library: str) -> str:
    """Library text that names a parameter by value, as the command line says it."""
    for hint, replacement in _HINTS.items():
        library = library.replace(hint, replacement)
    return library
