"""Exactly-once Delta commits through Delta's idempotent-write transaction ids.

Every commit the sink makes for a source transaction sets ``txnAppId`` (one per target table) and
``txnVersion`` (the source transaction's end LSN as an int). Delta skips a write whose version is
<= the version it has stored for that app id, so re-applying an already applied transaction after a
crash is a no-op, even when the crash fell between two tables of one transaction. The settings are
session-wide, so they are set right before the one write and always unset right after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def app_id_for(table_id: str) -> str:
    """The Delta app id of one target table (stable across runs, distinct per table)."""
    return f"applier:{table_id}"


@contextmanager
def idempotent_write(spark: SparkSession, app_id: str, version: int, user_metadata: str) -> Iterator[None]:
    conf = spark.conf
    conf.set(TXN_APP_ID, app_id)
    conf.set(TXN_VERSION, str(version))
    conf.set(USER_METADATA, user_metadata)
    try:
        yield
    finally:
        conf.unset(TXN_APP_ID)
        conf.unset(TXN_VERSION)
        conf.unset(USER_METADATA)


def applied_version(spark: SparkSession, table_path: str, app_id: str) -> int | None:
    """The last ``txnVersion`` Delta recorded for ``app_id`` on the table at ``table_path`` (None if never).

    Read through the JVM DeltaLog (the Python API does not expose SetTransaction actions); this is the
    authoritative record of what has been applied, independent of any state file of ours.
    """
    txn = latest_snapshot(spark, table_path).transactions().get(app_id)
    if txn.isEmpty():
        return None
    return int(txn.get())


def latest_snapshot(spark: SparkSession, table_path: str) -> Any:
    """The table's newest Delta snapshot, as the JVM object (its log is read up to the last commit)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table_path)  # type: ignore[attr-defined]
    return delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def holds_no_files(spark: SparkSession, table_path: str) -> bool:
    """True when the table's newest version has no data files at all (so it has no rows)."""
    return int(latest_snapshot(spark, table_path).numOfFiles()) == 0
