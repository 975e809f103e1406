"""Step 1, on the driver: the survey of the message sequence (order check, catalog, what is open)
and its cuts into ranges where nothing is open; for a stored log on a thread of its own
(BackgroundSurvey). ``RangeSource`` is what the commit side reads ranges from.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.catalog import RelationCache
from applier.catalog.relations import ColumnsChanged
from applier.drivers.executors.ranges import LogRange, Segment, merged_segments
from applier.errors import ApplierError
from applier.lsn import parse_lsn
from applier.protocol.decoder import decode_message
from applier.protocol.headers import (
    COMMIT,
    COMMIT_PREPARED,
    IN_TRANSACTION_KINDS,
    RELATION,
    STREAM_COMMIT,
    TYPE,
    kind_of,
)
from applier.protocol.messages import Relation, Type
from applier.protocol.order import OpenTransactions
from applier.sources.rawlog import log_batches


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


_CATALOG = frozenset((RELATION, TYPE))  # messages the survey decodes, to follow the catalog
#: messages that end a committed transaction (Commit, Stream Commit, Commit Prepared): what a range's
#: transactions are counted by (``Surveyor.ended``; a fold counts those it applies, never more)
_ENDS = frozenset((COMMIT, STREAM_COMMIT, COMMIT_PREPARED))
_NOTED = _ENDS | _CATALOG  # what Surveyor.add does more with than the order check

#: A limit nothing reaches
NO_LIMIT = 1 << 64


class Surveyor:
    """The survey's view of the message sequence, one message at a time: the order check, the catalog
    and what is open (see applier.drivers.executors). Shared by the survey of a stored log and the catch-up of a live
    stream (applier.drivers.backlog)."""

    def __init__(self, catalog_json: dict[str, Any] | None, columns_changed: ColumnsChanged | None = None) -> None:
        # the survey meets every Relation in log order on the driver: it tells the identity layer which
        # columns were renamed or dropped (executors fold by the Relations they see, and tell nobody)
        self.survey = LogSurvey(catalog=RelationCache.from_json(catalog_json, columns_changed=columns_changed)
                                if catalog_json else RelationCache(columns_changed=columns_changed))
        self.survey.relations = {(v["namespace"] or "pg_catalog", v["name"])
                                 for v in (catalog_json or {}).get("relations", [])}
        self.survey.oids_by_name = {(v["namespace"] or "pg_catalog", v["name"]): int(v["oid"])
                                    for v in (catalog_json or {}).get("relations", [])}
        self.open = OpenTransactions()  # the order check and what is open (applier.protocol.order)
        self.ended = 0  # committed transactions ended so far (``_ENDS``): a range's are counted by it
        self.catalog_row = -1  # the row (messages added before it) of the last Relation or Type message
        #: the row of the Begin of the transaction a Relation or Type message last came inside of, and the
        #: catalog (JSON) as it was before that transaction's first: a range may still end before its Begin
        self.catalog_before: tuple[int, dict[str, Any]] | None = None

    def add(self, lsn: int, data: bytes) -> None:
        """Check one message's place and follow what it opens, closes or describes (raises on disorder)."""
        open_ = self.open
        if problems := open_.add(lsn, data):
            raise problems[0].error()
        kind = open_.last_kind
        if kind not in _NOTED:  # (one test for most messages, as before the ends were counted)
            return
        if kind in _ENDS:
            self.ended += 1
        else:  # the catalog moves on
            txn = open_.checker.current
            if txn is not None and self.catalog_row < txn.first_row:  # the first inside this transaction
                self.catalog_before = (txn.first_row, self.survey.catalog.to_json())
            self.catalog_row = open_.checker.rows - 1
            _follow_catalog(self.survey, data, open_.in_stream, lsn)

    def add_run(self, lsns: list[int], datas: list[bytes], start: int, end: int, stop_at: int,
                stop_ended: int = NO_LIMIT) -> int:
        """:meth:`add` for the messages from ``start`` to ``end``, the row changes of an open
        transaction in one loop (OpenTransactions.add_rows); it returns early, after the first message
        at ``stop_at`` or past it, or the one that makes ``ended`` reach ``stop_ended`` (where the
        caller may cut), with the index after the last one added."""
        add, add_rows = self.add, self.open.add_rows
        k = start
        while k < end:
            k = add_rows(lsns, datas, k, end)  # (their positions are 0, or below a commit record's)
            if k < end:
                lsn = lsns[k]
                add(lsn, datas[k])
                k += 1
                if lsn >= stop_at or self.ended >= stop_ended:
                    break
        return k

    def open_row(self) -> int:
        """The row of the Begin of the regular or two-phase transaction open (-1: none, or not known)."""
        txn = self.open.checker.current
        return txn.first_row if txn is not None else -1

    def nothing_open(self) -> bool:
        """Nothing open, and no rename or reused name met (ranges after one are the driver path's)."""
        return self.open.nothing_open() and self.survey.identity_change_lsn is None

    def may_cut_after(self, data: bytes) -> bool:
        """Whether a range may end with the message just added: one that ends something, with nothing
        left open."""
        return self.may_end_with(data) and self.nothing_open()

    def earlier_cut(self, first: int) -> tuple[int, dict[str, Any]] | None:
        """Where a range that has grown past a limit inside a transaction may end instead: just before
        that transaction's Begin, so that it starts the next range (a range then holds more than a
        limit allows only when one transaction alone does). The row of that Begin (the messages added
        before it) and the catalog (JSON) there, the next range's; or None when the range must go on to
        the transaction's end: something else is open (a streamed or prepared transaction, or the
        transaction is a new session's re-sending), a relation was renamed, or the Begin is the range's
        first message (row ``first``). The caller still asks ``may_end_with`` of the message before it."""
        checker = self.open.checker
        txn = checker.current
        if txn is None or checker.streams or checker.in_stream is not None or self.open.prepared \
                or self.survey.identity_change_lsn is not None:
            return None
        row = txn.first_row
        if row <= first:  # (-1: not known)
            return None
        if self.catalog_row < row:  # the catalog has not moved since the Begin
            return row, self.survey.catalog.to_json()
        if self.catalog_before is not None and self.catalog_before[0] == row:
            return self.catalog_before
        return None

    @staticmethod
    def may_end_with(data: bytes | None) -> bool:
        """Whether a range may end with this message, given that nothing was open after it (the message
        before a Begin ``earlier_cut`` found): not one that belongs to a transaction (as ``may_cut_after``)."""
        return data is not None and len(data) > 0 and kind_of(data) not in IN_TRANSACTION_KINDS

    def cut(self, index: int, segments: tuple[Segment, ...], start_catalog: dict[str, Any], messages: int,
            first_lsn: int, last_lsn: int, inline: tuple[list[int], list[bytes]] | None = None, *,
            size: int = 0) -> LogRange:
        return LogRange(index, segments, start_catalog, messages, first_lsn, last_lsn,
                        frozenset(self.survey.relations), inline, size)


def survey_log(path: str, catalog_json: dict[str, Any] | None, *, partition_messages: int,
               on_range: Callable[[LogRange], None] | None = None,
               columns_changed: ColumnsChanged | None = None, max_transactions: int | None = None,
               max_bytes: int | None = None) -> LogSurvey:
    """Order-check the whole log (as read_raw_log does), follow the catalog, and cut it into ranges
    (each handed to ``on_range`` as soon as it is cut, the last one included, not the tail).

    A range ends at the first place where nothing is open once it holds ``partition_messages`` messages
    or ``max_bytes`` bytes of them (when a transaction is open there, just before its Begin if it can:
    ``Surveyor.earlier_cut``), or right after its ``max_transactions``-th committed transaction: the
    group limits (apply.max_group_*) then hold for every group of ranges (fold_and_commit)."""
    surveyor = Surveyor(catalog_json, columns_changed)
    survey = surveyor.survey
    add = surveyor.add
    built = _StoredRange(max_bytes)
    most_ended = max_transactions if max_transactions is not None else NO_LIMIT
    stop_ended = most_ended  # ``ended`` at the range's last transaction
    start_catalog = survey.catalog.to_json()
    first_lsn = last_lsn = 0
    in_range = 0  # messages in the range being built
    range_row = 0  # the position in the log of its first message
    earlier = True  # an earlier cut (Surveyor.earlier_cut) not yet tried for the range: once is enough
    index = 0  # position of the batch's first message in the log
    for batch, file, first in log_batches(path):
        lsns = batch.column(0).to_pylist()
        if pa.types.is_string(batch.column(0).type) or pa.types.is_large_string(batch.column(0).type):
            lsns = [None if v is None else parse_lsn(v) for v in lsns]
        datas = batch.column(2).to_pylist()
        n = len(datas)
        built.batch(str(file), first, index, lsns, datas, batch.column(2), surveyor.open_row())
        stop = built.stop(0, partition_messages, in_range)  # the message at which the range holds its size
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
            if i < stop and surveyor.ended < stop_ended:
                continue
            full = i >= stop
            before = None
            if surveyor.may_cut_after(data):
                at = index + i + 1  # the range ends here
            elif full and earlier and (before := surveyor.earlier_cut(range_row)) is not None \
                    and built.may_end_before(before[0]):
                at = before[0]  # before the open transaction: it starts the next range
            else:
                earlier = earlier and not full
                continue  # on to the end of what is open
            rest = index + i + 1 - at  # messages past the cut (of the open transaction)
            next_lsn = built.lsn_at(at) if rest else 0
            segments, size, end_lsn = built.cut(at, i + 1)
            cut = surveyor.cut(len(survey.ranges), segments, start_catalog, in_range - rest, first_lsn, end_lsn,
                               size=size)
            survey.ranges.append(cut)
            if on_range is not None:
                on_range(cut)
            first_lsn, in_range, range_row, earlier = next_lsn, rest, at, True
            stop_ended = surveyor.ended + most_ended
            stop = built.stop(i + 1, partition_messages, in_range)
            start_catalog = before[1] if before is not None else survey.catalog.to_json()
        index += n
    survey.messages = index
    if in_range:
        segments, size, _end = built.cut(index, None)
        tail = surveyor.cut(len(survey.ranges), segments, start_catalog, in_range, first_lsn, last_lsn, size=size)
        if surveyor.nothing_open():
            survey.ranges.append(tail)
            if on_range is not None:
                on_range(tail)
        else:
            survey.tail = tail
    return survey


@dataclass(frozen=True, slots=True)
class _Begun:
    """The Begin of a transaction still open when its batch of the log was surveyed: what a range needs
    to end before it later (``_StoredRange``)."""

    row: int  # its position in the log
    bytes_before: int  # of the log's messages before it
    may_end: bool  # the message before it may end a range (Surveyor.may_end_with)
    lsn_before: int
    lsn: int


class _StoredRange:
    """The range survey_log is building, a batch of the log at a time: its pieces of files (rows
    ``start:stop`` of a file, the first at position ``row`` in the log) and its bytes, counted as the
    bytes of the log's messages before a position (a cumulative sum a batch, in Arrow and numpy: nothing
    more is done per message for them). It may end before the Begin of the transaction open (Surveyor.
    earlier_cut), in the batch being surveyed or an earlier one (``begun``, noted at each batch's end)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.pieces: list[tuple[str, int, int, int]] = []  # (file, start, stop, row) in earlier batches
        self.start_bytes = 0  # the log's bytes before the range's first message
        self.bytes_before = 0  # the log's bytes before the batch
        # the batch being surveyed: its file, its first row there, its first position in the log, its LSNs,
        # messages and the bytes of its messages up to each; the range's part of it starts at ``start``
        self.file, self.first, self.index = "", 0, 0
        self.lsns: list[int | None] = []
        self.datas: list[bytes | None] = []
        self.ends: Any = np.zeros(0, np.int64)
        self.start = 0
        self.last: tuple[int | None, bytes | None] = (None, None)  # the LSN and message before the batch
        self.begun: _Begun | None = None

    def batch(self, file: str, first: int, index: int, lsns: list[int | None], datas: list[bytes | None],
              column: Any, open_row: int) -> None:
        """The next batch of the log (``column``: its messages, in Arrow); ``open_row``: the position of
        the Begin of the transaction open at the end of the one before (-1: none)."""
        n = len(self.lsns)
        if n:
            if self.start < n:
                self.pieces.append((self.file, self.first + self.start, self.first + n, self.index + self.start))
            if open_row >= self.index and (self.begun is None or self.begun.row != open_row):
                j = open_row - self.index
                lsn_before, before = (self.lsns[j - 1], self.datas[j - 1]) if j else self.last
                lsn = self.lsns[j]
                if lsn_before is not None and lsn is not None:
                    self.begun = _Begun(open_row, self._before(open_row), Surveyor.may_end_with(before),
                                        lsn_before, lsn)
            elif self.begun is not None and self.begun.row != open_row:
                self.begun = None
            self.last = (self.lsns[-1], self.datas[-1])
            self.bytes_before += _upto(self.ends, n)
        lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
        self.file, self.first, self.index, self.lsns, self.datas = file, first, index, lsns, datas
        self.ends, self.start = np.cumsum(lengths, dtype=np.int64), 0

    def stop(self, nxt: int, partition_messages: int, messages: int) -> int:
        """The batch's message at which a range of ``messages`` (the batch's from ``nxt`` on to come) holds
        ``partition_messages`` messages, or ``max_bytes`` bytes."""
        at = nxt + partition_messages - messages - 1
        if self.max_bytes is None:
            return at
        # with the batch's message i, the range holds bytes_before + ends[i] - start_bytes
        return min(at, int(np.searchsorted(self.ends, self.max_bytes + self.start_bytes - self.bytes_before,
                                           side="left")))

    def _before(self, row: int) -> int:
        """The log's bytes before position ``row`` (of the batch, its end, or a Begin noted in ``begun``)."""
        if row >= self.index:
            return self.bytes_before + _upto(self.ends, row - self.index)
        assert self.begun is not None and self.begun.row == row
        return self.begun.bytes_before

    def may_end_before(self, row: int) -> bool:
        """Whether the range may end just before position ``row`` (a Begin earlier_cut found): the message
        before it is known and may end a range."""
        if row > self.index:
            return Surveyor.may_end_with(self.datas[row - self.index - 1])
        if row == self.index:
            return Surveyor.may_end_with(self.last[1])
        return self.begun is not None and self.begun.row == row and self.begun.may_end

    def lsn_at(self, row: int) -> int:
        if row >= self.index:
            value = self.lsns[row - self.index]
            assert value is not None
            return value
        assert self.begun is not None and self.begun.row == row
        return self.begun.lsn

    def _lsn_before(self, row: int) -> int:
        if row > self.index:
            value = self.lsns[row - self.index - 1]
        elif row == self.index:
            value = self.last[0]
        else:
            assert self.begun is not None and self.begun.row == row
            value = self.begun.lsn_before
        assert value is not None
        return value

    def cut(self, row: int, upto: int | None) -> tuple[tuple[Segment, ...], int, int]:
        """The range ends before position ``row``, with the batch's first ``upto`` messages surveyed (None:
        all of them): its segments, bytes and last LSN. The next range starts at ``row``."""
        upto = len(self.lsns) if upto is None else upto
        kept: list[Segment] = []
        carried: list[tuple[str, int, int, int]] = []
        for file, start, stop, at in self.pieces:
            if at + stop - start <= row:
                kept.append((file, start, stop))
            elif at >= row:
                carried.append((file, start, stop, at))
            else:
                kept.append((file, start, start + row - at))
                carried.append((file, start + row - at, stop, row))
        end = min(row - self.index, upto)
        if end > self.start:
            kept.append((self.file, self.first + self.start, self.first + end))
        at_row = self._before(row)
        size, last = at_row - self.start_bytes, self._lsn_before(row)
        self.pieces, self.start, self.start_bytes = carried, max(self.start, row - self.index), at_row
        return tuple(merged_segments(kept)), size, last


def _upto(ends: Any, j: int) -> int:
    """The bytes of a batch's first ``j`` messages."""
    return int(ends[j - 1]) if j else 0


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
        version = survey.catalog.update(msg)
        # A column renamed: executors see a column dropped and one added (only the driver's catalog proves
        # a rename), and rows last changed before it would come out NULL in the new column. The driver
        # path takes it, and everything after it.
        if version.change is not None and version.change.renamed and survey.identity_change_lsn is None:
            survey.identity_change_lsn = lsn
        survey.relations.add(name)
    elif isinstance(msg, Type):
        survey.catalog.update_type(msg)


class BackgroundSurvey:
    """survey_log on a thread of its own, so that executors fold the first ranges while the rest of
    the log is surveyed. Nothing may be committed before :meth:`result` returns: only then is the
    whole log known to be in order."""

    def __init__(self, path: str, catalog_json: dict[str, Any] | None, *, partition_messages: int,
                 columns_changed: ColumnsChanged | None = None, max_transactions: int | None = None,
                 max_bytes: int | None = None) -> None:
        self._cut: queue.SimpleQueue[LogRange | None] = queue.SimpleQueue()
        self._survey: LogSurvey | None = None
        self._error: BaseException | None = None
        self._ended = False  # the queue's end was taken
        self.seconds = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                self._survey = survey_log(path, catalog_json, partition_messages=partition_messages,
                                          columns_changed=columns_changed, max_transactions=max_transactions,
                                          max_bytes=max_bytes, on_range=self._cut.put)
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


def _row_error(file: object, row: int) -> ApplierError:
    from applier.errors import SourceError

    return SourceError("raw log row has a NULL lsn, xid or data", path=str(file), row=row)


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
