"""The Spark store: Delta tables through delta-spark, on the run's SparkSession (started when first
needed: applier.spark.session.SparkProvider).

It takes what delta-rs cannot: key-less (multiset) MERGEs over floating-point or nested columns,
floating-point keys, column mapping, type widening, deletion vectors, liquid clustering, and paths
delta-rs cannot open (a ``%`` in an escaped name). Its primitives (reads of the log, properties, a
frame written) are ``SparkTables`` (applier.sink.store.sparkbase); its MERGE, history commit and DDL
are ``sparkmerge``, ``sparkhistory`` and ``sparkddl``, beside delta-rs's ``rsmerge`` and ``rshistory``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from applier.sink.store.base import CommitResult
from applier.sink.store.sparkbase import SparkTables, session_settings

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.spec import Renames, RewritePolicy, SchemaEvolution, TableOptions, TableSpec


class SparkStore(SparkTables):
    """Delta tables through Spark; ``spark`` is a session or a provider (None: reads of the log only)."""

    name = "spark"
    #: whether its operations need Spark (the session is started by the first that does)
    uses_spark = True

    # --- reading ----------------------------------------------------------------------------------

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

    def replace_empty(self, path: str, spec: TableSpec) -> bool:
        from applier.sink.store.sparkddl import empty_with_schema

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
        with session_settings(spark, settings):
            spark.sql(f"VACUUM {delta_path_sql(path)}{retain}{' DRY RUN' if dry_run else ''}").collect()

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution:
        """Every change Delta makes: renames (a rewrite, or column mapping) and widenings (type widening) too."""
        from applier.sink.store.sparkddl import evolve_table

        return evolve_table(self.session(f"{spec.source_name}: a schema change (or a table delta-rs cannot read)"),
                            path, spec, renames, rename=rename)

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult:
        """A key-less plan applied again is checked first: its MERGE counts the copies the table holds
        before Delta's idempotent write could skip it, and a plan that deletes copies would find too few
        (the apply loop never sends one twice; a store keeps the contract anyway)."""
        from applier.sink.store.sparkmerge import apply_plan

        if plan.multiset and not plan.truncated:
            done = self.applied_version(path, app_id)
            if done is not None and done >= version:
                return CommitResult(0, 0, False)
        return apply_plan(self.session(f"{path}: a MERGE delta-rs does not write"), path, schema, plan,
                          app_id=app_id, version=version, description=description, may_be_empty=may_be_empty)

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int:
        """A history table's commit (applier.sink.history), as one Spark MERGE."""
        from applier.sink.store.sparkhistory import commit_history

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
        from applier.sink.naming import quote_identifier as q
        from applier.sink.plan import freeze
        from applier.sink.store.sparkmerge import restrict_to_keys

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
