"""Execute a keyed :class:`TablePlan` through delta-rs instead of Spark, when that gives the same commit.

Why: a Spark MERGE costs seconds per commit on a small machine whatever its size (a job, the
JVM's first Delta log read, 300 k rows in about 5 s on 2 cores), while delta-rs merges the fold's
Arrow table in the Python process (500 k rows in about 0.5 s, bench/RESULTS.md). The commit is
the same Delta commit: the same rows, the applied version as the same ``txn`` action Spark's
idempotent writes record, the same ``userMetadata``; Spark, delta-rs and every other reader see
one table.

Which plans: keyed tables whose keys hold no NULL (unchanged-TOAST values the fold could not resolve
are read from the target row of their lookup key, in Arrow, from the version the MERGE replaces), and
key-less (multiset) tables whose columns compare in DataFusion as in PostgreSQL (no floating point,
no nested types): the same MERGE Spark makes (applier.sink.store.sparkmerge). Anything else, and a table
delta-rs cannot write (type widening, column mapping, a path holding ``%``), goes through Spark.
The caller decides per table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from applier.sink.plan import multiset_source, rows_after_truncate
from applier.sink.rowimage import target_missing
from applier.sink.store.arrow import OP_COL, arrow_table, with_op_column
from applier.sink.store.base import CommitResult
from applier.sink.store.readback import frozen_rows, matching
from applier.sink.store.rsrows import reads_rows

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.keyedcolumns import KeyedColumns
    from applier.sink.plan import TablePlan


class TableOpener(Protocol):
    """What these commits need of the delta-rs store: the table's newest version, opened."""

    def open(self, path: str) -> Any: ...


def quoted(name: str) -> str:
    """An identifier for delta-rs's SQL (DataFusion): double-quoted, quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def apply_plan_deltars(store: TableOpener, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str,
                       version: int, description: str, may_be_empty: bool = True) -> CommitResult | None:
    """The one commit ``plan`` describes, through delta-rs; None when delta-rs would not make the same
    commit (the caller then takes the Spark path): a NULL key, a key-less table whose values do not
    compare as in PostgreSQL, a value that does not convert to Arrow exactly, or a key-less table with
    columns the source no longer has (a keyed one takes them: ``open_for_commit``)."""
    if plan.multiset:
        return _apply_multiset(store, path, schema, plan, app_id=app_id, version=version, description=description)
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    names = list(schema.names)
    ncols = len(names)
    source, fills, upserts, deletes = merge_source(plan, schema)
    if source is None or any(source.column(p).null_count - _filled_nulls(fills, p) for p in plan.key_positions):
        return None

    table = open_for_commit(store, path, names, app_id, version, dropped_ok=True)
    if isinstance(table, CommitResult):
        return CommitResult(0, 0, plan.truncated)
    if table is None:
        return None
    if fills:
        if not reads_rows(table):  # the values to take are in files delta-rs does not read as Spark does
            return None
        source = _fill_from_target(table, source, schema, plan.key_positions, fills, description)
        if source is None:
            return None
    properties = commit_tags(app_id, version, description)
    if plan.truncated or (may_be_empty and not fills and not table.file_uris()):
        upserted = source.filter(pc.equal(source.column(ncols), "U")).drop_columns([OP_COL])
        upserted = _with_dropped_columns(table, upserted)
        write_deltalake(table, upserted, mode="overwrite" if plan.truncated else "append",
                        commit_properties=properties)
        return CommitResult(upserts, 0, plan.truncated, int(table.version()))

    keys = [names[p] for p in plan.key_positions]
    predicate = " AND ".join(f"t.{quoted(k)} = s.{quoted(k)}" for k in keys)
    first = source.column(plan.key_positions[0])
    if _integer_type(first.type) and len(first):
        # lets delta-rs skip the files whose key statistics lie outside the batch's keys (a catch-up's
        # changes touch recent keys: 0.4 s instead of 1.0-1.6 s for 1M rows into a 4M-row table)
        column = f"t.{quoted(keys[0])}"
        ranges = " OR ".join(f"({column} >= {lo} AND {column} <= {hi})" for lo, hi in key_ranges(first))
        predicate = f"({ranges}) AND {predicate}"
    assignments = {quoted(n): f"s.{quoted(n)}" for n in names}
    op = f"s.{quoted(OP_COL)}"
    (table.merge(source, predicate=predicate, source_alias="s", target_alias="t", commit_properties=properties)
     .when_matched_delete(predicate=f"{op} = 'D'")
     .when_matched_update(updates=assignments, predicate=f"{op} = 'U'")
     .when_not_matched_insert(updates=assignments, predicate=f"{op} = 'U'")
     .execute())
    return CommitResult(upserts, deletes, False, int(table.version()))


#: buckets the span of a batch's keys is cut into to find where they are (``key_ranges``)
KEY_BUCKETS = 64

#: the most key ranges a MERGE's condition names
KEY_RANGES = 8


def key_ranges(keys: Any, *, buckets: int = KEY_BUCKETS, most: int = KEY_RANGES) -> list[tuple[int, int]]:
    """Where a batch's integer keys lie, as up to ``most`` ranges (least and greatest key of each), so
    that delta-rs reads only the files whose statistics meet one of them. Why not one range: a batch of
    recent keys and one old one (a marker row, a late fix of an old order) would read every file
    between them, the whole table. The span is cut into ``buckets`` buckets; each run of buckets with
    keys is a range, the runs nearest each other joined until ``most`` are left. Pure, for the tests."""
    import numpy as np

    values = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    width = (high - low) // buckets + 1  # (a Python int: the span may pass int64's)
    bucket = values // width - low // width  # 0 to ``buckets``: each value's bucket without an overflow
    occupied = np.flatnonzero(np.bincount(bucket))
    if occupied[-1] - occupied[0] + 1 == len(occupied):
        return [(low, high)]
    breaks = np.flatnonzero(np.diff(occupied) > 1)  # a run ends after each
    gaps = occupied[breaks + 1] - occupied[breaks]
    kept = np.sort(breaks[np.argsort(-gaps, kind="stable")[:most - 1]])
    runs = zip([occupied[0], *occupied[kept + 1]], [*occupied[kept], occupied[-1]], strict=True)
    out: list[tuple[int, int]] = []
    for first, last in runs:
        inside = values[(bucket >= first) & (bucket <= last)]
        out.append((int(inside.min()), int(inside.max())))
    return out


_Fills = list[tuple[int, tuple[Any, ...] | None, frozenset[int]]]  # source row, lookup key, positions


def merge_source(plan: TablePlan, schema: pa.Schema) -> tuple[Any, _Fills, int, int]:
    """A keyed plan's MERGE source (``schema``'s columns and the operation), the placeholders of the
    values to take from the target, and the rows it upserts and deletes; the source is None when a value
    does not convert to Arrow. Columnar entries (applier.sink.keyedcolumns) are taken as they are."""
    fills: _Fills = []
    columnar = plan.columnar
    if columnar is not None:
        source = _columnar_source(columnar, schema)
        if source is not None:
            deletes = columnar.deletes()
            return source, fills, len(columnar) - deletes, deletes
    ncols = len(schema)
    rows: list[tuple[Any, ...]] = []
    upserts = deletes = 0
    for entry in plan.keyed.values():  # one pass: the checks cost nothing extra on a million keys
        if entry.row is None:
            deletes += 1
            row: list[Any] = [None] * ncols
            for p, v in zip(plan.key_positions, entry.lookup_key or (), strict=True):
                row[p] = v
            rows.append((*row, "D"))
        elif entry.unresolved:
            upserts += 1
            fills.append((len(rows), entry.lookup_key, entry.unresolved))
            rows.append((*(None if i in entry.unresolved else v for i, v in enumerate(entry.row)), "U"))
        else:
            upserts += 1
            rows.append((*entry.row, "U"))
    return arrow_table(rows, with_op_column(schema)), fills, upserts, deletes


def _columnar_source(columns: KeyedColumns, schema: pa.Schema) -> Any:
    """The MERGE source of columnar entries (applier.sink.keyedcolumns), as ``arrow_table`` makes it of
    Python ones; None when their types are not the table's exactly (the caller makes it of Python
    values, which says whether they convert)."""
    import pyarrow as pa

    rows = columns.rows
    if [f.type for f in rows.schema] != [f.type for f in schema] or rows.column_names != list(schema.names):
        return None
    op = pa.array(["U", "D"]).take(pa.array((~columns.writes).astype("int8")))
    return pa.Table.from_arrays([*rows.columns, op], schema=with_op_column(schema))


def _filled_nulls(fills: _Fills, position: int) -> int:
    """How many of a key column's NULLs are placeholders the target fills (a soft-deleted row keeps its
    key, so this is 0 unless the key itself is read from the target)."""
    return sum(1 for _, _, unresolved in fills if position in unresolved)


def open_for_commit(store: TableOpener, path: str, names: list[str], app_id: str, version: int, *,
                    dropped_ok: bool = False) -> Any:
    """The table to commit to; a ``CommitResult`` when ``version`` is applied already (what Spark's
    idempotent write does: nothing), None when its columns are not the plan's (Spark takes it).

    ``dropped_ok``: the table may also hold nullable columns the plan does not, the columns dropped at
    the source (applier.sink.schema keeps them). A keyed MERGE that assigns only the plan's columns
    then does what Spark's does: an updated row keeps its value there, a new row gets NULL."""
    table = store.open(path)
    done = table.transaction_version(app_id)
    if done is not None and int(done) >= version:
        return CommitResult(0, 0, False)
    fields = table.schema().fields
    have = [f.name for f in fields]
    if have == names:
        return table
    if not dropped_ok or not set(names) <= set(have) or any(not f.nullable for f in fields if f.name not in names):
        return None
    return table


def _with_dropped_columns(table: Any, rows: Any) -> Any:
    """``rows`` (the plan's columns) as rows of ``table``, NULL in the columns the source dropped: an
    append or overwrite must carry every column of the table (Spark's fills them the same way)."""
    import pyarrow as pa

    schema = pa.schema(table.schema().to_arrow())
    if schema.names == rows.column_names:
        return rows
    return pa.table([rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                     for f in schema], names=schema.names)


def commit_tags(app_id: str, version: int, description: str) -> Any:
    """The commit's applied version as the ``txn`` action Spark's idempotent writes record, and its
    ``userMetadata``."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app_id, version)],
                            custom_metadata={"userMetadata": description})


def _fill_from_target(table: Any, source: Any, schema: pa.Schema, key_positions: tuple[int, ...],
                      fills: _Fills, description: str) -> Any:
    """``source`` with the unchanged-TOAST placeholders replaced by the target row's values (the row of
    their lookup key): the last step of applier.sink.rowimage's walk, as Spark's MERGE does it. None
    when a lookup key does not convert to Arrow (Spark takes the plan)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = list(schema.names)
    key_names = [names[p] for p in key_positions]
    known = [(row, key, unresolved) for row, key, unresolved in fills if key is not None]
    wanted = arrow_table([key for _, key, _ in known], pa.schema([schema.field(p) for p in key_positions]))
    if wanted is None:
        return None
    candidates = matching(table.to_pyarrow_dataset(), source.schema.remove(len(names)), wanted)
    where = {key: n for n, key in enumerate(frozen_rows(candidates, key_names))}
    found = [where.get(key) for key in frozen_rows(wanted, key_names)]
    missing = len(fills) - len(known) + sum(1 for n in found if n is None)
    if missing:
        raise target_missing(missing, table=description, key_columns=key_names)
    for i in sorted(set().union(*(unresolved for _, _, unresolved in fills))):
        take: list[int | None] = [None] * source.num_rows
        for (row, _, unresolved), n in zip(known, found, strict=True):
            if i in unresolved:
                take[row] = n
        indices = pa.array(take, type=pa.int64())
        field = source.schema.field(i)
        values = candidates.column(i).take(indices).cast(field.type)
        source = source.set_column(i, field, pc.if_else(pc.is_valid(indices), values, source.column(i)))
    return source


def _comparable(schema: pa.Schema) -> bool:
    """Whether DataFusion's equality of these columns is PostgreSQL's: not for floating point (NaN and
    -0.0) nor for nested values, whose comparison the multiset MERGE would rely on."""
    import pyarrow

    return not any(pyarrow.types.is_floating(f.type) or pyarrow.types.is_nested(f.type) for f in schema)


def _apply_multiset(store: TableOpener, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str,
                    version: int, description: str) -> CommitResult | None:
    """A key-less table's commit, as Spark makes it (applier.sink.store.sparkmerge): a truncated plan overwrites
    the table with its rows; otherwise one MERGE deletes every copy of each touched row image and
    inserts the new number of copies (the target's count plus the plan's signed count)."""
    from deltalake import write_deltalake

    names = list(schema.names)
    touched = [(img, delta) for img, delta in plan.counts.items() if delta != 0]
    if not names or not _comparable(schema):
        return None
    if plan.truncated:
        after = arrow_table(rows_after_truncate(plan, description), schema)
        table = open_for_commit(store, path, names, app_id, version) if after is not None else None
        if table is None:
            return None
        if isinstance(table, CommitResult):
            return CommitResult(0, 0, True)
        write_deltalake(table, after, mode="overwrite", commit_properties=commit_tags(app_id, version, description))
        return CommitResult(after.num_rows, 0, True, int(table.version()))
    if not touched:  # every change cancelled out: no commit, as Spark
        return CommitResult(0, 0, False)

    images = arrow_table([plan.images[img] for img, _ in touched], schema)
    if images is None:
        return None
    table = open_for_commit(store, path, names, app_id, version)
    if isinstance(table, CommitResult) or table is None:
        return table
    if not reads_rows(table):  # the copies to count are in files delta-rs does not read as Spark does
        return None
    # the copies the target holds of each touched image, counted in Arrow (a key-less table may hold
    # millions of rows like them): only the distinct rows come to Python
    copies = matching(table.to_pyarrow_dataset(), images.schema, images).group_by(names, use_threads=False).aggregate(
        [([], "count_all")])
    have = dict(zip(frozen_rows(copies, names), copies.column("count_all").to_pylist(), strict=True))
    held = [have.get(image, 0) for image in frozen_rows(images, names)]
    rows, inserted, deleted = multiset_source(plan, touched, held, description)
    source = arrow_table(rows, with_op_column(schema))
    if source is None:
        return None
    op = f"s.{quoted(OP_COL)}"
    predicate = " AND ".join([*(f"(t.{quoted(n)} IS NOT DISTINCT FROM s.{quoted(n)})" for n in names), f"({op} = 'D')"])
    (table.merge(source, predicate=predicate, source_alias="s", target_alias="t",
                 commit_properties=commit_tags(app_id, version, description))
     .when_matched_delete()
     .when_not_matched_insert(updates={quoted(n): f"s.{quoted(n)}" for n in names}, predicate=f"{op} = 'I'")
     .execute())
    return CommitResult(inserted, deleted, False, int(table.version()))


def _integer_type(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t))
