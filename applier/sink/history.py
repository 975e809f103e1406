"""SCD type 2 history tables: one row per version of each key, with the commits that opened and closed it.

Why a plan of its own: the mirror table (SCD1) keeps the last image per key, which loses exactly what
a history needs, the images in between and when each ended. So the history walks a group's changes in
commit order and keeps, per key, the open version: an insert opens one; an update closes it and opens
the next (or, when none of the tracked columns changed, updates it in place); a key change closes the
old key's and opens the new key's; a delete closes it; a TRUNCATE closes every open version. A version
opened and closed by the same transaction never was one at a commit boundary and is dropped. Unchanged
TOAST values come from the version they continue, which holds every value (the target's open version is
read for the keys the group continues, before the walk; applier.sink.rowimage).

The commit is one idempotent MERGE: versions the target holds and the group changes or closes are
matched on key and start LSN, new versions are inserted, and after a TRUNCATE every other open version
is closed (WHEN NOT MATCHED BY SOURCE). The history table records its own applied version (its own Delta
app id), so a re-run writes nothing and a crash between the mirror table's commit and the history's
leaves the history to catch up from the log like any table behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from applier.changes import OP_DELETE, OP_TRUNCATE, TableChange
from applier.errors import SinkError
from applier.sink.plan import freeze
from applier.sink.rowimage import TOAST, check_key, refusal, resolve
from applier.sink.rowkeys import key_of, old_key_of
from applier.sink.spec import app_id_for, with_added_columns

if TYPE_CHECKING:
    from applier.sink.spec import TableSpec

START_LSN, END_LSN, START_AT, END_AT = "__start_lsn", "__end_lsn", "__start_at", "__end_at"
HISTORY_COLUMNS = (START_LSN, END_LSN, START_AT, END_AT)
KIND = "__applier_kind"  # a history commit's source rows: "U" (a version changed) or "I" (new)
_NO_VERSION = ("an unchanged TOAST value has no version to come from (was the history table created after the "
               "table's first copy?)")

#: One change of the group with its transaction's commit LSN and time.
Event = tuple[int, datetime | None, TableChange]


def history_app_id(source_name: str) -> str:
    return app_id_for(f"history:{source_name}")


def history_spec(table: TableSpec) -> TableSpec:
    """The history table of ``table``: its columns, then the four version columns."""
    import pyarrow as pa

    instant = pa.timestamp("us", "UTC")
    return with_added_columns(table, [pa.field(START_LSN, pa.int64()), pa.field(END_LSN, pa.int64()),
                                      pa.field(START_AT, instant), pa.field(END_AT, instant)], "history")


@dataclass(slots=True)
class _Version:
    start_lsn: int
    start_at: datetime | None
    row: list[Any]
    in_target: bool  # the target holds it (opened by an earlier commit)
    changed: bool = False  # in place: its values changed since it was read from the target


@dataclass(slots=True)
class HistoryPlan:
    """What one history commit does."""

    updates: list[tuple[Any, ...]] = field(default_factory=list)  # target versions, new values and end
    inserts: list[tuple[Any, ...]] = field(default_factory=list)  # versions opened by the group
    truncate: tuple[int, datetime | None] | None = None  # every other open version ends here

    @property
    def empty(self) -> bool:
        return not (self.updates or self.inserts or self.truncate)


def plan_history(events: Iterable[Event], key_positions: tuple[int, ...], tracked: tuple[int, ...],
                 target_versions: dict[object, tuple[int, datetime | None, list[Any]]],
                 marker: object) -> HistoryPlan:
    """Walk the group's changes (one table, commit order) into a :class:`HistoryPlan`;
    ``target_versions`` are the target's open versions of :func:`keys_continued`, by frozen key.

    Versions are what each key holds at commit boundaries: a transaction's changes to a key are
    gathered first, and only its result is compared with the open version (so a transaction that
    deletes and re-inserts a row unchanged, or changes a column and back, makes no version)."""
    plan = HistoryPlan()
    current: dict[object, _Version | None] = {}  # None: closed in this group, nothing open
    target_gone = False  # after a TRUNCATE the target's open versions are all closed
    txn: tuple[int, datetime | None] | None = None
    after: dict[object, list[Any] | None] = {}  # this transaction's rows so far (None: gone)

    def lookup(frozen: object) -> _Version | None:
        if frozen in current:
            return current[frozen]
        found = None if target_gone else target_versions.get(frozen)
        version = None if found is None else _Version(found[0], found[1], list(found[2]), True)
        current[frozen] = version
        return version

    def close(frozen: object, lsn: int, at: datetime | None) -> None:
        version = lookup(frozen)
        if version is None:
            return
        if version.in_target:
            plan.updates.append((*version.row, version.start_lsn, lsn, version.start_at, at))
        elif version.start_lsn != lsn:
            plan.inserts.append((*version.row, version.start_lsn, lsn, version.start_at, at))
        current[frozen] = None

    def end_transaction() -> None:
        assert txn is not None
        lsn, at = txn
        for frozen, row in after.items():
            version = lookup(frozen)
            if row is None:
                close(frozen, lsn, at)
            elif version is not None and all(freeze(row[i]) == freeze(version.row[i]) for i in tracked):
                if freeze(row) != freeze(version.row):  # only untracked columns changed: in place
                    version.row, version.changed = row, True
            else:
                close(frozen, lsn, at)
                current[frozen] = _Version(lsn, at, row, False)
        after.clear()

    for lsn, at, change in events:
        if txn is None or txn[0] != lsn:
            if txn is not None:
                end_transaction()
            txn = (lsn, at)
        op = change.op
        if op == OP_TRUNCATE:
            after.clear()  # what the transaction did before is gone too
            for frozen in list(current):
                close(frozen, lsn, at)
            current.clear()  # closed by the TRUNCATE, not by a delete (lookup finds nothing either way)
            target_gone = True
            plan.truncate = plan.truncate or (lsn, at)
            continue
        if op == OP_DELETE:
            old = old_key_of(change, key_positions)  # a delete has no new row to fall back on
            if old is None:
                raise SinkError("delete without an old key", op=op)
            after[freeze(old)] = None
            continue
        new = change.new_row
        if new is None:
            raise SinkError("insert/update without a new row", op=op)
        new_key = key_of(new, key_positions)
        check_key(new_key, marker, op)  # else the marker would be the row's key
        old_key = old_key_of(change, key_positions)  # the new row's key when the update kept it
        assert old_key is not None
        old_frozen, new_frozen = freeze(old_key), freeze(new_key)
        if change.new_partial:  # the version it continues holds every value (the target's was read)
            previous: list[Any] | None = None
            if old_frozen in after:
                previous = after[old_frozen]
                deleted, truncated = previous is None, False
            else:
                deleted = old_frozen in current and current[old_frozen] is None
                truncated = target_gone and old_frozen not in current
                version = lookup(old_frozen)
                previous = version.row if version is not None else None
            row, _ = resolve(new, marker, op, change.old_row, previous,
                             no_earlier=refusal(TOAST, deleted=deleted, truncated=truncated) or _NO_VERSION)
        else:
            row = list(new)
        if old_frozen != new_frozen:
            after[old_frozen] = None
        after[new_frozen] = row
    if txn is not None:
        end_transaction()
    for version in current.values():
        if version is None:
            continue
        if not version.in_target:
            plan.inserts.append((*version.row, version.start_lsn, None, version.start_at, None))
        elif version.changed:
            plan.updates.append((*version.row, version.start_lsn, None, version.start_at, None))
    return plan


#: the rows of a table's columns (an Arrow schema) whose key is one of ``keys``, by frozen key, with
#: ``open_only`` naming a column that must be NULL (applier.sink.store: ``rows_by_key`` of a store)
RowsOf = Callable[..., dict[object, list[Any]]]


def read_open_versions(read: RowsOf, spec: TableSpec,
                       keys: list[tuple[Any, ...]]) -> dict[object, tuple[int, datetime | None, list[Any]]]:
    """The target's open versions of ``keys`` (start LSN, start time, the table's own values), read by
    ``read`` (the history table's store)."""
    import pyarrow as pa

    if not keys:
        return {}
    own = len(spec.source_column_names)
    schema = pa.schema([*spec.source_schema, spec.schema.field(START_LSN), spec.schema.field(START_AT)])
    rows = read(schema, keys, open_only=END_LSN)
    return {key: (int(v[own]), v[own + 1], v[:own]) for key, v in rows.items()}
