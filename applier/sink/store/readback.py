"""Rows read back from a target table by their values, with delta-rs, for the commits that need them
first: unchanged TOAST values taken from the committed row, a key-less table's copies counted, the
mirror table's rows a change feed continues, a history's open versions.

Why in Arrow: a table may hold millions of rows and a commit needs a few, so the rows are matched in
Arrow, column by column, and only the few come to Python. Values are compared as the commit's own
Arrow types, on both sides (delta-rs may read a string as a view, a time zone by another name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from applier.sink.plan import freeze
from applier.sink.store.arrow import arrow_table

if TYPE_CHECKING:
    import pyarrow as pa


def matching(dataset: Any, types: Any, wanted: Any | None) -> Any:
    """The rows of ``dataset`` (a table's version, from ``DeltaTable.to_pyarrow_dataset``) whose values in
    each of ``wanted``'s columns are among that column's values (NULL included when it holds one; every
    row when ``wanted`` is None): a superset of the rows matching a row of ``wanted``, as the Arrow types
    of ``types``. An integer first column also lets the file statistics skip files (only integers: a
    scan filter must match each file's own physical type, and delta-rs reads a string as a view)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    first = wanted.column_names[0] if wanted is not None and wanted.num_columns else None
    skip = None
    if wanted is not None and first is not None and _integer_type(wanted.schema.field(first).type) and \
            _integer_type(dataset.schema.field(first).type):
        present = pc.drop_null(wanted.column(first))
        skip = ds.field(first).isin(present.cast(dataset.schema.field(first).type))
        if wanted.column(first).null_count:
            skip = skip | ds.field(first).is_null()
    compared = [] if wanted is None else [(name, wanted.column(name)) for name in wanted.column_names]
    kept = []
    for batch in dataset.to_batches(columns=types.names, filter=skip):
        columns = [batch.column(f.name).cast(f.type) for f in types]
        mask = None
        for name, values in compared:
            among = pc.is_in(columns[types.get_field_index(name)], value_set=pc.drop_null(values).combine_chunks(),
                             skip_nulls=True)
            if values.null_count:
                among = pc.or_kleene(among, pc.is_null(columns[types.get_field_index(name)]))
            mask = among if mask is None else pc.and_kleene(mask, among)
        batch = pa.RecordBatch.from_arrays(columns, schema=types)
        kept.append(batch if mask is None else batch.filter(pc.fill_null(mask, False)))
    return pa.Table.from_batches(kept, schema=types)


def frozen_rows(table: Any, columns: list[str]) -> list[object]:
    """Rows of ``columns`` as frozen Python tuples; both sides of a comparison come from Arrow of the
    same types, so equal values give equal tuples."""
    return [freeze(r) for r in zip(*(table.column(c).to_pylist() for c in columns), strict=True)]


def rows_by_key(table: Any, schema: pa.Schema, key_columns: Sequence[str], keys: Sequence[tuple[Any, ...]] | None,
                *, open_only: str | None = None, unless: str | None = None) -> dict[object, list[Any]] | None:
    """The rows of ``schema``'s columns whose key is one of ``keys`` (every row: None), by frozen key as
    given (every row: as read), with values as a Spark row holds them (``spark_like``); a column the
    table does not have yet reads NULL. ``open_only``: only rows where that column is NULL (a history's
    open versions); ``unless``: not the rows where that flag is true (soft-deleted). None when delta-rs
    does not read the table as Spark does, or a key does not convert to Arrow (Spark reads it then)."""
    import pyarrow
    import pyarrow.compute as pc

    from applier.sink.store.rsrows import reads_rows, spark_like

    if not reads_rows(table):
        return None
    if keys is not None and not keys:
        return {}
    names = list(schema.names)
    dataset = table.to_pyarrow_dataset()
    have = set(dataset.schema.names)
    extras = [c for c in dict.fromkeys((open_only, unless)) if c is not None and c in have and c not in names]
    types = pyarrow.schema([f for f in schema if f.name in have] +
                      [dataset.schema.field(c) for c in extras])
    wanted = None
    if keys is not None:
        wanted = arrow_table(list(keys), pyarrow.schema([schema.field(k) for k in key_columns]))
        if wanted is None:
            return None
    rows = matching(dataset, types, wanted)
    if open_only is not None and open_only in have:
        rows = rows.filter(pc.is_null(rows.column(open_only)))
    if unless is not None and unless in have:
        rows = rows.filter(pc.invert(pc.fill_null(rows.column(unless), False)))
    columns = [spark_like(rows.column(n)) if n in rows.column_names else [None] * rows.num_rows for n in names]
    values = [list(r) for r in zip(*columns, strict=True)] if columns else [[] for _ in range(rows.num_rows)]
    if wanted is None:
        positions = [names.index(k) for k in key_columns]
        return {freeze(tuple(v[p] for p in positions)): v for v in values}
    found = dict(zip(frozen_rows(rows, list(key_columns)), values, strict=True))
    out: dict[object, list[Any]] = {}
    for given, key in zip(keys or (), frozen_rows(wanted, list(key_columns)), strict=True):
        row = found.get(key)
        if row is not None:
            out[freeze(tuple(given))] = row
    return out


def _integer_type(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t))
