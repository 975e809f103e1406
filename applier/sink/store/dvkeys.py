"""A data file's rows found by key for the deletion-vector MERGE (applier.sink.store.dvmerge): the file's
one integer key column, sorted once and searched at every commit.

Why: each commit tested every key of every live file against the plan's keys (``pyarrow.compute.is_in``):
19 ms for a 1M-row file on the standard machine, at every commit, whatever the plan's size and growing
with the table; following pgbench (bench/follow.py) it was most of a round's commit for
``pgbench_accounts``. Sorted, a commit's few thousand keys are found by binary search in well under a
millisecond. A file's keys usually come sorted already (a copy in ctid order of a serial key; this
writer's own files hold its plans' rows): then no order is kept at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    import pyarrow as pa

__all__ = ["KeyIndex", "live_rows"]


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """One file's keys in ascending order, each once; ``order``: the file's row of each (None when the
    file holds them in that order). ``dense``: the keys are every integer from the first to the last, in
    the file's order (a serial key copied in its order: pgbench_accounts' 1M rows), so a key's row is
    its distance from the first, with no search: a binary search of 3,000 keys among 1M took 2 ms, most
    of it waiting for memory."""

    keys: npt.NDArray[np.integer]
    order: npt.NDArray[np.integer] | None
    dense: bool = False

    @classmethod
    def of(cls, column: pa.ChunkedArray | pa.Array) -> KeyIndex | None:
        """The index of a file's key column; None when there is none to make: a NULL, or a key the file
        holds twice (the caller's general path finds every copy, and declines the commit)."""
        if column.null_count:
            return None
        values = np.asarray(column.to_numpy())
        if values.size < 2 or bool(np.all(values[1:] > values[:-1])):  # compared, not subtracted: no overflow
            dense = values.dtype.kind == "i" and values.size > 0 and int(values[-1]) - int(values[0]) == values.size - 1
            return cls(values, None, dense)  # (signed: PostgreSQL's integers; their rows are found as int64)
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        if bool(np.any(ordered[1:] == ordered[:-1])):
            return None
        return cls(ordered, order.astype(np.int32) if values.size < 2**31 else order)

    def find(self, wanted: npt.NDArray[np.integer]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.integer]]:
        """The rows (ascending, each once) holding any of ``wanted`` (of the file's type), and their keys."""
        if self.dense:
            low = int(self.keys[0])
            wanted = wanted[(wanted >= low) & (wanted <= int(self.keys[-1]))]  # (compared: no overflow)
            rows = np.unique(wanted.astype(np.int64) - low)
            return rows, self.keys[rows]
        at = np.searchsorted(self.keys, wanted)
        inside = at < self.keys.size
        at, wanted = at[inside], wanted[inside]
        hit = self.keys[at] == wanted
        at = at[hit]
        rows = at.astype(np.int64) if self.order is None else self.order[at].astype(np.int64)
        rows, first = np.unique(rows, return_index=True)  # sorted, each once (``wanted`` may repeat a key)
        return rows, self.keys[at[first]]


def live_rows(rows: npt.NDArray[np.int64], deleted: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Which of ``rows`` a file's deletion vector (its rows, as read or as this writer made it) does not
    mark."""
    if not deleted.size or not rows.size:
        return np.ones(rows.size, dtype=bool)
    if not bool(np.all(deleted[1:] >= deleted[:-1])):
        deleted = np.sort(deleted)
    probe = rows.astype(np.uint64)
    at = np.minimum(np.searchsorted(deleted, probe), deleted.size - 1)
    return np.asarray(deleted[at] != probe)
