"""Spark's DDL on a Delta table: a schema change (columns added, renamed, widened; a retype it cannot
make stops with the error that says what to do), a table left empty for a fresh copy, column mapping
switched on, and a rule's table options compared with an existing table's.

Beside delta-rs's (applier.sink.store.evolution makes the common changes without Spark); the Spark
store (applier.sink.store.spark) calls these for what delta-rs declines. applier.sink.schema says
which rules a schema change follows.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from applier.errors import SinkError, TypeChangeError
from applier.infra.crashpoints import crashpoint
from applier.sink.naming import delta_path_sql, needs_column_mapping, quote_identifier, sql_string_literal
from applier.sink.spec import (
    COLUMN_MAPPING,
    COLUMN_MAPPING_MODE,
    PROP_DROPPED,
    PROP_WIDENED,
    TYPE_WIDENING,
    Renames,
    RewritePolicy,
    SchemaEvolution,
    TableOptions,
    TableSpec,
    column_properties,
    option_mismatches,
)
from applier.sink.store.checkpoints import refresh_checkpoint
from applier.sink.store.deltars import DeltaRsStore
from applier.sink.store.evolution import recorded_changes, rename_suspects
from applier.sink.store.sparkbase import SparkTables
from applier.sink.zerocol import ROW_COLUMN
from applier.spark.session import SparkLike
from applier.spark.types import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

#: the schema changes' one logger, whichever engine makes them (what a log filter names)
log = logging.getLogger("applier.sink.schema")


class ProtocolReader(Protocol):
    """A store that reads a table's reader protocol and properties from its log."""

    def reader_protocol(self, path: str) -> tuple[int, tuple[str, ...]]: ...

    def configuration(self, path: str) -> dict[str, str]: ...


def warn_option_mismatches(spark: SparkSession, path: str, spec: TableSpec, options: TableOptions) -> None:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().collect()[0]
    properties = dict(detail["properties"] or {})
    mismatches = option_mismatches(properties, list(detail["partitionColumns"] or []), options)
    if options.cluster_by and list(detail["clusteringColumns"] or []) != list(options.cluster_by):
        mismatches.append(f"cluster_by {list(options.cluster_by)} configured, table has "
                          f"{list(detail['clusteringColumns'] or [])}")
    if mismatches:
        log.warning("%s: the existing Delta table differs from its rule's table options, which apply only when a "
                    "table is created (change it with ALTER TABLE, or rebuild the table): %s",
                    spec.source_name, "; ".join(mismatches))


def widenable(old: DataType, new: DataType) -> bool:
    """Type changes Delta's type widening supports (Delta 4): integral up, float->double, decimal up, date->ts_ntz."""
    from pyspark.sql.types import (
        ByteType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
        TimestampNTZType,
    )

    order = [ByteType, ShortType, IntegerType, LongType]
    ranks: dict[type[DataType], int] = {t: i for i, t in enumerate(order)}
    if type(old) in ranks and type(new) in ranks:
        return ranks[type(new)] > ranks[type(old)]
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(old, (ByteType, ShortType, IntegerType)) and isinstance(new, DoubleType):
        return True
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale >= old.scale and (new.precision - new.scale) >= (old.precision - old.scale) and (
            new.precision > old.precision or new.scale > old.scale)
    if isinstance(old, (ByteType, ShortType, IntegerType, LongType)) and isinstance(new, DecimalType):
        digits = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 20}[type(old)]
        return new.precision - new.scale >= digits
    return isinstance(old, DateType) and isinstance(new, TimestampNTZType)


def type_change_error(table: str, column: str, old: str, new: str) -> TypeChangeError:
    """The error for a retype Delta cannot widen, with the way forward: a fresh copy of the table."""
    return TypeChangeError(
        f"column {column!r} of {table} changed type from {old} to {new} (Delta types; an ALTER COLUMN ... TYPE, "
        "or the column dropped and added again), which Delta cannot widen in place. Re-copy this table from "
        f"Postgres at a new position: `applier resync --config FILE --table {table}`, then run the mirror again (or "
        "set apply.schema_changes: resync to do this automatically); a replay of a stored log cannot re-copy: "
        "rebuild the table from a new snapshot", table=table, column=column, old_type=old, new_type=new)


def empty_with_schema(spark: SparkSession, path: str, spec: TableSpec) -> None:
    """Leave the existing table at ``path`` empty with ``spec``'s columns and keys, in one commit (an
    overwrite with ``overwriteSchema``: its history, table id, properties and layout stay), for a fresh
    copy (``applier resync``). Not CREATE OR REPLACE: on a path Delta refuses a schema that differs."""
    store = SparkTables(spark)
    if needs_column_mapping(spec.column_names):  # Delta refuses such names in a table without it
        enable_column_mapping(spark, path, table=spec.source_name)
    writer = spark.createDataFrame([], spark_schema(spec.schema)).write.format("delta").mode("overwrite") \
        .option("overwriteSchema", "true")
    partitions = [c for c in store.partition_columns(path) if c in spec.column_names]
    if partitions:
        writer = writer.partitionBy(*partitions)
    writer.save(path)
    refresh_checkpoint(spark, path, table=spec.source_name)  # the new types in the newest checkpoint
    configuration = store.configuration(path)
    wanted, unset = column_properties(spec)
    store.set_properties(path, {k: v for k, v in wanted.items() if configuration.get(k) != v})
    stale = [p for p in unset if p in configuration]
    if stale:
        spark.sql(f"ALTER TABLE {delta_path_sql(path)} UNSET TBLPROPERTIES "
                  f"({', '.join(sql_string_literal(p) for p in stale)})")


def _rename_columns(spark: SparkSession, path: str, spec: TableSpec, have: dict[str, DataType],
                    renames: Renames | None, earlier: set[str], policy: RewritePolicy | None) -> dict[str, DataType]:
    """Rename the Delta columns that were renamed in the source, keeping their values: by a rewrite
    under the new names (``rewrite_renamed``) or in place with column mapping, as ``policy`` says
    (applier.sink.spec.RewritePolicy; None: column mapping). Which were renamed was decided as the
    stream's Relations were read (``renames`` answers from that note, and stops the run where a column
    that may have been renamed was never decided). Columns an earlier drop left in Delta
    (``applier.droppedColumns``) and applier's own added columns are no candidates."""
    from applier.catalog.relations import rename_candidates

    if renames is None:  # a caller that does not follow renames (derived tables)
        return have
    old_order, gone, new = rename_suspects(list(have), spec, earlier)
    if not gone or not new:
        return have
    mapping = renames(gone, new, rename_candidates(old_order, spec.source_column_names))
    if not mapping:
        return have
    if _rewrites(spark, path, spec, policy, "rename"):
        rewrite_renamed(spark, path, spec, mapping)
    else:
        enable_column_mapping(spark, path, table=spec.source_name)
        table = delta_path_sql(path)
        for old, new_name in mapping.items():
            spark.sql(f"ALTER TABLE {table} RENAME COLUMN {quote_identifier(old)} TO {quote_identifier(new_name)}")
            log.warning("%s: column %s was renamed to %s in the source; renamed in Delta, values kept",
                        spec.source_name, old, new_name)
    crashpoint("column_renamed")
    return {mapping.get(n, n): t for n, t in have.items()}


def _rewrites(spark: SparkSession, path: str, spec: TableSpec, policy: RewritePolicy | None,
              change: Literal["rename", "widening"], configuration: dict[str, str] | None = None) -> bool:
    """Whether a rename (or a widening) of this table is a rewrite: the policy says so for its size, and a
    rewrite would leave it readable without column mapping (or type widening): a table column-mapped
    already is renamed and widened in place (pyarrow, pandas and Polars refuse it anyway, and an overwrite
    would give its columns new physical names), one with type widening in its protocol already is widened
    in place (an overwrite leaves a protocol's features on), and so is one with a change data feed; a
    clustered one too (Delta keeps its clustering columns by name, which an overwrite does not rename)."""
    if policy is None or (policy.mode == "map" if change == "rename" else policy.widening == "feature"):
        return False
    store = SparkTables(spark)
    if column_mapping_state(spark, path, store).mode != "none":
        return False
    snapshot = store._snapshot(path)
    features = json.loads(snapshot.protocol().json())["protocol"].get("writerFeatures") or ()
    if change == "widening" and "typeWidening" in features:
        return False
    if change == "widening" and ((configuration if configuration is not None else store.configuration(path))
                                 .get("delta.enableChangeDataFeed") or "").lower() == "true":
        return False  # its change feed would show every row deleted and inserted again; Delta widens it in place
    if "clustering" in features:
        log.warning("%s: a liquid-clustered table's %s is made in place, not rewritten (Delta keeps its "
                    "clustering columns by name)", spec.source_name, change)
        return False
    size = int(snapshot.sizeInBytes())
    if change == "rename" and policy.rewrites(size):
        return True
    if change == "widening" and policy.rewrites_widening(size):
        return True
    if change == "rename":
        log.warning("%s: the table holds %d MB of data files, more than apply.rename_rewrite_max_mb (%d): its "
                    "column rename turns Delta column mapping on instead of rewriting it (pandas, Polars and "
                    "delta-rs's to_pyarrow_table cannot read it from now on; docs/schema-changes.md)",
                    spec.source_name, size >> 20, policy.rewrite_max_bytes >> 20)
    else:
        log.warning("%s: the table holds %d MB of data files, more than apply.widen_rewrite_max_mb (%d): its "
                    "widened column turns Delta type widening on instead of rewriting it (delta-rs and its "
                    "readers cannot read it from now on; docs/schema-changes.md)",
                    spec.source_name, size >> 20, policy.widen_max_bytes >> 20)
    return False


def _overwrite(frame: DataFrame, path: str, partitions: list[str], note: str) -> None:
    """The table replaced by ``frame`` in one commit (``overwriteSchema``), partitioned as before, the
    commit's ``userMetadata`` saying why (what ``table rewritten`` in the history is found by); then a
    checkpoint, where the newest one holds statistics in other types (applier.sink.store.checkpoints)."""
    writer = frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true") \
        .option("userMetadata", note)
    if partitions:
        writer = writer.partitionBy(*partitions)
    writer.save(path)
    refresh_checkpoint(frame.sparkSession, path)


def rewrite_renamed(spark: SparkSession, path: str, spec: TableSpec, mapping: dict[str, str]) -> None:
    """Rewrite the table under the renamed columns' new names in one overwrite commit (``overwriteSchema``:
    the table's id, history, properties, partitioning and its applied versions, Delta's ``txn`` state,
    stay), so that it needs no column mapping. Exactly once by construction: the commit is atomic, and
    once it is in, the table has the new names and a re-run finds nothing to rename (a crash before it
    leaves the old table, and the re-run rewrites it)."""
    partitions = [mapping.get(c, c) for c in SparkTables(spark).partition_columns(path)]
    renamed = ", ".join(f"{old} -> {new}" for old, new in mapping.items())
    _overwrite(spark.read.format("delta").load(path).withColumnsRenamed(mapping), path, partitions,
               f"applier: columns renamed in the source, table rewritten: {renamed}")
    log.warning("%s: columns renamed in the source (%s); the Delta table was rewritten under the new names "
                "(apply.column_renames), values kept, no column mapping", spec.source_name, renamed)


def rewrite_widened(spark: SparkSession, path: str, spec: TableSpec, wanted: dict[str, DataType]) -> None:
    """Rewrite the table with the widened columns cast to their new types in one overwrite commit
    (``overwriteSchema``), so that it needs no type widening and delta-rs keeps reading and writing it.
    Exactly once as ``rewrite_renamed``: atomic, and a re-run finds the wider types in place. Every
    widening Delta allows is a cast Spark makes without loss (``widenable``)."""
    from pyspark.sql.functions import col

    frame = spark.read.format("delta").load(path)
    frame = frame.withColumns({name: col(quote_identifier(name)).cast(t) for name, t in wanted.items()})
    widened = ", ".join(f"{name} to {t.simpleString()}" for name, t in wanted.items())
    _overwrite(frame, path, SparkTables(spark).partition_columns(path),
               f"applier: columns widened in the source, table rewritten: {widened}")
    log.warning("%s: columns widened in the source (%s); the Delta table was rewritten with the wider types "
                "(apply.type_widening), values kept, no type widening feature", spec.source_name, widened)


def evolve_table(spark: SparkSession, path: str, spec: TableSpec, renames: Renames | None = None, *,
                 rename: RewritePolicy | None = None) -> SchemaEvolution:
    """Bring the Delta table's columns in line with ``spec`` (renames first, as ``rename`` says, see
    ``_rename_columns``); raise SinkError for unsupported retypes."""
    current = spark.read.format("delta").load(path).schema
    store = SparkTables(spark)
    configuration = store.configuration(path)
    have = _rename_columns(spark, path, spec, {f.name: f.dataType for f in current.fields}, renames,
                           set(json.loads(configuration.get(PROP_DROPPED) or "[]")), rename)
    wanted = spark_schema(spec.schema)
    added: list[str] = []
    widened: list[str] = []
    for field in wanted.fields:
        old_type = have.get(field.name)
        if old_type is None:
            added.append(field.name)
        elif old_type != field.dataType:
            if not widenable(old_type, field.dataType):
                raise type_change_error(spec.source_name, field.name, old_type.simpleString(),
                                        field.dataType.simpleString())
            widened.append(field.name)
    source_names = set(spec.column_names)
    # ROW_COLUMN: what a table without columns had (applier.sink.zerocol), not a dropped source column
    dropped = tuple(name for name in have if name not in source_names and name != ROW_COLUMN)
    table = delta_path_sql(path)
    if added:
        if needs_column_mapping(added):
            enable_column_mapping(spark, path, table=spec.source_name)
        cols = ", ".join(f"{quote_identifier(f.name)} {f.dataType.simpleString()}"
                         for f in wanted.fields if f.name in added)
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({cols})")
    # applier's own properties change in one commit at the end (each ALTER TABLE is a commit)
    properties: dict[str, str] = {}
    if widened and _rewrites(spark, path, spec, rename, "widening", configuration):
        rewrite_widened(spark, path, spec, {name: wanted[name].dataType for name in widened})
        crashpoint("column_widened")
    elif widened:
        # Type widening is a reader feature delta-rs cannot read, so a table gains it only now, when a source
        # column is actually widened; the property names the columns for `applier status`.
        if (configuration.get(TYPE_WIDENING) or "").lower() != "true":
            log.warning("%s: enabling Delta type widening to widen %s; readers without type widening support "
                        "(delta-rs) cannot read this table from now on", spec.source_name, ", ".join(widened))
            store.set_properties(path, {TYPE_WIDENING: "true"})
        earlier = json.loads(configuration.get(PROP_WIDENED) or "[]")
        properties[PROP_WIDENED] = json.dumps(sorted(set(earlier) | set(widened)))
        for name in widened:
            new_type = wanted[name].dataType
            spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quote_identifier(name)} TYPE {new_type.simpleString()}")
    store.set_properties(path, recorded_changes(spec, configuration, dropped, properties, announce=True))
    return SchemaEvolution(tuple(added), tuple(widened), dropped)


@dataclass(frozen=True, slots=True)
class MappingState:
    """A table's column mapping mode and reader protocol, as its Delta log says."""

    mode: str  # 'none', 'name' or 'id'
    min_reader_version: int
    reader_features: tuple[str, ...]

    @property
    def readable_by_deltars(self) -> bool:
        """Column mapping as a named reader feature: delta-rs reads it (QueryBuilder) or refuses it
        (to_pyarrow_table); a reader-2 column-mapped table is read as all NULLs by its pyarrow path."""
        return self.mode == "none" or (self.min_reader_version >= 3 and "columnMapping" in self.reader_features)


def column_mapping_state(spark: SparkLike | None, path: str, store: ProtocolReader | None = None) -> MappingState:
    """The table's column mapping state, read from its log (no Spark job) by the store that reads it
    (default: delta-rs where it can open the path), else from the newest snapshot Spark reads."""
    if store is None:
        store = DeltaRsStore() if DeltaRsStore.can_open(path) else SparkTables(spark)
    if isinstance(store, SparkTables) and store.spark is None:
        raise SinkError("reading this table's protocol needs Spark (delta-rs cannot open its path)", path=path)
    version, features = store.reader_protocol(path)
    return MappingState(store.configuration(path).get(COLUMN_MAPPING_MODE, "none"), version, features)


def enable_column_mapping(spark: SparkSession, path: str, *, table: str | None = None) -> bool:
    """Make the Delta table at ``path`` column-mapped (mode ``name``) with protocol 3/7 and the
    ``columnMapping`` reader feature; True when it committed a change, False when the table already was.

    Idempotent: a table that already has both gets no commit. A table column-mapped with the legacy
    reader version 2 (what Spark made of applier's tables before, and what a plain
    ``delta.columnMapping.mode = 'name'`` still makes) is upgraded by one protocol commit, so that
    delta-rs refuses it instead of reading NULLs. Needed before Delta can hold a column name with a
    space or ``,;{}()=``, and before ``ALTER TABLE ... RENAME COLUMN`` on the table."""
    state = column_mapping_state(spark, path)
    if state.mode == "name" and state.readable_by_deltars:
        return False
    if state.mode not in ("none", "name"):
        raise SinkError(f"the table uses column mapping mode {state.mode!r}; applier writes only mode 'name' "
                        "tables: rebuild it from a snapshot", path=path, table=table or path)
    properties = dict(COLUMN_MAPPING) if state.min_reader_version < 3 else {COLUMN_MAPPING_MODE: "name"}
    if state.mode == "name":
        properties.pop(COLUMN_MAPPING_MODE)
        log.warning("%s: upgrading the Delta table's column mapping from reader version %d to the "
                    "'columnMapping' reader feature (protocol 3/7): delta-rs's to_pyarrow_table read every "
                    "column of it as NULL, now it refuses the table (read it with deltalake.QueryBuilder)",
                    table or path, state.min_reader_version)
    else:
        log.info("%s: enabling Delta column mapping (protocol 3/7, 'columnMapping' reader feature)", table or path)
    SparkTables(spark).set_properties(path, properties)
    return True
