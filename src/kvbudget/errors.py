"""The one exception type the CLI turns into a one-line message and exit status 2."""


class KVBudgetError(ValueError):
    """Bad input: the message says what was wrong, where, and how to fix it."""
