"""The pure fold of the apply stage: what Delta table a batch maps to, the keys its rows merge on, and a
table's batches folded into one commit's TablePlan, with how that commit describes itself.

No session and no store: an executor folds ranges of a stored log with exactly these functions
(applier.drivers.executors.task) and imports this module alone; the driver's applier.sink.engine
commits what they give.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from applier.catalog import SchemaVersion, TypeCache
from applier.catalog.batches import TableBatch
from applier.changes import TableChange
from applier.config import TablesSettings
from applier.errors import SinkError
from applier.lsn import format_lsn
from applier.protocol.messages import pg_time_to_datetime
from applier.sink.extras import ExtraColumns, with_extra_values
from applier.sink.layouts import Layouts
from applier.sink.plan import TablePlan, fold_changes
from applier.sink.spec import COMMIT_TIME_FIELD, TableSpec, with_added_columns
from applier.sink.zerocol import is_zero_column, with_row_column, zero_column_spec
from applier.values import UNCHANGED_TOAST, arrow_schema_for


def approximate_bytes(batch: TableBatch, sample: int = 4) -> int:
    """A cheap size estimate of a batch's row images (for apply.max_group_bytes_mb): the mean size
    of its first few rows times its number of changes. Strings and bytes count their length,
    containers their elements, everything else 8 bytes."""
    changes = batch.changes
    if not changes:
        return 0
    rows = [c.new_row or c.old_row or c.old_key or () for c in changes[:sample]]
    return sum(_value_bytes(v) for row in rows for v in row) * len(changes) // len(rows)


def _value_bytes(value: Any) -> int:
    if isinstance(value, str | bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_value_bytes(v) for v in value)
    return 8


def table_spec(batch: TableBatch, tables: TablesSettings, types: TypeCache | None) -> TableSpec:
    """The Delta table a batch's source table maps to: columns and Arrow types (rules' exclusions
    applied), merge key, and the added metadata columns. Pure (no session): executors use it too."""
    sv = batch.schema
    rel = sv.relation
    qualified = f"{batch.namespace}.{batch.name}"
    if not rel.columns:
        return zero_column_spec(qualified, rel.replica_identity)  # a row count (applier.sink.zerocol)
    rule = tables.rule_for(qualified)
    keys = merge_keys(batch, tables)
    schema = arrow_schema_for(sv, types)
    excluded = set(rule.exclude_columns) if rule is not None else set()
    if excluded:
        import pyarrow as pa

        if excluded & set(keys):
            raise SinkError("a key column cannot be excluded (it is what rows are merged on)",
                            table=qualified, columns=", ".join(sorted(excluded & set(keys))))
        schema = pa.schema([f for f in schema if f.name not in excluded])
    spec = TableSpec(qualified, schema, keys, rel.replica_identity)
    if tables.safe_column_names(qualified):
        spec = safe_named(spec)
    extra = ExtraColumns.for_table(tables, qualified)
    if extra is None:
        return spec
    if not keys:
        raise SinkError("metadata columns and soft deletes need a key: this table has none (REPLICA "
                        "IDENTITY FULL without a primary key); set key_columns in a tables rule, or "
                        "metadata_columns/soft_delete: false in a rule for it", table=qualified)
    return with_added_columns(spec, extra.fields(), "metadata", extra=extra,
                              remedy="choose other names in tables.metadata_names")


def safe_named(spec: TableSpec) -> TableSpec:
    """``spec`` (of the source's columns only) with its columns under their safe Delta names
    (``column_names: safe``, applier.sink.naming.safe_column_name)."""
    import pyarrow as pa

    from applier.sink.naming import safe_column_name

    schema = pa.schema([f.with_name(safe_column_name(f.name)) for f in spec.schema])
    return TableSpec(spec.source_name, schema, tuple(safe_column_name(k) for k in spec.key_columns),
                     spec.replica_identity, safe_names=True)


def merge_keys(batch: TableBatch, tables: TablesSettings) -> tuple[str, ...]:
    """The columns a batch's rows are merged on: a rule's ``key_columns``, else the replica identity
    key of the batch's schema version; empty for REPLICA IDENTITY FULL (the rows are a multiset)."""
    rule = tables.rule_for(f"{batch.namespace}.{batch.name}")
    if rule is not None and rule.key_columns:
        return tuple(rule.key_columns)
    rel = batch.schema.relation
    if rel.replica_identity == "f":
        return ()  # whole-row identity: a multiset
    return tuple(rel.columns[i].name for i in batch.schema.key_indexes)


def key_runs(parts: Sequence[tuple[int, TableBatch]], tables: TablesSettings) -> list[list[tuple[int, TableBatch]]]:
    """One table's batches of a group (``(end_lsn, batch)``, commit order) cut where the columns its
    rows are merged on change (``merge_keys``: a key added or dropped, REPLICA IDENTITY set to or
    from FULL).

    Why: a fold merges every change on one set of keys, and a keyed fold of a multiset's changes (or
    a multiset fold of key images) is not what Postgres did: with duplicates, an update of one copy
    and a delete of the other fold to a deleted key. Each run is folded and committed on its own, as
    one commit per transaction would have. Nearly always there is one run (the keys are computed
    once per schema version). A cut between two changes of ONE transaction (``ALTER TABLE ... REPLICA
    IDENTITY`` or ``ADD PRIMARY KEY`` between its row changes, which PostgreSQL's own subscriber
    applies) makes a run of that transaction's part alone, the earlier transactions of the run before
    it a run of their own: a run that ends inside a transaction is committed with a piece marker
    (applier.sink.engine, ``split_ends``), not with the transaction's end LSN, as a piece of a large
    transaction is."""
    keys_of: dict[int, tuple[str, ...]] = {}
    runs: list[list[tuple[int, TableBatch]]] = []
    current: tuple[str, ...] | None = None
    for end_lsn, batch in parts:
        keys = keys_of.get(id(batch.schema))
        if keys is None:
            keys = keys_of[id(batch.schema)] = merge_keys(batch, tables)
        if not runs or keys != current:
            if runs and runs[-1][-1][0] == end_lsn and runs[-1][0][0] != end_lsn:
                run = runs.pop()  # the transaction's part before the cut: a run of its own
                cut = next(i for i, (lsn, _b) in enumerate(run) if lsn == end_lsn)
                runs += [run[:cut], run[cut:]]
            runs.append([])
            current = keys
        runs[-1].append((end_lsn, batch))
    return runs


def split_ends(transactions: Sequence[tuple[int, Sequence[TableBatch]]], tables: TablesSettings) -> set[int]:
    """The end LSNs of ``transactions`` inside which a table's merge keys change between its row changes
    (``key_runs`` cuts them)."""
    ends: set[int] = set()
    for end_lsn, batches in transactions:
        keys: dict[int, tuple[str, ...]] = {}
        for batch in batches:
            these = merge_keys(batch, tables)
            if keys.setdefault(batch.relation_oid, these) != these:
                ends.add(end_lsn)
                break
    return ends


@dataclass
class FoldedTable:
    """One table's fold of a range of transactions, made away from this applier (on an executor:
    applier.drivers.executors), with the spec and schema version it was folded for."""

    path: str
    spec: TableSpec
    schema: SchemaVersion
    plan: TablePlan


def fold_table(spec: TableSpec, batches: Sequence[TableBatch], newest: SchemaVersion | None = None) -> TablePlan:
    """One table's batches (commit order) folded into one commit's plan, rows aligned to ``spec``'s
    columns (batches of older schema versions remapped; ``newest``, the version ``spec`` was made
    from, is the last batch's by default) and the metadata values added."""
    names = spec.column_names
    layouts = Layouts(spec.postgres_column_names, newest or (batches[-1].schema if batches else None))
    key_positions = tuple(names.index(k) for k in spec.key_columns)
    extra, ncols = spec.extra, len(spec.source_column_names)
    changes: Iterable[TableChange] = chain.from_iterable(layouts.aligned(b) for b in batches) if extra is None else \
        chain.from_iterable(with_extra_values(layouts.aligned(b), b, extra, key_positions, ncols, UNCHANGED_TOAST)
                            for b in batches)
    if is_zero_column(spec):
        changes = with_row_column(changes)
    soft = extra.soft_delete_positions(ncols) if extra is not None else None
    return fold_changes(changes, names, key_positions, unchanged_marker=UNCHANGED_TOAST, soft_delete=soft)


def commit_description(spec: TableSpec, end_lsn: int, transactions: int, plan: TablePlan, extra: str = "", *,
                       commit_time: int | None = None) -> str:
    """What a commit's Delta history says it applied (with the truncate, in Postgres terms, when it has one);
    ``commit_time`` (the source commit time of its last transaction, PostgreSQL microseconds) is how
    ``applier status`` tells each table's lag."""
    out = f"{spec.source_name} end_lsn={format_lsn(end_lsn)} transactions={transactions}"
    if commit_time is not None:
        out += f" {COMMIT_TIME_FIELD}{pg_time_to_datetime(commit_time).isoformat(timespec='microseconds')}"
    out += f" {extra}" if extra else ""
    return out + (f" {truncate_clause(plan)}" if plan.truncated else "")


def truncate_clause(plan: TablePlan) -> str:
    """How the plan's truncate reads in Postgres terms, e.g. ``TRUNCATE CASCADE RESTART IDENTITY``."""
    return " ".join(["TRUNCATE"] + (["CASCADE"] if plan.cascade else [])
                    + (["RESTART IDENTITY"] if plan.restart_identity else []))


def describe_plan(description: str, plan: TablePlan) -> str:
    """One line saying what a commit would do (for --dry-run)."""
    if plan.multiset:
        inserts = sum(n for n in plan.counts.values() if n > 0)
        deletes = -sum(n for n in plan.counts.values() if n < 0)
        what = f"multiset: +{inserts} -{deletes} row copies"
    else:
        upserts = sum(1 for e in plan.keyed.values() if e.row is not None)
        deletes = sum(1 for e in plan.keyed.values() if e.row is None)
        toast = sum(1 for e in plan.keyed.values() if e.row is not None and e.unresolved)
        what = f"upsert {upserts} keys ({toast} keep TOAST values from the target), delete {deletes} keys"
    if plan.truncated:
        what = f"{truncate_clause(plan)} then {what} (overwrite)"
    return f"{description}: {plan.changes} changes -> {what}"
