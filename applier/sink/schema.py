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
from dataclasses import replace
from typing import TYPE_CHECKING

from applier.errors import ColumnNamesError, SinkError
from applier.sink.naming import needs_column_mapping, safe_column_name
from applier.sink.spec import (
    COLUMN_MAPPING,
    DEFAULT_TARGET_FILE_SIZE,
    PROP_COLUMN_NAMES,
    PROP_KEYS,
    PROP_SOURCE,
    TARGET_FILE_SIZE,
    Renames,
    RewritePolicy,
    SchemaEvolution,
    TableOptions,
    TableSpec,
    column_properties,
)
from applier.sink.store import SparkStore, StorePicker
from applier.sink.store.deltatypes import delta_type
from applier.sink.store.picker import Store
from applier.sink.store.sparkddl import column_mapping_state, enable_column_mapping, warn_option_mismatches
from applier.spark.session import SparkLike, session_of

if TYPE_CHECKING:
    from applier.config import TableRule


def _creation_properties(spec: TableSpec, options: TableOptions) -> dict[str, str]:
    """The properties a new table is created with (and the check that its layout names real columns)."""
    names = set(spec.column_names)
    unknown = [c for c in (*options.partition_by, *options.cluster_by) if c not in names]
    if unknown:
        raise SinkError("partition_by/cluster_by names columns the table does not have (or excludes); fix the "
                        "table's rule", table=spec.source_name, columns=", ".join(unknown))
    properties = {PROP_SOURCE: spec.source_name, TARGET_FILE_SIZE: str(DEFAULT_TARGET_FILE_SIZE)} \
        | column_properties(spec)[0] | options.table_properties()
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
    if isinstance(store, SparkStore) and TARGET_FILE_SIZE not in options.properties:
        del properties[TARGET_FILE_SIZE]  # Spark's Delta refuses a property it does not know; its MERGE ignores it
    store.create(path, spec, options, properties)


def table_options(rule: TableRule | None) -> TableOptions | None:
    """The Delta table options of a config rule (None without a rule: nothing to create with or compare)."""
    if rule is None:
        return None
    return TableOptions(rule.type_widening, rule.change_data_feed, tuple(rule.partition_by), tuple(rule.cluster_by),
                        dict(rule.table_properties))


def ensure_table(spark: SparkLike, path: str, spec: TableSpec, options: TableOptions | None = None,
                 *, check_options: bool = True, renames: Renames | None = None,
                 stores: StorePicker | None = None, rename: RewritePolicy | None = None) -> SchemaEvolution:
    """Create the table (with ``options``) or evolve it; an existing table's options are compared, not changed.

    The first call for a path in a run (``check_options``) also upgrades a table that an earlier version
    column-mapped with reader version 2 (see :func:`enable_column_mapping`): its next run migrates it.
    A table delta-rs reads that needs none of this is checked without Spark (a provider is not started).
    ``stores``: the run's choice of store (a new table is then created by the store it picks: delta-rs
    when it creates the table as Spark would); without it, a new table is created by Spark. ``rename``:
    how a proven column rename is made (applier.sink.spec.RewritePolicy; default: column mapping)."""
    name = spec.source_name
    picker = stores if stores is not None else StorePicker(spark)
    store = picker.reader(path)
    if options is not None and spec.safe_names:  # a rule names Postgres columns
        options = replace(options, partition_by=tuple(map(spec.delta_name, options.partition_by)),
                          cluster_by=tuple(map(spec.delta_name, options.cluster_by)))
    if not store.exists(path):
        create_table(spark, path, spec, options, picker=stores)
        return SchemaEvolution(added=spec.column_names)
    _check_column_names(store, path, spec)
    if options is not None and options.any and check_options:
        warn_option_mismatches(session_of(spark, f"{name}: comparing its table options"), path, spec, options)
    if check_options and not column_mapping_state(spark, path, store).readable_by_deltars:
        # a reader-2 table of an earlier version
        enable_column_mapping(session_of(spark, f"{name}: upgrading its column mapping"), path, table=name)
    if _unchanged(store, path, spec):
        return SchemaEvolution()
    return picker.evolver(path).evolve(path, spec, renames, rename=rename)  # what delta-rs declines, Spark makes


def _unchanged(store: Store, path: str, spec: TableSpec) -> bool:
    """True when the table already has exactly ``spec``'s columns and types and key columns, read from
    its log with delta-rs: evolve_table would change nothing, and reading the same through Spark costs
    the JVM's first Delta log read (seconds in a fresh process, bench/RESULTS.md). Anything else (a
    path delta-rs cannot open, a type written differently) is left to evolve_table."""
    if store.uses_spark:
        return False
    have = {f["name"]: f["type"] for f in store.schema_fields(path)}
    if have != {f.name: delta_type(f.type) for f in spec.schema}:
        return False
    keys = store.configuration(path).get(PROP_KEYS)
    return keys is None or json.loads(keys) == list(spec.key_columns)


def _check_column_names(store: Store, path: str, spec: TableSpec) -> None:
    """Stop before a table written under one ``column_names`` choice is written under the other: its
    column ``Weird col`` would look dropped (NULL from then on) and ``Weird%20col`` new, and the rows the
    table held would lose that column's value without an error; worse, a source that also has a column
    literally named ``Weird%20col`` would have its values written into the other's. Nearly never read:
    only for a spec with a name the other choice writes differently.

    Under ``safe``: a column the table holds under a Postgres name that ``safe`` maps (no safe name has a
    space or ``,;{}()=``, so it was written under ``keep``). Under ``keep``: a column the table's property
    ``applier.columnNames`` (kept by every table written under ``safe``) lists as the safe name of one of
    the spec's columns."""
    if spec.safe_names:
        maps = spec.renamed_columns()  # Delta name -> Postgres name
        if not maps:
            return
        have = set(store.columns(path))
        held = [(p, p, d) for d, p in maps.items() if p in have and p not in spec.column_names]
    else:
        if not any(safe_column_name(n) != n for n in spec.source_column_names):
            return
        recorded = store.configuration(path).get(PROP_COLUMN_NAMES)
        if recorded is None:
            return
        have = set(store.columns(path))
        held = [(p, d, p) for d, p in json.loads(recorded).items() if d in have and p in spec.source_column_names]
    if not held:
        return
    ours, theirs = ("safe", "keep") if spec.safe_names else ("keep", "safe")
    named = ", ".join(f"{pg!r} as {there!r} ({ours} writes {would!r})" for pg, there, would in sorted(held))
    raise ColumnNamesError(
        f"{spec.source_name}: the Delta table was written with column_names: {theirs} and holds {named}; the "
        f"config now says {ours}, which would leave those columns NULL from now on and write new ones beside "
        f"them; nothing was written. To go on: set column_names: {theirs} for this table (a tables rule), or "
        f"copy it anew under the new names (`applier resync --config FILE --table "
        f"{spec.source_name}`)", table=spec.source_name, path=path, column_names=ours)
