"""The ``applier`` command line: one subcommand per job, each in its own module under applier.commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from applier import __version__
from applier.commands import COMMAND_MODULES
from applier.commands.skip import way_forward
from applier.errors import ApplierError

DESCRIPTION = """\
Mirror PostgreSQL tables into Delta Lake by replaying PostgreSQL's logical replication stream
(pgoutput), exactly once and in commit order, with PySpark and delta-spark.

Run `applier COMMAND --help` for each command's options."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="applier", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"applier {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"applier.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except ApplierError as e:
        print(f"applier {args.command}: error: {e}", file=sys.stderr)
        hint = way_forward(args.command, e) if args.command in ("replay", "mirror") else None
        if hint:
            print(f"applier {args.command}: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"applier {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
