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

from applier.errors import SinkError

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


def applied_version(spark: SparkSession | None, table_path: str, app_id: str) -> int | None:
    """The last ``txnVersion`` Delta recorded for ``app_id`` on the table at ``table_path`` (None if never).

    Read with delta-rs (``deltalake.DeltaTable.transaction_version``), a public reader of the Delta log's
    ``txn`` actions that follows checkpoints like Spark does: no JVM internals, so ``applier status``
    runs without a JVM and the sink works on a Spark session without ``_jvm`` (Spark Connect). It only
    reads the log, so tables with reader features delta-rs cannot scan (type widening) still answer.
    This is the authoritative record of what has been applied, independent of any state file of ours.
    ``spark`` is unused and kept so that callers need not care which reader answers.
    """
    del spark
    version = delta_table(table_path).transaction_version(app_id)
    return int(version) if version is not None else None


def delta_table(table_path: str) -> Any:
    """The table's newest version as a ``deltalake.DeltaTable`` (its log read up to the last commit).

    Object stores are reached with delta-rs's own settings (``AWS_*``, ``AZURE_*``, ``GOOGLE_*``
    environment variables), not Spark's Hadoop configuration."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(table_path)
    except Exception as e:  # noqa: BLE001 - delta-rs raises its own classes; the message is the detail
        raise SinkError("cannot read the Delta log of a target table", path=table_path,
                        error=f"{type(e).__name__}: {e}"[:500]) from e


def holds_no_files(spark: SparkSession | None, table_path: str) -> bool:
    """True when the table's newest version has no data files at all (so it has no rows)."""
    del spark
    return len(delta_table(table_path).file_uris()) == 0


def is_delta_table(table_path: str) -> bool:
    """True when ``table_path`` holds a Delta table (read with delta-rs, no JVM)."""
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(table_path))
