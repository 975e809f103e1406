"""The facts about a mirrored table that every part of the sink shares: its columns and keys
(``TableSpec``), a rule's table options, what a schema change did, the names of applier's table
properties and the app ids its commits are tagged with.

A leaf on purpose: the stores (applier.sink.store), the schema changes (applier.sink.schema), the fold
and the derived tables all read these, and none of it needs a session or an engine, so importing it
never pulls in Spark or delta-rs, nor the modules that pick between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING

from applier.errors import SinkError

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.extras import ExtraColumns

PROP_SOURCE = "applier.source"
PROP_KEYS = "applier.keyColumns"
PROP_IDENTITY = "applier.replicaIdentity"
PROP_DROPPED = "applier.droppedColumns"
PROP_RESTART_IDENTITY = "applier.restartIdentityLsn"  # end LSN of the last TRUNCATE ... RESTART IDENTITY
#: "published", or "not published since <time>": a table taken out of the publication (or dropped) is no
#: longer followed; its Delta table stays, marked, and is never presented as current (applier status)
PROP_PUBLICATION = "applier.publication"
PROP_WIDENED = "applier.widenedColumns"  # JSON list of the columns whose type was widened in place
#: column_names: safe: JSON object of the Delta names that differ from their Postgres names, each to its
#: Postgres name (applier.sink.naming.safe_column_name); on every table written under that rule
PROP_COLUMN_NAMES = "applier.columnNames"
TYPE_WIDENING = "delta.enableTypeWidening"
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
TARGET_FILE_SIZE = "delta.targetFileSize"
#: The size of the files a new table's commits write (``delta.targetFileSize``; a rule's
#: ``table_properties`` may set another). A commit without deletion vectors rewrites every file holding a
#: row it updates or deletes, and delta-rs writes up to 100 MiB a file by default: a catch-up's updates of
#: the keys the last group inserted rewrote the whole table with every group, so each commit took longer
#: and held more memory as the table grew (30M changes: 0.2 s to 7 s a group, 1.9 GB; bench/RESULTS.md,
#: 2026-12-07). In files of 16 MiB a group rewrites the one or two files its keys reach.
DEFAULT_TARGET_FILE_SIZE = 16 << 20
COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
# Column mapping as a named reader feature (protocol 3/7), not the legacy reader version 2: delta-rs 1.6's
# pyarrow path (to_pyarrow_table, to_pandas) then refuses the table loudly, where on a version-2 table it
# returns every column as NULL without an error; its DataFusion path (deltalake.QueryBuilder) reads either
# correctly. Delta (4.x) normalizes a protocol whose features are all legacy ones (columnMapping is) down
# to reader 2 / writer 5 or 7, whatever delta.minReaderVersion says; a non-legacy reader feature keeps it
# at 3/7 with named reader features. timestampNtz is that feature: every reader of column mapping
# (Spark, delta-rs, DuckDB, Polars) supports it, and it needs no column of that type.
COLUMN_MAPPING = {COLUMN_MAPPING_MODE: "name", "delta.feature.timestampNtz": "supported"}


#: In a commit's userMetadata (applier.sink.fold.commit_description): the source commit time of the last
#: transaction the commit applied, ISO 8601 in UTC.
COMMIT_TIME_FIELD = "source_commit_time="


def app_id_for(table_id: str) -> str:
    """The Delta app id of one target table (stable across runs, distinct per table)."""
    return f"applier:{table_id}"


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
    #: config ``column_names: safe``: the source's columns are named in ``schema`` (and ``key_columns``) by
    #: applier.sink.naming.safe_column_name of their Postgres names, so the table needs no column mapping
    safe_names: bool = False

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

    def delta_name(self, postgres_name: str) -> str:
        """The Delta name of one of the source's columns (its Postgres name, unless ``safe_names``)."""
        if not self.safe_names:
            return postgres_name
        from applier.sink.naming import safe_column_name

        return safe_column_name(postgres_name)

    def postgres_name(self, delta_name: str) -> str:
        """The Postgres name of one of the table's own Delta columns (the inverse of ``delta_name``)."""
        if not self.safe_names:
            return delta_name
        from applier.sink.naming import postgres_column_name

        return postgres_column_name(delta_name)

    @property
    def postgres_column_names(self) -> tuple[str, ...]:
        """``source_column_names`` as Postgres names them (what the stream's and the copy's rows match by)."""
        return tuple(self.postgres_name(n) for n in self.source_column_names)

    def renamed_columns(self) -> dict[str, str]:
        """The table's own columns whose Delta name is not their Postgres name, Delta name to Postgres name
        (what ``PROP_COLUMN_NAMES`` lists)."""
        return {d: p for d, p in zip(self.source_column_names, self.postgres_column_names, strict=True) if d != p}

    @property
    def source_schema(self) -> pa.Schema:
        """``schema`` without applier's added columns."""
        import pyarrow

        return pyarrow.schema(list(self.schema)[:len(self.schema) - self.added])


def column_properties(spec: TableSpec) -> tuple[dict[str, str], tuple[str, ...]]:
    """The applier properties that describe ``spec``'s columns (its key, replica identity and, under
    ``column_names: safe``, the mapped names): what a new table is created with and what a table emptied
    for a fresh copy (``applier resync``) is given; and those such a table loses (they were about the
    replaced table's columns)."""
    import json

    wanted = {PROP_KEYS: json.dumps(list(spec.key_columns)), PROP_IDENTITY: spec.replica_identity}
    stale = [PROP_DROPPED, PROP_WIDENED]
    if spec.safe_names:
        wanted[PROP_COLUMN_NAMES] = json.dumps(spec.renamed_columns(), sort_keys=True)
    else:
        stale.append(PROP_COLUMN_NAMES)
    return wanted, tuple(stale)


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
                     table.replica_identity, extra, len(fields), table.safe_names)


@dataclass(frozen=True, slots=True)
class SchemaEvolution:
    added: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()  # present in Delta, gone from the source: kept, NULL from now on

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened)


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


#: (columns gone from Delta's, columns new, rename candidates by position) -> {old: new} (applier.sink.identity)
Renames = Callable[[tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]]], dict[str, str]]


@dataclass(frozen=True, slots=True)
class RewritePolicy:
    """How a proven column rename reaches a Delta table that is not column-mapped yet (config
    ``apply.column_renames``): ``map`` turns Delta column mapping on and renames in place (no data
    rewritten, but the table gains the ``columnMapping`` reader feature that delta-rs's pyarrow path,
    pandas and Polars refuse); ``rewrite`` rewrites the table under the new names in one overwrite
    commit (readable by every reader, costs a full copy); ``auto`` rewrites a table of at most
    ``rewrite_max_bytes`` of data files and maps a larger one. A table that is column-mapped already
    is always renamed in place (a rewrite would not make it readable).

    A widened type follows ``widening`` (``apply.type_widening``) the same way: ``feature`` turns Delta's
    type widening on (a reader feature delta-rs cannot read, so every later commit goes through Spark),
    ``rewrite`` rewrites the table with the wider type, ``auto`` rewrites up to ``widen_max_bytes``."""

    mode: str = "map"  # 'auto', 'rewrite' or 'map' (the default of a caller that names none: what it did before)
    rewrite_max_bytes: int = 0
    widening: str = "feature"  # 'auto', 'rewrite' or 'feature' (likewise)
    widen_max_bytes: int = 0

    def rewrites(self, size_bytes: int) -> bool:
        return self.mode == "rewrite" or (self.mode == "auto" and size_bytes <= self.rewrite_max_bytes)

    def rewrites_widening(self, size_bytes: int) -> bool:
        return self.widening == "rewrite" or (self.widening == "auto" and size_bytes <= self.widen_max_bytes)
