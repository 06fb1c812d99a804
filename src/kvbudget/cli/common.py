"""What the commands share: the parser class, option groups, argument readers, output, and saying what was written.

The library's errors name parameters (`tp`, `kv_memory`); `kvbudget.commands.spelling` shows them as the flags
people typed."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvbudget.commands.spelling import flag
from kvbudget.errors import KVBudgetError

UNITS_NOTE = "KiB/MiB/GiB are powers of 1024"

class UsageError(KVBudgetError):
    """Arguments the parser refuses (an unknown flag, a missing argument): main prints it in one line, exit 2."""


def terminal_width() -> int:
    """shutil.get_terminal_size()'s columns (COLUMNS, else the terminal's, else 80) without importing shutil."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, given the width: left to itself it imports shutil (and its archive modules) to ask,
    once for every option a parser adds."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or terminal_width())


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]  # one line, exit 2, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class CommandParser(Parser):
    """A command's parser: options may come anywhere among its positional arguments
    (`kvbudget tokens MODEL --no-template FILE`), as argparse's intermixed parsing reads them."""

    _parsing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._parsing:  # the intermixed parse calls back into this method, twice
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def add_options(p: argparse.ArgumentParser, request: type) -> None:
    """The flags of a command, from its request's description (kvbudget.commands.options)."""
    from kvbudget.commands.options import options

    groups: dict[str, Any] = {}
    for name, default, opt in options(request):
        target = p if opt.group is None else groups.setdefault(opt.group, p.add_argument_group(opt.group))
        how: dict[str, Any] = {"help": opt.text}
        if opt.metavar:
            how["metavar"] = opt.metavar
        if opt.many or opt.nargs:
            how["nargs"] = opt.nargs or "+"
        if opt.positional:
            target.add_argument(name, **how)
            continue
        if default is False:
            how["action"] = "store_true"
        elif opt.repeat:
            how.update(action="append", default=[])
        elif default is not None:
            how["default"] = default
        if opt.extend:
            how["action"] = "extend"
        if opt.kind is not None:
            how["type"] = opt.kind
        if opt.required:
            how["required"] = True
        if opt.choices:
            how["choices"] = opt.choices
        target.add_argument(flag(name), **how)


def request_of(request: type, args: argparse.Namespace) -> Any:
    """The command's request from its parsed arguments."""
    from kvbudget.commands.options import build

    return build(request, vars(args))


def console() -> Any:
    """rich's Console without its number highlighter (which coloured 131,072 as three tokens), whose tables fit the
    terminal: numbers and names never wrap or get cut, text columns wrap instead (fit_table); a table that cannot
    fit so is shown as one block of `header  value` lines per row (records)."""
    from rich.console import Console
    from rich.table import Table

    class FittingConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            shown = [obj if not isinstance(obj, Table) or fit_table(obj, self.width) else records(obj)
                     for obj in objects]
            super().print(*shown, **kwargs)

    return FittingConsole(highlight=False)


def fit_table(table: Any, width: int) -> bool:
    """Lay out a table wider than the terminal by hand: a lighter box (no vertical rules); each number column as
    wide as its widest cell and its headers' and words' longest word (numbers never wrap or get cut; headers and
    words in it wrap between words), each no_wrap text column (names) as wide as its widest cell; the other text
    columns share what is left and wrap between words (a word longer than 20 may fold). Two spaces between
    columns, one where two do not fit. Tables that fit are left as they are. False where the table cannot fit
    even so (the caller shows it as records); cells never end in an ellipsis."""
    from rich.cells import cell_len

    def plain(cell: Any) -> str:
        return cell.plain if hasattr(cell, "plain") else str(cell)

    def longest_line(texts: list[str]) -> int:
        return max((cell_len(line) for t in texts for line in t.split("\n")), default=0)

    def longest_word(texts: list[str]) -> int:
        return max((cell_len(w) for t in texts for w in t.split()), default=0)

    for column in table.columns:
        column.overflow = "fold"
    columns = table.columns
    texts = [[plain(c) for c in col.cells] for col in columns]
    natural = [max(longest_line(texts[i]), longest_line([plain(col.header)])) for i, col in enumerate(columns)]
    if table.box is None or sum(natural) + 3 * len(columns) + 1 <= width:
        return True
    numbers = [i for i, col in enumerate(columns) if col.justify == "right"]
    whole = [i for i, col in enumerate(columns) if col.no_wrap and i not in numbers]  # names: never cut or wrapped
    words = [i for i in range(len(columns)) if i not in numbers and i not in whole]
    # a number column is as wide as its widest number, its header's longest word and its words' ("does not fit")
    fixed = {i: max(longest_line([t for t in texts[i] if any(ch.isdigit() for ch in t)]),
                    longest_word([*texts[i], plain(columns[i].header)]), 1) for i in numbers}
    fixed.update({i: natural[i] for i in whole})
    least = {i: max(1, min(20, longest_word([*texts[i], plain(columns[i].header)]))) for i in words}
    need = sum(fixed.values()) + sum(least.values())
    gap = next((g for g in (2, 1) if need + g * (len(columns) - 1) <= width), 0)
    if not gap:
        return False
    table.box, table.pad_edge, table.show_edge = None, False, False
    table.padding = (0, 1) if gap == 2 else (0, 1, 0, 0)
    table.header_style = "bold underline"
    room = width - gap * (len(columns) - 1) - sum(fixed.values())
    for n, i in enumerate(sorted(words, key=lambda i: natural[i])):  # short text whole, the longest wraps most
        share = max(least[i], room // (len(words) - n))
        fixed[i] = min(natural[i], share) if n < len(words) - 1 else max(least[i], room)
        room -= fixed[i]
    for i, col in enumerate(columns):
        col.width = fixed[i]
    return True


def records(table: Any) -> Any:
    """A table too wide for the terminal, every value whole: its title, then per row its first cell and under it
    one `header  value` line per other column (values wrap between words, never inside one)."""
    from rich.console import Group
    from rich.table import Table

    columns = table.columns
    cells = [list(col.cells) for col in columns]
    labels = [" ".join(str(col.header).split()) for col in columns]
    parts: list[Any] = [table.title] if table.title else []
    for row in range(table.row_count):
        block = Table.grid(padding=(0, 1))
        block.add_column(no_wrap=True)
        block.add_column()
        for i in range(1, len(columns)):
            block.add_row(f"  {labels[i]}", cells[i][row])
        parts += [cells[0][row], block]
    return Group(*parts)


def wrote(path: str, what: str, replaced: bool = False) -> None:
    """Say on stderr where a file went (kvbudget.files wrote it), and that it replaced one."""
    print(f"kvbudget: {'replaced' if replaced else 'wrote'} {path} ({what})", file=sys.stderr)
