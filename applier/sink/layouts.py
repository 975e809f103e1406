"""Lays a table's batches out in the columns of one schema version (the group's newest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from applier.catalog import PerSchemaVersion, SchemaVersion
from applier.catalog.batches import TableBatch
from applier.changes import TableChange


class Layouts:
    """Lays batches out in the columns ``names`` of the group's newest schema version ``newest``.

    A column is matched by its identity (``SchemaVersion.column_ids``), not by its name: rows decoded
    before ``RENAME COLUMN a TO b`` carry under ``a`` what is ``b`` now, and a name dropped and taken
    by a new column is another column. A column added since is NULL in older rows (a constant default
    was given to them before this: applier.drivers.columnfill), one dropped since is left out. Without
    ``newest`` (or for another relation's rows), columns match by name.

    How a schema version maps to ``names`` is worked out once per version, not once per batch: a group
    of 100 k small transactions holds 100 k batches per table, nearly all of one version."""

    def __init__(self, names: tuple[str, ...], newest: SchemaVersion | None = None) -> None:
        self.names = names
        self.newest = newest
        self._positions: PerSchemaVersion[tuple[int | None, ...] | None] = PerSchemaVersion(self._positions_of)

    def _positions_of(self, schema: SchemaVersion) -> tuple[int | None, ...] | None:
        """Where each of ``names`` is in a row of ``schema`` (None: not there); None when it is the same."""
        newest = self.newest
        if newest is not None and newest.relation.oid == schema.relation.oid:
            where = {cid: i for i, cid in enumerate(schema.ids)}
            id_of = dict(zip(newest.column_names, newest.ids, strict=True))
            positions = tuple(where.get(id_of[n]) if n in id_of else None for n in self.names)
        else:
            by_name = {c.name: i for i, c in enumerate(schema.relation.columns)}
            positions = tuple(by_name.get(n) for n in self.names)
        same = len(schema.relation.columns) == len(self.names) and positions == tuple(range(len(self.names)))
        return None if same else positions

    def aligned(self, batch: TableBatch) -> Sequence[TableChange]:
        positions = self._positions[batch.schema]
        return batch.changes if positions is None else _remapped(batch.changes, positions)


def _remapped(changes: Sequence[TableChange], positions: tuple[int | None, ...]) -> list[TableChange]:
    def remap(row: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        return None if row is None else tuple(None if p is None else row[p] for p in positions)

    return [replace(c, old_row=remap(c.old_row), new_row=remap(c.new_row)) for c in changes]
