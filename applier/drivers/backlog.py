"""Catching up a large backlog of a live slot on Spark's executors.

A mirror that starts far behind its slot (after downtime, or after a bulk load) would spend the
catch-up in one Python thread decoding and folding every message (about 115 k changes/s on the
standard machine) while the executors wait. Here the backlog is read as ``replay`` reads a large
stored log (applier.drivers.executors), from the stream itself:

1. A thread of the driver reads the stream and surveys each message (order check, catalog, what is
   open: applier.drivers.executors.survey.Surveyor), cutting it into ranges of about
   ``distributed.partition_messages`` messages where no transaction is open. A range carries its
   messages (``LogRange.inline``): nothing is written to disk, and at most a few ranges wait.
2. Executors decode, assemble and fold the ranges; the driver combines their folds and commits them
   in order, as groups, while the thread reads on (``fold_and_commit``; a live stream commits as it
   goes, like the driver path).
3. The catch-up ends at the first cut at or past the server's flush position when it began (or when
   the walsender says it sent that far, or the stream goes quiet). What follows the last cut (a
   transaction still open there) is fed to the one apply loop, which goes on following the same
   stream; so does everything from a group that needs the driver path (a table that joined the
   publication, a column added: table sync copies it first) or a range an executor could not fold.

The slot is confirmed only after the catch-up's commits exist, to the end of the last transaction
they hold (every cut is a place where nothing is open, so nothing before it is needed again). A
crash before re-sends the backlog, and each table recognises what it applied by the end LSN its
Delta commits record, exactly as on the driver path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from applier.catalog import RelationCache
from applier.catalog.relations import ColumnsChanged
from applier.config import MirrorConfig
from applier.drivers.executors.commit import MayCommit, fold_and_commit
from applier.drivers.executors.eligibility import folds_unfit
from applier.drivers.executors.ranges import LogRange, range_messages
from applier.drivers.executors.survey import NO_LIMIT, LogSurvey, Surveyor
from applier.infra.progress import Progress
from applier.loop import ApplyLoop, ApplyStats
from applier.lsn import format_lsn
from applier.protocol.replication import PrimaryKeepalive
from applier.spark.session import SparkLike, session_of

log = logging.getLogger(__name__)

#: How long the reader lets frames pile up in the socket when it has read all the socket held
#: (WalSenderStream.read_message): it then waits on the socket only when the walsender has been quiet
#: that long, instead of being woken for every frame the walsender sends (which cost both of them
#: CPU: bench/stream_read.py, bench/RESULTS.md).
GATHER_SECONDS = 0.001

#: Frames the reader takes from libpq's buffer in one call (WalSenderStream.read_buffered).
READ_AT_ONCE = 4096

#: A position no message reaches: the survey's runs need not stop for a cut once the target is reached.
_NO_TARGET = 1 << 64

#: A catch-up's last ranges are no shorter than ``distributed.partition_messages`` over this
TAIL_DIVISOR = 16

#: Messages read past the target to finish a transaction open there (StreamRanges._read)
FINISH_AT_MOST = 10_000

#: What a message read and held costs beyond its bytes (the bytes object, its LSN, two list slots), for
#: StreamRanges' ``range_bytes``
MESSAGE_OVERHEAD = 80

#: The share of ``apply.memory_budget_mb`` one range may hold (StreamRanges ``range_bytes``): the reader,
#: the ranges waiting (``queued``) and the one being folded then hold about the budget together.
RANGE_BUDGET_DIVISOR = 6

#: A round of a follower (StreamRanges ``until``) ends once the stream has been quiet this long with no
#: transaction open: the load has stopped, and what was read is committed at once. Under pgbench's load a
#: frame comes every fraction of a millisecond, but on a busy machine the walsender can be off a core for
#: that long: such a round only ends early, and the next one starts at once (ReplicationFollower).
#: Inside an open transaction the rest is surely coming: the quiet then is ``OPEN_QUIET_SECONDS``.
FOLLOW_QUIET_SECONDS = 0.02

#: How long the stream is quiet before a catch-up ends with a transaction open (its tail then goes to
#: the apply loop, which costs a group of its own).
OPEN_QUIET_SECONDS = 0.5


class BacklogStream(Protocol):
    """What a catch-up reads: a started walsender (applier.sources.walsender.WalSenderStream) or, before the
    walsender starts, a temporary copy of the slot read through SQL (applier.sources.slotcopy)."""

    def read_message(self, timeout: float, *, gather: float = 0.0) -> tuple[int, bytes] | PrimaryKeepalive | None:
        ...

    def read_buffered(self, lsns: list[int], datas: list[bytes], limit: int) -> PrimaryKeepalive | None: ...

    def hot_reader(self) -> AbstractContextManager[None]: ...

    def keep_alive(self) -> None: ...

    def reading_note(self) -> str:
        """How the reading went, for the catch-up's line."""
        ...


class StreamRanges:
    """The backlog of a started stream, surveyed and cut into ranges on a thread of its own (a
    ``RangeSource`` for fold_and_commit). It ends at the first cut at or past ``target``, when a
    keepalive says the walsender sent that far, when nothing arrives for ``quiet_seconds``, or on
    ``stop()``; what is not cut then is the tail. The stream is the thread's until ``result()``.

    ``until`` (a ``time.monotonic()`` instant; a follower's round): ``target`` is not looked at; the
    reading goes on as messages arrive, and ends at the first cut once that instant has passed, or when
    the stream has been quiet for ``quiet_seconds`` with no transaction open (``OPEN_QUIET_SECONDS``
    with one open). A round that read to the server's position when it began, and then waited out its
    pace, left what arrived meanwhile to the next round: after a busy period the last of it was applied
    a pace step, a reading and a commit after the load stopped (bench/follow.py's drain). Read as it
    arrives, it is folded and committed once the stream goes quiet.

    ``range_bytes`` bounds what one range holds (its messages' bytes, ``MESSAGE_OVERHEAD`` each more): a
    range that reaches it is cut at the next end of a transaction, like one of ``partition_messages``; and
    when twice that is read with the transaction still open, the reading ends there and what was read
    becomes the tail (``handed_over``). Such a transaction is larger than a range may be: the apply loop
    takes it, and applies it in pieces within ``apply.memory_budget_mb`` (applier.assembly) as it goes on
    reading the same stream, where a range would have held it whole (a 3M-row UPDATE in a catch-up at the
    start: 2.3 GB, issue 77).

    The group limits (issue 74): a range ends right after its ``max_transactions``-th committed
    transaction, and a range that reaches ``partition_messages`` messages (a caller passes at most
    ``apply.max_group_rows``: a message holds one row change at most) or ``group_bytes`` (as
    ``range_bytes``) inside a transaction ends just before that transaction's Begin when it can
    (``Surveyor.earlier_cut``), else at its end; so fold_and_commit can keep every group within
    ``apply.max_group_*``, but for a transaction larger alone."""

    def __init__(self, stream: BacklogStream, catalog_json: dict[str, Any] | None, *, partition_messages: int,
                 target: int, queued: int = 3, quiet_seconds: float = OPEN_QUIET_SECONDS,
                 until: float | None = None,
                 columns_changed: ColumnsChanged | None = None, range_bytes: int | None = None,
                 max_transactions: int | None = None, group_bytes: int | None = None) -> None:
        self.stream = stream
        self.surveyor = Surveyor(catalog_json, columns_changed)
        self.partition_messages = partition_messages
        self.range_bytes = range_bytes if range_bytes is not None else NO_LIMIT
        self.max_transactions = max_transactions if max_transactions is not None else NO_LIMIT
        self.cut_bytes = min(self.range_bytes, group_bytes if group_bytes is not None else NO_LIMIT)
        self.handed_over: int | None = None  # the bytes held when an open transaction ended the reading
        self.target = target
        self.until = until
        self.quiet_seconds = quiet_seconds
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # of the reading thread (the rest of ``seconds`` it waited for the walsender or room)
        self._cut: queue.Queue[LogRange | None] = queue.Queue(maxsize=queued)  # bounds the driver's memory
        self._stop = threading.Event()
        self._abandoned = threading.Event()
        self._error: BaseException | None = None
        self._ended = False  # the queue's end was taken
        self._thread = threading.Thread(target=self._run, name="applier-backlog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            with self.stream.hot_reader():  # then the heartbeat answers the walsender while executors commit
                self._read()
        except BaseException as e:  # noqa: BLE001  # handed to the caller's thread by result()
            self._error = e
        finally:
            self.seconds = time.monotonic() - started
            self.cpu_seconds = time.thread_time()
            self._put(None)

    def _read(self) -> None:
        surveyor, stream, until = self.surveyor, self.stream, self.until
        target = self.target if until is None else _NO_TARGET
        survey = surveyor.survey
        add, add_run, may_cut_after = surveyor.add, surveyor.add_run, surveyor.may_cut_after
        checker = surveyor.open.checker
        lsns: list[int] = []
        datas: list[bytes] = []
        start_catalog = survey.catalog.to_json()
        index = messages = 0
        read, buffered, stopped = stream.read_message, stream.read_buffered, self._stop.is_set
        quiet = self.quiet_seconds
        open_quiet = max(quiet, OPEN_QUIET_SECONDS) if until is not None else quiet  # (a round's)
        nothing_open = surveyor.nothing_open
        reached = False
        range_bytes, cut_bytes, partition = self.range_bytes, self.cut_bytes, self.partition_messages
        held = 0  # what the messages read and not yet cut hold (``range_bytes``)
        most_ended = self.max_transactions
        stop_ended = most_ended  # ``surveyor.ended`` at the range's last transaction
        base = 0  # the row (``checker.rows``) of the range's first message
        earlier = True  # an earlier cut (Surveyor.earlier_cut) not yet tried for the range: once is enough
        # A catch-up's last ranges shrink: each range from the second on ends at half the way left to the
        # target (at least ``smallest`` messages), so that the fold of the last one, which nothing overlaps,
        # is short. With full ranges the last one's fold began when the reading ended: a quarter of the
        # 1M catch-up's time after it (bench/RESULTS.md, thirty-seventh session).
        smallest = max(1, partition // TAIL_DIVISOR)
        halfway = _NO_TARGET  # the current range's cut, past ``smallest`` messages (the first range: none)
        # Quiet is counted from the last message, not the last frame: keepalives keep coming while nothing
        # of ours does. The walsender sends one each time it waits for WAL while our confirmed position is
        # behind what it sent (a round confirms only after its commits), so any WAL written meanwhile (an
        # autovacuum after the load, other tables and databases) woke it with another: a round that should
        # have ended 20 ms after the load's last transaction read on for its whole second (bench/follow.py:
        # drains of 1.1 s after the first short load, bench/RESULTS.md, thirty-sixth session).
        last_message = time.monotonic()
        extra = 0  # messages read past the target to finish what is open there
        while not stopped():
            new = len(lsns)
            if reached:
                # Past the target, a transaction open at the end of what was read is read to its end when it
                # comes at once (its frames are usually already sent; at most FINISH_AT_MOST of them): a tail
                # fed to the apply loop becomes a group of its own, and costs a commit as large as a range's.
                if not lsns or extra >= FINISH_AT_MOST or nothing_open():
                    break
                frame = read(open_quiet)
                if frame is None:
                    break
                if isinstance(frame, PrimaryKeepalive):
                    continue
                lsns.append(frame[0])
                datas.append(frame[1])
                extra += 1
                keepalive = None
            else:
                if until is not None and time.monotonic() >= until:
                    target, until = 0, None  # the round's time is up: a cut at the next end of a transaction
                keepalive = buffered(lsns, datas, READ_AT_ONCE)  # the frames libpq holds, in one loop
                if len(lsns) == new:  # no message in libpq's buffer
                    wait = (quiet if nothing_open() else open_quiet) - (time.monotonic() - last_message)
                    if wait <= 0:
                        break  # quiet (keepalives only): the backlog is read
                    if keepalive is None:  # nothing at all: wait for the socket, up to the quiet's end
                        frame = read(wait, gather=GATHER_SECONDS)
                        if frame is None:
                            break  # quiet: the backlog is read
                        if isinstance(frame, PrimaryKeepalive):
                            keepalive = frame
                        else:
                            lsns.append(frame[0])
                            datas.append(frame[1])
            if len(lsns) > new:
                last_message = time.monotonic()
                held += sum(map(len, datas[new:])) + MESSAGE_OVERHEAD * (len(lsns) - new)
            k, end = new, len(lsns)
            while k < end:  # each new message: its place checked, the catalog followed, a cut after it?
                # in runs (Surveyor.add_run) up to where a cut may come: the range's size or its last
                # transaction reached, or a message at the target; past the size, one at a time to the end
                # of its transaction. Past the target (``reached``: what was read with the last of it), the
                # size and the transactions still cut.
                if held >= cut_bytes or k + 1 >= partition:
                    after = k + 1
                    add(lsns[k], datas[k])
                elif reached:
                    after = add_run(lsns, datas, k, min(end, partition), _NO_TARGET, stop_ended)
                elif k + 1 < smallest:
                    after = add_run(lsns, datas, k, min(end, smallest), target, stop_ended)
                else:
                    after = add_run(lsns, datas, k, min(end, partition), min(target, halfway), stop_ended)
                messages += after - k
                k = after
                lsn, data = lsns[k - 1], datas[k - 1]
                full = k >= partition or held >= cut_bytes
                if not (full or surveyor.ended >= stop_ended
                        or (not reached and (lsn >= target or (k >= smallest and lsn >= halfway)))):
                    continue
                before = None
                if may_cut_after(data):
                    at = k  # the range ends here
                elif full and earlier and (before := surveyor.earlier_cut(base)) is not None \
                        and surveyor.may_end_with(datas[before[0] - base - 1]):
                    at = before[0] - base  # before the transaction open: it starts the next range
                else:
                    earlier = earlier and not full
                    continue  # on to the end of what is open
                left = sum(map(len, datas[at:])) + MESSAGE_OVERHEAD * (len(datas) - at)
                self._put(surveyor.cut(index, (), start_catalog, at, lsns[0], lsns[at - 1], (lsns[:at], datas[:at]),
                                       size=held - left - MESSAGE_OVERHEAD * at))
                last_message = time.monotonic()  # a wait for room (slow folds) is not the stream's quiet
                index += 1
                # what was read past the cut starts the next range (past the target: the tail)
                lsn = lsns[at - 1]
                lsns, datas, k, end, held = lsns[at:], datas[at:], k - at, end - at, left
                base, earlier = checker.rows - k, True
                stop_ended = surveyor.ended + most_ended
                start_catalog = before[1] if before is not None else survey.catalog.to_json()
                reached = reached or lsn >= target
                if self.until is None:  # (a catch-up's)
                    halfway = lsn + (target - lsn) // 2
            if held >= 2 * range_bytes and not nothing_open():
                self.handed_over = held  # a transaction too large for a range: the apply loop's (above)
                break
            if not reached and keepalive is not None and keepalive.wal_end >= target \
                    and (self.until is None or nothing_open()):  # (a round: not in a transaction)
                break
        survey.messages = messages
        if lsns:
            rest = surveyor.cut(index, (), start_catalog, len(lsns), lsns[0], lsns[-1], (lsns, datas),
                                size=sum(map(len, datas)))
            if surveyor.nothing_open():
                self._put(rest)
            else:
                survey.tail = rest  # the apply loop takes it, and goes on from there on the same stream

    def _put(self, item: LogRange | None) -> None:
        """Wait for room (the executors are behind), answering the walsender meanwhile so that it does
        not time the connection out."""
        while not self._abandoned.is_set():
            try:
                self._cut.put(item, timeout=1.0)
                return
            except queue.Full:
                if item is not None:
                    self.stream.keep_alive()

    def ranges(self) -> Iterator[LogRange]:
        """The ranges as they are cut and not yet taken."""
        while not self._ended and (cut := self._cut.get()) is not None:
            yield cut
        self._ended = True

    def stop(self) -> None:
        self._stop.set()

    def result(self) -> LogSurvey:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.surveyor.survey

    def abandon(self) -> None:
        """The caller gives up (an error): let the thread end, and wait for it (it holds the stream)."""
        self._stop.set()
        self._abandoned.set()
        while True:
            try:
                self._cut.get_nowait()
            except queue.Empty:
                break
        self._thread.join()


def catch_up_eligibility(spark: SparkLike, config: MirrorConfig, loop: ApplyLoop, backlog_bytes: int, *,
                         following: bool = False) -> str | None:
    """None when a backlog of ``backlog_bytes`` of WAL is to be caught up in ranges, else why not.
    ``following``: the mirror fell that far behind while following (``distributed.follow_backlog_mb``,
    checked by the follower); folds on the driver need no more, executors still need ``min_backlog_mb``.

    Spark's cores are asked last: a provider (applier.spark.session) is started only for a backlog
    that is otherwise one for executors."""
    settings = config.distributed
    if settings.mode == "off":
        return "distributed.mode is 'off'"
    if config.source.read_mode != "replication":
        return "source.read_mode is 'sql'"
    if settings.mode == "auto" and backlog_bytes < settings.min_backlog_mb << 20 \
            and not (following and folds_on_driver(config)):
        return f"the backlog ({backlog_bytes >> 20} MiB) is under distributed.min_backlog_mb"
    unfit = folds_unfit(config.apply, config.tables, loop.state)
    if unfit is not None:
        return unfit
    if folds_on_driver(config):
        return None  # no Spark needed
    if settings.mode == "auto" and session_of(spark, f"a backlog of {backlog_bytes >> 20} MiB to catch up on "
                                              "executors (distributed.mode)").sparkContext.defaultParallelism < 2:
        return "Spark has one core"
    return None


def folds_on_driver(config: MirrorConfig) -> bool:
    """Whether a backlog's ranges are folded in this process rather than on Spark's executors
    (``distributed.backlog_folds``; auto: when Spark's master, as it would be chosen, is local)."""
    choice = config.distributed.backlog_folds
    if choice != "auto":
        return choice == "driver"
    from applier.spark.session import master_is_local

    return master_is_local(config.spark.master)


def catch_up_on_executors(spark: SparkLike, config: MirrorConfig, loop: ApplyLoop, stream: BacklogStream,
                          target: int, *, feed: Callable[[int, bytes], None], may_commit: MayCommit,
                          progress: Progress, progress_every: float, backlog: int | None = None,
                          until: float | None = None) -> None:
    """Read the started ``stream`` up to ``target`` and apply it on executors (see the module); what the
    driver path must take is fed to ``feed`` (the follower's, into ``loop``); ``backlog`` (bytes of WAL
    up to ``target``) gives the progress lines a done fraction and an ETA. ``until``: a follower's round,
    read as it arrives until that instant or until the stream is quiet (StreamRanges). Returns with the
    stream the caller's again, the slot confirmed up to what was committed here."""
    catalog = loop.feeder.catalog
    ids = loop.applier.identities
    apply = config.apply
    source = StreamRanges(stream, catalog.to_json(),
                          partition_messages=min(config.distributed.partition_messages, apply.max_group_rows),
                          target=target, until=until,
                          quiet_seconds=FOLLOW_QUIET_SECONDS if until is not None else OPEN_QUIET_SECONDS,
                          columns_changed=ids.columns_changed if ids is not None else None,
                          range_bytes=(apply.memory_budget_mb << 20) // RANGE_BUDGET_DIVISOR,
                          max_transactions=apply.max_group_transactions, group_bytes=apply.max_group_bytes_mb << 20)
    fed = 0
    executors_end: int | None = None
    applied_before = loop.applier.stats.transactions
    transactions = 0

    def executors_part() -> None:
        """What the executors' part applied, for the progress line: fold_and_commit has counted and
        confirmed it (ApplyLoop.folded_applied) before it hands anything to ``drive``."""
        nonlocal executors_end, transactions
        transactions = loop.applier.stats.transactions - applied_before
        executors_end = loop.applier.stats.last_end_lsn

    def drive(ranges: list[LogRange]) -> ApplyStats:
        nonlocal fed
        executors_part()
        catalog.replace_with(RelationCache.from_json(ranges[0].catalog))
        before = loop.transactions
        for cut in ranges:
            for raw in range_messages(cut):
                feed(raw.lsn, raw.data)
                fed += 1
        return ApplyStats(transactions=loop.transactions - before)

    started = time.monotonic()
    try:
        on_driver = folds_on_driver(config)
        session = None if on_driver else session_of(spark, "catching up a backlog on executors")
        summary = fold_and_commit(session, config.apply, config.tables, loop, source, progress=progress,
                                  progress_every=progress_every, drive=drive, whole_source_first=False,
                                  may_commit=may_commit,
                                  span=(target - backlog, target) if backlog else None)
    except BaseException:
        source.abandon()
        raise
    survey = source.result()
    if not fed:
        executors_part()  # the catalog as at the end of the backlog is the loop's (fold_and_commit)
    loop.messages += survey.messages - fed
    where = "on the driver" if on_driver else "on executors"
    if source.handed_over is not None:
        progress(f"catch-up: a transaction holds over {_kib(source.handed_over)} where a range may hold "
                 f"{_kib(source.range_bytes)} (apply.memory_budget_mb / {RANGE_BUDGET_DIVISOR}); it is applied "
                 "on the driver, in pieces within apply.memory_budget_mb, and the stream followed from there")
    progress(f"catch-up {where}: {survey.messages - fed} messages in {summary.ranges} ranges, "
             f"{transactions} transactions, up to {format_lsn(executors_end) if executors_end else '-'} "
             f"in {time.monotonic() - started:.1f}s (reading {source.seconds:.1f}s, "
             f"{source.cpu_seconds:.1f}s of it CPU, {stream.reading_note()})")


def _kib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} kB"
