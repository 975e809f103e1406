"""The audit table of skipped transactions: what was left out of the mirror, when, and why.

A skip is a user's decision to lose one source transaction (``apply.skip_transactions``), so it is
recorded where the data lives, in a Delta table beside the state, written before the transactions
around it are confirmed. Appends are idempotent per commit LSN (a restarted run that skips the
same transaction again adds no second row). Written and read through the run's store (no JVM where
delta-rs writes the table).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from applier.changes import SkippedTransaction
from applier.lsn import format_lsn, parse_lsn
from applier.sink.owntables import append_rows
from applier.sink.spec import TableSpec
from applier.sink.store.picker import scanner

if TYPE_CHECKING:
    from applier.sink.store import StorePicker
    from applier.spark.session import SparkLike

_COLUMNS = ("commit_lsn", "xid", "end_lsn", "reason", "skipped_at")


def skipped_spec() -> TableSpec:
    """commit_lsn string, xid long, end_lsn string, reason string, skipped_at timestamp."""
    import pyarrow as pa

    types = (pa.string(), pa.int64(), pa.string(), pa.string(), pa.timestamp("us", "UTC"))
    return TableSpec("skipped transactions", pa.schema([pa.field(n, t) for n, t in zip(_COLUMNS, types, strict=True)]),
                     (), "n")


def record_skips(stores: StorePicker, path: str, skipped: Sequence[SkippedTransaction]) -> None:
    if not skipped:
        return
    store = stores.reader(path)
    seen = {row[0] for row in store.scan(path, ("commit_lsn",))} if store.exists(path) else set()
    now = dt.datetime.now(dt.UTC)
    rows: dict[str, tuple[Any, ...]] = {}
    for s in skipped:
        lsn = format_lsn(s.commit_lsn)
        if lsn not in seen:
            rows.setdefault(lsn, (lsn, s.xid, format_lsn(s.end_lsn), s.reason[:2000], now))
    if rows:
        append_rows(stores, path, skipped_spec(), list(rows.values()), tag=None)


def read_skips(spark: SparkLike | None, path: str) -> list[dict[str, object]]:
    store = scanner(path, spark)
    if not store.exists(path):
        return []
    rows = [dict(zip(_COLUMNS, row, strict=True)) for row in store.scan(path, _COLUMNS)]
    return sorted(rows, key=lambda r: parse_lsn(str(r["commit_lsn"])))
