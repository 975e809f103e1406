"""Tables without columns (``CREATE TABLE t()``): what Delta holds for them.

Such a table holds nothing but a number of rows (``INSERT INTO t DEFAULT VALUES`` adds one; with
REPLICA IDENTITY FULL a DELETE sends an old image of no columns and removes one of the identical
rows; TRUNCATE empties it). Delta cannot create a table without columns, so its Delta table has one
column applier adds, :data:`ROW_COLUMN`, always NULL, and one Delta row per Postgres row: a
multiset of identical rows, folded and merged like any table without a key, and ``count(*)``
equals Postgres's. NULL rather than a constant so that a table whose last column is dropped (its
rows then match on this column alone) and one that gains a column (its earlier rows keep NULL in
it) stay consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from applier.changes import TableChange

if TYPE_CHECKING:
    from applier.sink.spec import TableSpec

#: The one column of a zero-column table's Delta table (documented in docs/delta-tables.md).
ROW_COLUMN = "_applier_row"


def zero_column_spec(source_name: str, replica_identity: str) -> TableSpec:
    """The Delta table of a source table without columns: :data:`ROW_COLUMN` alone, added by applier."""
    import pyarrow as pa

    from applier.sink.spec import TableSpec

    return TableSpec(source_name, pa.schema([pa.field(ROW_COLUMN, pa.bool_(), nullable=True)]), (),
                     replica_identity, added=1)


def is_zero_column(spec: TableSpec) -> bool:
    return spec.extra is None and spec.column_names == (ROW_COLUMN,) and spec.added == 1


def with_row_column(changes: Iterable[TableChange]) -> Iterator[TableChange]:
    """A zero-column table's changes with the NULL of :data:`ROW_COLUMN` in every row image."""
    for change in changes:
        yield replace(change, old_row=None if change.old_row is None else (*change.old_row, None),
                      new_row=None if change.new_row is None else (*change.new_row, None))
