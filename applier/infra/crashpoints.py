"""Named points where a crash test can have the process SIGKILLed, to prove recovery at exactly the
moments that matter (like PostgreSQL's injection points). Inert unless the environment variable
``APPLIER_CRASH_AT`` is ``point:n`` (die the n-th time ``point`` is reached); only the test suite
sets it.

Points: ``decode`` (a message decoded, before the assembler sees it), ``between_tables`` (one
table's Delta commit of a group done, the next not), ``before_confirm`` (every Delta commit of a
group done, the slot not yet advanced), ``prepared_staged`` (a prepared transaction staged on
disk, not yet committed); and, during the initial copy, ``snapshot_chunk`` (a commit of part of a
table's copy done, the table not finished) and, on Spark's executors, ``snapshot_files`` (a table's
Parquet files written by the tasks, not committed); with history or change feed tables, ``feed_committed``
(a table's change feed committed, the mirror table not) and ``before_history`` (the mirror tables
committed, their history tables not); with a column added with a constant default, ``column_filled``
(the Delta table has the column and its filled rows, the group's commit is not done); on an object
store, ``object_copied`` (an object of a table being moved copied to its new place, not all of them);
``table_moved`` (a renamed table's Delta table moved, its app id and the records of the move not updated);
``piece_committed`` (a piece of a large transaction committed, its later pieces not); ``key_run_committed``
(the part of a transaction before its table's merge key changed committed, the rest not); ``column_renamed``
(a renamed column renamed in Delta, by a rewrite or with column mapping, the group's commit not done);
``column_widened`` (a table rewritten with a widened column's new type, the group's commit not done);
``before_cut`` (every Delta commit of a group done, its consistent cut not recorded: applier.sink.cuts).
"""

from __future__ import annotations

import os
import signal

POINTS = ("decode", "between_tables", "before_confirm", "prepared_staged")
#: reached only while copying (the stream's crash test leaves them out)
SNAPSHOT_POINTS = ("snapshot_chunk", "snapshot_files")
DERIVED_POINTS = ("feed_committed", "before_history")  # reached only with history or change feed tables
FILL_POINTS = ("column_filled",)  # reached only when a column added with a constant default is filled
MOVE_POINTS = ("object_copied", "table_moved")  # reached only when a table is moved (renamed, retired)
PIECE_POINTS = ("piece_committed",)  # reached only when a large transaction is applied in pieces
KEY_RUN_POINTS = ("key_run_committed",)  # reached only when a table's merge key changes inside a group
REWRITE_POINTS = ("column_renamed", "column_widened")  # reached only when a column is renamed or widened
CUT_POINTS = ("before_cut",)  # a group's cut (its own crash test: tests/integration/test_cuts.py)
ALL_POINTS = (POINTS + SNAPSHOT_POINTS + DERIVED_POINTS + FILL_POINTS + MOVE_POINTS + PIECE_POINTS + KEY_RUN_POINTS
              + REWRITE_POINTS + CUT_POINTS)


class _Counter:
    def __init__(self, spec: str | None) -> None:
        self.point, self.remaining = None, 0
        if spec:
            point, _, n = spec.partition(":")
            if point not in ALL_POINTS:
                known = ", ".join(ALL_POINTS)
                raise ValueError(f"APPLIER_CRASH_AT: unknown point {point!r} (known: {known})")
            self.point, self.remaining = point, int(n or 1)

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


_COUNTER = _Counter(os.environ.get("APPLIER_CRASH_AT"))


def crashpoint(point: str) -> None:
    """Die here if the crash test asked for it (a no-op otherwise)."""
    if _COUNTER.point is not None:
        _COUNTER.reached(point)
