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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.infra.crashpoints import crashpoint
from applier.sink.conflicts import retry_on_conflict
from applier.sink.spec import DEFAULT_TARGET_FILE_SIZE, TARGET_FILE_SIZE
from applier.sink.store import SparkStore
from applier.sink.store.arrow import arrow_table
from applier.sink.store.fallback import FallbackStore
from applier.spark.session import SparkLike, SparkProvider
from applier.spark.types import spark_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from applier.sink.copyfiles import CopyFile
    from applier.sink.spec import TableSpec
    from applier.sink.store import TableStore, WriteMode
    from applier.sink.store.deltars import DeltaRsStore


@dataclass(frozen=True, slots=True)
class CopyShape:
    """How the copy's rows (the source's columns, by their Postgres names, or the stream's converted
    rows in the source's column order) become rows of the Delta table: the table's own columns under
    their Delta names and types, then applier's added columns with their constant values. Plain data,
    so a Spark task shapes its pieces exactly as the driver does."""

    names: tuple[str, ...]  # the table's own columns, by their Postgres names
    delta_names: tuple[str, ...] | None  # their Delta names, when any differs (column_names: safe)
    index: tuple[int, ...] | None  # where they are among the source's columns, when not all of them in order
    own_schema: pa.Schema  # the table's own columns (Delta names, Arrow types)
    schema: pa.Schema  # the whole Delta table: its own columns, then applier's added ones
    constants: tuple[Any, ...]  # the added columns' values in every copied row (spec.extra)

    @classmethod
    def of(cls, spec: TableSpec, source_columns: tuple[str, ...], constants: tuple[Any, ...]) -> CopyShape:
        own = tuple(spec.postgres_column_names)
        delta = tuple(spec.source_column_names)
        index = None if own == source_columns else tuple(source_columns.index(n) for n in own)
        return cls(own, None if own == delta else delta, index, spec.source_schema, spec.schema, constants)

    def from_arrow(self, table: Any) -> Any:
        """A piece of the copy with the source's columns, as the Delta table's rows."""
        piece = table.select(list(self.names))
        if self.delta_names is not None:
            piece = piece.rename_columns(list(self.delta_names))
        return self._with_constants(piece.cast(self.own_schema), table.num_rows)

    def from_rows(self, rows: list[tuple[Any, ...]]) -> Any | None:
        """Converted rows as the Delta table's rows, or None when a value does not go into Arrow."""
        table = arrow_table(self._own(rows), self.own_schema)
        return None if table is None else self._with_constants(table, len(rows))

    def spark_rows(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Converted rows as the Delta table's rows, for Spark (values Arrow does not take)."""
        rows = self._own(rows)
        return [(*row, *self.constants) for row in rows] if self.constants else rows

    def _own(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        index = self.index
        return rows if index is None else [tuple(row[i] for i in index) for row in rows]

    def _with_constants(self, piece: Any, n: int) -> Any:
        if not self.constants:
            return piece
        import pyarrow

        # n, not piece.num_rows: the cast of a table without columns (applier.sink.zerocol) has none
        added = [pyarrow.array([v] * n, type=f.type) for v, f in
                 zip(self.constants, list(self.schema)[len(self.names):], strict=True)]
        return pyarrow.Table.from_arrays(piece.columns + added, schema=self.schema)


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
        self.shape = CopyShape.of(spec, source_columns, constants)
        self._on_done = on_done
        self._lock = threading.Lock()
        self._pending: list[Any] = []  # pieces not written yet (``write_arrow`` writes them at a commit)
        self._files: list[CopyFile] = []  # pieces written as Parquet files, not committed yet
        self._pending_bytes = 0  # the Arrow size of either, since the last commit
        self._decided = False  # whether pieces go as files, decided at the first piece
        self._direct: DeltaRsStore | None = None  # where they go as files (None: gathered for write_arrow)
        self._file_bytes = DEFAULT_TARGET_FILE_SIZE  # the table's delta.targetFileSize
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
        self._add(self.shape.from_arrow(table))

    def _add(self, piece: Any) -> None:
        files = self._files_store_for(piece)
        if files is not None and not piece.num_rows:
            return
        # outside the lock: the copy's threads write at once
        written = None if files is None else files.write_files(self.path, piece, max_bytes=self._file_bytes)
        with self._lock:
            if written is None:
                self._pending.append(piece)
            else:
                self._files.extend(written)
            self._pending_bytes += piece.nbytes
            self.rows += piece.num_rows
            if self._pending_bytes >= self.commit_bytes:
                self._write_pending(final=False)

    def add_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """Converted rows (the stream's Python values) in the source's column order."""
        table = self.shape.from_rows(rows)
        if table is not None:
            self._add(table)
            return
        rows = self.shape.spark_rows(rows)
        with self._lock:  # a value Arrow cannot take as it is: this piece goes row by row, on its own
            self.rows += len(rows)
            self._write_pending(final=False)  # what is pending first (delta-rs overwrites on its first write)
            self._write(self.spark.createDataFrame(rows, spark_schema(self.spec.schema)), tagged=False)

    def _files_store_for(self, piece: Any) -> DeltaRsStore | None:
        """Where the copy's own threads write their pieces as Parquet files, each as it comes (committed
        every ``commit_bytes`` and at the end), or None: pieces are gathered and written by one
        ``write_arrow`` per commit. Why files: one ``write_deltalake`` of a commit's rows encodes them on
        one thread after the reading is done (0.9 s of 1M typed rows, the other thread idle), while each
        thread's file is written while the others read. Only into a table whose columns are the pieces'
        (a change feed that kept a dropped column takes ``write_arrow``'s schema merge)."""
        with self._lock:
            if not self._decided:
                store = self.files_store()
                table = store.open(self.path) if store is not None and store.exists(self.path) else None
                same = table is not None and [f.name for f in table.schema().fields] == piece.schema.names
                self._direct, self._decided = store if same else None, True
                if table is not None:
                    size = table.metadata().configuration.get(TARGET_FILE_SIZE)
                    self._file_bytes = int(size) if size and size.isdigit() else DEFAULT_TARGET_FILE_SIZE
            return self._direct

    def files_store(self) -> DeltaRsStore | None:
        """The store a copy on Spark's executors writes this table's Parquet files into, committed by
        ``commit_files`` (a table delta-rs writes), or None: Spark's Delta writer writes it (``write_whole``)."""
        return self.store.preferred if isinstance(self.store, FallbackStore) else None

    def commit_files(self, store: DeltaRsStore, attempt: Callable[[], list[CopyFile]]) -> int:
        """The whole copy as Parquet files written into the table by Spark's tasks (``attempt`` writes
        them, again when a conflict retries the commit), in one commit that replaces the table and carries
        the applied version. Returns the table's rows."""
        def write() -> int:
            files = attempt()
            crashpoint("snapshot_files")
            store.commit_files(self.path, files, schema=self.spec.schema, tag=self.tag)
            return sum(f.rows for f in files)

        return self._whole(write)

    def write_whole(self, attempt: Callable[[], tuple[Any, Callable[[], int]]]) -> int:
        """The whole copy as one Spark DataFrame (read and written on Spark's executors), in one commit
        that replaces the table and carries the applied version: ``attempt`` makes the frame and a count
        of its rows that holds once the frame is written (made anew when a conflict retries the write).
        Returns the table's rows."""
        def write() -> int:
            frame, rows = attempt()
            self._spark_store.write_frame(self.path, frame, mode="overwrite", tag=self.tag)
            return rows()

        return self._whole(write)

    def _whole(self, write: Callable[[], int]) -> int:
        with self._lock:
            self.rows = retry_on_conflict(write, table=self.spec.source_name)
            self._first = False
            self._finished = True
        self._on_done(self.rows)
        return self.rows

    def targets(self) -> list[SnapshotLoader]:
        """The tables this loader writes, in the order they must finish: itself."""
        return [self]

    def finish(self) -> int:
        """Write what is left with the applied version; returns the table's rows."""
        with self._lock:
            self._write_pending(final=True)
            self._finished = True
        self._on_done(self.rows)
        return self.rows

    def _write_pending(self, *, final: bool) -> None:
        import pyarrow as pa

        files, self._files = self._files, []
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        store = self._direct
        if files and store is not None:  # (pieces written as files leave nothing pending)
            mode, tag = self._mode(), self.tag if final else None
            retry_on_conflict(lambda: store.commit_files(self.path, files, schema=self.spec.schema, tag=tag,
                                                         mode=mode), table=self.spec.source_name)
            self._written(tagged=final)
            return
        if not pieces and not final:
            return
        table = pa.concat_tables(pieces) if pieces else pa.Table.from_batches([], schema=self.spec.schema)
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

    def targets(self) -> list[SnapshotLoader]:
        """The tables written, in the order they must finish: the mirror table last."""
        return [*self.others, self.primary]

    def finish(self) -> int:
        for other in self.others:
            other.finish()
        return self.primary.finish()
