"""A keyed table's row changes folded column by column: the TablePlan ``plan.fold_changes`` makes of
the same changes, without a Python object per change.

Why: the fold's question, the last image of every key in commit order, is a sort. Each change is one
or two events on keys: an Insert or Update sets its new key (position ``2i + 1``), a Delete, or an
Update that moved the key, removes its old key first (position ``2i``). Sorted by key then position,
a key's last event is its state after the range, and its first tells where the reference's dict
first met it (so the plan's keys come in the reference's order too). Only the keys' final rows become
Python values.

Only the plain case is folded here: full new images (no unchanged TOAST value), old tuples that
hold the key only ('K'), no key that is floating point (NaN is one key to the reference, none to a
sort), no soft deletes or metadata columns. The caller checks that and takes ``plan.fold_changes``
otherwise; tests/unit/sink/test_columnar_fold.py holds the two to the same plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from applier.sink.plan import _NO_COLUMNS, KeyedRow, TablePlan, _freeze_key

if TYPE_CHECKING:
    import numpy as np


def fold_keyed_columns(columns: Sequence[str], key_positions: tuple[int, ...], removes: np.ndarray,
                       sets: np.ndarray, old_keys: Sequence[Any], new_rows: Sequence[Any]) -> TablePlan | None:
    """The plan of ``len(removes)`` changes of one keyed table in commit order. ``removes[i]``: change
    ``i`` removes the key of its old tuple (a Delete, or an Update with an old key); ``sets[i]``: it
    writes its new image (an Insert or Update). ``old_keys`` (one pyarrow array per key column, values
    where ``removes``) and ``new_rows`` (one per column, values where ``sets``) are typed as the table's
    columns. None when a key value is NULL (the reference path says why)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    changes = len(removes)
    plan = TablePlan(tuple(columns), key_positions)
    plan.changes = changes
    removed, written = np.flatnonzero(removes), np.flatnonzero(sets)
    if not (removed.size or written.size):
        return plan
    keys = [pa.concat_arrays([old.take(pa.array(removed)), new_rows[p].take(pa.array(written))])
            for old, p in zip(old_keys, key_positions, strict=True)]
    if any(k.null_count for k in keys):
        return None
    position = np.concatenate([2 * removed, 2 * written + 1])
    names = [f"k{j}" for j in range(len(keys))]
    events = pa.table(keys + [pa.array(position)], names=names + ["position"])
    order = pc.sort_indices(events, [(n, "ascending") for n in names] + [("position", "ascending")]).to_numpy()
    events = events.take(pa.array(order))
    count = len(order)
    boundary = np.zeros(count - 1, dtype=bool)
    for name in names:
        column = events.column(name)
        boundary |= pc.not_equal(column.slice(1), column.slice(0, count - 1)).to_numpy(zero_copy_only=False)
    last = np.append(boundary, True)
    first = np.insert(boundary, 0, True)
    # one entry per key: its last event, in the order the reference first met each key
    sorted_position = events.column("position").to_numpy()
    met = np.argsort(sorted_position[first], kind="stable")
    final = np.flatnonzero(last)[met]
    final_position = sorted_position[final]
    key_values = [events.column(n).take(pa.array(final)).to_pylist() for n in names]
    writes = final_position % 2 == 1
    rows_at = final_position[writes] // 2
    row_values = [column.take(pa.array(rows_at)).to_pylist() for column in new_rows]
    rows = zip(*row_values, strict=True)  # (a keyed table has a column: its key)
    key_tuples = list(zip(*key_values, strict=True))
    entries = [KeyedRow(next(rows), _NO_COLUMNS, None) if write else KeyedRow(None, lookup_key=key)
               for key, write in zip(key_tuples, writes.tolist(), strict=True)]
    # keys of integers and strings are their own frozen form (plan._freeze_key): no call per key
    plain = all(pa.types.is_integer(k.type) or pa.types.is_string(k.type) for k in keys)
    plan.keyed.update(zip(key_tuples if plain else map(_freeze_key, key_tuples), entries, strict=True))
    return plan
