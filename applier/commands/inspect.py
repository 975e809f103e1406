"""``applier inspect``: summarise a stored raw log (counts per message kind, transactions, relations,
LSN range), decoding every message so that a bad one is reported with its LSN and byte offset."""

from __future__ import annotations

import argparse
import json
import logging

from applier.lsn import format_lsn


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a stored raw log of pgoutput messages",
        description="Read a raw log (a Parquet file, a directory of Parquet files, or an append-only "
        "Delta table with columns lsn, xid, data), decode every message, and print counts per "
        "message kind, transactions (committed, streamed, prepared, aborted), the relations seen "
        "and the LSN range, and check order: transactions in commit order, changes in LSN order, no "
        "message or transaction twice, every Commit with its Begin. Exit 0 when the log is healthy, "
        "1 when it has order problems (listed), 2 when a message does not decode. Progress goes to "
        "stderr on long logs.",
    )
    p.add_argument("--source", required=True, metavar="PATH", help="the raw log to read")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def _progress(count: int, lsn: int) -> None:
    logging.getLogger("applier.inspect").info("%d messages read, at %s", count, format_lsn(lsn))


def run(args: argparse.Namespace) -> int:
    # imported here, not when `applier` builds its parser: every command (mirror --once too) pays for that
    from applier.checks.inspect import format_report, inspect_messages
    from applier.sources.rawlog import read_raw_log

    report = inspect_messages(read_raw_log(args.source, check_order=False), progress=_progress)
    if args.json:
        print(json.dumps({"source": args.source, **report.to_json()}, indent=2))
    else:
        print(format_report(report))
    return 0 if report.healthy else 1
