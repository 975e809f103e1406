"""Create Delta tables from a source relation's schema and follow its schema changes.

Rules (issue: Delta sink): added columns are added; dropped columns stay in Delta (NULL from then on)
and are reported; widened types use Delta type widening; any other retype stops with an error
that says what to do. Key columns and the source relation are recorded in table properties so that
a restart (or a human) can see what a table mirrors.

A table is created with the lowest Delta protocol its columns need, so that readers outside Spark
(delta-rs and what is built on it: Polars, pandas, DuckDB's delta extension) can open it: column
mapping only when a column name needs it (delta-rs reads it with its DataFusion engine), type widening (a reader feature
delta-rs cannot read) only when a source column is actually widened or a rule opts in. A rule's
table options (change data feed, partitioning, liquid clustering, free properties) are applied when
the table is created and never to an existing table: a mismatch is a warning and shows in status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING

from applier.errors import SinkError, TypeChangeError
from applier.sink.naming import delta_path_sql, needs_column_mapping, quote_identifier, sql_string_literal
from applier.sink.store import DeltaRsStore, InMemoryStore, SparkStore, StorePicker, reader
from applier.sink.store.deltatypes import delta_fields, delta_type
from applier.sink.store.picker import Store
from applier.sink.zerocol import ROW_COLUMN
from applier.spark.session import SparkLike, session_of
from applier.spark.types import spark_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

    from applier.config import TableRule
    from applier.sink.extras import ExtraColumns

log = logging.getLogger(__name__)

PROP_SOURCE = "applier.source"
PROP_KEYS = "applier.keyColumns"
PROP_IDENTITY = "applier.replicaIdentity"
PROP_DROPPED = "applier.droppedColumns"
PROP_RESTART_IDENTITY = "applier.restartIdentityLsn"  # end LSN of the last TRUNCATE ... RESTART IDENTITY
#: "published", or "not published since <time>": a table taken out of the publication (or dropped) is no
#: longer followed; its Delta table stays, marked, and is never presented as current (applier status)
PROP_PUBLICATION = "applier.publication"
PROP_WIDENED = "applier.widenedColumns"  # JSON list of the columns whose type was widened in place
TYPE_WIDENING = "delta.enableTypeWidening"
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
# Column mapping as a named reader feature (protocol 3/7), not the legacy reader version 2: delta-rs 1.6's
# pyarrow path (to_pyarrow_table, to_pandas) then refuses the table loudly, where on a version-2 table it
# returns every column as NULL without an error; its DataFusion path (deltalake.QueryBuilder) reads either
# correctly. Delta (4.x) normalizes a protocol whose features are all legacy ones (columnMapping is) down
# to reader 2 / writer 5 or 7, whatever delta.minReaderVersion says; a non-legacy reader feature keeps it
# at 3/7 with named reader features. timestampNtz is that feature: every reader of column mapping
# (Spark, delta-rs, DuckDB, Polars) supports it, and it needs no column of that type.
COLUMN_MAPPING = {COLUMN_MAPPING_MODE: "name", "delta.feature.timestampNtz": "supported"}


@dataclass(frozen=True, slots=True)
class TableOptions:
    """A rule's Delta table options (config ``tables.rules[]``): used only when a table is created."""

    type_widening: bool = False
    change_data_feed: bool = False
    partition_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = dataclass_field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.type_widening or self.change_data_feed or self.partition_by or self.cluster_by
                    or self.properties)

    def table_properties(self) -> dict[str, str]:
        """The Delta properties these options set (each one checked against an existing table)."""
        props = dict(self.properties)
        if self.type_widening:
            props[TYPE_WIDENING] = "true"
        if self.change_data_feed:
            props[CHANGE_DATA_FEED] = "true"
        return props


@dataclass(frozen=True, slots=True)
class TableSpec:
    """What the sink needs to know about one source table's current schema."""

    source_name: str  # "schema.table" as in Postgres
    schema: pa.Schema  # Arrow types per the documented mapping (applier.values.registry), in source order
    key_columns: tuple[str, ...]  # replica identity key; empty for FULL identity without a key
    replica_identity: str  # 'd', 'i', 'f' or 'n'
    extra: ExtraColumns | None = None  # metadata / soft-delete columns, last in ``schema``
    added: int = 0  # how many columns at the end of ``schema`` applier adds (extra's, or a history table's)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    @property
    def floating_point_key(self) -> bool:
        """A key column is floating point: NaN and -0.0 compare differently in SQL engines, so only
        Spark's MERGE matches such keys as the other commits of the table did."""
        import pyarrow

        return any(pyarrow.types.is_floating(self.schema.field(k).type) for k in self.key_columns)

    @property
    def source_column_names(self) -> tuple[str, ...]:
        """The table's own columns (those the stream's rows hold), without applier's added ones."""
        names = self.column_names
        return names[:len(names) - self.added]

    @property
    def source_schema(self) -> pa.Schema:
        """``schema`` without applier's added columns."""
        import pyarrow

        return pyarrow.schema(list(self.schema)[:len(self.schema) - self.added])


def with_added_columns(table: TableSpec, fields: list[pa.Field], what: str, *, remedy: str | None = None,
                       extra: ExtraColumns | None = None) -> TableSpec:
    """``table``'s own columns followed by the ``fields`` applier adds (metadata columns, or a derived
    table's: history, change feed); a source column of the same name stops the run."""
    import pyarrow

    clash = {f.name for f in fields} & set(table.column_names)
    if clash:
        raise SinkError(f"the table has a column named like a {what} column; "
                        f"{remedy or f'it cannot have a {what} table'}",
                        table=table.source_name, columns=", ".join(sorted(clash)))
    return TableSpec(table.source_name, pyarrow.schema([*table.schema, *fields]), table.key_columns,
                     table.replica_identity, extra, len(fields))


@dataclass(frozen=True, slots=True)
class SchemaEvolution:
    added: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()  # present in Delta, gone from the source: kept, NULL from now on

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened)


def _creation_properties(spec: TableSpec, options: TableOptions) -> dict[str, str]:
    """The properties a new table is created with (and the check that its layout names real columns)."""
    names = set(spec.column_names)
    unknown = [c for c in (*options.partition_by, *options.cluster_by) if c not in names]
    if unknown:
        raise SinkError("partition_by/cluster_by names columns the table does not have (or excludes); fix the "
                        "table's rule", table=spec.source_name, columns=", ".join(unknown))
    properties = {PROP_SOURCE: spec.source_name, PROP_KEYS: json.dumps(list(spec.key_columns)),
                  PROP_IDENTITY: spec.replica_identity} | options.table_properties()
    if needs_column_mapping(spec.column_names):
        properties |= COLUMN_MAPPING
    return properties


def create_table(spark: SparkLike, path: str, spec: TableSpec, options: TableOptions | None = None, *,
                 picker: StorePicker | None = None) -> None:
    """Create the Delta table for ``spec`` at ``path`` with the lowest protocol it needs, by the store
    ``picker`` chooses (delta-rs when it creates the table exactly as Spark would; without a picker,
    Spark)."""
    options = options or TableOptions()
    properties = _creation_properties(spec, options)
    store = picker.creator(path, spec, options) if picker is not None else SparkStore(spark)
    store.create(path, spec, options, properties)


def table_options(rule: TableRule | None) -> TableOptions | None:
    """The Delta table options of a config rule (None without a rule: nothing to create with or compare)."""
    if rule is None:
        return None
    return TableOptions(rule.type_widening, rule.change_data_feed, tuple(rule.partition_by), tuple(rule.cluster_by),
                        dict(rule.table_properties))


def option_mismatches(properties: Mapping[str, str], partition_columns: list[str],
                      options: TableOptions) -> list[str]:
    """What an existing table lacks of ``options`` (its properties and partition columns), one line each.

    Clustering columns are not in the table's properties (Delta keeps them in domain metadata); the
    callers check them. ``type_widening`` is not a mismatch: it is switched on when first needed."""
    out = [f"{key}={value!r} configured, table has {properties.get(key)!r}"
           for key, value in options.table_properties().items()
           if properties.get(key, "").lower() != value.lower() and key != TYPE_WIDENING]
    if options.partition_by and tuple(partition_columns) != options.partition_by:
        out.append(f"partition_by {list(options.partition_by)} configured, table has {partition_columns}")
    return out


def _warn_option_mismatches(spark: SparkSession, path: str, spec: TableSpec, options: TableOptions) -> None:
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


def _widenable(old: DataType, new: DataType) -> bool:
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
    store = SparkStore(spark)
    writer = spark.createDataFrame([], spark_schema(spec.schema)).write.format("delta").mode("overwrite") \
        .option("overwriteSchema", "true")
    partitions = [c for c in store.partition_columns(path) if c in spec.column_names]
    if partitions:
        writer = writer.partitionBy(*partitions)
    writer.save(path)
    configuration = store.configuration(path)
    wanted = {PROP_KEYS: json.dumps(list(spec.key_columns)), PROP_IDENTITY: spec.replica_identity}
    store.set_properties(path, {k: v for k, v in wanted.items() if configuration.get(k) != v})
    stale = [p for p in (PROP_DROPPED, PROP_WIDENED) if p in configuration]  # about the replaced table's columns
    if stale:
        spark.sql(f"ALTER TABLE {delta_path_sql(path)} UNSET TBLPROPERTIES "
                  f"({', '.join(sql_string_literal(p) for p in stale)})")


#: (columns gone from Delta's, columns new, rename candidates by position) -> {old: new} (applier.sink.identity)
Renames = Callable[[tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]]], dict[str, str]]


def _rename_suspects(have: list[str], spec: TableSpec,
                     earlier: set[str]) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """The Delta columns that may have been renamed (in table order), those gone from the source, and
    the source columns new to Delta. Columns an earlier drop left in Delta (``earlier``), applier's own
    added columns and zerocol's ``_applier_row`` are no candidates."""
    source = spec.source_column_names
    own = set(spec.column_names) - set(source)
    old_order = [n for n in have if n not in own and n not in earlier and n != ROW_COLUMN]
    gone = tuple(n for n in old_order if n not in source)
    new = tuple(n for n in source if n not in have)
    return old_order, gone, new


def _rename_columns(spark: SparkSession, path: str, spec: TableSpec, have: dict[str, DataType],
                    renames: Renames | None, earlier: set[str]) -> dict[str, DataType]:
    """Rename in place the Delta columns that were renamed in the source, keeping their values (column
    mapping lets Delta rename without rewriting data). Which were renamed was decided as the stream's
    Relations were read (``renames`` answers from that note, and stops the run where a column that may
    have been renamed was never decided). Columns an earlier drop left in Delta
    (``applier.droppedColumns``) and applier's own added columns are no candidates."""
    from applier.catalog.relations import rename_candidates

    if renames is None:  # a caller that does not follow renames (derived tables)
        return have
    old_order, gone, new = _rename_suspects(list(have), spec, earlier)
    if not gone or not new:
        return have
    mapping = renames(gone, new, rename_candidates(old_order, spec.source_column_names))
    if not mapping:
        return have
    enable_column_mapping(spark, path, table=spec.source_name)
    table = delta_path_sql(path)
    for old, new_name in mapping.items():
        spark.sql(f"ALTER TABLE {table} RENAME COLUMN {quote_identifier(old)} TO {quote_identifier(new_name)}")
        log.warning("%s: column %s was renamed to %s in the source; renamed in Delta, values kept",
                    spec.source_name, old, new_name)
    return {mapping.get(n, n): t for n, t in have.items()}


def evolve_table(spark: SparkSession, path: str, spec: TableSpec, renames: Renames | None = None) -> SchemaEvolution:
    """Bring the Delta table's columns in line with ``spec`` (renames first, see ``_rename_columns``);
    raise SinkError for unsupported retypes."""
    current = spark.read.format("delta").load(path).schema
    store = SparkStore(spark)
    configuration = store.configuration(path)
    have = _rename_columns(spark, path, spec, {f.name: f.dataType for f in current.fields}, renames,
                           set(json.loads(configuration.get(PROP_DROPPED) or "[]")))
    wanted = spark_schema(spec.schema)
    added: list[str] = []
    widened: list[str] = []
    for field in wanted.fields:
        old_type = have.get(field.name)
        if old_type is None:
            added.append(field.name)
        elif old_type != field.dataType:
            if not _widenable(old_type, field.dataType):
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
    if widened:
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
    if dropped:
        log.warning("%s: columns %s were dropped in the source; kept in Delta, NULL from now on",
                    spec.source_name, ", ".join(dropped))
        properties[PROP_DROPPED] = json.dumps(sorted(dropped))
    keys = configuration.get(PROP_KEYS)
    if keys is not None and json.loads(keys) != list(spec.key_columns):
        properties[PROP_KEYS] = json.dumps(list(spec.key_columns))
    store.set_properties(path, {k: v for k, v in properties.items() if configuration.get(k) != v})
    return SchemaEvolution(tuple(added), tuple(widened), dropped)


def ensure_table(spark: SparkLike, path: str, spec: TableSpec, options: TableOptions | None = None,
                 *, check_options: bool = True, renames: Renames | None = None,
                 stores: StorePicker | None = None) -> SchemaEvolution:
    """Create the table (with ``options``) or evolve it; an existing table's options are compared, not changed.

    The first call for a path in a run (``check_options``) also upgrades a table that an earlier version
    column-mapped with reader version 2 (see :func:`enable_column_mapping`): its next run migrates it.
    A table delta-rs reads that needs none of this is checked without Spark (a provider is not started).
    ``stores``: the run's choice of store (a new table is then created by the store it picks: delta-rs
    when it creates the table as Spark would); without it, a new table is created by Spark."""
    name = spec.source_name
    picker = stores if stores is not None else StorePicker(spark)
    store = picker.reader(path)
    if not store.exists(path):
        create_table(spark, path, spec, options, picker=stores)
        return SchemaEvolution(added=spec.column_names)
    if options is not None and options.any and check_options:
        _warn_option_mismatches(session_of(spark, f"{name}: comparing its table options"), path, spec, options)
    if check_options and not column_mapping_state(spark, path, store).readable_by_deltars:
        # a reader-2 table of an earlier version
        enable_column_mapping(session_of(spark, f"{name}: upgrading its column mapping"), path, table=name)
    if _unchanged(store, path, spec):
        return SchemaEvolution()
    evolution = picker.evolver(path).evolve(path, spec, renames)
    if evolution is None:  # declined by delta-rs: Spark makes every change Delta makes
        evolution = SparkStore(spark).evolve(path, spec, renames)
    return evolution


def evolve_without_spark(store: DeltaRsStore | InMemoryStore, path: str, spec: TableSpec,
                         renames: Renames | None) -> SchemaEvolution | None:
    """``evolve_table`` for the common changes, columns added and columns dropped, in a store that makes
    them without Spark (delta-rs, on a table it writes), None for anything else, left to
    ``evolve_table``: a rename, a retype, a column name that needs column mapping, a type that needs a
    table feature. Starting Spark for an ADD COLUMN costs a fresh process most of its run; the Delta log
    gets the same metaData either way."""
    have = {f["name"]: f["type"] for f in store.schema_fields(path)}
    configuration = store.configuration(path)
    earlier = set(json.loads(configuration.get(PROP_DROPPED) or "[]"))
    old_order, gone, new = _rename_suspects(list(have), spec, earlier)
    if gone and new and renames is not None:
        from applier.catalog.relations import rename_candidates

        if renames(gone, new, rename_candidates(old_order, spec.source_column_names)):
            return None  # a rename: column mapping, through Spark
    added = [f for f in spec.schema if f.name not in have]
    if any(have[f.name] != delta_type(f.type) for f in spec.schema if f.name in have):
        return None  # a retype: widened, or the error, by evolve_table
    if needs_column_mapping([f.name for f in added]) or "timestamp_ntz" in json.dumps(delta_fields(added)):
        return None
    if added:
        # as ALTER TABLE ADD COLUMNS adds them
        store.add_columns(path, [dict(f, nullable=True) for f in delta_fields(added)])
    source_names = set(spec.column_names)
    dropped = tuple(n for n in have if n not in source_names and n != ROW_COLUMN)
    properties: dict[str, str] = {}
    if dropped:
        if set(dropped) - earlier:  # said once, when they go
            log.warning("%s: columns %s were dropped in the source; kept in Delta, NULL from now on",
                        spec.source_name, ", ".join(dropped))
        properties[PROP_DROPPED] = json.dumps(sorted(dropped))
    keys = configuration.get(PROP_KEYS)
    if keys is not None and json.loads(keys) != list(spec.key_columns):
        properties[PROP_KEYS] = json.dumps(list(spec.key_columns))
    properties = {k: v for k, v in properties.items() if configuration.get(k) != v}
    if properties:
        store.set_properties(path, properties)
    return SchemaEvolution(tuple(f.name for f in added), (), dropped)


def _unchanged(store: Store, path: str, spec: TableSpec) -> bool:
    """True when the table already has exactly ``spec``'s columns and types and key columns, read from
    its log with delta-rs: evolve_table would change nothing, and reading the same through Spark costs
    the JVM's first Delta log read (seconds in a fresh process, bench/RESULTS.md). Anything else (a
    path delta-rs cannot open, a type written differently) is left to evolve_table."""
    if isinstance(store, SparkStore):
        return False
    have = {f["name"]: f["type"] for f in store.schema_fields(path)}
    if have != {f.name: delta_type(f.type) for f in spec.schema}:
        return False
    keys = store.configuration(path).get(PROP_KEYS)
    return keys is None or json.loads(keys) == list(spec.key_columns)


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


def column_mapping_state(spark: SparkLike | None, path: str, store: Store | None = None) -> MappingState:
    """The table's column mapping state, read from its log (no Spark job) by the store that reads it
    (default: delta-rs where it can open the path), else from the newest snapshot Spark reads."""
    store = store if store is not None else reader(path, spark)
    if isinstance(store, SparkStore) and store.spark is None:
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
    SparkStore(spark).set_properties(path, properties)
    return True
