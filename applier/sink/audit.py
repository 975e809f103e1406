"""The audit table of skipped transactions: what was left out of the mirror, when, and why.

A skip is a user's decision to lose one source transaction (``apply.skip_transactions``), so it is
recorded where the data lives, in a Delta table beside the state, written before the transactions
around it are confirmed. Appends are idempotent per commit LSN (a restarted run that skips the
same transaction again adds no second row).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from applier.changes import SkippedTransaction
from applier.lsn import format_lsn, parse_lsn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SKIPPED_SCHEMA = ("commit_lsn string, xid long, end_lsn string, reason string, skipped_at timestamp")


def record_skips(spark: SparkSession, path: str, skipped: Sequence[SkippedTransaction]) -> None:
    if not skipped:
        return
    now = dt.datetime.now(dt.UTC)
    rows = [(format_lsn(s.commit_lsn), s.xid, format_lsn(s.end_lsn), s.reason[:2000], now) for s in skipped]
    df = spark.createDataFrame(rows, SKIPPED_SCHEMA)
    if (Path(path) / "_delta_log").is_dir():
        seen = spark.read.format("delta").load(path).select("commit_lsn")
        df = df.join(seen, "commit_lsn", "left_anti")
    df.dropDuplicates(["commit_lsn"]).write.format("delta").mode("append").save(path)


def read_skips(spark: SparkSession, path: str) -> list[dict[str, object]]:
    if not (Path(path) / "_delta_log").is_dir():
        return []
    rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    return sorted(rows, key=lambda r: parse_lsn(str(r["commit_lsn"])))
