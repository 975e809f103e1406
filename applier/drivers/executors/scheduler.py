"""Step 2, from the driver: ranges handed to Spark one task each, results taken in log order;
and the group of consecutive ranges' folds, combined, waiting for its commit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from applier.changes import SkippedTransaction
from applier.drivers.executors.ranges import FoldJob, RangeFold
from applier.drivers.executors.task import collect, fold_pickled, fold_range, imported, unpickled_fold
from applier.errors import SinkError
from applier.protocol.messages import LogicalMessage
from applier.sink.combine import combine_plans
from applier.sink.fold import FoldedTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def fold_on_executors(spark: SparkSession, jobs: Iterable[FoldJob]) -> Iterator[RangeFold]:
    """The folds of ``jobs`` in their order. Each range is a Spark job of one task; ``defaultParallelism
    + 1`` of them are in flight at a time, so every core stays busy while the caller combines and
    commits, and the driver holds at most that many results it has not used yet. ``jobs`` is read
    as the ranges are needed (they may still be being cut)."""
    sc = spark.sparkContext
    depth = max(1, sc.defaultParallelism) + 1
    upcoming = iter(jobs)
    with ThreadPoolExecutor(depth + 1, thread_name_prefix="applier-fold") as pool:
        pool.submit(warm_up, sc)  # while the first range is cut (its error, if any, is the ranges' too)
        pending: deque[Future[list[bytes]]] = deque()

        def submit() -> None:
            job = next(upcoming, None)
            if job is not None:
                rdd = sc.parallelize([job], 1).map(fold_pickled)
                pending.append(pool.submit(sc.runJob, rdd, collect, [0]))

        for _ in range(depth):
            submit()
        while pending:
            (payload,) = pending.popleft().result()
            submit()
            yield unpickled_fold(payload)


def warm_up(sc: Any) -> None:
    """One task per core that imports the fold's modules: Spark's Python workers start and import
    them (about a second of CPU each) while the driver still reads the first range, not when it is
    ready to fold (bench/catchup.py: workers then started 3-5 s into the catch-up). The workers are
    reused by the ranges' tasks that follow."""
    cores = max(1, sc.defaultParallelism)
    sc.runJob(sc.parallelize(range(cores), cores).map(imported), collect)


def fold_in_process(jobs: Iterable[FoldJob]) -> Iterator[RangeFold]:
    """The folds of ``jobs`` in their order, made here one after the other (``distributed.backlog_folds:
    driver``): the executors' own fold, without a Spark job, a pickled range or a pickled plan. (The
    caller, fold_and_commit, runs with the automatic garbage collector off, as a task does.)"""
    for job in jobs:
        yield fold_range(job)


class FoldGroup:
    """Combined folds of consecutive ranges, per table, waiting for their commit."""

    def __init__(self) -> None:
        self.tables: dict[str, FoldedTable] = {}
        self.transactions = 0
        self.end: int | None = None
        self.commit_time: int | None = None  # of its last transaction (PG clock): its consistent cut's
        self.messages: list[tuple[int, LogicalMessage]] = []
        self.skipped: list[SkippedTransaction] = []

    def fits(self, fold: RangeFold) -> bool:
        """Whether ``fold`` can join: the same table layouts (a schema change commits in between)."""
        for t in fold.folded:
            mine = self.tables.get(t.path)
            if mine is not None and (mine.spec != t.spec or mine.schema.version != t.schema.version):
                return False
        return True

    def add(self, fold: RangeFold) -> None:
        """``fold`` joins (its range's messages are not kept: fold_and_commit asks whether it may join
        before it does)."""
        for t in fold.folded:
            mine = self.tables.get(t.path)
            if mine is None:
                self.tables[t.path] = t
            else:
                try:
                    combine_plans(mine.plan, t.plan)
                except SinkError as e:
                    e.add_context(table=t.spec.source_name)
                    raise
        self.transactions += fold.transactions
        if fold.last_end_lsn is not None:
            self.end, self.commit_time = fold.last_end_lsn, fold.last_commit_time
        self.messages += fold.messages
        self.skipped += fold.skipped

    def size(self) -> int:
        return sum(t.plan.size() for t in self.tables.values())

    def __bool__(self) -> bool:
        return self.end is not None or bool(self.skipped) or bool(self.messages)
