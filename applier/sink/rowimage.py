"""Where a column 'u' (unchanged TOAST) takes its value: the one walk the fold, its combination, the
history and the change feed share.

pgoutput sends 'u' in the NEW image of an update for a toasted value that did not change; the old
image ('K' or 'O') is always sent in full. PostgreSQL's apply worker keeps the local column
(worker.c, slot_modify_data). A mirror that applies a batch of changes in one commit has no local
row between them, so it takes the value, in this order:

1. from the old FULL image ('O', REPLICA IDENTITY FULL), which holds every value;
2. else from an earlier image of the same row in the batch (the row of the OLD key when the key
   changed), inheriting what that image itself still reads from the target;
3. else from the target table's row of the old key, read before the commit; unless the row is known
   to be gone (deleted earlier in the batch, or removed by a TRUNCATE in it): then the change is
   refused, as is a 'u' in a key column (the key must be sent in full).

Where the walks differ, on purpose, the caller says so: a key-less table's rows are matched on every
value, so only step 1 applies there (its refusal is the caller's ``no_earlier``); the history and the
change feed read the target's rows before they walk, so for them an image of step 2 is always
complete, and "no image" is refused with their own reason; a combination of folds (applier.sink.
combine) only has step 2 left, for the positions the later fold could not resolve.

The functions here are pure and work on positions, so a caller that only knows "these columns still
read from before me" (a combination of folds) walks the same steps as one that scans an image for
the marker. The target itself is read by the caller (applier.sink.store.sparkmerge), which says, with
:func:`target_missing`, what it means when the row is not there.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from applier.errors import DivergenceError, SinkError

__all__ = [
    "NO_POSITIONS", "KEY_CHANGE", "TOAST", "check_key", "check_old_image", "refusal", "resolve",
    "take_from_earlier", "take_from_old", "target_missing", "unchanged_positions",
]

NO_POSITIONS: frozenset[int] = frozenset()

#: What a row image reads from before the batch (``TablePlan.external``): unchanged TOAST values, or
#: with soft deletes the other columns of a row a key change removes.
TOAST = "toast"
KEY_CHANGE = "key change"

_DELETED = "an unchanged TOAST value refers to a row deleted earlier in the same batch"
_TRUNCATED = "an unchanged TOAST value refers to a row removed by a TRUNCATE in the same batch"
_KEY_CHANGE_GONE = "a key change refers to a row that is gone earlier in the same batch"


def unchanged_positions(row: Sequence[object], marker: object) -> list[int]:
    """Positions of ``row`` that hold the marker (compared by identity)."""
    return [i for i, v in enumerate(row) if v is marker]


def check_key(key: Sequence[object], marker: object, op: str) -> None:
    """Refuse a new image whose key holds the marker."""
    if marker in key:  # ``in`` compares by identity first; no value of a row equals the marker
        raise SinkError("a key column arrived as unchanged TOAST; the key must be sent in full", op=op)


def check_old_image(old: Sequence[object], marker: object, op: str) -> None:
    """Refuse an old image that holds the marker (Postgres sends old images in full)."""
    if marker in old:
        raise SinkError("old row image holds unchanged TOAST markers", op=op)


def refusal(reading: str, *, deleted: bool, truncated: bool) -> str | None:
    """Why a row image that reads from before it (``reading``: :data:`TOAST` or :data:`KEY_CHANGE`)
    cannot, when the batch has no earlier image of that row: it was deleted earlier in the batch
    (``deleted``), or a TRUNCATE removed it (``truncated``). None: the target's row is read."""
    if not (deleted or truncated):
        return None
    if reading == KEY_CHANGE:
        return _KEY_CHANGE_GONE
    return _DELETED if deleted else _TRUNCATED


def take_from_old(row: list[object], positions: Sequence[int], old: Sequence[object], marker: object,
                  op: str) -> None:
    """Step 1: ``row``'s ``positions`` from the old FULL image (which must hold their values)."""
    for i in positions:
        v = old[i]
        if v is marker:
            raise SinkError("old row image holds unchanged TOAST markers", op=op)
        row[i] = v


def take_from_earlier(row: list[object], positions: Collection[int], earlier: Sequence[object],
                      earlier_unresolved: Collection[int] = NO_POSITIONS) -> frozenset[int]:
    """Step 2: ``row``'s ``positions`` from an earlier image of the row; returns those the earlier
    image itself still reads from the target (they stay unresolved, read from its lookup key)."""
    if not earlier_unresolved:
        for i in positions:
            row[i] = earlier[i]
        return NO_POSITIONS
    inherited = []
    for i in positions:
        if i in earlier_unresolved:
            inherited.append(i)
        else:
            row[i] = earlier[i]
    return frozenset(inherited) if inherited else NO_POSITIONS


def resolve(new: Sequence[object], marker: object, op: str, old: Sequence[object] | None,
            earlier: Sequence[object] | None, earlier_unresolved: Collection[int] = NO_POSITIONS,
            no_earlier: str | None = None) -> tuple[list[object], frozenset[int]]:
    """``new`` with its unchanged values taken from ``old`` (the old FULL image), else from ``earlier``
    (an earlier image of the row, whose ``earlier_unresolved`` positions are inherited); returns the
    row and the positions still to read from the target. With neither image, ``no_earlier`` is the
    reason none can be read (:func:`refusal`, or the caller's own): then the change is refused.

    The unchanged positions of the returned row still hold the marker."""
    row = list(new)
    positions = unchanged_positions(row, marker)
    if not positions:
        return row, NO_POSITIONS
    if old is not None:
        take_from_old(row, positions, old, marker, op)
        return row, NO_POSITIONS
    if earlier is not None:
        return row, take_from_earlier(row, positions, earlier, earlier_unresolved)
    if no_earlier is not None:
        raise SinkError(no_earlier, op=op)
    return row, frozenset(positions)


def target_missing(rows: int, *, table: str, key_columns: Sequence[str]) -> DivergenceError:
    """Step 3 failed: ``rows`` rows read values from a target row that is not there."""
    name = table.split(" end_lsn=", 1)[0]
    return DivergenceError(
        f"{rows} row(s) carry unchanged TOAST values but the target has no row to take them from: the Delta "
        "table is missing rows Postgres has (it has diverged; or an UPDATE moved a row into a publication's row "
        "filter, which PostgreSQL sends as an INSERT without its unchanged TOAST values unless the table has "
        "REPLICA IDENTITY FULL), and running the mirror again meets the same table. A fresh copy of it mends it: "
        f"`applier resync --config FILE --table {name}`, then run the mirror again (apply.schema_changes: resync, "
        "the default, does this by itself)",
        table=name, key_columns=", ".join(key_columns))
