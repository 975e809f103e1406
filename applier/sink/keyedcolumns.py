"""A keyed plan's entries as Arrow columns, as a columnar fold makes them (applier.sink.columnfold).

Why: delta-rs merges Arrow columns, and the columnar fold made its rows of Arrow columns; turning
them into Python entries and back cost more than the fold itself. A plan holds these until something
asks for its Python entries (``TablePlan.keyed``, made of these once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


@dataclass(frozen=True, slots=True, eq=False)
class KeyedColumns:
    """A keyed plan's entries as columns: one row per key, in the order the reference fold's dict holds
    them. ``rows`` has the plan's columns; where ``writes`` is False the key was deleted, and the row
    holds its key and NULL elsewhere (what a MERGE source's delete row holds)."""

    rows: pa.Table
    writes: np.ndarray
    key_positions: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        import numpy as np

        return isinstance(other, KeyedColumns) and self.key_positions == other.key_positions \
            and bool(np.array_equal(self.writes, other.writes)) and self.rows.equals(other.rows)

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return int(self.rows.num_rows)

    def deletes(self) -> int:
        return int(len(self.writes) - self.writes.sum())

    def keys(self) -> tuple[list[tuple[object, ...]], bool]:
        """Every entry's key as a tuple of Python values, and whether every key column holds integers
        or strings (which are their own frozen form: applier.sink.plan.freeze)."""
        import pyarrow as pa

        keys = [self.rows.column(p) for p in self.key_positions]
        plain = all(pa.types.is_integer(k.type) or pa.types.is_string(k.type) for k in keys)
        return list(zip(*(k.to_pylist() for k in keys), strict=True)), plain

    def written_rows(self) -> list[tuple[object, ...]]:
        """The rows of the keys written (not deleted), in order, as tuples of Python values."""
        import pyarrow as pa

        written = self.rows.filter(pa.array(self.writes))
        return list(zip(*(c.to_pylist() for c in written.columns), strict=True))  # (a keyed table has a column)
