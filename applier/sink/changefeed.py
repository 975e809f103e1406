"""Change feed tables: one row per change, with the full row image, op, commit LSN and ordinal.

Why: a downstream pipeline (Spark Declarative Pipelines' ``create_auto_cdc_flow(keys=...,
sequence_by=struct(__commit_lsn, __ordinal), apply_as_deletes="__op = 'D'")``, or any streaming job)
wants the changes themselves, each with every column. pgoutput does not send every column: an
unchanged TOAST value arrives as 'u'. So the feed resolves them like the mirror table does: from the
old FULL image, an earlier image in the group, or the mirror table's row (applier.sink.rowimage).
Deletes carry the deleted row's last values, a key change is a delete of the old key and an update of the new one, and a
TRUNCATE is a delete of every row the table held (a feed consumer has no other way to see it).

Consistency: the feed reads the mirror table's rows, so it must never be behind it. The feed's commit
of a group goes in before the mirror table's, and the walk starts at the mirror table's applied
version (older or equal), emitting only the transactions after the feed's own: after a crash between
the two commits the state it reads is still exact. Each commit is an idempotent append (its own Delta
app id), so a re-run adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.errors import SinkError
from applier.sink.plan import freeze
from applier.sink.rowimage import TOAST, check_key, refusal, resolve
from applier.sink.rowkeys import key_of, key_only_row, old_key_of
from applier.sink.spec import app_id_for, with_added_columns

if TYPE_CHECKING:
    from applier.sink.spec import TableSpec

OP, COMMIT_LSN, ORDINAL, COMMIT_TIME = "__op", "__commit_lsn", "__ordinal", "__commit_time"
FEED_COLUMNS = (OP, COMMIT_LSN, ORDINAL, COMMIT_TIME)
_NO_ROW = "an unchanged TOAST value has no row to come from (the mirror table is missing a row Postgres has)"

#: One change with its transaction's commit LSN and time, and whether the feed still needs it.
FeedEvent = tuple[int, datetime | None, TableChange, bool]


def feed_app_id(source_name: str) -> str:
    return app_id_for(f"changes:{source_name}")


def feed_spec(table: TableSpec) -> TableSpec:
    """The feed table of ``table`` (its own columns): those columns, then op, commit LSN, ordinal, time."""
    import pyarrow as pa

    return with_added_columns(table, [pa.field(OP, pa.string()), pa.field(COMMIT_LSN, pa.int64()),
                                      pa.field(ORDINAL, pa.int32()), pa.field(COMMIT_TIME, pa.timestamp("us", "UTC"))],
                              "change feed")


#: the mirror table's rows whose key is one of the keys given (every row: None), by frozen key
#: (applier.sink.derived reads them through the table's store)
ReadMirror = Callable[[list[tuple[Any, ...]] | None], dict[object, list[Any]]]


@dataclass(slots=True)
class MirrorRows:
    """The mirror table's rows as they were before the walk's first transaction: read by key on
    demand (one read for the keys the group continues), or all of them for a TRUNCATE."""

    read: ReadMirror
    rows: dict[object, list[Any]] | None = None
    everything: bool = False

    def load(self, keys: list[tuple[Any, ...]]) -> None:
        self.rows = self.read(keys) if keys else {}

    def get(self, frozen: object) -> list[Any] | None:
        return (self.rows or {}).get(frozen)

    def all_keys(self) -> dict[object, list[Any]]:
        if not self.everything:
            self.rows = self.read(None)
            self.everything = True
        return dict(self.rows or {})


def feed_rows(events: list[FeedEvent], key_positions: tuple[int, ...], ncols: int, mirror: MirrorRows,
              marker: object) -> list[tuple[Any, ...]]:
    """The feed's rows for the events flagged for it, walking every event for the state."""
    state: dict[object, list[Any] | None] = {}
    gone = False  # after a TRUNCATE nothing of the mirror table is alive
    out: list[tuple[Any, ...]] = []

    def current(frozen: object) -> list[Any] | None:
        if frozen in state:
            return state[frozen]
        return None if gone else mirror.get(frozen)

    for lsn, at, change, emit in events:
        op, ordinal = change.op, change.ordinal
        if op == OP_TRUNCATE:
            alive: dict[object, list[Any] | None] = {} if gone else dict(mirror.all_keys())
            alive.update(state)
            if emit:
                out.extend((*row, OP_DELETE, lsn, ordinal, at) for row in alive.values() if row is not None)
            state, gone = {}, True
            continue
        if op == OP_DELETE:
            old = old_key_of(change, key_positions)  # a delete has no new row to fall back on
            if old is None:
                raise SinkError("delete without an old key", op=op)
            frozen = freeze(old)
            row = list(change.old_row) if change.old_row is not None else current(frozen)
            if row is None:  # a row the mirror never had: the key is all the feed can say
                row = key_only_row(old, key_positions, ncols)
            if emit:
                out.append((*row, OP_DELETE, lsn, ordinal, at))
            state[frozen] = None
            continue
        new = change.new_row
        if new is None:
            raise SinkError("insert/update without a new row", op=op)
        new_key = key_of(new, key_positions)
        check_key(new_key, marker, op)  # else the marker would be the row's key
        old_key = old_key_of(change, key_positions)  # the new row's key when the update kept it
        assert old_key is not None
        old_frozen, new_frozen = freeze(old_key), freeze(new_key)
        # An insert can carry 'u' too (a row filter turned the update into one): like the fold, it
        # keeps the row's value from before, when there is a row.
        before = list(change.old_row) if change.old_row is not None else current(old_frozen)
        if change.new_partial:
            gone_here = refusal(TOAST, deleted=old_frozen in state and state[old_frozen] is None,
                                truncated=gone and old_frozen not in state)
            row, _ = resolve(new, marker, op, change.old_row, before, no_earlier=gone_here or _NO_ROW)
        else:
            row = list(new)
        if old_frozen != new_frozen:
            if emit:
                out.append((*(before if before is not None else key_only_row(old_key, key_positions, ncols)),
                            OP_DELETE, lsn, ordinal, at))
            state[old_frozen] = None
        if emit:
            out.append((*row, OP_INSERT if op == OP_INSERT else OP_UPDATE, lsn, ordinal, at))
        state[new_frozen] = row
    return out
