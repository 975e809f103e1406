"""The initial copy on an executor: ctid ranges of one table read under the slot's exported snapshot
and shaped into the Delta table's rows, then written as Parquet files where the task runs: by pyarrow
into a table delta-rs writes (``ParquetFiles``), else by Spark's Delta writer (``ArrowBatches``). The
driver commits them (``applier.drivers.executor_copy``).

Each task opens its own connection and imports the snapshot (``SET TRANSACTION SNAPSHOT``) before it
reads, exactly as a driver's copy worker does, so every chunk sees the slot's starting point; a chunk
is read the same two ways (``COPY`` into typed Arrow columns, and a chunk with a value Spark's type
cannot hold again through the stream's per-value conversion, which applies the special-value
policy). Spark ships the tasks' functions to its Python workers by value: this module must stay
importable there, without a SparkSession.
"""

from __future__ import annotations

import base64
import pickle
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from applier.errors import ApplierError, SourceError

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.protocol.messages import Relation
    from applier.sink.bulkload import CopyShape
    from applier.sink.copyfiles import CopyFile
    from applier.sources.copy import CopyPlan
    from applier.sources.publication import PublishedTable
    from applier.storage.options import StorageOptions
    from applier.values import RowConverter

#: what brackets a task's own error (pickled, base64) in the text of the error Spark gives the driver
_CARRIED = re.compile(r"\[applier-error:([A-Za-z0-9+/=]+)\]")

#: rows per Arrow batch handed to Spark's writer
_BATCH_ROWS = 65_536


class ChunkNeedsDriver(ApplierError):
    """A chunk holds a value Arrow does not take (``arrow_table`` gives None), which only the driver's
    row-by-row path writes: the driver copies the table itself."""


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else repr(error)


def carried(error: ApplierError) -> RuntimeError:
    """``error`` as a task raises it: Spark hands the driver only its text, which carries it whole."""
    return RuntimeError(f"{error} [applier-error:{base64.b64encode(pickle.dumps(error)).decode()}]")


def carried_error(text: str) -> ApplierError | None:
    """The error a task raised through ``carried``, from the text of Spark's error, with its class and
    context (what the user acts on: the column, the special-value policy), or None."""
    found = _CARRIED.search(text)
    if found is None:
        return None
    error = pickle.loads(base64.b64decode(found.group(1)))  # noqa: S301 - written by our own task
    return error if isinstance(error, ApplierError) else None


@dataclass(frozen=True, slots=True)
class ChunkCopy:
    """How a task reads chunks (``plan.chunks``, by index) of one table as the Delta table's rows."""

    dsn: str
    snapshot_name: str
    table: PublishedTable
    relation: Relation
    plan: CopyPlan
    readers: list[Any]
    converter: RowConverter
    shape: CopyShape

    def chunks(self, indexes: Iterable[int]) -> Iterator[tuple[pa.Table, bool]]:
        """Each chunk's rows, and whether they took the per-value path, in pieces, read on a connection
        of the task's own under the snapshot. Errors are ``carried`` to the driver."""
        import psycopg

        from applier.sources.snapshot import open_snapshot

        try:
            conn = psycopg.connect(self.dsn, autocommit=True)
        except psycopg.Error as e:
            raise carried(SourceError(
                f"an executor could not connect to PostgreSQL ({_first_line(e)}): the executors must reach source.dsn "
                "(snapshot.on_executors: false copies on the driver's connections)",
                table=self.table.qualified_name, sqlstate=e.sqlstate)) from None
        try:
            with conn:
                open_snapshot(conn, self.snapshot_name)
                for index in indexes:
                    yield from self._chunk(conn, self.plan.chunks[index])
                conn.execute("COMMIT")
        except ApplierError as e:
            raise carried(e) from None
        except psycopg.Error as e:
            raise carried(SourceError(f"copying the table on an executor failed: {_first_line(e)}",
                                      table=self.table.qualified_name, sqlstate=e.sqlstate)) from None

    def _chunk(self, conn: Any, chunk: str) -> Iterator[tuple[pa.Table, bool]]:
        """One chunk as the Delta table's rows: the typed fast path, or the stream's per-value one."""
        from applier.sources.copy import read_arrow_chunk, select_sql
        from applier.sources.snapshot import copy_rows

        names = [c.name for c in self.relation.columns]
        sql = select_sql(self.plan, names, chunk)
        piece = read_arrow_chunk(conn, sql, names, self.readers, self.table)
        if piece is not None:
            yield self.shape.from_arrow(piece), False
            return
        for batch in copy_rows(conn, self.table, self.relation, select=sql):
            table = self.shape.from_rows([self.converter.convert(t) for t in batch])
            if table is None:
                raise ChunkNeedsDriver("a value only the driver's row-by-row path writes",
                                       table=self.table.qualified_name, chunk=chunk)
            yield table, True


@dataclass(frozen=True, slots=True)
class ParquetFiles:
    """A task of a copy into a table delta-rs writes (``sc.parallelize(...).mapPartitions``): its chunks
    written as Parquet files into the table (one per chunk), returned for the driver's one commit."""

    copy: ChunkCopy
    path: str
    storage: tuple[StorageOptions, ...]  # the driver's storage options in force (credentials, endpoints)

    def __call__(self, indexes: Iterable[int]) -> Iterator[tuple[CopyFile, bool]]:
        import pyarrow as pa

        from applier.sink.store.deltars import DeltaRsStore
        from applier.storage.options import put_in_force

        for options in self.storage:
            put_in_force(options)
        store = DeltaRsStore()
        for index in indexes:
            pieces = list(self.copy.chunks([index]))
            if pieces:
                table = pa.concat_tables([p for p, _ in pieces]) if len(pieces) > 1 else pieces[0][0]
                yield store.write_file(self.path, table), any(slow for _, slow in pieces)


@dataclass(frozen=True, slots=True)
class ArrowBatches:
    """A task of a copy through Spark's Delta writer (a table delta-rs does not write), as ``mapInArrow``'s
    function: given the indexes of its chunks, it yields their rows typed as Spark's schema ``schema``
    (``to_arrow_schema`` of the table's Spark schema) and counts them into ``rows`` and the chunks copied
    per value into ``per_value`` (Spark accumulators: a task run again counts once)."""

    copy: ChunkCopy
    schema: pa.Schema
    rows: Any
    per_value: Any

    def __call__(self, indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = [int(i) for batch in indexes for i in batch.column(0).to_pylist()]
        slow_chunks: set[int] = set()
        for index in chunks:
            for piece, slow in self.copy.chunks([index]):
                if slow and index not in slow_chunks:
                    slow_chunks.add(index)
                    self.per_value.add(1)
                self.rows.add(piece.num_rows)
                yield from piece.cast(self.schema).to_batches(max_chunksize=_BATCH_ROWS)
