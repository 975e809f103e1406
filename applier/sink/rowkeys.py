"""Keys of row changes, for the walks that follow a table's rows through a group (history, change feed).

Why shared: both must read, before the walk, the rows of exactly the keys whose state before the
group matters (an update or delete of a key the group did not insert first, up to its first TRUNCATE,
after which nothing from before is alive), and both name a change's old key the same way pgoutput
gives it: the KEY image, else the FULL old row, else the new row's key (an update that kept its key).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from applier.changes import OP_INSERT, OP_TRUNCATE, TableChange
from applier.sink.plan import freeze


def key_of(row: tuple[Any, ...] | list[Any], positions: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(row[i] for i in positions)


def old_key_of(change: TableChange, positions: tuple[int, ...]) -> tuple[Any, ...] | None:
    if change.old_key is not None:
        return tuple(change.old_key)
    if change.old_row is not None:
        return key_of(change.old_row, positions)
    return key_of(change.new_row, positions) if change.new_row is not None else None


def key_only_row(key: tuple[Any, ...], positions: tuple[int, ...], ncols: int) -> list[Any]:
    """A row that holds nothing but its key (what is known of a row the target never had)."""
    row: list[Any] = [None] * ncols
    for p, v in zip(positions, key, strict=True):
        row[p] = v
    return row


def keys_continued(changes: Iterable[TableChange], positions: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Keys whose row from before the group an update or delete (or an insert with unchanged TOAST
    values) continues: those changed before the group's first TRUNCATE and not inserted by it first."""
    seen: set[object] = set()
    out: list[tuple[Any, ...]] = []
    for change in changes:
        if change.op == OP_TRUNCATE:
            break
        if change.op != OP_INSERT or change.new_partial:  # an insert with 'u' continues the row too
            old = old_key_of(change, positions)
            if old is not None and freeze(old) not in seen:
                seen.add(freeze(old))
                out.append(old)
        if change.new_row is not None:
            seen.add(freeze(key_of(change.new_row, positions)))
    return out
