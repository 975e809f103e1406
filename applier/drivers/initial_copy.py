"""The initial copy of many tables: chunks read on N connections under one exported snapshot.

Every worker opens its own connection and imports the snapshot (``SET TRANSACTION SNAPSHOT``) before
it reads anything; the exporting replication connection stays open and idle meanwhile (the caller
holds it), which is what keeps the snapshot importable. The chunks of all tables go into one queue in
table order, so the workers spread over several tables at once when a table has fewer chunks than
workers, and over the chunks of one table when it is big. A worker reads a chunk (COPY into Arrow,
typed column by column; a chunk with a value Spark's type cannot hold, again through the stream's
per-value conversion, which applies the special-value policy) and hands it to the table's
SnapshotLoader, which commits in large pieces; the worker that finishes a table's last chunk writes
its final, tagged commit. The first error stops every worker and is raised: a table without its
final commit is never presented as copied.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import psycopg

from applier.drivers.copyjob import CopyJob, copy_job
from applier.errors import ApplierError, SourceError, TransientSourceError
from applier.infra.progress import Progress, ProgressReport, count_fields, count_line
from applier.sources.copy import read_arrow_chunk, select_sql
from applier.sources.failures import is_transient
from applier.sources.publication import PublishedTable
from applier.sources.snapshot import copy_rows, open_snapshot

if TYPE_CHECKING:
    from applier.catalog import RelationCache
    from applier.config import MirrorConfig, SnapshotSettings
    from applier.sink.engine import DeltaApplier
    from applier.values import SpecialValuePolicy


def executor_chunks(config: MirrorConfig) -> int | None:
    """The fewest chunks a table needs to be copied on Spark's executors (``snapshot.on_executors``; auto:
    when Spark's master, as it would be chosen, is a cluster), or None: every table on the driver."""
    from applier.spark.session import master_is_local

    return config.snapshot.executor_chunks(master_is_local(config.spark.master))


def copy_tables(dsn: str, snapshot_name: str, tables: list[PublishedTable], *, applier: DeltaApplier,
                catalog: RelationCache, lsn: int, settings: SnapshotSettings, special_values: SpecialValuePolicy,
                progress: Progress, progress_every: float, own_schemas: bool = False,
                skip: Callable[[PublishedTable], bool] | None = None,
                on_rows: Callable[[str, int, int], None] | None = None,
                replace: Collection[str] = (), executor_chunks: int | None = None) -> dict[str, int]:
    """Copy ``tables`` under the exported snapshot ``snapshot_name`` (taken at ``lsn``), the one table
    sync of the mirror's first copy and of every later one (a table added to the publication, a table
    copied again): each table is described under the snapshot, its types and relation go into
    ``catalog`` (``own_schemas``: a catalog of its own per table, when the stream may still be behind a
    later ALTER and its own Relation messages must keep deciding how its changes decode), its columns'
    attnums are recorded as of the copy, and the chunks of all of them are read on
    ``settings.workers()`` connections. ``skip``: a table already copied (after the catalog saw it).
    ``replace``: tables (qualified names) whose Delta table is first emptied with the columns they have
    under the snapshot (``DeltaApplier.replace_table``), instead of evolved to them.
    ``executor_chunks`` (``SnapshotSettings.executor_chunks``): tables of at least that many chunks are
    copied on Spark's executors (applier.drivers.executor_copy), the others meanwhile on the driver.
    Returns the rows copied per table."""
    from applier.catalog import RelationCache
    from applier.sources.catalog_lookup import column_attnums, dropped_attnums, rewrite_witness
    from applier.sources.snapshot import describe_relation

    jobs: list[CopyJob] = []
    with psycopg.connect(dsn, autocommit=True) as snap:
        open_snapshot(snap, snapshot_name)
        for table in tables:
            relation, types = describe_relation(snap, table)
            for typ in types:
                catalog.update_type(typ)
            schema = (RelationCache(catalog.types) if own_schemas else catalog).update(relation)
            if skip is not None and skip(table):
                continue
            if table.qualified_name in replace:
                applier.replace_table(schema)
            jobs.append(copy_job(snap, table, relation, schema, applier=applier, types=catalog.types, lsn=lsn,
                                 settings=settings, special_values=special_values))
            if applier.identities is not None:  # the columns' attnums and the table's file as of the copy
                applier.identities.record_attnums(relation.oid, column_attnums(snap, relation.oid))
                witness = rewrite_witness(snap, relation.oid, ())
                applier.identities.record_relfilenode(relation.oid, witness.relfilenode if witness else None)
                applier.identities.record_dropped(relation.oid, dropped_attnums(snap, relation.oid))
        snap.execute("COMMIT")
    copier = InitialCopy(dsn, snapshot_name, workers=settings.workers(), progress=progress,
                         progress_every=progress_every, on_rows=on_rows)
    remote = [] if executor_chunks is None else \
        [j for j in jobs if j.arrow_types is not None and len(j.plan.chunks) >= executor_chunks]
    local = [j for j in jobs if all(j is not r for r in remote)]
    if not remote:
        return copier.run(jobs)
    from applier.drivers.executor_copy import ExecutorCopy

    spark = applier.spark.get(f"the initial copy on Spark's executors ({len(remote)} table(s); "
                              "snapshot.on_executors)")
    on_executors = ExecutorCopy(spark, dsn, snapshot_name, progress=progress, progress_every=progress_every,
                                tables_at_once=settings.workers(), on_rows=on_rows)
    with ThreadPoolExecutor(1, thread_name_prefix="applier-copy-executors") as pool:
        remote_done = pool.submit(on_executors.run, remote)
        try:
            rows = copier.run(local)  # the driver's share meanwhile
        except BaseException:
            on_executors.cancel()  # the first error stops every table's copy
            raise
        remote_rows, to_driver = remote_done.result()
    rows |= remote_rows
    if to_driver:
        rows |= copier.run(to_driver)
    return rows


def copy_session_lost(error: BaseException) -> bool:
    """A copy that failed because a session went away, which a reconnect cures: its own connection broke
    (a server restart), or the session that exported its snapshot ended (a walsender terminated while a
    table sync's slot waited: "snapshot ... does not exist"). Copying again at a new snapshot is exact, as
    after a crash mid-copy: a table is counted as copied only once its copy is done."""
    if not isinstance(error, psycopg.Error):
        return False
    if isinstance(error, psycopg.OperationalError) and is_transient(error.sqlstate, True, str(error)):
        return True
    return error.sqlstate == "22023" and "snapshot" in str(error)


class InitialCopy:
    """Copies ``jobs`` under ``snapshot_name`` with ``workers`` connections; reports progress."""

    def __init__(self, dsn: str, snapshot_name: str, *, workers: int, progress: Progress,
                 progress_every: float = 10.0, on_rows: Callable[[str, int, int], None] | None = None) -> None:
        self.dsn = dsn
        #: told (table, rows copied, estimated rows) as rows arrive: the metrics' copy gauges
        self.on_rows = on_rows
        self.snapshot_name = snapshot_name
        self.workers = workers
        self.progress = progress
        self.progress_every = progress_every
        self._lock = threading.Lock()
        self._last_report = time.monotonic()
        self._error: BaseException | None = None
        self._stop = threading.Event()

    def run(self, jobs: list[CopyJob]) -> dict[str, int]:
        """Copy every job; returns rows per table. Raises the first error of any worker."""
        todo: queue.SimpleQueue[tuple[CopyJob, str]] = queue.SimpleQueue()
        for job in jobs:
            job.chunks_left = len(job.plan.chunks)
            for chunk in job.plan.chunks:
                todo.put((job, chunk))
        threads = [threading.Thread(target=self._worker, args=(todo,), name=f"applier-copy-{i}", daemon=True)
                   for i in range(min(self.workers, sum(len(j.plan.chunks) for j in jobs)) or 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._error is not None:
            raise self._error
        return {j.table.qualified_name: j.rows for j in jobs}

    def _worker(self, todo: queue.SimpleQueue[tuple[CopyJob, str]]) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                open_snapshot(conn, self.snapshot_name)
                while not self._stop.is_set():
                    try:
                        job, chunk = todo.get_nowait()
                    except queue.Empty:
                        break
                    self._copy_chunk(conn, job, chunk)
                conn.execute("COMMIT")
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
            with self._lock:
                if self._error is None:
                    if not isinstance(e, ApplierError):
                        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                        if copy_session_lost(e):  # the mirror reconnects and copies again (see there)
                            wrapped: SourceError = TransientSourceError(f"the initial copy lost its session: {reason}")
                        else:
                            wrapped = SourceError(f"the initial copy failed: {reason}")
                        wrapped.__cause__ = e
                        e = wrapped
                    self._error = e
            self._stop.set()

    def _copy_chunk(self, conn: psycopg.Connection, job: CopyJob, chunk: str) -> None:
        with self._lock:
            if job.started is None:
                job.started = time.monotonic()
        names = [c.name for c in job.relation.columns]
        sql = select_sql(job.plan, names, chunk)
        piece = None if job.arrow_types is None else read_arrow_chunk(conn, sql, names, job.arrow_types, job.table)
        if piece is not None:
            job.loader.add_arrow(piece)
            self._count(job, piece.num_rows)
        else:  # a table the fast path cannot read, or a chunk with a special value: the stream's conversion
            if job.arrow_types is not None:
                with self._lock:
                    job.per_value_chunks += 1
            for batch in copy_rows(conn, job.table, job.relation, select=sql):
                if self._stop.is_set():
                    return
                job.loader.add_rows([job.converter.convert(t) for t in batch])
                self._count(job, len(batch))
        with self._lock:
            job.chunks_left -= 1
            last = job.chunks_left == 0
        if last:
            job.loader.finish()
            job.finished = time.monotonic()
            seconds = job.finished - (job.started or job.finished)
            rate = f", {job.rows / seconds:,.0f} rows/s" if seconds > 0 else ""
            slow = f", {job.per_value_chunks} of {len(job.plan.chunks)} chunks per value (special values)" \
                if job.per_value_chunks else ""
            self.progress(f"snapshot: {job.table.qualified_name}: {job.rows} rows in {seconds:.1f}s{rate}{slow}")

    def _count(self, job: CopyJob, rows: int) -> None:
        with self._lock:
            job.rows += rows
            if self.on_rows is not None:
                self.on_rows(job.table.qualified_name, job.rows, job.plan.estimated_rows)
            now = time.monotonic()
            if now - self._last_report < self.progress_every:
                return
            self._last_report = now
        self.progress(progress_line(job.table.qualified_name, job.rows, job.plan.estimated_rows,
                                    now - (job.started or now)))


def progress_line(name: str, rows: int, estimated: int, seconds: float) -> ProgressReport:
    """``name: rows of ~estimate (pct), rows/s, ETA`` (the estimate is pg_class.reltuples)."""
    return ProgressReport(f"snapshot: {name}: {count_line(rows, estimated, seconds, 'rows', estimate=True)}",
                          count_fields(f"snapshot: {name}", rows, estimated, seconds, "rows"))
