"""Sizes: bytes inside, KiB/MiB/GiB (powers of 1024) only when shown to people."""

from __future__ import annotations

import re

from kvbudget.errors import KVBudgetError
from kvbudget.validate import MAX_BYTES, MAX_COUNT, shown

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": TIB,
    "k": KIB, "m": MIB, "g": GIB, "t": TIB,
}
_SIZE_RE = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$"  # compiled (and cached) by re on first use


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def parse_size(text: str, what: str = "size", zero: bool = False) -> int:
    """'3.81GiB', '24GB', '24G' (= GiB), '1048576' -> bytes. GB is 10**9, GiB is 2**30. A bare number is bytes, and
    must be 1 MiB at least (`--gpu-memory 24` meant GiB); 0 only where `zero` allows it; 1 PiB at most."""
    param = _param(what)
    match = re.match(_SIZE_RE, str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise KVBudgetError(
            f"{what}: cannot read {shown(text)} as a size; write bytes or a number with a unit "
            "such as 512MiB, 3.81GiB or 24GB", param
        )
    number, unit = match.group(1), match.group(2)
    whole, _, decimals = number[:40].partition(".")  # 40 digits: past MAX_BYTES in any unit, and exact below
    over = 10 ** len(decimals)  # bytes = scaled / over, exactly
    scaled = int(whole + decimals) * _SIZE_UNITS[unit.lower()] if len(number) <= 40 else (MAX_BYTES + 1) * over
    if scaled == 0 and zero:
        return 0
    if scaled < over:
        raise KVBudgetError(f"{what}: {shown(text)} must be positive (1 byte or more)", param)
    if not unit and scaled < MIB * over:
        raise KVBudgetError(f"{what}: {number} has no unit; write {number}GiB (sizes below 1 MiB need a unit)",
                            param)
    if scaled > MAX_BYTES * over:
        raise KVBudgetError(f"{what}: {shown(text)} is more than 1 PiB, the most a size may be", param)
    return scaled // over


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit, size in (("EiB", 1024 * 1024 * TIB), ("PiB", 1024 * TIB), ("TiB", TIB), ("GiB", GIB), ("MiB", MIB),
                       ("KiB", KIB)):
        if abs(n) >= size:
            value = n / size
            return f"{value:,.2f} {unit}" if abs(value) < 10_000 else f"{value:.3g} {unit}"
    return f"{int(n):,} B"


def size_setting(n: int) -> str:
    """A size as a setting is written, in the largest binary unit that divides it: 256 GiB -> '256GiB'."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


_BEYOND = "is beyond any deployment kvbudget sizes (at most {:,}); check the units"


def parse_positive_ints(text: str, what: str, most: int = MAX_COUNT) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8); every value must be a positive integer, `most` at most. Accepts k and M as powers of
    1024 (4k = 4096, 1.5k = 1536, 1M = 1,048,576), as context lengths are written; a fraction must come out
    whole."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kKmM]?)", part)
        if not m:
            raise KVBudgetError(f"{what}: {shown(part)} is not a positive integer (write e.g. 1,4,8, 4k, 1.5k or 1M)",
                                _param(what))
        if len(m.group(1)) > 20:  # past any `most`: refused before the arithmetic
            raise KVBudgetError(f"{what}: {shown(part)} {_BEYOND.format(most)}", _param(what))
        whole, _, fraction = m.group(1).partition(".")  # exact: 1.5k = 15 x 1024 / 10
        numerator = int(whole + fraction) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()]
        if numerator % 10 ** len(fraction):
            raise KVBudgetError(f"{what}: {part!r} is {numerator / 10 ** len(fraction):,.2f}, not a whole number of "
                                "tokens", _param(what))
        value = numerator // 10 ** len(fraction)
        if value <= 0:
            raise KVBudgetError(f"{what}: {part!r} must be positive", _param(what))
        if value > most:
            raise KVBudgetError(f"{what}: {part} {_BEYOND.format(most)}", _param(what))
        values.append(value)
    return tuple(values)


def _param(what: str) -> str | None:
    """The parameter a reader's `what` names (None where it is a description or a command-line flag)."""
    return what if what.isidentifier() else None


def log_figure(text: str, what: str) -> float:
    """A figure an engine's log printed (read by a pattern as loose as `[\\d.]+`), or a one-line error where the
    paste garbled it ('1.2.3')."""
    try:
        return float(text)
    except ValueError:
        raise KVBudgetError(f"check-log: the log's {what} reads {shown(text)}, not a number; pass the log as the "
                            "engine printed it") from None
