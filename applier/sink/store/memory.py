"""An in-memory store: tables as Python rows, for tests of the loop and the drivers without a JVM or
files, and the oracle the two Delta stores are checked against (tests/unit/sink/test_store_contract.py).

It makes the commits a plan describes the way Delta's MERGE does, row by row: a keyed table's rows are
replaced by key (an unchanged TOAST value taken from the target row of its lookup key), a key-less
table's copies of a row image are counted, a truncated plan overwrites. Columns the plan does not name
(dropped in the source) keep their value on update and are NULL on insert, as Delta's MERGE with an
explicit assignment list leaves them.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.sink.plan import diverged, rows_after_truncate
from applier.sink.rowimage import target_missing
from applier.sink.store.base import CommitResult, CommitTag, WriteMode
from applier.sink.store.deltatypes import delta_fields

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.spec import Renames, RewritePolicy, SchemaEvolution, TableOptions, TableSpec


@dataclass
class MemoryTable:
    fields: list[dict[str, Any]]  # as Delta's JSON schema writes them (name, type, nullable, metadata)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)  # app id -> version (Delta's txn actions)
    table_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    commits: list[str] = field(default_factory=list)  # each commit's description

    @property
    def columns(self) -> list[str]:
        return [f["name"] for f in self.fields]


class InMemoryStore:
    """Tables by path, in this process only."""

    name = "memory"
    uses_spark = False

    def __init__(self) -> None:
        self.tables: dict[str, MemoryTable] = {}
        self._ids = itertools.count()

    def table(self, path: str) -> MemoryTable:
        try:
            return self.tables[str(path)]
        except KeyError:
            raise SinkError("no such table in the in-memory store", path=path) from None

    def rows(self, path: str, columns: tuple[str, ...] | None = None) -> list[tuple[Any, ...]]:
        """The table's rows, projected on ``columns`` (default: all of its own)."""
        table = self.table(path)
        if columns is None:
            return list(table.rows)
        index = [table.columns.index(c) for c in columns]
        return [tuple(row[i] for i in index) for row in table.rows]

    # --- reading ----------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return str(path) in self.tables

    def applied_version(self, path: str, app_id: str) -> int | None:
        return self.table(path).applied.get(app_id)

    def version(self, path: str) -> int:
        """Its commits since the one that created it (version 0, which ``commits`` does not list)."""
        return len(self.table(path).commits)

    def columns(self, path: str) -> tuple[str, ...]:
        return tuple(self.table(path).columns)

    def is_empty(self, path: str) -> bool:
        return not self.table(path).rows

    def scan(self, path: str, columns: Sequence[str], *, unless: str | None = None) -> Iterator[tuple[Any, ...]]:
        table = self.table(path)
        flag = None if unless is None else table.columns.index(unless)
        index = [table.columns.index(c) for c in columns]
        return iter([tuple(row[i] for i in index) for row in table.rows if flag is None or not row[flag]])

    def table_id(self, path: str) -> str | None:
        table = self.tables.get(str(path))
        return table.table_id if table is not None else None

    # --- writing ----------------------------------------------------------------------------------

    def create(self, path: str, spec: TableSpec, options: TableOptions, properties: Mapping[str, str]) -> None:
        if self.exists(path):
            raise SinkError("the table exists already", path=path)
        self.tables[str(path)] = MemoryTable(delta_fields(spec.schema), properties=dict(properties))

    def schema_fields(self, path: str) -> list[dict[str, Any]]:
        return [dict(f) for f in self.table(path).fields]

    def configuration(self, path: str) -> dict[str, str]:
        return dict(self.table(path).properties)

    def reader_protocol(self, path: str) -> tuple[int, tuple[str, ...]]:
        """No column mapping, no reader features: what a table delta-rs writes says."""
        return 1, ()

    def add_columns(self, path: str, fields: list[dict[str, Any]]) -> None:
        """Columns given as Delta JSON schema fields, NULL in every row held."""
        table = self.table(path)
        new = [dict(f) for f in fields if f["name"] not in table.columns]
        table.fields.extend(new)
        table.rows = [(*row, *(None for _ in new)) for row in table.rows]
        table.commits.append("ADD COLUMNS")

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None:
        table = self.table(path)
        table.properties.update(properties)
        if carry is not None:
            table.applied[carry[0]] = carry[1]
        table.commits.append("SET TBLPROPERTIES")

    def write_arrow(self, path: str, table: Any, *, mode: WriteMode, tag: CommitTag | None,
                    schema: pa.Schema | None = None) -> None:
        target = self.table(path)
        if tag is not None and self._done(target, tag[0], tag[1]):
            return
        index = [table.column_names.index(c) if c in table.column_names else None for c in target.columns]
        columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
        rows = [tuple(None if i is None else columns[i][r] for i in index) for r in range(table.num_rows)]
        target.rows = rows if mode == "overwrite" else target.rows + rows
        self._commit(target, tag, mode.upper())

    def replace_empty(self, path: str, spec: TableSpec) -> bool:
        from applier.sink.spec import column_properties

        table = self.table(path)
        table.fields = delta_fields(spec.schema)
        table.rows = []
        wanted, stale = column_properties(spec)
        for name in stale:
            table.properties.pop(name, None)
        table.properties.update(wanted)
        table.commits.append("WRITE (overwrite)")
        return True

    def fill_columns(self, path: str, spec: TableSpec, values: Mapping[str, object]) -> bool:
        table = self.table(path)
        index = {table.columns.index(c): v for c, v in values.items()}
        table.rows = [tuple(index.get(i, v) for i, v in enumerate(row)) for row in table.rows]
        table.commits.append("UPDATE")
        return True

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> dict[str, Any]:
        """Nothing to compact: the rows are not in files."""
        self.table(path)
        return {}

    def vacuum(self, path: str, retention_hours: int | None, *, dry_run: bool, enforce_retention: bool) -> int:
        self.table(path)
        return 0

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int:
        raise SinkError("the in-memory store keeps no history tables (a Delta store does)", table=spec.source_name)

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]]:
        raise SinkError("the in-memory store does not read rows by key (a Delta store does)", path=path)

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution:
        """Columns added and dropped, as delta-rs makes them; anything else stops (it needs a Delta table)."""
        from applier.sink.store.evolution import evolve_without_spark

        evolution = evolve_without_spark(self, path, spec, renames)
        if evolution is None:
            raise SinkError("the in-memory store adds and drops columns only (a rename or a retype needs a Delta "
                            "table)", table=spec.source_name, path=path)
        return evolution

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult:
        target = self.table(path)
        if self._done(target, app_id, version):
            return CommitResult(0, 0, plan.truncated)
        names = list(schema.names)
        index = [target.columns.index(n) for n in names]  # every source column is in the table (evolved first)
        if plan.truncated:
            result = self._overwrite(target, index, plan, description)
        elif plan.multiset:
            result = self._merge_multiset(target, index, plan, description)
        else:
            result = self._merge_keyed(target, index, plan, description)
        self._commit(target, (app_id, version, description), "MERGE")
        return result

    # --- the MERGEs ---------------------------------------------------------------------------------

    def _laid_out(self, target: MemoryTable, index: list[int], row: tuple[Any, ...],
                  base: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        out = list(base) if base is not None else [None] * len(target.columns)
        for value, i in zip(row, index, strict=True):
            out[i] = value
        return tuple(out)

    def _overwrite(self, target: MemoryTable, index: list[int], plan: TablePlan, description: str) -> CommitResult:
        rows = [self._laid_out(target, index, row) for row in rows_after_truncate(plan, description)]
        target.rows = rows
        return CommitResult(len(rows), 0, True)

    def _merge_keyed(self, target: MemoryTable, index: list[int], plan: TablePlan,
                     description: str) -> CommitResult:
        key_index = [index[p] for p in plan.key_positions]
        by_key = {tuple(row[i] for i in key_index): n for n, row in enumerate(target.rows)}
        before = dict(by_key)
        rows: list[tuple[Any, ...] | None] = list(target.rows)
        upserts = deletes = 0
        missing = 0
        for entry in plan.keyed.values():
            if entry.row is None:
                deletes += 1
                n = by_key.pop(tuple(entry.lookup_key or ()), None)
                if n is not None:
                    rows[n] = None
                continue
            upserts += 1
            row = list(entry.row)
            if entry.unresolved:  # read from the table as it was before this commit, as Delta's MERGE does
                source = before.get(tuple(entry.lookup_key or ()))
                if source is None:
                    missing += 1
                    continue
                held = target.rows[source]
                for i in entry.unresolved:
                    row[i] = held[index[i]]
            key = tuple(row[p] for p in plan.key_positions)
            n = by_key.get(key)
            if n is None:
                by_key[key] = len(rows)
                rows.append(self._laid_out(target, index, tuple(row)))
            else:
                rows[n] = self._laid_out(target, index, tuple(row), rows[n])
        if missing:
            raise target_missing(missing, table=description,
                                 key_columns=[target.columns[i] for i in key_index])
        # counted as the Delta stores count them: the plan's deletes, none into an empty table (an append)
        empty = not target.rows
        target.rows = [r for r in rows if r is not None]
        return CommitResult(upserts, 0 if empty else deletes, False)

    def _merge_multiset(self, target: MemoryTable, index: list[int], plan: TablePlan,
                        description: str) -> CommitResult:
        inserted = deleted = 0
        for image, delta in plan.counts.items():
            if not delta:
                continue
            row = plan.images[image]
            same = [n for n, held in enumerate(target.rows) if tuple(held[i] for i in index) == row]
            want = len(same) + delta
            if want < 0:
                raise diverged(description, missing_copies=-want)
            if delta < 0:
                drop = set(same[:-delta])
                target.rows = [r for n, r in enumerate(target.rows) if n not in drop]
                deleted -= delta
            else:
                target.rows.extend([self._laid_out(target, index, row)] * delta)
                inserted += delta
        return CommitResult(inserted, deleted, False)

    @staticmethod
    def _done(target: MemoryTable, app_id: str, version: int) -> bool:
        done = target.applied.get(app_id)
        return done is not None and done >= version

    @staticmethod
    def _commit(target: MemoryTable, tag: CommitTag | None, operation: str) -> None:
        if tag is not None:
            target.applied[tag[0]] = tag[1]
        target.commits.append(tag[2] if tag is not None else operation)
