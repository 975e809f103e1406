"""A keyed table's row changes folded column by column: the TablePlan ``plan.fold_changes`` makes of
the same changes, without a Python object per change, and whose rows stay Arrow columns up to the
commit.

Why: the fold's question, the last image of every key in commit order, is a sort. Each change is one
or two events on keys: an Insert or Update sets its new key (position ``2i + 1``), a Delete, or an
Update that moved the key, removes its old key first (position ``2i``). Sorted by key then position,
a key's last event is its state after the range, and its first tells where the reference's dict
first met it (so the plan's keys come in the reference's order too). The folds of consecutive ranges
combine by the same sort (``combine_keyed_columns``), and delta-rs merges the result as it is: the
rows were Arrow when decoded, and turning them into Python values and back cost more than the fold
(2.5 µs a key, bench/RESULTS.md). They become Python values only if something asks for
``TablePlan.keyed`` (the Spark engine, a dry run, a fold the reference path goes on with).

Only the plain case is folded here: full new images (no unchanged TOAST value), old tuples that
hold the key only ('K'), no key that is floating point (NaN is one key to the reference, none to a
sort), no soft deletes or metadata columns. The caller checks that and takes ``plan.fold_changes``
otherwise; tests/unit/sink/test_columnar_fold.py holds the two to the same plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from applier.sink.keyedcolumns import KeyedColumns
from applier.sink.plan import TablePlan

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def last_of_each_key(keys: Sequence[pa.Array], position: np.ndarray) -> np.ndarray:
    """Indices of every key's last event (the highest ``position``; positions are distinct and not
    negative), in the order of every key's first event."""
    if len(keys) == 1:
        final = _last_by_numbers(keys[0], position)
        if final is not None:
            return final
    return _last_by_sort(keys, position)


def _last_by_numbers(key: pa.Array, position: np.ndarray) -> np.ndarray | None:
    """:func:`last_of_each_key` for one integer key, as one sort of numbers: an event is
    ``(key - lowest) * P + position`` (P above every position), so sorting those sorts by key and then
    by position, and a number gives both back. Half the time of Arrow's sort by two columns on random
    keys (bench/RESULTS.md, thirty-seventh session). None when the numbers would not fit in 63 bits."""
    import numpy as np
    import pyarrow as pa

    count = len(position)
    if not count or key.null_count or not pa.types.is_integer(key.type) or pa.types.is_uint64(key.type):
        return None
    values = key.to_numpy().astype(np.int64, copy=False)
    lowest = int(values.min())
    span = int(values.max()) - lowest + 1
    places = int(position.max()) + 1
    if span * places >= 1 << 62 or int(position.min()) < 0:
        return None
    # (stable: numpy's merge of runs, twice as fast as the quicksort when keys come mostly in order,
    # as serial keys do; as fast on random keys)
    events = np.sort((values - lowest) * places + position, kind="stable")
    sorted_key = events // places
    sorted_position = events - sorted_key * places
    boundary = sorted_key[1:] != sorted_key[:-1]
    first_position = sorted_position[np.insert(boundary, 0, True)]
    index_of = np.empty(places, dtype=np.int64)
    index_of[position] = np.arange(count)
    last_index = index_of[sorted_position[np.append(boundary, True)]]
    # the keys in the order of their first events: by position, with no second sort (positions < places)
    met = np.zeros(places, dtype=bool)
    met[first_position] = True
    last_by_first = np.empty(places, dtype=np.int64)
    last_by_first[first_position] = last_index
    final: np.ndarray = last_by_first[np.flatnonzero(met)]
    return final


def _last_by_sort(keys: Sequence[pa.Array], position: np.ndarray) -> np.ndarray:
    """:func:`last_of_each_key` for any keys: Arrow sorts the events by key columns and position."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    names = [f"k{j}" for j in range(len(keys))]
    events = pa.table([*keys, pa.array(position)], names=[*names, "position"])
    order: np.ndarray = pc.sort_indices(events, [(n, "ascending") for n in names]
                                        + [("position", "ascending")]).to_numpy()
    count = len(order)
    if not count:
        return order
    taken = pa.array(order)
    boundary = np.zeros(count - 1, dtype=bool)
    for key in keys:
        column = key.take(taken)
        boundary |= pc.not_equal(column.slice(1), column.slice(0, count - 1)).to_numpy(zero_copy_only=False)
    last = np.append(boundary, True)
    first = np.insert(boundary, 0, True)
    sorted_position = position[order]
    met = np.argsort(sorted_position[first], kind="stable")
    final: np.ndarray = order[np.flatnonzero(last)[met]]
    return final


def fold_keyed_columns(columns: Sequence[str], key_positions: tuple[int, ...], removes: np.ndarray,
                       sets: np.ndarray, old_keys: Sequence[Any], new_rows: Sequence[Any]) -> TablePlan | None:
    """The plan of ``len(removes)`` changes of one keyed table in commit order. ``removes[i]``: change
    ``i`` removes the key of its old tuple (a Delete, or an Update with an old key); ``sets[i]``: it
    writes its new image (an Insert or Update). ``old_keys`` (one pyarrow array per key column, values
    where ``removes``) and ``new_rows`` (one per column, values where ``sets``) are typed as the table's
    columns. None when a key value is NULL (the reference path says why)."""
    import numpy as np
    import pyarrow as pa

    plan = TablePlan(tuple(columns), key_positions)
    plan.changes = len(removes)
    removed, written = np.flatnonzero(removes), np.flatnonzero(sets)
    if not (removed.size or written.size):
        return plan
    keys = [pa.concat_arrays([old.take(pa.array(removed)), new_rows[p].take(pa.array(written))])
            for old, p in zip(old_keys, key_positions, strict=True)]
    if any(k.null_count for k in keys):
        return None
    position = np.concatenate([2 * removed, 2 * written + 1])
    final = last_of_each_key(keys, position)
    final_position = position[final]
    writes = final_position % 2 == 1
    row_at = pa.array(final_position // 2, mask=~writes)  # NULL (a deleted key's row) takes NULL
    final_keys = dict(zip(key_positions, (k.take(pa.array(final)) for k in keys), strict=True))
    rows = [final_keys[p] if p in final_keys else column.take(row_at) for p, column in enumerate(new_rows)]
    plan.columnar = KeyedColumns(pa.table(rows, names=list(columns)), writes, key_positions)
    return plan


def combine_keyed_columns(earlier: KeyedColumns, later: KeyedColumns) -> KeyedColumns | None:
    """The entries of ``earlier`` updated with those of ``later`` (what ``dict.update`` does to the
    reference's entries); None when their columns are not of the same types (the caller then combines
    the Python entries)."""
    import numpy as np
    import pyarrow as pa

    if not len(earlier):
        return later
    if not len(later):
        return earlier
    if not earlier.rows.schema.equals(later.rows.schema) or earlier.key_positions != later.key_positions:
        return None
    rows = pa.concat_tables([earlier.rows, later.rows])
    final = last_of_each_key([rows.column(p).combine_chunks() for p in earlier.key_positions],
                             np.arange(rows.num_rows))
    writes = np.concatenate([earlier.writes, later.writes])[final]
    return KeyedColumns(rows.take(pa.array(final)).combine_chunks(), writes, earlier.key_positions)
