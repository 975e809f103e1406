"""A history table's commit (applier.sink.history) through delta-rs: the same MERGE Spark makes.

Versions the target holds and the group changes or closes are matched on key and start LSN and
updated, new versions are inserted, and after a TRUNCATE every other open version is closed (WHEN NOT
MATCHED BY SOURCE). The applied version is recorded as the same ``txn`` action, so a re-run writes
nothing whichever engine made the commit. Declined (None: Spark makes it) for floating-point keys (NaN
and -0.0 compare differently in DataFusion) and values Arrow cannot hold.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from applier.sink.store.arrow import OP_COL, arrow_table, with_op_column
from applier.sink.store.base import CommitResult
from applier.sink.store.rsmerge import TableOpener, commit_tags, open_for_commit, quoted

if TYPE_CHECKING:
    from applier.sink.history import HistoryPlan
    from applier.sink.spec import TableSpec


def apply_history_deltars(store: TableOpener, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str,
                          version: int, description: str) -> int | None:
    """Write ``plan`` in one idempotent commit; the versions it wrote or changed (0: applied already),
    None when delta-rs would not make the same commit."""
    from applier.sink.history import END_AT, END_LSN, START_LSN

    if spec.floating_point_key:
        return None
    names = list(spec.column_names)
    rows = [(*r, "U") for r in plan.updates] + [(*r, "I") for r in plan.inserts]
    source = arrow_table(rows, with_op_column(spec.schema))
    if source is None:
        return None
    closing = {}
    if plan.truncate is not None:
        lsn, at = plan.truncate
        ended = _instant(at, source.schema.field(END_AT).type)
        if ended is None:
            return None
        closing = {quoted(END_LSN): str(int(lsn)), quoted(END_AT): ended}
    # the columns the source dropped stay (NULL in new versions), as with Spark's MERGE of the same values
    table = open_for_commit(store, path, names, app_id, version, dropped_ok=True)
    if table is None:
        return None
    if isinstance(table, CommitResult):
        return 0
    kind = f"s.{quoted(OP_COL)}"
    predicate = " AND ".join([f"({kind} = 'U')", f"(t.{quoted(END_LSN)} IS NULL)",
                              f"(t.{quoted(START_LSN)} = s.{quoted(START_LSN)})",
                              *(f"(t.{quoted(k)} IS NOT DISTINCT FROM s.{quoted(k)})" for k in spec.key_columns)])
    values = {quoted(n): f"s.{quoted(n)}" for n in names}
    merge = (table.merge(source, predicate=predicate, source_alias="s", target_alias="t",
                         commit_properties=commit_tags(app_id, version, description))
             .when_matched_update(updates=values)
             .when_not_matched_insert(updates=values, predicate=f"{kind} = 'I'"))
    if closing:
        merge = merge.when_not_matched_by_source_update(updates=closing, predicate=f"t.{quoted(END_LSN)} IS NULL")
    merge.execute()
    return len(rows)


def _instant(at: datetime | None, arrow_type: Any) -> str | None:
    """``at`` as a DataFusion literal of the column's Arrow type (SQL has no literal of a zoned instant);
    None for a type this does not write."""
    import pyarrow as pa

    if at is None:
        return "NULL"
    if not pa.types.is_timestamp(arrow_type) or arrow_type.unit != "us":
        return None
    zone = f'Some("{arrow_type.tz}")' if arrow_type.tz else "None"
    value = (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(UTC)
    text = value.replace(tzinfo=None).isoformat(timespec="microseconds") + ("Z" if arrow_type.tz else "")
    return f"arrow_cast('{text}', 'Timestamp(Microsecond, {zone})')"
