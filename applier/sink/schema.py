"""Create Delta tables from a source relation's schema and follow its schema changes.

Rules (issue: Delta sink): added columns are added; dropped columns stay in Delta (NULL from then on)
and are reported; widened types use Delta type widening; any other retype stops with an error
that says what to do. Key columns and the source relation are recorded in table properties so that
a restart (or a human) can see what a table mirrors.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from applier.errors import SinkError
from applier.sink.naming import delta_path_sql, needs_column_mapping, quote_identifier, sql_string_literal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

PROP_SOURCE = "applier.source"
PROP_KEYS = "applier.keyColumns"
PROP_IDENTITY = "applier.replicaIdentity"
PROP_DROPPED = "applier.droppedColumns"
PROP_RESTART_IDENTITY = "applier.restartIdentityLsn"
PROP_TYPE_WIDENING = "delta.enableTypeWidening"  # end LSN of the last TRUNCATE ... RESTART IDENTITY


@dataclass(frozen=True, slots=True)
class TableSpec:
    """What the sink needs to know about one source table's current schema."""

    source_name: str  # "schema.table" as in Postgres
    schema: StructType  # Spark types per the documented mapping, columns in source order
    key_columns: tuple[str, ...]  # replica identity key; empty for FULL identity without a key
    replica_identity: str  # 'd', 'i', 'f' or 'n'

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.schema.fields)


@dataclass(frozen=True, slots=True)
class SchemaEvolution:
    added: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()  # present in Delta, gone from the source: kept, NULL from now on

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened)


def _table_exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def create_table(spark: SparkSession, path: str, spec: TableSpec, *, type_widening: bool = True) -> None:
    """Create the Delta table for ``spec`` at ``path`` (no-op if it exists).

    SQL with every identifier quoted, not DeltaTableBuilder.location(): the builder splices the path
    into ``delta.`...``` unescaped, so a schema or table name with a backtick broke it. Without
    ``type_widening`` (the initial copy's data is written by delta-rs, which cannot write that table
    feature) the copy's final commit turns it on (``PROP_TYPE_WIDENING``)."""
    properties = {PROP_SOURCE: spec.source_name, PROP_KEYS: json.dumps(list(spec.key_columns)),
                  PROP_IDENTITY: spec.replica_identity}
    if type_widening:
        properties[PROP_TYPE_WIDENING] = "true"
    if needs_column_mapping(spec.column_names):
        properties |= {"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2",
                       "delta.minWriterVersion": "5"}
    columns = ", ".join(f"{quote_identifier(f.name)} {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                        for f in spec.schema.fields)
    props = ", ".join(f"{sql_string_literal(k)} = {sql_string_literal(v)}" for k, v in properties.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {delta_path_sql(path)} ({columns}) USING delta TBLPROPERTIES ({props})")


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


def evolve_table(spark: SparkSession, path: str, spec: TableSpec) -> SchemaEvolution:
    """Bring the Delta table's columns in line with ``spec``; raise SinkError for unsupported retypes."""
    current = spark.read.format("delta").load(path).schema
    have = {f.name: f.dataType for f in current.fields}
    added: list[str] = []
    widened: list[str] = []
    for field in spec.schema.fields:
        old_type = have.get(field.name)
        if old_type is None:
            added.append(field.name)
        elif old_type != field.dataType:
            if not _widenable(old_type, field.dataType):
                raise SinkError(
                    f"column {field.name!r} of {spec.source_name} changed type from "
                    f"{old_type.simpleString()} to {field.dataType.simpleString()}, which Delta cannot widen "
                    "in place; rebuild this table: drop its Delta directory and replay from a snapshot, "
                    "or map the column to a compatible type in the config",
                    table=spec.source_name, column=field.name)
            widened.append(field.name)
    source_names = set(spec.column_names)
    dropped = tuple(name for name in have if name not in source_names)
    table = delta_path_sql(path)
    if added:
        if needs_column_mapping(added):
            _enable_column_mapping(spark, path)
        cols = ", ".join(f"{quote_identifier(f.name)} {f.dataType.simpleString()}"
                         for f in spec.schema.fields if f.name in added)
        spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({cols})")
    for name in widened:
        new_type = next(f.dataType for f in spec.schema.fields if f.name == name)
        spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quote_identifier(name)} TYPE {new_type.simpleString()}")
    if dropped:
        log.warning("%s: columns %s were dropped in the source; kept in Delta, NULL from now on",
                    spec.source_name, ", ".join(dropped))
        set_table_property(spark, path, PROP_DROPPED, json.dumps(sorted(dropped)))
    keys = _get_property(spark, path, PROP_KEYS)
    if keys is not None and json.loads(keys) != list(spec.key_columns):
        set_table_property(spark, path, PROP_KEYS, json.dumps(list(spec.key_columns)))
    return SchemaEvolution(tuple(added), tuple(widened), dropped)


def ensure_table(spark: SparkSession, path: str, spec: TableSpec) -> SchemaEvolution:
    if not _table_exists(spark, path):
        create_table(spark, path, spec)
        return SchemaEvolution(added=spec.column_names)
    return evolve_table(spark, path, spec)


def _get_property(spark: SparkSession, path: str, key: str) -> str | None:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().collect()[0]
    return (detail["properties"] or {}).get(key)


def set_table_property(spark: SparkSession, path: str, key: str, value: str) -> None:
    if _get_property(spark, path, key) == value:
        return
    # TBLPROPERTIES takes no parameter markers; the value is escaped as a literal (it can hold
    # hostile column names from Postgres).
    spark.sql(f"ALTER TABLE {delta_path_sql(path)} SET TBLPROPERTIES "
              f"({sql_string_literal(key)} = {sql_string_literal(value)})")


def _enable_column_mapping(spark: SparkSession, path: str) -> None:
    if _get_property(spark, path, "delta.columnMapping.mode") == "name":
        return
    spark.sql(f"ALTER TABLE {delta_path_sql(path)} SET TBLPROPERTIES ("
              "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
