"""Writing one table's initial copy to Delta in few, large commits, from several threads.

Why delta-rs for the data: writing Arrow through Spark costs a JVM round trip and a Spark job per
commit (bench/RESULTS.md: about ten times the copy's own time on the 2-core machine), while delta-rs
writes Parquet from Arrow directly. Tables are created with the lowest protocol they need (no type
widening unless a rule asks for it), which delta-rs writes; the final commit records the applied
version as a Delta ``txn`` action, the same action Spark's idempotent writes (and the stream's
commits) record. A table delta-rs cannot write (column mapping, type widening asked for by a rule)
is written through Spark from Arrow instead.

Why large commits: a Delta commit costs about a second whatever its size, so the copy gathers Arrow
batches (from any chunk, in any order: the copy is a multiset until the stream starts) up to
``commit_bytes`` before it writes one. The first commit overwrites (a table left part-way by an
earlier attempt is replaced), the others append, and the last one carries the snapshot's LSN as the
table's applied version (``txnAppId``/``txnVersion``), so a table without that version is known to be
unfinished. The version goes in as writer options, not session settings: several tables are written
at the same time through one SparkSession.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from applier.infra.crashpoints import crashpoint
from applier.sink.conflicts import retry_on_conflict
from applier.sink.store import SparkStore
from applier.sink.store.arrow import arrow_table
from applier.spark.session import SparkLike, SparkProvider
from applier.spark.types import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.sink.spec import TableSpec
    from applier.sink.store import TableStore, WriteMode


class SnapshotLoader:
    """Gathers one table's copied rows (Arrow tables or converted rows, in the source's column order)
    and writes them in commits of about ``commit_bytes``, through ``store`` (default: Spark's);
    thread-safe."""

    def __init__(self, spark: SparkLike, path: str, spec: TableSpec, source_columns: tuple[str, ...], *,
                 tag: tuple[str, int, str], commit_bytes: int, on_done: Callable[[int], None],
                 store: TableStore | None = None, constants: tuple[Any, ...] = ()) -> None:

        self._spark = SparkProvider.of(spark)
        self.path = path
        self.spec = spec
        self.tag = tag
        self.commit_bytes = commit_bytes
        self.rows = 0
        own = spec.postgres_column_names  # what the copy's rows and Arrow pieces are named by
        self._names = list(own)
        self._delta_names = None if own == spec.source_column_names else list(spec.source_column_names)
        self._index = None if own == source_columns else \
            [source_columns.index(n) for n in own]  # excluded columns are left out
        self._own_schema = spec.source_schema
        self._constants = constants  # values of applier's added columns in every copied row (spec.extra)
        self._on_done = on_done
        self._lock = threading.Lock()
        self._pending: list[Any] = []
        self._pending_bytes = 0
        self._first = True
        self._finished = False
        self._spark_store = SparkStore(self._spark)
        self.store: TableStore = store if store is not None else self._spark_store

    @property
    def spark(self) -> SparkSession:
        """The session (started now when it is not: the copy of a table delta-rs does not write)."""
        return self._spark.get(f"the copy of {self.spec.source_name} (a table delta-rs does not write, or "
                               "a value Arrow cannot hold)")

    def add_arrow(self, table: Any) -> None:
        """One piece of the copy as a pyarrow Table with the source's columns (by their Postgres names)."""
        piece = table.select(self._names)
        if self._delta_names is not None:  # column_names: safe
            piece = piece.rename_columns(self._delta_names)
        self._add(piece.cast(self._own_schema), table.num_rows)

    def _add(self, piece: Any, n: int) -> None:
        """A piece with the table's own columns under their Delta names; ``n``: its rows."""
        if self._constants:
            import pyarrow as pa

            # n, not piece.num_rows: the cast of a table without columns (applier.sink.zerocol) has none
            added = [pa.array([v] * n, type=f.type) for v, f in
                     zip(self._constants, list(self.spec.schema)[len(self._names):], strict=True)]
            piece = pa.Table.from_arrays(piece.columns + added, schema=self.spec.schema)
        with self._lock:
            self._pending.append(piece)
            self._pending_bytes += piece.nbytes
            self.rows += piece.num_rows
            if self._pending_bytes >= self.commit_bytes:
                self._write_pending(final=False)

    def add_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """Converted rows (the stream's Python values) in the source's column order."""
        if self._index is not None:
            index = self._index
            rows = [tuple(row[i] for i in index) for row in rows]
        table = arrow_table(rows, self._own_schema)
        if table is not None:
            self._add(table, len(rows))
            return
        if self._constants:
            rows = [(*row, *self._constants) for row in rows]
        with self._lock:  # a value Arrow cannot take as it is: this piece goes row by row, on its own
            self.rows += len(rows)
            self._write_pending(final=False)  # what is pending first (delta-rs overwrites on its first write)
            self._write(self.spark.createDataFrame(rows, spark_schema(self.spec.schema)), tagged=False)

    def finish(self) -> int:
        """Write what is left with the applied version; returns the table's rows."""
        with self._lock:
            self._write_pending(final=True)
            self._finished = True
        self._on_done(self.rows)
        return self.rows

    def _write_pending(self, *, final: bool) -> None:
        import pyarrow as pa

        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        if not pieces and not final:
            return
        table = pa.concat_tables(pieces) if pieces else self.spec.schema.empty_table()
        del pieces
        if not (table.num_rows or final):
            return
        tag = self.tag if final else None
        retry_on_conflict(lambda: self.store.write_arrow(self.path, table, mode=self._mode(), tag=tag,
                                                         schema=self.spec.schema), table=self.spec.source_name)
        self._written(tagged=final)

    def _write(self, frame: Any, *, tagged: bool) -> None:
        """Rows Arrow cannot hold, as a Spark DataFrame."""
        tag = self.tag if tagged else None
        retry_on_conflict(lambda: self._spark_store.write_frame(self.path, frame, mode=self._mode(), tag=tag),
                          table=self.spec.source_name)
        self._written(tagged=tagged)

    def _mode(self) -> WriteMode:
        """The first commit replaces what an earlier attempt left, the others append."""
        return "overwrite" if self._first else "append"

    def _written(self, *, tagged: bool) -> None:
        self._first = False
        if not tagged:
            crashpoint("snapshot_chunk")


class TeeLoader:
    """One table's copy written to several tables: the mirror table and its history or change feed
    tables. Those finish first, so a crash in between leaves the mirror table unfinished and the
    whole copy is done again (their first commits overwrite too)."""

    def __init__(self, primary: SnapshotLoader, others: list[SnapshotLoader]) -> None:
        self.primary, self.others = primary, others

    @property
    def rows(self) -> int:
        return self.primary.rows

    def add_arrow(self, table: Any) -> None:
        for other in self.others:
            other.add_arrow(table)
        self.primary.add_arrow(table)

    def add_rows(self, rows: list[tuple[Any, ...]]) -> None:
        for other in self.others:
            other.add_rows(rows)
        self.primary.add_rows(rows)

    def finish(self) -> int:
        for other in self.others:
            other.finish()
        return self.primary.finish()
