"""The columns applier adds after a table's own: which change last wrote a row, and soft deletes.

Why they ride in the rows: the fold keeps the last image per key in commit order, so values appended
to every change's new row are, after the fold, exactly those of the last transaction that touched the
key, however many transactions a group holds. A soft delete becomes an update of the key whose other
columns are "whatever the row had" (the unchanged-TOAST marker), so they are resolved like an
unchanged TOAST value: from the old FULL image, an earlier image in the group, or the target row.

Tables without a key cannot have them: their rows are matched on every column (a multiset), which the
added values would make different from Postgres's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from applier.catalog.batches import TableBatch
from applier.changes import OP_DELETE, OP_TRUNCATE, TableChange
from applier.protocol.messages import pg_time_to_datetime
from applier.sink.rowkeys import old_key_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from applier.config import TablesSettings
    from applier.sink.plan import SoftDelete

#: ``_applier_op`` of a row written by the initial copy (Debezium calls it 'r', read).
OP_READ = "R"


@dataclass(frozen=True, slots=True)
class ExtraColumns:
    """Names of the added columns, None for one not added; in this order after the table's own."""

    commit_lsn: str | None = None
    commit_time: str | None = None
    op: str | None = None
    deleted: str | None = None

    @classmethod
    def for_table(cls, settings: TablesSettings, qualified_name: str) -> ExtraColumns | None:
        metadata, soft = settings.extra_columns_for(qualified_name)
        if not (metadata or soft):
            return None
        n = settings.metadata_names
        return cls(n.commit_lsn if metadata else None, n.commit_time if metadata else None,
                   n.op if metadata else None, n.deleted if soft else None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.commit_lsn, self.commit_time, self.op, self.deleted) if n is not None)

    @property
    def soft_delete(self) -> bool:
        return self.deleted is not None

    def fields(self) -> list[pa.Field]:
        import pyarrow

        types = (pyarrow.int64(), pyarrow.timestamp("us", "UTC"), pyarrow.string(), pyarrow.bool_())
        names = (self.commit_lsn, self.commit_time, self.op, self.deleted)
        return [pyarrow.field(n, t) for n, t in zip(names, types, strict=True) if n is not None]

    def values(self, op: str, commit_lsn: int, commit_time: datetime | None, deleted: bool) -> tuple[Any, ...]:
        out: list[Any] = []
        if self.commit_lsn is not None:
            out.extend((commit_lsn, commit_time, op))
        if self.deleted is not None:
            out.append(deleted)
        return tuple(out)

    def soft_delete_positions(self, source_columns: int) -> SoftDelete | None:
        """Where the fold finds the added columns of a row (None: deletes remove rows)."""
        from applier.sink.plan import SoftDelete

        if self.deleted is None:
            return None
        first = source_columns
        copied = (first, first + 1) if self.commit_lsn is not None else ()
        op = first + 2 if self.op is not None else None
        return SoftDelete(source_columns, len(self.names) - 1 + first, op, copied)


def with_extra_values(changes: Iterable[TableChange], batch: TableBatch, extra: ExtraColumns,
                      key_positions: tuple[int, ...], ncols: int, marker: object) -> Iterator[TableChange]:
    """The batch's changes (already in the table's source columns) with the added values appended.

    Old images get NULLs there (they are only read for the table's own columns); with soft deletes a
    delete carries a new row: its key, the marker in every other column, and the flag set."""
    when = commit_datetime(batch)
    lsn = batch.commit_lsn
    pad = (None,) * len(extra.names)
    kept = extra.values("I", lsn, when, False), extra.values("U", lsn, when, False)
    gone = extra.values(OP_DELETE, lsn, when, True)
    for change in changes:
        op = change.op
        if op == OP_TRUNCATE:
            yield change
            continue
        old_row = None if change.old_row is None else (*change.old_row, *pad)
        if op == OP_DELETE:
            new_row = None
            if extra.soft_delete:
                key = old_key_of(change, key_positions)
                if key is not None:  # else the fold stops on it as on any delete without a key
                    new_row = _deleted_image(key, key_positions, ncols, marker) + gone
            yield TableChange(op, change.old_key, old_row, new_row, change.ordinal, new_row is not None)
            continue
        assert change.new_row is not None or op not in "IU"
        new_row = None if change.new_row is None else (*change.new_row, *kept[op != "I"])
        yield TableChange(op, change.old_key, old_row, new_row, change.ordinal, change.new_partial)


def commit_datetime(batch: TableBatch) -> datetime | None:
    """The batch's commit time as a UTC datetime (None when the source did not carry one)."""
    return pg_time_to_datetime(batch.commit_time) if batch.commit_time is not None else None


def live_rows(df: DataFrame, deleted: str) -> DataFrame:
    """The rows of a soft-deleting table that Postgres still has (the flag off or NULL)."""
    from pyspark.sql import functions as F

    from applier.sink.naming import quote_identifier

    return df.filter(~F.coalesce(F.col(quote_identifier(deleted)), F.lit(False)))


def _deleted_image(key: tuple[Any, ...], key_positions: tuple[int, ...], ncols: int,
                   marker: object) -> tuple[Any, ...]:
    row: list[Any] = [marker] * ncols
    for p, v in zip(key_positions, key, strict=True):
        row[p] = v
    return tuple(row)
