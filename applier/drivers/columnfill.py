"""Columns added with a constant default: the rows that existed are filled in Delta from the catalog,
without copying the table again.

Why this is possible: ``ALTER TABLE ... ADD COLUMN c ... DEFAULT <constant>`` does not rewrite the
table. PostgreSQL stores the value once (``pg_attribute.attmissingval``, ``atthasmissing``) and every
row written before the ALTER reads it. The stream sends no row changes for the ALTER; its next
Relation for the table simply has ``c``. A copy of the table would be exact too, but it needs a
temporary slot, and creating a slot waits for every transaction open on the server, prepared ones
included: one forgotten ``PREPARE TRANSACTION`` stalls the whole mirror (issue 30, row 14).

Why the fill is exact: the ALTER takes an ACCESS EXCLUSIVE lock, so every change to the table
decoded without ``c`` committed before the ALTER, and every one after it is decoded with ``c``. Let
B be the end LSN of the first transaction whose changes to the table carry ``c``. While the Delta
table's applied version is below B it holds only rows written before the ALTER, so setting ``c`` to
the missing value in all of them is right, and stays right when repeated. Changes of the group that
end before B are decoded without ``c``: their rows were written before the ALTER too and get the
missing value in their images. Changes from B on carry their own value of ``c`` (an explicit NULL
included) and are left as they are.

Why it is crash-safe: the fill (B and the value's text) is saved in the state before the Delta table
is touched; the schema evolution and the UPDATE are separate Delta commits, but both are repeated
after a crash for as long as the table's applied version is below B (the stream re-sends the group,
its old-schema changes are filled again from the saved record). Once a group commit at or past B
exists, the record is dropped and nothing is filled again.

A transaction applied in pieces (applier.loop) keeps the table's applied version below B until its last
piece, while its pieces commit its own changes, values of ``c`` included. Filling again before each
piece would set ``c`` back to the missing value in the rows the earlier pieces wrote (the everyday
``ALTER TABLE ... ADD COLUMN c ... DEFAULT 0; UPDATE ... SET c = ...`` in one transaction, issue 77).
So the fill records the ordinal of B's first change to the table that carries ``c`` before it writes,
and is not made again once the table's piece marker for B has reached that ordinal: from then on the
table holds changes made after the ALTER. Before that, the pieces it holds are changes made before the
ALTER, which the fill is right to overwrite.

Only a default PostgreSQL stored as a missing value is filled. A volatile default (``random()``,
``clock_timestamp()``), an identity or a generated column rewrote the table: no missing value, and
the values exist only in the rewritten rows, so the table is copied again (``tablesync``). A column
of an array type is copied as well (its missing value's text is not read back here).
"""

from __future__ import annotations

import logging
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from applier.catalog import SchemaVersion, TypeCache
from applier.catalog.batches import GroupedTransactions, TableBatch
from applier.changes import TableChange
from applier.config import MirrorConfig
from applier.errors import SinkError
from applier.infra.crashpoints import crashpoint
from applier.infra.progress import Progress
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.messages import COL_TEXT
from applier.sink.engine import DeltaApplier
from applier.sink.fold import table_spec
from applier.sources.sql_slot import pin_session
from applier.state import StateDir
from applier.values import convert_value

log = logging.getLogger(__name__)

STATE_KEY = "filled_columns"


@dataclass(frozen=True, slots=True)
class Fill:
    """One added column of one table: rows written before ``before`` (an end LSN) read ``text``."""

    column: str
    text: str  # attmissingval as the type's output text: what a 't' column of the stream carries
    before: int
    #: the ordinal of the first change of transaction ``before`` to the table that carries the column, once
    #: a fill was made for a piece of it (None: not yet)
    carried_from: int | None = None

    def saved(self) -> list[str | int]:
        return [self.text, format_lsn(self.before)] + ([] if self.carried_from is None else [self.carried_from])

    @classmethod
    def load(cls, column: str, saved: list[str | int]) -> Fill:
        text, before, *rest = saved
        return cls(column, str(text), parse_lsn(str(before)), int(rest[0]) if rest else None)


def missing_values(conn: psycopg.Connection, oid: int, names: set[str]) -> dict[str, str]:
    """Of the columns ``names`` of relation ``oid``: the missing value (as the type's output text, in
    the session pinned like the walsender's) of each whose rows written before it was added read a
    stored constant. Columns of array types are left out."""
    pin_session(conn)
    rows = conn.execute(
        "SELECT a.attname, (a.attmissingval::text::text[])[1] FROM pg_attribute a "
        "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s AND a.attname = ANY(%s) "
        "AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing AND a.attgenerated = '' "
        "AND a.attidentity = '' AND t.typcategory <> 'A'", (oid, sorted(names))).fetchall()
    return {str(name): str(text) for name, text in rows if text is not None}


def first_carrying(transactions: GroupedTransactions, oid: int, column: str) -> int | None:
    """The end LSN of the group's first transaction whose changes to relation ``oid`` carry ``column``."""
    for end_lsn, batches in transactions:
        for batch in batches:
            if batch.relation_oid == oid and column in batch.schema.column_names:
                return end_lsn
    return None


def first_carrying_ordinal(transactions: GroupedTransactions, oid: int, fill: Fill) -> int | None:
    """The ordinal of the first change to relation ``oid`` of the fill's own transaction that carries its
    column, in this group (None: the group holds none)."""
    for end_lsn, batches in transactions:
        if end_lsn != fill.before:
            continue
        for batch in batches:
            if batch.relation_oid == oid and fill.column in batch.schema.column_names and batch.changes:
                return min(c.ordinal for c in batch.changes)
    return None


class ColumnFills:
    """The fills not yet behind a group commit, kept in the state (``filled_columns``), by relation OID:
    a group may rename the table, or give its name to another one, between the fill's changes (a state
    written before OIDs keyed it holds names, which are matched by name)."""

    def __init__(self, config: MirrorConfig, applier: DeltaApplier, types: TypeCache,
                 state: StateDir, progress: Progress) -> None:
        self.config = config
        self.applier = applier
        self.types = types
        self.state = state
        self.progress = progress
        saved = state.load(STATE_KEY) or {}
        self._pending: dict[str, dict[str, list[str | int]]] = {table: dict(cols) for table, cols in saved.items()}

    def record(self, oid: int, fills: Sequence[Fill]) -> None:
        """Save ``fills`` for relation ``oid`` before anything is written for them."""
        entry = self._pending.setdefault(str(oid), {})
        for fill in fills:
            entry[fill.column] = fill.saved()
        self.state.save(STATE_KEY, self._pending)

    def forget(self, oid: int, qualified: str) -> None:
        """The table is copied again: its copy holds what the fills would have written."""
        if (self._pending.pop(str(oid), None), self._pending.pop(qualified, None)) != (None, None):
            self.state.save(STATE_KEY, self._pending)

    def pending(self, oid: int, qualified: str) -> bool:
        return str(oid) in self._pending or qualified in self._pending

    def _key(self, batch: TableBatch) -> str | None:
        for key in (str(batch.relation_oid), batch.qualified_name):
            if key in self._pending:
                return key
        return None

    def apply(self, transactions: GroupedTransactions) -> None:
        """Fill every pending column of the tables this group touches (see the module docstring): the
        Delta table gets the column and the missing value in the rows it holds, and the group's changes
        decoded before the column existed get it in their images."""
        if not self._pending:
            return
        newest: dict[str, TableBatch] = {}
        first: dict[str, TableBatch] = {}  # where the relation's Delta table is as the group begins
        for _end, batches in transactions:
            for batch in batches:
                key = self._key(batch)
                if key is not None:
                    newest[key] = batch
                    first.setdefault(key, batch)
        changed = False
        for key, last in newest.items():
            oid = last.relation_oid
            done = self.applier.relation_version(oid, first[key].namespace, first[key].name)
            fills = [fill for fill in (Fill.load(column, saved) for column, saved in self._pending[key].items())
                     if done is None or fill.before > done]
            # A column the group's newest schema lacks was dropped again (nothing to fill), unless the group
            # ends before it exists: a restart may cut the stream so that a group ends before the ALTER
            # (the fill was recorded, and written, by a run that was killed). The fill waits for the group
            # that reaches it, whose _fill_delta fills every row written until then.
            waiting = any(f.column not in last.schema.column_names and last.end_lsn <= f.before for f in fills)
            fills = [f for f in fills if f.column in last.schema.column_names]
            if not fills:
                if not waiting:
                    del self._pending[key]
                    changed = True
                continue
            if self.config.apply.schema_changes == "stop":
                continue  # the sink stops at this schema change; nothing is written before it
            values = {f.column: self._value(last.schema, f) for f in fills}
            todo = self._not_in_pieces(key, first[key], fills, transactions)
            if todo:
                self._fill_delta(first[key], last, {f.column: values[f.column] for f in todo})
            _rewrite_batches(transactions, oid, fills, values, last.schema)
        if changed:
            self.state.save(STATE_KEY, self._pending)

    def _not_in_pieces(self, key: str, first: TableBatch, fills: list[Fill],
                       transactions: GroupedTransactions) -> list[Fill]:
        """Of ``fills``, those the Delta table still needs: all but the ones whose transaction is applied
        in pieces and whose table has committed a piece holding a change made after the ALTER (see the
        module docstring). For a fill made for a piece, where its transaction's changes start to carry the
        column is saved first (a crash between the fill and the piece's commit fills again)."""
        out: list[Fill] = []
        noted = False
        for fill in fills:
            if fill.before not in self.applier.pieced_ends:
                out.append(fill)
                continue
            mark = self.applier.piece_mark(first.relation_oid, first.namespace, first.name, fill.before)
            if fill.carried_from is not None and mark is not None and mark >= fill.carried_from:
                continue
            carried = first_carrying_ordinal(transactions, first.relation_oid, fill)
            if carried is not None and carried != fill.carried_from:
                self._pending[key][fill.column] = replace(fill, carried_from=carried).saved()
                noted = True
            out.append(fill)
        if noted:
            self.state.save(STATE_KEY, self._pending)
        return out

    def _value(self, schema: SchemaVersion, fill: Fill) -> object:
        """The missing value through the stream's own value conversion (and special-value policy)."""
        column = schema.relation.columns[schema.column_names.index(fill.column)]
        return convert_value(COL_TEXT, fill.text.encode("utf-8"), column.type_oid, column.type_modifier,
                             self.types, self.config.apply.special_values, fill.column)

    def _fill_delta(self, first: TableBatch, last: TableBatch, values: dict[str, object]) -> None:
        """Evolve the Delta table to the group's newest columns and set the filled ones in every row
        it holds (all written before the ALTER: its applied version is below each fill's LSN). Its
        table is where the group's first change of the relation finds it (a rename later in the group
        moves it after this)."""
        where = self.applier.relation_table(first.relation_oid, first.namespace, first.name)
        if where is None:  # no Delta table: created from the stream's rows, which carry the column
            return
        path = where[0]
        spec = replace(table_spec(last, self.applier.tables, self.types), source_name=where[1])
        values = {spec.delta_name(c): v for c, v in values.items()}  # Postgres names to Delta's
        missing = [c for c in values if c not in spec.schema.names]
        if missing:  # excluded by the config: never in the Delta table
            raise SinkError("a column to fill is not in the table's Delta schema", table=spec.source_name,
                            columns=", ".join(missing))
        stores = self.applier.stores
        # through the engine's own evolution: a column renamed before the add is renamed in place, not
        # taken for a drop (which left its values NULL: issue 47, repro 21a)
        self.applier.ensure(path, spec, last.schema)
        stores.writer(path).fill_columns(path, spec, values)  # Spark's where delta-rs declines
        crashpoint("column_filled")
        self.progress(f"{spec.source_name}: column(s) {', '.join(sorted(values))} added with a constant "
                      "default: the rows that existed are filled with it from the catalog (no copy)")


def _rewrite_batches(transactions: GroupedTransactions, oid: int, fills: Sequence[Fill],
                     values: dict[str, object], newest: SchemaVersion) -> None:
    """Give the changes of relation ``oid`` decoded before each filled column existed the missing value, in
    place in the group's lists: batches of transactions that end before the fill's LSN, and in the
    transaction that ends there (it may have altered the table itself, between two changes) the
    batches before the first one that carries the column."""
    extended: dict[int, tuple[SchemaVersion, tuple[str, ...]]] = {}
    seen: set[str] = set()  # columns a batch of the fill's own transaction already carried
    for end_lsn, batches in transactions:
        if not isinstance(batches, MutableSequence):
            raise SinkError("internal: a group's batches cannot be rewritten", end_lsn=end_lsn)
        for i, batch in enumerate(batches):
            if batch.relation_oid != oid:
                continue
            late: set[str] = set()
            for f in fills:
                if f.column in batch.schema.column_names:
                    if end_lsn == f.before:
                        seen.add(f.column)
                elif end_lsn < f.before or (end_lsn == f.before and f.column not in seen):
                    late.add(f.column)
            add = tuple(c for c in newest.column_names if c in late)  # the newest version's order
            if not add:
                continue
            cached = extended.get(id(batch.schema))
            if cached is None or cached[1] != add:
                added = [(c, cid) for c, cid in zip(newest.relation.columns, newest.ids, strict=True) if c.name in add]
                columns = batch.schema.relation.columns + tuple(c for c, _cid in added)
                schema = replace(batch.schema, relation=replace(batch.schema.relation, columns=columns),
                                 column_ids=batch.schema.ids + tuple(cid for _c, cid in added))
                cached = extended[id(batch.schema)] = (schema, add)
            tail = tuple(values[c] for c in add)
            batches[i] = replace(batch, schema=cached[0],
                                 changes=[_with_tail(c, tail) for c in batch.changes])


def _with_tail(change: TableChange, tail: tuple[Any, ...]) -> TableChange:
    return replace(change,
                   old_row=None if change.old_row is None else change.old_row + tail,
                   new_row=None if change.new_row is None else change.new_row + tail)
