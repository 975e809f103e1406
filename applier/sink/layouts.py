"""Lays a table's batches out in the columns of one schema version (the group's newest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from applier.catalog import PerSchemaVersion
from applier.changes import TableBatch, TableChange


class Layouts:
    """Lays batches out in the columns of the group's newest schema version (``names``).

    Whether a schema version already has that layout is decided once per version, not once per
    batch: a group of 100 k small transactions holds 100 k batches per table, nearly all of one
    version."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._same: PerSchemaVersion[bool] = PerSchemaVersion(lambda schema: schema.column_names == names)

    def aligned(self, batch: TableBatch) -> Sequence[TableChange]:
        return batch.changes if self._same[batch.schema] else _remapped(batch, self.names)


def _remapped(batch: TableBatch, names: tuple[str, ...]) -> list[TableChange]:
    index = {c.name: i for i, c in enumerate(batch.schema.relation.columns)}

    def remap(row: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        return None if row is None else tuple(row[index[n]] if n in index else None for n in names)

    return [replace(c, old_row=remap(c.old_row), new_row=remap(c.new_row)) for c in batch.changes]
