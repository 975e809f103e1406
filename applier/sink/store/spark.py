"""The Spark store: Delta tables through delta-spark, on the run's SparkSession (started when first
needed: applier.spark.session.SparkProvider).

It takes what delta-rs cannot: key-less (multiset) MERGEs over floating-point or nested columns,
floating-point keys, column mapping, type widening, deletion vectors, liquid clustering, and paths
delta-rs cannot open (a ``%`` in an escaped name). Reads that need no job (does the table exist, its
id) look at the log's files directly, so asking them starts no JVM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.sink.store.base import CommitResult, CommitTag, WriteMode
from applier.spark.session import SparkLike, session_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.schema import Renames, SchemaEvolution, TableOptions, TableSpec


class SparkStore:
    """Delta tables through Spark; ``spark`` is a session or a provider (None: reads of the log only)."""

    name = "spark"

    def __init__(self, spark: SparkLike | None) -> None:
        self.spark = spark

    def session(self, why: str) -> SparkSession:
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

    def columns(self, path: str) -> tuple[str, ...]:
        return tuple(self.session(f"{path}: a table delta-rs cannot open").read.format("delta").load(path).columns)

    def is_empty(self, path: str) -> bool:
        return int(self._snapshot(path).numOfFiles()) == 0

    def scan(self, path: str, columns: Sequence[str], *, unless: str | None = None) -> Iterator[tuple[Any, ...]]:
        """The rows as Spark's ``toLocalIterator`` gives them, but instants as aware UTC datetimes: PySpark
        hands TimestampType values back as naive datetimes in this process's local time zone, which fails
        for the earliest instants (a clamped '-infinity' is 0001-01-01 UTC: year 0 in a zone west of
        UTC), so they are read as microseconds since the epoch."""
        from datetime import UTC, datetime, timedelta

        from pyspark.sql import functions as F
        from pyspark.sql.types import TimestampType

        from applier.sink.extras import live_rows
        from applier.sink.naming import quote_identifier

        df = self.session(f"{path}: a table delta-rs cannot read").read.format("delta").load(path)
        if unless is not None:
            df = live_rows(df, unless)
        df = df.select(*[quote_identifier(c) for c in columns])
        instants = [isinstance(f.dataType, TimestampType) for f in df.schema.fields]
        if not any(instants):
            for row in df.toLocalIterator():
                yield tuple(row)
            return
        df = df.select(*[F.unix_micros(F.col(quote_identifier(c))).alias(c) if flag else F.col(quote_identifier(c))
                         for c, flag in zip(columns, instants, strict=True)])
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        for row in df.toLocalIterator():
            yield tuple(epoch + timedelta(microseconds=v) if flag and v is not None else v
                        for v, flag in zip(row, instants, strict=True))

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

    # --- writing ----------------------------------------------------------------------------------

    def create(self, path: str, spec: TableSpec, options: TableOptions, properties: Mapping[str, str]) -> None:
        """SQL with every identifier quoted, not DeltaTableBuilder.location(): the builder splices the
        path into ``delta.`...``` unescaped, so a schema or table name with a backtick broke it."""
        from applier.sink.naming import delta_path_sql, quote_identifier, sql_string_literal
        from applier.spark.types import spark_ddl_type

        columns = ", ".join(f"{quote_identifier(f.name)} {spark_ddl_type(f.type)}"
                            f"{'' if f.nullable else ' NOT NULL'}" for f in spec.schema)
        layout = ""
        if options.partition_by:
            layout = f" PARTITIONED BY ({', '.join(quote_identifier(c) for c in options.partition_by)})"
        elif options.cluster_by:
            layout = f" CLUSTER BY ({', '.join(quote_identifier(c) for c in options.cluster_by)})"
        props = ", ".join(f"{sql_string_literal(k)} = {sql_string_literal(v)}" for k, v in properties.items())
        self.session(f"{spec.source_name}: creating its Delta table").sql(
            f"CREATE TABLE IF NOT EXISTS {delta_path_sql(path)} ({columns}) USING delta{layout} "
            f"TBLPROPERTIES ({props})")

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

    def replace_empty(self, path: str, spec: TableSpec) -> bool:
        from applier.sink.schema import empty_with_schema

        empty_with_schema(self.session(f"{spec.source_name}: replacing the table for a fresh copy"), path, spec)
        return True

    def fill_columns(self, path: str, spec: TableSpec, values: Mapping[str, object]) -> bool:
        """One UPDATE; each value cast to its column's type as Spark maps it."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from applier.sink.naming import quote_identifier
        from applier.spark.types import spark_type

        spark = self.session(f"{spec.source_name}: filling a column added with a default")
        DeltaTable.forPath(spark, path).update(
            set={quote_identifier(c): F.lit(v).cast(spark_type(spec.schema.field(c).type)) for c, v in values.items()})
        return True

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> dict[str, Any]:
        """Spark's OPTIMIZE (``target_size``: Delta's own setting, ``spark.databricks.delta.optimize.maxFileSize``,
        applies instead)."""
        from applier.sink.naming import delta_path_sql, quote_identifier

        spark = self.session(f"{path}: OPTIMIZE of a table delta-rs cannot write")
        clause = f" ZORDER BY ({', '.join(quote_identifier(c) for c in z_order)})" if z_order else ""
        rows = spark.sql(f"OPTIMIZE {delta_path_sql(path)}{clause}").collect()
        return dict((rows[0].asDict(recursive=True).get("metrics") if rows else None) or {})

    def vacuum(self, path: str, retention_hours: int | None, *, dry_run: bool, enforce_retention: bool) -> None:
        """Spark's VACUUM, which does not say how many files it deleted (so: None)."""
        from applier.sink.naming import delta_path_sql

        spark = self.session(f"{path}: VACUUM of a table delta-rs cannot write")
        retain = f" RETAIN {retention_hours} HOURS" if retention_hours is not None else ""
        settings = {}
        if not enforce_retention:
            settings["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
        # VACUUM lists the table's directories in this many tasks: Spark's default of 10000 made a
        # ten-file table take 60-100 s on 2 cores (4 s with 8); a value the user set is kept
        listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
        if spark.conf.get(listing) == "10000":
            settings[listing] = str(max(8, 4 * spark.sparkContext.defaultParallelism))
        with _session_settings(spark, settings):
            spark.sql(f"VACUUM {delta_path_sql(path)}{retain}{' DRY RUN' if dry_run else ''}").collect()

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None) -> SchemaEvolution:
        """Every change Delta makes: renames (column mapping) and widenings (type widening) too."""
        from applier.sink.schema import evolve_table

        return evolve_table(self.session(f"{spec.source_name}: a schema change (or a table delta-rs cannot read)"),
                            path, spec, renames)

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult:
        """A key-less plan applied again is checked first: its MERGE counts the copies the table holds
        before Delta's idempotent write could skip it, and a plan that deletes copies would find too few
        (the apply loop never sends one twice; a store keeps the contract anyway)."""
        from applier.sink.merge import apply_plan

        if plan.multiset and not plan.truncated:
            done = self.applied_version(path, app_id)
            if done is not None and done >= version:
                return CommitResult(0, 0, False)
        return apply_plan(self.session(f"{path}: a MERGE delta-rs does not write"), path, schema, plan,
                          app_id=app_id, version=version, description=description, may_be_empty=may_be_empty)

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int:
        """A history table's commit (applier.sink.history), as one Spark MERGE."""
        from applier.sink.history import commit_history

        return commit_history(self.session(f"{path}: a history commit delta-rs does not make"), path, spec, plan,
                              app_id=app_id, version=version, description=description)

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]]:
        """The rows of ``schema``'s columns whose key is one of ``keys`` (every row: None), by frozen key;
        a column the table does not have yet reads NULL; ``open_only``: only rows where that column is
        NULL; ``unless``: not the rows where that flag is true."""
        from pyspark.sql import functions as F

        from applier.sink.extras import live_rows
        from applier.sink.merge import restrict_to_keys
        from applier.sink.naming import quote_identifier as q
        from applier.sink.plan import freeze

        if keys is not None and not keys:
            return {}
        spark = self.session(f"{path}: rows read back from a table delta-rs does not read")
        df = spark.read.format("delta").load(path)
        if open_only is not None:
            df = df.filter(F.col(q(open_only)).isNull())
        if unless is not None:
            df = live_rows(df, unless)
        have = set(df.columns)
        names = list(schema.names)
        df = df.select(*[F.col(q(n)) if n in have else F.lit(None).alias(n) for n in names])
        if keys is not None:
            df = restrict_to_keys(spark, df, [schema.field(k) for k in key_columns], list(keys))
        positions = [names.index(k) for k in key_columns]
        out: dict[object, list[Any]] = {}
        for r in df.toLocalIterator():
            values = list(r)
            out[freeze(tuple(values[p] for p in positions))] = values
        return out


def _logged_actions(path: str, kind: str) -> Iterator[dict[str, Any]]:
    """The ``kind`` actions of a local table's JSON commits, oldest first."""
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line).get(kind) if line.strip() else None
            if action:
                yield action


@contextmanager
def _session_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
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
