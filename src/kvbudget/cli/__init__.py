"""`kvbudget` command line: one module per command (its options, its run, its rendering), shared options in
`common`. Commands parse arguments and render results; every number comes from the Python API."""

from __future__ import annotations

import importlib
import sys

from kvbudget import __version__
from kvbudget.cli import common
from kvbudget.commands import spelling
from kvbudget.errors import KVBudgetError

COMMANDS = ("estimate", "catalog", "plan", "simulate", "recommend", "checklog", "tokens", "guard", "quality",
            "web")  # modules
# each command's module: a run builds (so imports) only its own command's parser
MODULE_OF = {"estimate": "estimate", "models": "catalog", "gpus": "catalog", "traces": "catalog", "plan": "plan",
             "compare": "plan", "simulate": "simulate",
             "recommend": "recommend", "check-log": "checklog", "tokens": "tokens", "guard": "guard",
             "alerts": "guard", "quality": "quality", "web": "web"}


def build_parser(command: str | None = None) -> common.Parser:
    """The parser of every command, or only of `command`'s module when it names one."""
    parser = common.Parser(prog="kvbudget", description="Exact KV-cache memory for LLM serving.")
    parser.add_argument("--version", action="version", version=f"kvbudget {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=common.CommandParser, metavar="COMMAND")
    for module in (MODULE_OF[command],) if command in MODULE_OF else COMMANDS:
        importlib.import_module(f"kvbudget.cli.{module}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    parser = build_parser(args_in[0] if args_in else None)
    try:
        args = parser.parse_args(args_in)
        if args.command is None:  # `kvbudget` alone: what it can do
            parser.print_help()
            return 0
        code: int = args.run(args)
    except KVBudgetError as exc:
        print(f"kvbudget: error: {spelling.message(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kvbudget ... | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line (a file being written is removed on the way out)
        print("kvbudget: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
