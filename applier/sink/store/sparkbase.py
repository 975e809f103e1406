"""Spark's primitives on one Delta table: its session, what its log says, properties set, a frame
written, and Spark's idempotent-write settings. What the Spark store (applier.sink.store.spark) and
its MERGE, history commit and DDL (``sparkmerge``, ``sparkhistory``, ``sparkddl``) build on.

A module of its own so that those three import it, not the store class that calls them (no circle).
Reads that need no job (does the table exist, its id) look at the log's files directly, so asking
them starts no JVM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.sink.store.base import CommitTag, WriteMode
from applier.spark.session import SparkLike, session_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@contextmanager
def idempotent_write(spark: SparkSession, app_id: str, version: int, user_metadata: str) -> Iterator[None]:
    """Delta's idempotent-write ids for the one write made inside (session-wide settings: set right
    before it and always unset right after it; applier.sink.idempotence says why)."""
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


class SparkTables:
    """Delta tables through Spark, the primitives; ``spark`` is a session or a provider (None: reads of
    the log only)."""

    def __init__(self, spark: SparkLike | None, *, why: str | None = None) -> None:
        self.spark = spark
        self.why = why  # what starting Spark for this store's operations is logged as (None: each one's own)

    def session(self, why: str) -> SparkSession:
        why = self.why or why
        if self.spark is None:
            raise SinkError(f"{why} needs a Spark session and none was given")
        return session_of(self.spark, why)

    # --- reading ----------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        if "://" in str(path):  # an object store's table: Delta's own check (a local one needs no JVM)
            from delta.tables import DeltaTable

            return bool(DeltaTable.isDeltaTable(self.session(f"{path}: a table on an object store"), str(path)))
        log = Path(path) / "_delta_log"
        return log.is_dir() and any(f.suffix in (".json", ".parquet") for f in log.iterdir())

    def applied_version(self, path: str, app_id: str) -> int | None:
        if self.spark is None:
            raise SinkError("this table's path holds '%' (an escaped name), which delta-rs cannot open; "
                            "its applied version needs a Spark session", path=path)
        txn = self._snapshot(path).transactions().get(app_id)
        return None if txn.isEmpty() else int(txn.get())

    def version(self, path: str) -> int:
        if self.spark is None:
            raise SinkError("this table's path holds '%' (an escaped name), which delta-rs cannot open; "
                            "its version needs a Spark session", path=path)
        return int(self._snapshot(path).version())

    def columns(self, path: str) -> tuple[str, ...]:
        return tuple(self.session(f"{path}: a table delta-rs cannot open").read.format("delta").load(path).columns)

    def is_empty(self, path: str) -> bool:
        return int(self._snapshot(path).numOfFiles()) == 0


    def table_id(self, path: str) -> str | None:
        """From the first commit's ``metaData`` action (no JVM: a registry check starts none)."""
        first = Path(path) / "_delta_log" / "00000000000000000000.json"
        if first.is_file():
            for line in first.read_text(encoding="utf-8").splitlines():
                meta = json.loads(line).get("metaData") if line.strip() else None
                if meta and meta.get("id"):
                    return str(meta["id"])
        return None

    def logged_applied_version(self, path: str, app_id: str) -> int | None:
        """The highest ``txnVersion`` of ``app_id`` in the table's JSON commits (no checkpoint read, no
        JVM): what ``status`` can say of a table delta-rs cannot open."""
        best: int | None = None
        for txn in _logged_actions(path, "txn"):
            if txn.get("appId") == app_id:
                best = max(best or 0, int(txn["version"]))
        return best

    def logged_configuration(self, path: str) -> dict[str, str]:
        """The properties of the newest ``metaData`` action in the table's JSON commits (no JVM; empty
        when a checkpoint took the commits that had one)."""
        newest: dict[str, str] = {}
        for meta in _logged_actions(path, "metaData"):
            newest = dict(meta.get("configuration") or {})
        return newest

    def configuration(self, path: str) -> dict[str, str]:
        """The table's properties (``metaData.configuration``) from its newest snapshot: no Spark job.
        DESCRIBE DETAIL computes the table's size too, which rebuilds its state from the log (about a
        second after a protocol change), once per property read in a schema change."""
        return dict(self._log_action(path, "metaData").get("configuration") or {})

    def schema_fields(self, path: str) -> list[dict[str, Any]]:
        """The table's fields as Delta's JSON schema writes them (``name``, ``type``, ``nullable``...)."""
        return list(json.loads(self._log_action(path, "metaData")["schemaString"])["fields"])

    def partition_columns(self, path: str) -> list[str]:
        return list(self._log_action(path, "metaData").get("partitionColumns") or [])

    def reader_protocol(self, path: str) -> tuple[int, tuple[str, ...]]:
        """The table's minimum reader version and reader features."""
        protocol = self._log_action(path, "protocol")
        return int(protocol["minReaderVersion"]), tuple(protocol.get("readerFeatures") or ())

    def _log_action(self, path: str, kind: str) -> dict[str, Any]:
        """The newest snapshot's ``metaData`` or ``protocol`` action, as the log's JSON writes it."""
        snapshot = self._snapshot(path)
        action = snapshot.metadata() if kind == "metaData" else snapshot.protocol()
        return dict(json.loads(action.json())[kind])

    def _snapshot(self, path: str) -> Any:
        """The table's newest snapshot through Delta's JVM classes, on a classic Spark session."""
        spark = self.session("a table delta-rs cannot open")
        jvm: Any = spark._jvm  # py4j gateway of a classic session
        session: Any = spark._jsparkSession
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(session, path)
        return delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())

    def checkpoint(self, path: str, *, why: str) -> int:
        """A checkpoint of the table's newest version, written by Delta's JVM classes (there is no SQL for
        it); returns the version."""
        spark = self.session(why)
        jvm: Any = spark._jvm  # py4j gateway of a classic session
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        snapshot = delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
        delta_log.checkpoint(snapshot, jvm.scala.Option.empty())
        return int(snapshot.version())

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None:
        """Properties by ``ALTER TABLE``; a carried version by an empty idempotent append (Spark's SQL has
        no way to add a ``txn`` action to the ALTER's commit), after it."""
        from applier.sink.naming import delta_path_sql, sql_string_literal

        spark = self.session("changing a table's properties (a table delta-rs does not write)")
        if properties:  # one commit; no parameter markers here: keys and values are escaped literals
            props = ", ".join(f"{sql_string_literal(k)} = {sql_string_literal(v)}" for k, v in properties.items())
            spark.sql(f"ALTER TABLE {delta_path_sql(path)} SET TBLPROPERTIES ({props})")
        if carry is not None:
            app_id, version = carry
            empty = spark.read.format("delta").load(path).limit(0)
            empty.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", version) \
                .save(path)

    def write_frame(self, path: str, frame: Any, *, mode: WriteMode, tag: CommitTag | None) -> None:
        """One commit of a Spark DataFrame; the ids go in as writer options, not session settings, so
        several tables can be written at the same time through one session."""
        writer = frame.write.format("delta").mode(mode)
        if tag is not None:
            app_id, version, description = tag
            writer = (writer.option("txnAppId", app_id).option("txnVersion", str(version))
                      .option("userMetadata", description))
        writer.save(path)

    def write_arrow(self, path: str, table: Any, *, mode: WriteMode, tag: CommitTag | None,
                    schema: pa.Schema | None = None) -> None:
        """``schema``: the table's columns, whose Spark types the Arrow columns are taken as (by default,
        Arrow's own mapping)."""
        from applier.spark.types import spark_schema

        spark = self.session(f"{path}: a write delta-rs does not make")
        struct = spark_schema(schema) if schema is not None else None
        frame = spark.createDataFrame(table, struct) if table.num_rows or struct is None else \
            spark.createDataFrame([], struct)
        self.write_frame(path, frame, mode=mode, tag=tag)


def _logged_actions(path: str, kind: str) -> Iterator[dict[str, Any]]:
    """The ``kind`` actions of a local table's JSON commits, oldest first."""
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line).get(kind) if line.strip() else None
            if action:
                yield action


@contextmanager
def session_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Spark SQL settings for one statement, restored after it."""
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
