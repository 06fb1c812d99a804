"""`kvbudget` command line: one module per command (its options, its run, its rendering), shared options in
`common`. Commands parse arguments and render results; every number comes from the Python API."""

from __future__ import annotations

import sys

from kvbudget import __version__
from kvbudget.cli import catalog, checklog, common, estimate, guard, plan, quality, simulate, tokens, web
from kvbudget.errors import KVBudgetError

COMMANDS = (estimate, catalog, plan, simulate, checklog, tokens, guard, quality, web)


def build_parser() -> common.Parser:
    parser = common.Parser(prog="kvbudget", description="Exact KV-cache memory for LLM serving.")
    parser.add_argument("--version", action="version", version=f"kvbudget {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=common.Parser, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:  # `kvbudget` alone: what it can do
            parser.print_help()
            return 0
        code: int = args.run(args)
    except KVBudgetError as exc:
        print(f"kvbudget: error: {common.cli_message(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kvbudget ... | head`
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
