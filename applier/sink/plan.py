"""Fold an ordered run of row changes for ONE table into what a single Delta commit must do.

Why fold: Delta's MERGE fails when several source rows match one target row, and a MERGE per change
would cost a Spark job each. The fold keeps the last image per key in commit order, which is exact
because changes to different keys commute and changes to one key are applied in order here:

- keyed tables (a replica identity key): per key the final state is "deleted" or a full row; a row
  may still hold columns whose value is "whatever the target has" (unchanged TOAST, 'u') — those
  carry the key of the target row to read them from (the OLD key when the key changed, as
  PostgreSQL's apply worker keeps the local column; the walk is applier.sink.rowimage's);
- key-less tables (REPLICA IDENTITY FULL without a primary key, or no identity: inserts only) are
  multisets: each message affects exactly one row equal to the image, duplicates included, so the
  fold is a signed count per distinct row image;
- a TRUNCATE is a barrier: everything before it is gone, and the commit becomes an overwrite of the
  table with the rows that follow it.

The same fold serves one transaction or many grouped transactions: the result is the same as applying
them one by one, which the tests check against PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.errors import DivergenceError, SinkError
from applier.sink.rowimage import KEY_CHANGE, NO_POSITIONS, TOAST, check_key, check_old_image, refusal, resolve

if TYPE_CHECKING:
    from applier.sink.keyedcolumns import KeyedColumns


@dataclass(slots=True)
class KeyedRow:
    """Final state of one key: ``row`` None means deleted (then ``lookup_key`` is the key itself).

    ``unresolved`` are column positions whose value must come from the target row with key
    ``lookup_key`` (read before the commit).
    """

    row: tuple[object, ...] | None
    unresolved: frozenset[int] = frozenset()
    lookup_key: tuple[object, ...] | None = None


@dataclass(frozen=True, slots=True)
class SoftDelete:
    """Where a soft-deleting table's rows hold applier's added columns (applier.sink.extras): a row a
    delete or a key change removes is kept, with the flag at ``deleted`` set, ``op`` (when present)
    'D', and the ``copied`` positions (commit LSN and time) taken from the change that removed it."""

    source_columns: int  # positions below this are the table's own columns
    deleted: int
    op: int | None
    copied: tuple[int, ...]


@dataclass(slots=True)
class TablePlan:
    """What one Delta commit must do to one table."""

    columns: tuple[str, ...]
    key_positions: tuple[int, ...]  # empty: multiset table
    truncated: bool = False  # overwrite: the table holds exactly the keyed rows / positive counts below
    restart_identity: bool = False
    cascade: bool = False  # a TRUNCATE CASCADE reached this table (recorded; the cascade itself is in the log)
    _keyed: dict[object, KeyedRow] = field(default_factory=dict)  # by frozen key (see freeze): ``keyed``
    counts: Counter[object] = field(default_factory=Counter)  # by frozen row image
    images: dict[object, tuple[object, ...]] = field(default_factory=dict)  # frozen image -> row
    changes: int = 0
    soft_delete: SoftDelete | None = None
    #: Keys this fold read from "before it" (the target, or an earlier plan it is combined after):
    #: an unchanged TOAST value or a soft-deleted row's other columns. applier.sink.combine checks
    #: them against the earlier plan, which is how a fold of a later range refuses what the fold of
    #: the whole range would have refused.
    external: list[tuple[object, str]] = field(default_factory=list)
    #: The keyed entries as Arrow columns (applier.sink.keyedcolumns), when a columnar fold made them
    #: and nothing asked for them as Python values yet: ``keyed`` then makes them (once), and delta-rs
    #: merges these columns as they are. None, or the entries are ``keyed``'s alone.
    columnar: KeyedColumns | None = None

    @property
    def keyed(self) -> dict[object, KeyedRow]:
        """Every key's final state, by frozen key (see freeze), in the order the fold first met them."""
        if self.columnar is not None:
            self._keyed, self.columnar = _entries(self.columnar), None
        return self._keyed

    @keyed.setter
    def keyed(self, entries: dict[object, KeyedRow]) -> None:
        self._keyed, self.columnar = entries, None

    @property
    def multiset(self) -> bool:
        return not self.key_positions

    @property
    def empty(self) -> bool:
        return not (self.truncated or self.keyed_count() or any(self.counts.values()))

    def keyed_count(self) -> int:
        """``len(keyed)``, without making Python entries of columnar ones."""
        return len(self.columnar) if self.columnar is not None else len(self._keyed)

    def size(self) -> int:
        """The rows the commit writes or deletes (row images, or distinct images of a multiset table)."""
        return self.keyed_count() + len(self.counts)


def _entries(columns: KeyedColumns) -> dict[object, KeyedRow]:
    """Columnar entries as the Python entries ``fold_changes`` makes of the same changes."""
    keys, plain = columns.keys()
    rows = iter(columns.written_rows())
    entries = [KeyedRow(next(rows), _NO_COLUMNS, None) if write else KeyedRow(None, lookup_key=key)
               for key, write in zip(keys, columns.writes.tolist(), strict=True)]
    # keys of integers and strings are their own frozen form (_freeze_key): no call per key
    return dict(zip(keys if plain else map(_freeze_key, keys), entries, strict=True))


class _NaN:
    """Stands for float NaN in frozen keys: NaN != NaN, but two NaN images are the same row to Postgres."""

    def __repr__(self) -> str:
        return "NaN"


_NAN = _NaN()


def freeze(value: object) -> object:
    """A hashable, equality-faithful form of a row or key (lists -> tuples, NaN -> one marker)."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, float) and value != value:
        return _NAN
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


def fold_changes(
    changes: Iterable[TableChange],
    columns: Sequence[str],
    key_positions: Sequence[int],
    *,
    unchanged_marker: object,
    soft_delete: SoftDelete | None = None,
) -> TablePlan:
    """Fold ``changes`` (in commit order, one table) into a :class:`TablePlan`; with ``soft_delete``
    a delete carries the row to keep (applier.sink.extras) and a key change keeps the old key's row."""
    if soft_delete is not None and not key_positions:
        raise SinkError("soft deletes need a key (a table without one is matched on every column)")
    plan = TablePlan(tuple(columns), tuple(key_positions), soft_delete=soft_delete)
    for change in changes:
        plan.changes += 1
        if change.op == OP_TRUNCATE:
            plan.truncated = True
            plan.keyed.clear()
            plan.counts.clear()
            plan.images.clear()
            plan.restart_identity = plan.restart_identity or bool(getattr(change, "restart_identity", False))
            plan.cascade = plan.cascade or bool(getattr(change, "cascade", False))
            continue
        if plan.multiset:
            _fold_multiset(plan, change, unchanged_marker)
        else:
            _fold_keyed(plan, change, unchanged_marker)
    return plan


def _key_of(row: tuple[object, ...], positions: tuple[int, ...]) -> tuple[object, ...]:
    return tuple([row[i] for i in positions])


_PLAIN_KEY_TYPES = frozenset({int, str})
_NO_COLUMNS = NO_POSITIONS


def _freeze_key(key: tuple[object, ...]) -> object:
    """freeze() for keys, without its per-value walk for the common keys of integers and strings."""
    for v in key:
        if type(v) not in _PLAIN_KEY_TYPES:
            return freeze(key)
    return key


def _fold_keyed(plan: TablePlan, change: TableChange, marker: object) -> None:
    # (``_keyed``, not the property: this runs per change, on a plan no columnar fold made)
    op = change.op
    if op == OP_DELETE and change.new_row is None:
        key = change.old_key
        if key is None and change.old_row is not None:
            key = _key_of(change.old_row, plan.key_positions)
        if key is None:
            raise SinkError("delete without an old key", op=op)
        plan._keyed[_freeze_key(key)] = KeyedRow(None, lookup_key=key)
        return
    new = change.new_row
    if new is None:
        raise SinkError("insert/update without a new row", op=op)
    new_key = _key_of(new, plan.key_positions)
    if marker in new_key:  # tested here, not in the call: every change of a keyed table passes this line
        check_key(new_key, marker, op)
    old_key = change.old_key if change.old_key is not None else (
        _key_of(change.old_row, plan.key_positions) if change.old_row is not None else new_key)
    old_frozen = _freeze_key(old_key)
    new_frozen = _freeze_key(new_key)
    if marker not in new:  # the common case: a full new row (``in`` compares by identity first)
        if old_frozen != new_frozen:
            plan._keyed[old_frozen] = _removed(plan, change, old_key, old_frozen, new)
        plan._keyed[new_frozen] = KeyedRow(tuple(new), _NO_COLUMNS, None)
        return
    lookup: tuple[object, ...] | None = None
    if change.old_row is not None:  # 'O' present: the old row has every value
        row, unresolved = resolve(new, marker, op, change.old_row, None)
    else:
        previous = plan._keyed.get(old_frozen)
        if previous is not None and previous.row is not None:
            # The previous image of the same row in this batch: take its values, and inherit
            # whatever it still had to read from the target.
            row, unresolved = resolve(new, marker, op, None, previous.row, previous.unresolved)
            lookup = previous.lookup_key if unresolved else None
        else:
            row, unresolved = resolve(new, marker, op, None, None, no_earlier=refusal(
                TOAST, deleted=previous is not None, truncated=plan.truncated))
            lookup = old_key  # read from the target's row of the OLD key
            plan.external.append((old_frozen, TOAST))
    if old_frozen != new_frozen:
        plan._keyed[old_frozen] = _removed(plan, change, old_key, old_frozen, new)
    plan._keyed[new_frozen] = KeyedRow(tuple(row), unresolved, lookup)


def _removed(plan: TablePlan, change: TableChange, old_key: tuple[object, ...], old_frozen: object,
             new: Sequence[object]) -> KeyedRow:
    """The old key's state after a key change: gone, or with soft deletes its last row, flagged."""
    soft = plan.soft_delete
    if soft is None:
        return KeyedRow(None, lookup_key=old_key)
    previous = plan._keyed.get(old_frozen)
    unresolved: frozenset[int] = _NO_COLUMNS
    lookup: tuple[object, ...] | None = None
    if change.old_row is not None:  # 'O': every value of the old row
        row = list(change.old_row)
    elif previous is not None and previous.row is not None:
        row, unresolved, lookup = list(previous.row), previous.unresolved, previous.lookup_key
    elif (reason := refusal(KEY_CHANGE, deleted=previous is not None, truncated=plan.truncated)) is not None:
        raise SinkError(reason, op=change.op)
    else:  # read every other column from the target's row of the old key
        row = [None] * len(new)
        for p, v in zip(plan.key_positions, old_key, strict=True):
            row[p] = v
        unresolved = frozenset(i for i in range(soft.source_columns) if i not in plan.key_positions)
        lookup = old_key
        plan.external.append((old_frozen, KEY_CHANGE))
    for p in soft.copied:
        row[p] = new[p]
    if soft.op is not None:
        row[soft.op] = OP_DELETE
    row[soft.deleted] = True
    return KeyedRow(tuple(row), unresolved, lookup)


def _fold_multiset(plan: TablePlan, change: TableChange, marker: object) -> None:
    op = change.op
    if op in (OP_UPDATE, OP_DELETE):
        old = change.old_row
        if old is None:
            raise SinkError("update/delete on a table without a key needs the whole old row "
                            "(REPLICA IDENTITY FULL)", op=op)
        check_old_image(old, marker, op)
        image = freeze(old)
        plan.images.setdefault(image, tuple(old))
        plan.counts[image] -= 1
    if op in (OP_INSERT, OP_UPDATE):
        new = change.new_row
        if new is None:
            raise SinkError("insert/update without a new row", op=op)
        if marker in new:
            row, _ = resolve(new, marker, op, change.old_row, None, no_earlier="unchanged TOAST value in a table "
                             "without a key and without an old row")
            new = tuple(row)
        image = freeze(new)
        plan.images.setdefault(image, tuple(new))
        plan.counts[image] += 1


def diverged(description: str, **context: object) -> DivergenceError:
    """The error of a key-less commit (``description``: its commit description, which starts with the
    source table's name) that finds fewer copies of a row than Postgres deleted."""
    table = description.split(" end_lsn=", 1)[0]
    return DivergenceError(
        "Postgres deleted more copies of a row than the Delta table holds: the Delta table has diverged from "
        "the source, and running the mirror again meets the same table. A fresh copy of it mends it: "
        f"`applier resync --config FILE --table {table}`, then run the mirror again (or set "
        "apply.schema_changes: resync to do this by itself)", table=table, commit=description, **context)


def multiset_source(plan: TablePlan, touched: Sequence[tuple[object, int]], held: Sequence[int],
                    table: str) -> tuple[list[tuple[object, ...]], int, int]:
    """A key-less plan's MERGE source, whichever engine makes it: per touched row image (with its signed
    count), one 'D' row (every copy the table holds goes) and one 'I' row per copy it must hold after
    (``held``: the copies the table holds now); then the rows inserted and deleted. Stops when Postgres
    deleted more copies than the table holds: the table has diverged."""
    rows: list[tuple[object, ...]] = []
    inserted = deleted = 0
    for (img, delta), now in zip(touched, held, strict=True):
        want = now + delta
        if want < 0:
            raise diverged(table, missing_copies=-want)
        row = plan.images[img]
        rows.append((*row, "D"))
        rows.extend([(*row, "I")] * want)
        inserted += max(want - now, 0)
        deleted += max(now - want, 0)
    return rows, inserted, deleted


def rows_after_truncate(plan: TablePlan, table: str) -> list[tuple[object, ...]]:
    """Every row a truncated plan leaves the table with (it is overwritten with them): a keyed table's
    final rows, a key-less table's row images as many times as counted."""
    rows: list[tuple[object, ...]] = []
    if plan.multiset:
        for image, count in plan.counts.items():
            if count < 0:
                raise SinkError("rows deleted after a TRUNCATE that were never inserted after it", table=table)
            rows.extend([plan.images[image]] * count)
        return rows
    for entry in plan.keyed.values():
        if entry.row is not None:
            if entry.unresolved:  # fold guarantees this cannot happen; keep the invariant loud
                raise SinkError("unresolved unchanged-TOAST value after a TRUNCATE", table=table)
            rows.append(entry.row)
    return rows
