"""Replay of a stored raw log with decoding and folding on Spark's executors.

The driver path (applier.drivers.replay) sends every message through one Python thread. Here:

1. **Survey** (driver, one pass over the log's headers): the order check read_raw_log makes anyway,
   the catalog timeline (every Relation and Type message, decoded and applied in order) and the
   places where no transaction is open: no regular or two-phase transaction between its Begin and
   its Commit/Prepare, no streamed transaction between its first Stream Start and its Stream
   Commit/Abort, no prepared transaction waiting for its Commit/Rollback Prepared. The log is cut
   there into ranges of about ``partition_messages`` messages, each with the catalog as it stood at
   its start. A range therefore holds whole transactions, streamed and two-phase ones included.
2. **Fold** (executors, one task per range): the same feeder as the driver path (decode, assemble,
   convert, origin filter, configured skips) and the same per-table fold (applier.sink.engine's
   ``table_spec`` and ``fold_table``), leaving out what a table already applied (its end LSN, read
   by the driver before the run), gives per table one TablePlan for the range. The range is in
   memory whole, so the feeder takes its plain transactions (Begin, rows, Commit) the short way,
   without the assembler's buffer (``TransactionFeeder.feed_range``).
3. **Combine and commit** (driver, ranges in log order): consecutive ranges' plans are combined
   (applier.sink.combine, equal to folding the ranges in one pass) up to ``apply.max_group_rows``
   keys or ``apply.max_group_transactions`` transactions, then committed exactly as a group of the
   driver path is (same engines, same ``txn`` tag: the end LSN of the group's last transaction), so
   a crash anywhere and a re-run are exact.

What it does not do, it hands to the driver path, which is exact for everything: a log (or the
rest of one) with a range that failed on an executor (bad bytes, a value that does not convert: the
driver path then applies the transactions before the bad one and stops with the precise error), the
tail after the last place where nothing is open (a prepared transaction the log leaves waiting is
staged by the driver path, as always), and whole logs that need what only the driver path has:
history or change-feed tables (they need every change, not a fold), ``grouping: transaction``,
``--dry-run``, prepared transactions staged by an earlier run, or files whose rows are not in log
order (``eligibility`` says which).
"""

from __future__ import annotations

import logging
import pickle
import queue
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from applier.catalog import RelationCache, SchemaVersion
from applier.catalog.relations import ColumnsChanged
from applier.changes import OP_TRUNCATE, SkippedTransaction
from applier.config import ApplySettings, ReplayConfig, TablesSettings
from applier.errors import ApplierError, SinkError
from applier.infra.gcpolicy import after_group, collect_between_groups
from applier.infra.progress import Backlog, ProgressReport
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import decode_message
from applier.protocol.headers import IN_TRANSACTION_KINDS, RELATION, TYPE, kind_of
from applier.protocol.messages import LogicalMessage, Relation, Type
from applier.protocol.order import OpenTransactions
from applier.sink.combine import combine_plans
from applier.sink.engine import FoldedTable, fold_table, key_runs, table_spec
from applier.sink.plan import _NO_COLUMNS, KeyedRow, TablePlan
from applier.sources.rawlog import RawMessage, file_order_is_log_order, log_batches, read_file_rows
from applier.state import StateDir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from applier.drivers.replay import ReplaySummary
    from applier.loop import ApplyLoop

log = logging.getLogger(__name__)

#: One piece of a range: rows ``start:stop`` of one log file.
Segment = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class LogRange:
    """Consecutive messages of the log holding whole transactions, with the catalog at their start."""

    index: int
    segments: tuple[Segment, ...]
    catalog: dict[str, Any]
    messages: int
    first_lsn: int
    last_lsn: int
    relations: frozenset[tuple[str, str]] = frozenset()  # (namespace, name) described up to its end
    #: The messages themselves, (LSNs, datas), for a range read from a live stream (applier.drivers.backlog)
    #: rather than from log files: they travel to the executor inside its task.
    inline: tuple[list[int], list[bytes]] | None = None


@dataclass
class LogSurvey:
    """What the driver learns from one pass over the log's headers."""

    ranges: list[LogRange] = field(default_factory=list)
    tail: LogRange | None = None  # after the last place where nothing is open: the driver path's
    catalog: RelationCache = field(default_factory=RelationCache)  # as at the end of the log
    relations: set[tuple[str, str]] = field(default_factory=set)  # every (namespace, name) described
    messages: int = 0
    #: LSN of the first Relation that renames a relation or gives a name another relation had: folds are
    #: made by name, so from there on the driver path, which meets the names in log order, takes over
    identity_change_lsn: int | None = None
    oids_by_name: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FoldJob:
    """What an executor needs to fold one range: everything is in it (no session, no state dir)."""

    range: LogRange
    apply: ApplySettings
    tables: TablesSettings
    paths: dict[tuple[str, str], str]
    done: dict[str, int]  # table path -> end LSN it has applied


@dataclass
class RangeFold:
    """An executor's result for one range."""

    index: int
    folded: list[FoldedTable] = field(default_factory=list)
    transactions: int = 0
    last_end_lsn: int | None = None
    messages: list[tuple[int, LogicalMessage]] = field(default_factory=list)
    skipped: list[SkippedTransaction] = field(default_factory=list)
    error: str | None = None  # the range failed: the driver path takes over from its start
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of the task's process: below ``seconds`` when the task waited for a CPU


# -- eligibility -------------------------------------------------------------------------------------


def eligibility(config: ReplayConfig, state: StateDir) -> str | None:
    """None when the log may be replayed on executors; otherwise the reason it takes the driver path."""
    return folds_unfit(config.apply, config.tables, state) or file_order_is_log_order(config.source_log)


def folds_unfit(apply: ApplySettings, tables: TablesSettings, state: StateDir) -> str | None:
    """Why folds made on executors cannot stand for these settings and this state (replay and the
    mirror's catch-up alike), or None."""
    if apply.grouping == "transaction":
        return "apply.grouping is 'transaction' (one commit per source transaction)"
    if any(rule.history or rule.changes for rule in tables.rules):
        return "history or change-feed tables need every change, not a fold"
    from applier.assembly.staging import PreparedStore

    if PreparedStore(state.staging_dir).gids():
        return "prepared transactions staged by an earlier run wait for their Commit Prepared"
    return None


def log_messages(path: str) -> int:
    """The number of messages in the log, from the files' footers (no data read)."""
    from applier.sources.rawlog import log_message_count

    return log_message_count(path)


# -- 1. survey -----------------------------------------------------------------------------------------

_CATALOG = frozenset((RELATION, TYPE))  # messages the survey decodes, to follow the catalog


class Surveyor:
    """The survey's view of the message sequence, one message at a time: the order check, the catalog
    and what is open (see the module). Shared by the survey of a stored log and the catch-up of a live
    stream (applier.drivers.backlog)."""

    def __init__(self, catalog_json: dict[str, Any] | None, columns_changed: ColumnsChanged | None = None) -> None:
        self.survey = LogSurvey(catalog=RelationCache.from_json(catalog_json) if catalog_json else RelationCache())
        # the survey meets every Relation in log order on the driver: it tells the identity layer which
        # columns were renamed or dropped (executors fold by the Relations they see, and tell nobody)
        self.survey.catalog.columns_changed = columns_changed
        self.survey.relations = {(v["namespace"] or "pg_catalog", v["name"])
                                 for v in (catalog_json or {}).get("relations", [])}
        self.survey.oids_by_name = {(v["namespace"] or "pg_catalog", v["name"]): int(v["oid"])
                                    for v in (catalog_json or {}).get("relations", [])}
        self.open = OpenTransactions()  # the order check and what is open (applier.protocol.order)

    def add(self, lsn: int, data: bytes) -> None:
        """Check one message's place and follow what it opens, closes or describes (raises on disorder)."""
        open_ = self.open
        if problems := open_.add(lsn, data):
            raise problems[0].error()
        if open_.last_kind in _CATALOG:  # the catalog moves on
            _follow_catalog(self.survey, data, open_.in_stream, lsn)

    def nothing_open(self) -> bool:
        """Nothing open, and no rename or reused name met (ranges after one are the driver path's)."""
        return self.open.nothing_open() and self.survey.identity_change_lsn is None

    def may_cut_after(self, data: bytes) -> bool:
        """Whether a range may end with the message just added: one that ends something, with nothing
        left open."""
        return bool(data) and kind_of(data) not in IN_TRANSACTION_KINDS and self.nothing_open()

    def cut(self, index: int, segments: tuple[Segment, ...], start_catalog: dict[str, Any], messages: int,
            first_lsn: int, last_lsn: int, inline: tuple[list[int], list[bytes]] | None = None) -> LogRange:
        return LogRange(index, segments, start_catalog, messages, first_lsn, last_lsn,
                        frozenset(self.survey.relations), inline)


def survey_log(path: str, catalog_json: dict[str, Any] | None, *, partition_messages: int,
               on_range: Callable[[LogRange], None] | None = None,
               columns_changed: ColumnsChanged | None = None) -> LogSurvey:
    """Order-check the whole log (as read_raw_log does), follow the catalog, and cut it into ranges
    (each handed to ``on_range`` as soon as it is cut, the last one included, not the tail)."""
    surveyor = Surveyor(catalog_json, columns_changed)
    survey = surveyor.survey
    add = surveyor.add
    segments: list[Segment] = []
    start_catalog = survey.catalog.to_json()
    first_lsn = last_lsn = 0
    in_range = 0  # messages in the range being built
    index = 0  # position of the message in the log
    for batch, file, first in log_batches(path):
        lsns = batch.column(0).to_pylist()
        if pa.types.is_string(batch.column(0).type) or pa.types.is_large_string(batch.column(0).type):
            lsns = [None if v is None else parse_lsn(v) for v in lsns]
        datas = batch.column(2).to_pylist()
        n = len(datas)
        seg_start = first  # rows of this batch already given to a range
        for i in range(n):
            lsn, data = lsns[i], datas[i]
            if lsn is None or data is None:
                raise _row_error(file, first + i)
            try:
                add(lsn, data)
            except ApplierError as err:
                err.add_context(path=str(path))
                raise
            if in_range == 0:
                first_lsn = lsn
            in_range += 1
            last_lsn = lsn
            if in_range >= partition_messages and surveyor.may_cut_after(data):
                segments.append((str(file), seg_start, first + i + 1))
                seg_start = first + i + 1
                cut = surveyor.cut(len(survey.ranges), tuple(_merged(segments)), start_catalog, in_range, first_lsn,
                                   last_lsn)
                survey.ranges.append(cut)
                if on_range is not None:
                    on_range(cut)
                segments, in_range = [], 0
                start_catalog = survey.catalog.to_json()
        index += n
        if seg_start < first + n:
            segments.append((str(file), seg_start, first + n))
    survey.messages = index
    if in_range:
        tail = surveyor.cut(len(survey.ranges), tuple(_merged(segments)), start_catalog, in_range, first_lsn,
                            last_lsn)
        if surveyor.nothing_open():
            survey.ranges.append(tail)
            if on_range is not None:
                on_range(tail)
        else:
            survey.tail = tail
    return survey


def _follow_catalog(survey: LogSurvey, data: bytes, in_stream: bool, lsn: int) -> None:
    try:
        msg = decode_message(data, in_stream=in_stream)
    except ApplierError:
        return  # the range holding it fails to decode it too, and the driver path reports it
    if isinstance(msg, Relation):
        name = (msg.namespace or "pg_catalog", msg.name)
        renamed = msg.oid in survey.catalog and survey.catalog.get(msg.oid).qualified_name != ".".join(name)
        if (renamed or survey.oids_by_name.get(name, msg.oid) != msg.oid) and survey.identity_change_lsn is None:
            survey.identity_change_lsn = lsn
        survey.oids_by_name[name] = msg.oid
        survey.catalog.update(msg)
        survey.relations.add(name)
    elif isinstance(msg, Type):
        survey.catalog.update_type(msg)


class BackgroundSurvey:
    """survey_log on a thread of its own, so that executors fold the first ranges while the rest of
    the log is surveyed. Nothing may be committed before :meth:`result` returns: only then is the
    whole log known to be in order."""

    def __init__(self, path: str, catalog_json: dict[str, Any] | None, *, partition_messages: int,
                 columns_changed: ColumnsChanged | None = None) -> None:
        self._cut: queue.SimpleQueue[LogRange | None] = queue.SimpleQueue()
        self._survey: LogSurvey | None = None
        self._error: BaseException | None = None
        self._ended = False  # the queue's end was taken
        self.seconds = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                self._survey = survey_log(path, catalog_json, partition_messages=partition_messages,
                                          columns_changed=columns_changed,
                                          on_range=self._cut.put)
            except BaseException as e:  # noqa: BLE001  # handed to the caller's thread by result()
                self._error = e
            finally:
                self.seconds = time.monotonic() - started
                self._cut.put(None)

        self._thread = threading.Thread(target=run, name="applier-survey", daemon=True)
        self._thread.start()

    def ranges(self) -> Iterator[LogRange]:
        """The ranges as they are cut and not yet taken (stops early when the survey fails: result()
        raises why)."""
        while not self._ended and (cut := self._cut.get()) is not None:
            yield cut
        self._ended = True

    def stop(self) -> None:
        """A stored log is surveyed to its end anyway (its order check covers all of it)."""

    def result(self) -> LogSurvey:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._survey is not None
        return self._survey


def _merged(segments: list[Segment]) -> Iterator[Segment]:
    """Adjacent pieces of one file as one."""
    current: Segment | None = None
    for file, start, stop in segments:
        if current is not None and current[0] == file and current[2] == start:
            current = (file, current[1], stop)
            continue
        if current is not None:
            yield current
        current = (file, start, stop)
    if current is not None:
        yield current


def _row_error(file: object, row: int) -> ApplierError:
    from applier.errors import SourceError

    return SourceError("raw log row has a NULL lsn, xid or data", path=str(file), row=row)


def range_messages(log_range: LogRange) -> Iterator[RawMessage]:
    if log_range.inline is not None:
        for lsn, data in zip(*log_range.inline, strict=True):
            yield RawMessage(lsn, None, data)  # type: ignore[arg-type]  # a live stream has no xid column
        return
    for file, start, stop in log_range.segments:
        yield from read_file_rows(file, start, stop)


def range_columns(log_range: LogRange) -> tuple[Sequence[int], Sequence[int | None] | None, Sequence[bytes]]:
    """A range's messages as columns (lsns, xids or None for a live stream's, datas), in memory: a
    range is at most ``partition_messages`` long, and the fold looks ahead to each Commit."""
    if log_range.inline is not None:
        return log_range.inline[0], None, log_range.inline[1]
    rows = list(range_messages(log_range))
    return [r.lsn for r in rows], [r.xid for r in rows], [r.data for r in rows]


# -- 2. fold (on an executor) --------------------------------------------------------------------


def fold_range(job: FoldJob) -> RangeFold:
    """Decode, assemble and fold one range, exactly as the driver path would (see the module)."""
    from applier.assembly.feeder import TransactionFeeder
    from applier.protocol.decoder import MessageDecoder

    started, cpu_started = time.monotonic(), time.process_time()
    result = RangeFold(job.range.index)
    scratch = tempfile.mkdtemp(prefix="applier-fold-")
    try:
        feeder = TransactionFeeder.from_state(StateDir(scratch), job.apply, catalog_json=job.range.catalog,
                                              check_order=False)
        feeder.messages = result.messages
        feeder.skipped = result.skipped
        decoder = MessageDecoder()
        per_path: dict[str, list[Any]] = {}
        truncate_error = job.apply.truncate == "error"
        tables = job.tables
        lsns, xids, datas = range_columns(job.range)
        for txn, batches in feeder.feed_range(decoder, lsns, xids, datas):
            result.transactions += 1
            result.last_end_lsn = txn.end_lsn
            for batch in batches:
                qualified = batch.qualified_name
                if not tables.selected(qualified):
                    continue
                if truncate_error and any(c.op == OP_TRUNCATE for c in batch.changes):
                    raise SinkError("TRUNCATE received and apply.truncate is 'error'", table=qualified,
                                    end_lsn=txn.end_lsn)
                path = job.paths[(batch.namespace, batch.name)]
                done = job.done.get(path)
                if done is None or txn.end_lsn > done:
                    per_path.setdefault(path, []).append(batch)
            feeder.assembler.release(txn)
            feeder.applied(txn)
        types = feeder.types
        for path, batches in per_path.items():
            if len(key_runs(list(enumerate(batches)), tables)) > 1:
                raise SinkError("the table's merge key changes inside this range (a key added or dropped, "
                                "REPLICA IDENTITY set to or from FULL): it is folded on the driver, one part "
                                "per key", table=batches[-1].qualified_name)
            spec = table_spec(batches[-1], tables, types)
            result.folded.append(FoldedTable(path, spec, batches[-1].schema, fold_table(spec, batches)))
    except ApplierError as e:
        result = RangeFold(job.range.index, error=str(e))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.seconds = time.monotonic() - started
    result.cpu_seconds = time.process_time() - cpu_started
    return result


def _fold_pickled(job: FoldJob) -> bytes:
    """The task: a range's fold, pickled for the driver, with the automatic garbage collector off as in
    the driver path's loop (applier.infra.gcpolicy: it would scan the range's objects again and again)."""
    with collect_between_groups():
        fold = fold_range(job)
        packed = [(t.path, t.spec, t.schema, _packed(t.plan)) for t in fold.folded]
        fold.folded = []
        payload = pickle.dumps((fold, packed), protocol=pickle.HIGHEST_PROTOCOL)
        del fold, packed
        after_group()
    return payload


def _unpickled(payload: bytes) -> RangeFold:
    fold, packed = pickle.loads(payload)
    fold.folded = [FoldedTable(path, spec, schema, _unpacked(plan)) for path, spec, schema, plan in packed]
    assert isinstance(fold, RangeFold)
    return fold


def _packed(plan: TablePlan) -> tuple[Any, ...]:
    """A plan as lists and tuples: pickled ten times faster than its KeyedRow objects (a fold of a
    range holds one per key), which made (un)pickling a third of the work."""
    keyed = plan.keyed
    rows = [e.row for e in keyed.values()]
    special = [(i, e.unresolved, e.lookup_key) for i, e in enumerate(keyed.values())
               if e.unresolved or e.lookup_key is not None]
    plan_fields = (plan.columns, plan.key_positions, plan.truncated, plan.restart_identity, plan.cascade,
                   plan.counts, plan.images, plan.changes, plan.soft_delete, plan.external)
    return plan_fields, list(keyed), rows, special


def _unpacked(packed: tuple[Any, ...]) -> TablePlan:
    plan_fields, keys, rows, special = packed
    columns, key_positions, truncated, restart_identity, cascade, counts, images, changes, soft, external = plan_fields
    plan = TablePlan(columns, key_positions, truncated, restart_identity, cascade, counts=counts, images=images,
                     changes=changes, soft_delete=soft, external=external)
    entries = [KeyedRow(row, _NO_COLUMNS, None) for row in rows]
    for i, unresolved, lookup in special:
        entries[i] = KeyedRow(rows[i], unresolved, lookup)
    plan.keyed = dict(zip(keys, entries, strict=True))
    return plan


def _collect(iterator: Iterable[bytes]) -> list[bytes]:
    return list(iterator)


# -- 3. combine and commit (driver) --------------------------------------------------------------


def fold_on_executors(spark: SparkSession, jobs: Iterable[FoldJob]) -> Iterator[RangeFold]:
    """The folds of ``jobs`` in their order. Each range is a Spark job of one task; ``defaultParallelism
    + 1`` of them are in flight at a time, so every core stays busy while the caller combines and
    commits, and the driver holds at most that many results it has not used yet. ``jobs`` is read
    as the ranges are needed (they may still be being cut)."""
    sc = spark.sparkContext
    depth = max(1, sc.defaultParallelism) + 1
    upcoming = iter(jobs)
    with ThreadPoolExecutor(depth, thread_name_prefix="applier-fold") as pool:
        pending: deque[Future[list[bytes]]] = deque()

        def submit() -> None:
            job = next(upcoming, None)
            if job is not None:
                rdd = sc.parallelize([job], 1).map(_fold_pickled)
                pending.append(pool.submit(sc.runJob, rdd, _collect, [0]))

        for _ in range(depth):
            submit()
        while pending:
            (payload,) = pending.popleft().result()
            submit()
            yield _unpickled(payload)


class _Group:
    """Combined folds of consecutive ranges, per table, waiting for their commit."""

    def __init__(self) -> None:
        self.tables: dict[str, FoldedTable] = {}
        self.transactions = 0
        self.end: int | None = None
        self.messages: list[tuple[int, LogicalMessage]] = []
        self.skipped: list[SkippedTransaction] = []
        self.ranges: list[LogRange] = []

    def fits(self, fold: RangeFold) -> bool:
        """Whether ``fold`` can join: the same table layouts (a schema change commits in between)."""
        for t in fold.folded:
            mine = self.tables.get(t.path)
            if mine is not None and (mine.spec != t.spec or mine.schema.version != t.schema.version):
                return False
        return True

    def add(self, fold: RangeFold, cut: LogRange) -> None:
        self.ranges.append(cut)
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
        self.end = fold.last_end_lsn if fold.last_end_lsn is not None else self.end
        self.messages += fold.messages
        self.skipped += fold.skipped

    def size(self) -> int:
        return sum(len(t.plan.keyed) + len(t.plan.counts) for t in self.tables.values())

    def __bool__(self) -> bool:
        return self.end is not None or bool(self.skipped) or bool(self.messages)


class RangeSource(Protocol):
    """Where the ranges come from: the survey of a stored log (BackgroundSurvey) or a live stream read
    up to a position (applier.drivers.backlog.StreamRanges)."""

    seconds: float

    def ranges(self) -> Iterator[LogRange]:
        """The ranges as they are cut; ends early when the source fails (``result`` raises why)."""
        ...

    def stop(self) -> None:
        """No more ranges are wanted: what is not cut yet becomes the tail."""
        ...

    def result(self) -> LogSurvey:
        """Waits for the source to end; its survey (tail, catalog, message count)."""
        ...


#: Asked before a group commits, with its folded tables: None to commit it, or why the driver path
#: must apply it and everything after it (the mirror: a table to copy first, a column added).
MayCommit = Callable[[list[FoldedTable]], str | None]


def replay_on_executors(spark: SparkSession, config: ReplayConfig, loop: ApplyLoop, surveying: RangeSource,
                        *, progress: Callable[[str], None] | None, progress_every: float,
                        drive: Callable[[list[LogRange]], ReplaySummary]) -> ReplaySummary:
    """A stored log: nothing is committed before the whole log is known to be in order."""
    return fold_and_commit(spark, config.apply, config.tables, loop, surveying, progress=progress,
                           progress_every=progress_every, drive=drive, whole_source_first=True)


def fold_and_commit(spark: SparkSession, apply: ApplySettings, tables: TablesSettings, loop: ApplyLoop,
                    source: RangeSource, *, progress: Callable[[str], None] | None, progress_every: float,
                    drive: Callable[[list[LogRange]], ReplaySummary], whole_source_first: bool,
                    may_commit: MayCommit | None = None, span: tuple[int, int] | None = None) -> ReplaySummary:
    """Steps 2 and 3 while step 1 goes on; ``drive(ranges)`` replays ranges on the driver path, from the
    catalog at the first one's start (the tail, or everything from a range an executor could not fold
    or a group ``may_commit`` refused). ``whole_source_first``: wait for the source to end before the
    first commit (a stored log's order check covers all of it); a live stream commits as it goes,
    like the driver path. ``span``: the backlog's first and last LSN, for a done fraction and an ETA
    in the progress lines."""
    from applier.drivers.replay import ReplaySummary
    from applier.sink.messages import record_messages

    applier = loop.applier
    state = loop.state
    skip = sorted({*apply.skip_transactions, *(state.load("skipped") or [])}, key=parse_lsn)
    settings = apply.model_copy(update={"skip_transactions": skip})
    paths: dict[tuple[str, str], str] = {}
    done: dict[str, int] = {}
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
            given[cut.index] = cut
            yield FoldJob(cut, settings, tables, dict(paths), dict(done))

    survey: LogSurvey | None = None
    schemas: dict[tuple[int, int], SchemaVersion] = {}  # one object per schema version (_ensure compares identity)
    group = _Group()
    last_report = time.monotonic()
    received = 0
    backlog = Backlog(span[1] - span[0]) if span is not None else None

    committer = ThreadPoolExecutor(1, thread_name_prefix="applier-commit")
    in_flight: Future[None] | None = None

    def write(done: _Group) -> None:
        """A group's commits, on the commit thread: one group at a time, in log order, while the
        main thread goes on combining the next one and keeping the executors busy."""
        started = time.monotonic()
        if done.end is not None:
            applier.apply_folded(list(done.tables.values()), done.end, done.transactions)
            if apply.messages_table and done.messages:
                record_messages(spark, apply.messages_table, done.messages, done.end)
        loop._record_skips(done.skipped)
        timings["committing"] += time.monotonic() - started

    handed_over: list[LogRange] = []

    def commit(*, wait: bool = False) -> bool:
        """Hand the group to the commit thread; False when ``may_commit`` refused it (its ranges are
        then handed over to the driver path)."""
        nonlocal group, in_flight
        if group:
            why = ((may_commit(list(group.tables.values())) if may_commit is not None else None)
                   or applier.hand_over_for_identity(list(group.tables.values())))
            if why is not None:
                log.info("catch-up on executors ends at LSN %s: %s; the driver path takes over from there",
                         format_lsn(group.ranges[0].first_lsn), why)
                handed_over.extend(group.ranges)
                group = _Group()
                wait = True
            else:
                if in_flight is not None:
                    in_flight.result()  # its error, if any, stops the run here, before a later group commits
                in_flight = committer.submit(write, group)
                group = _Group()
                after_group()
        if wait and in_flight is not None:
            waited = in_flight
            in_flight = None
            waited.result()
        return not handed_over

    folded = 0
    timings = {"waiting for executors": 0.0, "combining": 0.0, "committing": 0.0, "folding (task time)": 0.0,
               "of it CPU": 0.0}
    clock = time.monotonic()
    try:
        with collect_between_groups():
            for fold in fold_on_executors(spark, jobs()):
                timings["waiting for executors"] += time.monotonic() - clock
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
                if not group.fits(fold) and not commit():
                    handed_over.append(cut)
                    break
                clock = time.monotonic()
                group.add(fold, cut)
                timings["combining"] += time.monotonic() - clock
                received += fold.transactions
                if (group.size() >= apply.max_group_rows or group.transactions >= apply.max_group_transactions) \
                        and not commit():
                    break
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
    log.info("folding and committing on executors: %s", ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    stats = applier.stats
    summary = ReplaySummary(messages=survey.messages, transactions=stats.transactions, applied=stats.applied,
                            rows=dict(stats.rows), tables=set(stats.tables), last_end_lsn=stats.last_end_lsn,
                            ranges=folded)
    if handed_over:
        rest = drive(handed_over)
        summary.transactions += rest.transactions
        summary.applied += rest.applied
        for name, n in rest.rows.items():
            summary.rows[name] = summary.rows.get(name, 0) + n
        summary.tables |= rest.tables
        summary.last_end_lsn = rest.last_end_lsn if rest.last_end_lsn is not None else summary.last_end_lsn
    else:
        state.save("catalog", survey.catalog.to_json())
    summary.already_applied = summary.transactions - summary.applied
    return summary
