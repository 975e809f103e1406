"""``--skip-transaction``: the documented way past a transaction the applier stopped on.

Shared by ``replay`` and ``mirror``; the LSNs join ``apply.skip_transactions`` of the config."""

from __future__ import annotations

import argparse

from applier.errors import ApplierError, DataError
from applier.lsn import format_lsn

SKIP_HELP = ("leave out the transaction with this commit LSN (repeatable), like ALTER SUBSCRIPTION ... "
             "SKIP: use the LSN an error named, after deciding its changes may be lost; each skip is "
             "recorded in the audit table <state_dir>/skipped_transactions")


def add_skip_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skip-transaction", action="append", default=[], metavar="LSN", help=SKIP_HELP)


def way_forward(command: str, error: ApplierError) -> str | None:
    """What to do after a data error, when the error names the transaction."""
    if not isinstance(error, DataError):
        return None
    lsn = error.commit_lsn if error.commit_lsn is not None else error.context.get("prepare_lsn")
    if not isinstance(lsn, int):
        return None
    text = format_lsn(lsn)
    return (f"every target table is as after the last transaction before this one. Either fix the "
            f"source and run `applier {command}` again, or leave this transaction out: rerun with "
            f"`--skip-transaction {text}` (or apply.skip_transactions in the config); the skip is recorded "
            "in <state_dir>/skipped_transactions")
