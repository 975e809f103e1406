"""Rows as Arrow, the form both engines take a commit's rows in, and the merge source's own columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: Prefix of the MERGE source's own columns. Longer than any PostgreSQL identifier can be (63
#: bytes, NAMEDATALEN - 1), so no source column can share a name with them: a user column named
#: ``__applier_op`` made every later MERGE ambiguous. Never written to a table.
INTERNAL_PREFIX = "__applier_internal_column_longer_than_any_postgresql_identifier_"
assert len(INTERNAL_PREFIX.encode()) > 63
OP_COL = INTERNAL_PREFIX + "op"
IMG_COL = INTERNAL_PREFIX + "img"


def with_op_column(schema: pa.Schema) -> pa.Schema:
    """``schema`` and the MERGE source's operation column (both engines' MERGEs)."""
    import pyarrow

    return pyarrow.schema([*schema, pyarrow.field(OP_COL, pyarrow.string(), nullable=False)])


def arrow_table(rows: list[tuple[object, ...]], schema: pa.Schema) -> Any:
    """``rows`` as a pyarrow Table of ``schema``'s Arrow types, or None when a value does not convert
    (e.g. a year-1 timestamp with a time zone that overflows Arrow's localisation: the caller then
    takes a row-by-row path)."""
    import pyarrow

    try:
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
        arrays = [pyarrow.array(col, type=field.type, from_pandas=False)
                  for col, field in zip(columns, schema, strict=True)]
        return pyarrow.Table.from_arrays(arrays, schema=schema)
    except (pyarrow.ArrowException, TypeError, ValueError, OverflowError):
        return None
