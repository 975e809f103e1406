"""A pure-Python reference sink, for tests only: applies row images one by one, the way PostgreSQL's
apply worker does (no folding), so it is an independent oracle for the Delta sink's grouped MERGEs.

Keyed tables: dict key -> row; 'u' columns keep the current row's value (of the OLD key on a key
change). Key-less FULL-identity tables: a list, one matching row removed per update/delete.
Rows are held in the layout of the newest Relation seen for their table; when a Relation changes
the column list (ALTER TABLE add/drop/retype), the held rows are re-laid out by column name: an
added column is NULL in the rows written before it (as in Postgres, for a column added without a
default), a dropped column disappears.
"""

from __future__ import annotations

from typing import Any

from applier.assembly import CommittedTransaction
from applier.assembly.rowchanges import row_changes
from applier.changes import TableChange
from applier.values import UNCHANGED_TOAST


class ReferenceSink:
    def __init__(self, convert: Any) -> None:
        self.convert = convert  # (schema, TupleData) -> values, the pipeline's converter
        self.keyed: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {}
        self.bags: dict[str, list[tuple[Any, ...]]] = {}
        self.columns: dict[str, tuple[str, ...]] = {}
        self.truncates: list[tuple[str, bool, bool]] = []  # (table, cascade, restart identity) as applied

    def rows(self, qualified: str, names: tuple[str, ...] | list[str]) -> list[tuple[Any, ...]]:
        """The held rows of a table, projected on ``names`` (the columns Postgres has now)."""
        have = self.columns.get(qualified, ())
        held = self.bags[qualified] if qualified in self.bags else list(self.keyed.get(qualified, {}).values())
        return [tuple(row[have.index(n)] if n in have else None for n in names) for row in held]

    def apply(self, txn: CommittedTransaction) -> None:
        for change in txn.changes:
            for schema, row in row_changes(change, self.convert):
                name = schema.qualified_name
                self._follow_schema(name, schema)
                if schema.relation.replica_identity == "f":
                    self._bag(name, row)
                else:
                    self._keyed(name, schema, row)

    def _follow_schema(self, name: str, schema: Any) -> None:
        names = schema.column_names
        before = self.columns.setdefault(name, names)
        if before == names:
            return
        self.columns[name] = names

        def relayout(row: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(row[before.index(n)] if n in before else None for n in names)

        if name in self.bags:
            self.bags[name] = [relayout(r) for r in self.bags[name]]
        if name in self.keyed:
            keys = schema.key_indexes
            self.keyed[name] = {tuple(new[i] for i in keys): new
                                for new in (relayout(r) for r in self.keyed[name].values())}

    def _keyed(self, name: str, schema: Any, im: TableChange) -> None:
        table = self.keyed.setdefault(name, {})
        keys = schema.key_indexes
        if im.op == "T":
            table.clear()
            self.truncates.append((name, im.cascade, im.restart_identity))
            return
        old_key = im.old_key if im.old_row is None else tuple(im.old_row[i] for i in keys)
        if im.op == "D":
            assert old_key is not None
            del table[old_key]
            return
        assert im.new_row is not None
        new_key = tuple(im.new_row[i] for i in keys)
        current = table.get(old_key if old_key is not None else new_key)
        if current is None:  # a new row: none of its values is an unchanged TOAST one
            current = ()
        row = tuple(current[i] if v is UNCHANGED_TOAST else v for i, v in enumerate(im.new_row))
        if old_key is not None and old_key != new_key:
            del table[old_key]
        table[new_key] = row

    def _bag(self, name: str, im: TableChange) -> None:
        bag = self.bags.setdefault(name, [])
        if im.op == "T":
            bag.clear()
            self.truncates.append((name, im.cascade, im.restart_identity))
            return
        if im.op in ("U", "D"):
            assert im.old_row is not None
            bag.remove(im.old_row)  # exactly one matching row
        if im.op in ("I", "U"):
            new = im.new_row
            assert new is not None
            bag.append(tuple(o if v is UNCHANGED_TOAST else v for v, o in zip(new, im.old_row or new, strict=True)))
