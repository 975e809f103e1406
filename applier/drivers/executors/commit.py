"""Step 3, on the driver: folds combined in log order and committed as groups, while the survey
(or a live stream's reader) goes on cutting ranges; what executors cannot take goes to the driver
path (``drive``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from applier.catalog import SchemaVersion
from applier.config import ApplySettings, GroupingSettings, ReplayConfig, TablesSettings
from applier.drivers.executors.ranges import FoldJob, LogRange, RangeFold
from applier.drivers.executors.scheduler import FoldGroup, fold_in_process, fold_on_executors
from applier.drivers.executors.survey import LogSurvey, RangeSource
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.infra.progress import Backlog, Progress, ProgressReport
from applier.loop import ApplyLoop, ApplyStats
from applier.lsn import format_lsn, parse_lsn
from applier.sink.fold import FoldedTable
from applier.storage.options import options_in_force

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


#: Asked before a group commits, with its folded tables: None to commit it, or why the driver path
#: must apply it and everything after it (the mirror: a table to copy first, a column added).
MayCommit = Callable[[list[FoldedTable]], str | None]


class GroupLimits:
    """``apply.max_group_*`` for a group of range folds (FoldGroup), as PendingGroup keeps them for the
    driver path's group of transactions: whether a fold would take the group past a limit (it is then
    committed first) or the group has reached one (committed at once). Row changes are the rows its
    commits write or delete (``FoldGroup.size``), a fold's counted before it joins as its own rows (at
    least what it adds); bytes are the ranges' messages' bytes (``LogRange.size``), an estimate of the
    row images folded; time runs from when the group's first fold joined it. ``timed``:
    ``max_group_seconds`` counts (a live stream's; a stored log's replay has no time limit, as on the
    driver path). ``clear()`` with every new group."""

    def __init__(self, apply: GroupingSettings, *, timed: bool) -> None:
        self.apply = apply  # the count limits' rule (GroupingSettings.reached, .passed)
        self.seconds = apply.max_group_seconds if timed else None
        self.bytes = 0  # of the ranges in the group
        self.since: float | None = None  # when the group's first fold joined it

    def clear(self) -> None:
        self.bytes = 0
        self.since = None

    def past(self, group: FoldGroup, fold: RangeFold, cut: LogRange, rows: int) -> bool:
        """Whether ``fold`` (of ``cut``, ``rows`` row changes) would take ``group`` past a limit, or the
        group has been open for ``max_group_seconds`` (False for a group no fold joined yet)."""
        return self.since is not None and (
            self.apply.passed(group.transactions + fold.transactions, group.size() + rows, self.bytes + cut.size)
            or self._aged())

    def joins(self, cut: LogRange) -> None:
        if self.since is None:
            self.since = time.monotonic()
        self.bytes += cut.size

    def reached(self, group: FoldGroup) -> bool:
        return self.apply.reached(group.transactions, group.size(), self.bytes) or self._aged()

    def _aged(self) -> bool:
        return self.seconds is not None and self.since is not None and time.monotonic() - self.since >= self.seconds


def replay_on_executors(spark: SparkSession, config: ReplayConfig, loop: ApplyLoop, surveying: RangeSource,
                        *, progress: Progress | None, progress_every: float,
                        drive: Callable[[list[LogRange]], ApplyStats]) -> ApplyStats:
    """A stored log: nothing is committed before the whole log is known to be in order."""
    return fold_and_commit(spark, config.apply, config.tables, loop, surveying, progress=progress,
                           progress_every=progress_every, drive=drive, whole_source_first=True)


def fold_and_commit(spark: SparkSession | None, apply: ApplySettings, tables: TablesSettings, loop: ApplyLoop,
                    source: RangeSource, *, progress: Progress | None, progress_every: float,
                    drive: Callable[[list[LogRange]], ApplyStats], whole_source_first: bool,
                    may_commit: MayCommit | None = None, span: tuple[int, int] | None = None) -> ApplyStats:
    """Steps 2 and 3 while step 1 goes on; ``drive(ranges)`` replays ranges on the driver path, from the
    catalog at the first one's start (the tail, or everything from a range an executor could not fold
    or a group ``may_commit`` refused). ``whole_source_first``: wait for the source to end before the
    first commit (a stored log's order check covers all of it); a live stream commits as it goes,
    like the driver path. ``span``: the backlog's first and last LSN, for a done fraction and an ETA
    in the progress lines. ``spark`` None: the ranges are folded in this process (fold_in_process)."""
    applier = loop.applier
    state = loop.state
    skip = sorted({*apply.skip_transactions, *(state.load("skipped") or [])}, key=parse_lsn)
    settings = apply.model_copy(update={"skip_transactions": skip})
    paths: dict[tuple[str, str], str] = {}
    done: dict[str, int] = {}
    owners: dict[str, int] = {}  # path -> the relation OID bound to it
    given: dict[int, LogRange] = {}  # ranges handed to the executors and not back yet

    def jobs() -> Iterator[FoldJob]:
        """A job per range as it is cut; a table's applied end LSN is read when it is first described
        (before this run commits to it: nothing it commits is for a table not described yet)."""
        for cut in source.ranges():
            for rel in sorted(cut.relations - paths.keys()):
                paths[rel] = path = applier.path_for(*rel)
                version = applier.snapshot_version(*rel)
                if version is not None:
                    done[path] = version
                owner = applier.relation_at(path)
                if owner is not None:
                    owners[path] = owner
            given[cut.index] = cut
            yield FoldJob(cut, settings, tables, dict(paths), dict(done), options_in_force(),
                          owners=dict(owners))

    survey: LogSurvey | None = None
    schemas: dict[tuple[int, int], SchemaVersion] = {}  # one object per schema version (_ensure compares identity)
    group = FoldGroup()
    limits = GroupLimits(apply, timed=not whole_source_first)
    last_report = time.monotonic()
    received = 0
    backlog = Backlog(span[1] - span[0]) if span is not None else None

    committer = ThreadPoolExecutor(1, thread_name_prefix="applier-commit")
    in_flight: Future[None] | None = None

    def write(done: FoldGroup) -> None:
        """A group's commits, on the commit thread: one group at a time, in log order, while the
        main thread goes on combining the next one and keeping the executors busy."""
        started = time.monotonic()
        loop.commit_folded(list(done.tables.values()), done.end, done.transactions, done.messages, done.skipped,
                           commit_time=done.commit_time)
        timings["committing"] += time.monotonic() - started

    handed_over: list[LogRange] = []

    def refused(fold: RangeFold) -> str | None:
        """Why ``fold`` cannot join the group (the driver path must apply it and everything after it), or
        None. Asked as each fold joins, not when the group commits: a group then never needs its ranges'
        messages again, and lets them go (a group of 1M changes held about 130 MB of them, twice over
        while the one before it committed: bench/RESULTS.md, 2026-12-07)."""
        tables = fold.folded
        return ((may_commit(list(tables)) if may_commit is not None and tables else None)
                or applier.hand_over_for_identity([*group.tables.values(), *tables]))

    def commit(*, wait: bool = False) -> None:
        """Hand the group to the commit thread (each of its folds was accepted as it joined)."""
        nonlocal group, in_flight
        if group:
            if in_flight is not None:
                in_flight.result()  # its error, if any, stops the run here, before a later group commits
            in_flight = committer.submit(write, group)
            group = FoldGroup()
            limits.clear()
            after_group()
        if wait and in_flight is not None:
            waited = in_flight
            in_flight = None
            waited.result()

    folded = 0
    timings = {"waiting for folds": 0.0, "combining": 0.0, "committing": 0.0, "folding (task time)": 0.0,
               "of it CPU": 0.0}
    clock = time.monotonic()
    try:
        with collect_between_groups():
            folds = fold_on_executors(spark, jobs()) if spark is not None else fold_in_process(jobs())
            for fold in folds:
                timings["waiting for folds"] += time.monotonic() - clock
                if survey is None and whole_source_first:  # nothing is used before the whole log is in order
                    survey = source.result()
                    log.info("survey of the log: %.1f s, %d ranges%s", source.seconds, len(survey.ranges),
                             f", a tail of {survey.tail.messages} messages for the driver" if survey.tail else "")
                timings["folding (task time)"] += fold.seconds
                timings["of it CPU"] += fold.cpu_seconds
                cut = given.pop(fold.index)
                if fold.error is not None:
                    log.warning("range %d of the log (from LSN %s) did not fold on an executor: %s; the driver "
                                "path takes over from there", fold.index, format_lsn(cut.first_lsn),
                                fold.error.splitlines()[0])
                    commit(wait=True)
                    handed_over.append(cut)
                    break
                folded += 1
                for t in fold.folded:
                    t.schema = schemas.setdefault((t.schema.relation.oid, t.schema.version), t.schema)
                # the group limits: a group that this fold would take past one is committed first, and
                # one that reached a limit at once (a range holds more only when one transaction does)
                why = refused(fold)
                if why is not None:
                    log.info("catch-up on executors ends at LSN %s: %s; the driver path takes over from there",
                             format_lsn(cut.first_lsn), why)
                    commit(wait=True)
                    handed_over.append(cut)
                    break
                fold_rows = sum(t.plan.size() for t in fold.folded)
                if not group.fits(fold) or limits.past(group, fold, cut, fold_rows):
                    commit()
                clock = time.monotonic()
                limits.joins(cut)
                group.add(fold)
                timings["combining"] += time.monotonic() - clock
                received += fold.transactions
                if limits.reached(group):
                    commit()
                if progress is not None and time.monotonic() - last_report >= progress_every:
                    last_report = time.monotonic()
                    where = f", {backlog.line(span[1] - cut.last_lsn)}" if backlog is not None and span else ""
                    fields = backlog.fields(span[1] - cut.last_lsn) if backlog is not None and span else \
                        {"task": "catch-up on executors"}
                    progress(ProgressReport(f"{folded} ranges folded on executors, {received} transactions, "
                                            f"at LSN {format_lsn(cut.last_lsn)}{where}",
                                            {**fields, "ranges_folded": folded, "transactions": received,
                                             "lsn": format_lsn(cut.last_lsn)}))
                clock = time.monotonic()
            commit(wait=True)
    finally:
        committer.shutdown(wait=True)
    if handed_over:
        source.stop()
        handed_over += sorted(given.values(), key=lambda r: r.index)
        handed_over += list(source.ranges())
    survey = source.result()  # no range at all, or the source failed (raised here)
    if survey.tail is not None:
        handed_over.append(survey.tail)
    log.info("folding and committing %s: %s", "on executors" if spark is not None else "on the driver",
             ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    # every group's commits exist: counted, and confirmed (with the catalog as at the end of the source
    # saved first, when the executors took all of it; else the driver path goes on from its own)
    loop.folded_applied(catalog=None if handed_over else survey.catalog)
    summary = ApplyStats.of(applier.stats, messages=survey.messages, ranges=folded)
    if handed_over:
        rest = drive(handed_over)  # the messages and ranges above count the whole source already
        rows = dict(summary.rows)
        for name, n in rest.rows.items():
            rows[name] = rows.get(name, 0) + n
        summary = replace(summary, transactions=summary.transactions + rest.transactions,
                          applied=summary.applied + rest.applied, rows=rows, tables=summary.tables | rest.tables,
                          last_end_lsn=rest.last_end_lsn if rest.last_end_lsn is not None else summary.last_end_lsn)
    return summary
