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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.infra.deltars import deltars_can_open, deltars_path
from applier.spark.session import SparkLike, session_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


#: In a commit's userMetadata (applier.sink.engine.commit_description): the source commit time of the last
#: transaction the commit applied, ISO 8601 in UTC.
COMMIT_TIME_FIELD = "source_commit_time="


def source_commit_time_of(description: str | None) -> datetime | None:
    """The source commit time a commit's userMetadata records (None: not one of ours, or written before
    applier recorded it)."""
    if not description:
        return None
    for word in description.split(" "):
        if word.startswith(COMMIT_TIME_FIELD):
            try:
                return datetime.fromisoformat(word[len(COMMIT_TIME_FIELD):])
            except ValueError:
                return None
    return None


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


def applied_version(spark: SparkLike | None, table_path: str, app_id: str) -> int | None:
    """The last ``txnVersion`` Delta recorded for ``app_id`` on the table at ``table_path`` (None if never).

    Read with delta-rs (``deltalake.DeltaTable.transaction_version``), a public reader of the Delta log's
    ``txn`` actions that follows checkpoints like Spark does: no JVM internals, so ``applier status``
    runs without a JVM and the sink works on a Spark session without ``_jvm`` (Spark Connect). It only
    reads the log, so tables with reader features delta-rs cannot scan (type widening) still answer.
    This is the authoritative record of what has been applied, independent of any state file of ours.
    ``spark`` is used (a provider started) only for such a path, so that callers need not care which
    reader answers.
    """
    if not deltars_can_open(table_path):
        return _jvm_applied_version(spark, table_path, app_id)
    version = delta_table(table_path).transaction_version(app_id)
    return int(version) if version is not None else None


def delta_table(table_path: str) -> Any:
    """The table's newest version as a ``deltalake.DeltaTable`` (its log read up to the last commit).

    Object stores are reached with delta-rs's own settings (``AWS_*``, ``AZURE_*``, ``GOOGLE_*``
    environment variables), not Spark's Hadoop configuration."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(deltars_path(table_path))
    except Exception as e:  # noqa: BLE001 - delta-rs raises its own classes; the message is the detail
        raise SinkError("cannot read the Delta log of a target table", path=table_path,
                        error=f"{type(e).__name__}: {e}"[:500]) from e


def holds_no_files(spark: SparkLike | None, table_path: str) -> bool:
    """True when the table's newest version has no data files at all (so it has no rows)."""
    if not deltars_can_open(table_path):
        if spark is None:
            return False  # unknown: the caller then takes the path that works either way
        return int(_jvm_snapshot(session_of(spark, "a table delta-rs cannot open"), table_path).numOfFiles()) == 0
    return len(delta_table(table_path).file_uris()) == 0


def is_delta_table(table_path: str) -> bool:
    """True when ``table_path`` holds a Delta table (read with delta-rs, no JVM)."""
    from deltalake import DeltaTable

    if not deltars_can_open(table_path):
        log = Path(table_path) / "_delta_log"
        return log.is_dir() and any(f.suffix in (".json", ".parquet") for f in log.iterdir())
    return bool(DeltaTable.is_deltatable(deltars_path(table_path)))


def _jvm_snapshot(spark: SparkSession, table_path: str) -> Any:
    """The table's newest snapshot through Delta's JVM classes: only for the paths delta-rs cannot
    open (see applier.infra.deltars), on a classic Spark session."""
    jvm: Any = spark._jvm  # py4j gateway of a classic session
    session: Any = spark._jsparkSession
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(session, table_path)
    return delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def _jvm_applied_version(spark: SparkLike | None, table_path: str, app_id: str) -> int | None:
    if spark is None:
        raise SinkError("this table's path holds '%' (an escaped name), which delta-rs cannot open; "
                        "its applied version needs a Spark session", path=table_path)
    txn = _jvm_snapshot(session_of(spark, "a table delta-rs cannot open"), table_path).transactions().get(app_id)
    return None if txn.isEmpty() else int(txn.get())


def carry_applied_version(spark: SparkLike | None, table_path: str, old_app_id: str, new_app_id: str,
                          properties: dict[str, str]) -> None:
    """Record under ``new_app_id`` the version ``old_app_id`` has applied, with ``properties``, in one
    Delta commit (a table that moved to a new source name keeps what it applied; idempotent)."""
    old = applied_version(spark, table_path, old_app_id)
    if old is None:
        return
    done = applied_version(spark, table_path, new_app_id)
    if done is not None and done >= old:
        return
    if deltars_can_open(table_path):
        from deltalake import CommitProperties, Transaction

        try:
            delta_table(table_path).alter.set_table_properties(
                properties, commit_properties=CommitProperties(app_transactions=[Transaction(new_app_id, old)]))
            return
        except Exception:  # noqa: BLE001 - a protocol delta-rs cannot write: Spark below does the same
            if spark is None:
                raise
    if spark is None:
        raise SinkError("moving this table's applied version needs a Spark session", path=table_path)
    spark = session_of(spark, "moving a renamed table's applied version (a table delta-rs does not write)")
    from applier.sink.naming import delta_path_sql, sql_string_literal

    if properties:
        props = ", ".join(f"{sql_string_literal(k)} = {sql_string_literal(v)}" for k, v in properties.items())
        spark.sql(f"ALTER TABLE {delta_path_sql(table_path)} SET TBLPROPERTIES ({props})")
    empty = spark.read.format("delta").load(table_path).limit(0)
    empty.write.format("delta").mode("append").option("txnAppId", new_app_id).option("txnVersion", old) \
        .save(table_path)
