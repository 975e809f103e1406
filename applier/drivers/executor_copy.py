"""The initial copy on Spark's executors (``snapshot.on_executors``): one Spark job per table.

Why: on a cluster the driver's connections would copy every table while the executors stay idle. Here
each task reads its ctid chunks under the slot's exported snapshot (``applier.drivers.copy_tasks``)
and writes them as Parquet files where it runs; the driver commits once per table: one delta-rs commit
of the tasks' files for a table delta-rs writes (pyarrow writes Parquet from the tasks' Arrow as it
is, where Spark's writer would turn every value into one of its rows: a third of the rate on the same
cores), Spark's own Delta write for one it does not. The commit replaces the table and carries the
snapshot's LSN as its applied version (``txn``), so a table is either copied whole or known to be
unfinished, and a resumed copy copies again exactly the unfinished tables, as on the driver path. The
replication connection that exported the snapshot stays open and idle on the driver meanwhile (the
caller holds it), which is what keeps the snapshot importable by the tasks.

Several tables are copied at the same time (one thread per table submits its job), so small tables
do not wait for big ones. A table with a value only the driver's row-by-row path writes is handed back
to the caller, which copies it on the driver.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from applier.drivers.copy_tasks import ArrowBatches, ChunkCopy, ChunkNeedsDriver, ParquetFiles, carried_error
from applier.errors import ApplierError, SourceError
from applier.infra.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.drivers.copyjob import CopyJob
    from applier.sink.bulkload import SnapshotLoader
    from applier.sink.copyfiles import CopyFile


class ExecutorCopy:
    """Copies ``CopyJob``s on Spark's executors, ``tables_at_once`` tables at a time."""

    def __init__(self, spark: SparkSession, dsn: str, snapshot_name: str, *, progress: Progress,
                 progress_every: float = 10.0, tables_at_once: int = 4,
                 on_rows: Callable[[str, int, int], None] | None = None) -> None:
        self.spark = spark
        self.dsn = dsn
        self.snapshot_name = snapshot_name
        self.progress = progress
        self.progress_every = progress_every
        self.tables_at_once = max(1, tables_at_once)
        self.on_rows = on_rows
        #: the Spark job group of this copy's jobs (the progress lines count their tasks)
        self.group = f"applier-copy-{uuid.uuid4().hex[:12]}"

    def run(self, jobs: list[CopyJob]) -> tuple[dict[str, int], list[CopyJob]]:
        """Copy every job; returns the rows per table copied, and the jobs left to the driver."""
        if not jobs:
            return {}, []
        chunks = sum(len(j.plan.chunks) for j in jobs)
        self.progress(f"snapshot: {len(jobs)} table(s), {chunks} chunk(s) on Spark's executors")
        rows: dict[str, int] = {}
        to_driver: list[CopyJob] = []
        started = time.monotonic()
        with ThreadPoolExecutor(min(self.tables_at_once, len(jobs)), thread_name_prefix="applier-copy") as pool:
            pending: dict[Future[int | None], CopyJob] = {pool.submit(self._copy, job): job for job in jobs}
            try:
                while pending:
                    done, _ = wait(pending, timeout=self.progress_every or None, return_when=FIRST_COMPLETED)
                    for future in done:
                        job = pending.pop(future)
                        copied = future.result()
                        if copied is None:
                            to_driver.append(job)
                        else:
                            rows[job.table.qualified_name] = copied
                    if pending and not done:
                        self._report(chunks, started)
            except BaseException:
                self.cancel()
                for future in pending:
                    future.cancel()
                raise
        return rows, to_driver

    def cancel(self) -> None:
        """Stop this copy's Spark jobs (a table not committed is copied again by the next run)."""
        self.spark.sparkContext.cancelJobGroup(self.group)

    def _copy(self, job: CopyJob) -> int | None:
        """One table (and the history or change-feed tables it feeds, first); None: the driver copies it."""
        sc = self.spark.sparkContext
        name = job.table.qualified_name
        sc.setJobGroup(self.group, f"applier: the copy of {name}", interruptOnCancel=True)
        job.started = time.monotonic()
        rows = 0
        try:
            writers = []
            for target in job.loader.targets():
                store = target.files_store()
                if store is not None:
                    rows = target.commit_files(store, functools.partial(self._files, job, target))
                else:
                    rows = target.write_whole(functools.partial(self._frame, job, target))
                writers.append("Spark's Delta writer" if store is None else "delta-rs commit")
        except ApplierError:
            raise
        except Exception as e:  # noqa: BLE001 - a task's error comes back as Spark's; ours is in its text
            error = carried_error(str(e))
            if isinstance(error, ChunkNeedsDriver):
                self.progress(f"snapshot: {name}: {error}; copied on the driver")
                return None
            if error is not None:
                raise error from e
            raise SourceError(f"the copy on Spark's executors failed: {_reason(str(e))} (snapshot.on_executors: "
                              "false copies on the driver)", table=name) from e
        job.finished = time.monotonic()
        seconds = job.finished - job.started
        rate = f", {rows / seconds:,.0f} rows/s" if seconds > 0 else ""
        slow = f", {job.per_value_chunks} of {len(job.plan.chunks)} chunks per value (special values)" \
            if job.per_value_chunks else ""
        how = ", ".join(dict.fromkeys(writers))
        self.progress(f"snapshot: {name}: {rows} rows in {seconds:.1f}s{rate} on executors ({how}){slow}")
        if self.on_rows is not None:
            self.on_rows(name, rows, job.plan.estimated_rows)
        return rows

    def _reader(self, job: CopyJob, target: SnapshotLoader) -> ChunkCopy:
        assert job.arrow_types is not None  # tables without columns stay on the driver
        return ChunkCopy(self.dsn, self.snapshot_name, job.table, job.relation, job.plan, job.arrow_types,
                         job.converter, target.shape)

    def _files(self, job: CopyJob, target: SnapshotLoader) -> list[CopyFile]:
        """The target's rows written as Parquet files into it by one task per chunk."""
        from applier.storage.options import options_in_force

        n = len(job.plan.chunks)
        task = ParquetFiles(self._reader(job, target), target.path, options_in_force())
        written = self.spark.sparkContext.parallelize(range(n), n).mapPartitions(task).collect()
        job.per_value_chunks = sum(1 for _, slow in written if slow)
        return [f for f, _ in written]

    def _frame(self, job: CopyJob, target: SnapshotLoader) -> tuple[Any, Callable[[], int]]:
        """The target's rows as a DataFrame of one task per chunk, and the count of its rows once written."""
        from pyspark.sql.pandas.types import to_arrow_schema

        from applier.spark.types import spark_schema

        struct = spark_schema(target.spec.schema)
        sc = self.spark.sparkContext
        rows, per_value = sc.accumulator(0), sc.accumulator(0)
        task = ArrowBatches(self._reader(job, target), to_arrow_schema(struct, timezone="UTC"), rows, per_value)
        n = len(job.plan.chunks)
        frame = self.spark.range(0, n, 1, n).mapInArrow(task, struct)

        def written() -> int:
            job.per_value_chunks = int(per_value.value)
            return int(rows.value)

        return frame, written

    def _report(self, chunks: int, started: float) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        done = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info is not None else ():
                stage = tracker.getStageInfo(stage_id)
                done += stage.numCompletedTasks if stage is not None else 0
        self.progress(f"snapshot: on executors: {min(done, chunks)} of {chunks} chunks copied "
                      f"({time.monotonic() - started:.0f}s)")


def _reason(text: str) -> str:
    """The line of a Spark error that names the Python error of a task, else its first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error:" in line and not line.startswith(("at ", "File ")):
            return line
    return lines[0] if lines else "unknown error"
