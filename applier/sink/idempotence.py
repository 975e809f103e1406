"""Exactly-once Delta commits through Delta's idempotent-write transaction ids.

Every commit the sink makes for a source transaction sets ``txnAppId`` (one per target table) and
``txnVersion`` (the source transaction's end LSN as an int). Delta skips a write whose version is
<= the version it has stored for that app id, so re-applying an already applied transaction after a
crash is a no-op, even when the crash fell between two tables of one transaction. The settings are
session-wide, so they are set right before the one write and always unset right after it
(applier.sink.store.sparkbase.idempotent_write); the app ids are applier.sink.spec.app_id_for's.
"""

from __future__ import annotations

from datetime import datetime

from applier.sink.spec import COMMIT_TIME_FIELD
from applier.sink.store import SparkStore, reader
from applier.spark.session import SparkLike


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


def applied_version(spark: SparkLike | None, table_path: str, app_id: str) -> int | None:
    """The last ``txnVersion`` Delta recorded for ``app_id`` on the table at ``table_path`` (None if never).

    This is the authoritative record of what has been applied, independent of any state file of ours.
    Read from the log's ``txn`` actions by the store that opens the path (delta-rs: no JVM, so
    ``applier status`` runs without one and the sink works on Spark Connect); ``spark`` is used (a
    provider started) only for a path delta-rs cannot open."""
    return reader(table_path, spark).applied_version(table_path, app_id)


def is_delta_table(table_path: str) -> bool:
    """True when ``table_path`` holds a Delta table (read from its log, no JVM)."""
    return reader(table_path).exists(table_path)


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
    store = reader(table_path, spark)
    try:
        store.set_properties(table_path, properties, carry=(new_app_id, old))
    except Exception:  # noqa: BLE001 - a protocol delta-rs cannot write: Spark does the same
        if spark is None or store.uses_spark:
            raise
        SparkStore(spark).set_properties(table_path, properties, carry=(new_app_id, old))
