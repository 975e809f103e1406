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

import pyarrow as pa

from applier.catalog import RelationCache
from applier.catalog.relations import ColumnsChanged
from applier.drivers.executors.ranges import LogRange, Segment, merged_segments
from applier.errors import ApplierError
from applier.lsn import parse_lsn
from applier.protocol.decoder import decode_message
from applier.protocol.headers import IN_TRANSACTION_KINDS, RELATION, TYPE, kind_of
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

    def add(self, lsn: int, data: bytes) -> None:
        """Check one message's place and follow what it opens, closes or describes (raises on disorder)."""
        open_ = self.open
        if problems := open_.add(lsn, data):
            raise problems[0].error()
        if open_.last_kind in _CATALOG:  # the catalog moves on
            _follow_catalog(self.survey, data, open_.in_stream, lsn)

    def add_run(self, lsns: list[int], datas: list[bytes], start: int, end: int, stop_at: int) -> int:
        """:meth:`add` for the messages from ``start`` to ``end``, the row changes of an open
        transaction in one loop (OpenTransactions.add_rows); it returns early, after the first message
        at ``stop_at`` or past it (where the caller may cut), with the index after the last one added."""
        add, add_rows = self.add, self.open.add_rows
        k = start
        while k < end:
            k = add_rows(lsns, datas, k, end)  # (their positions are 0, or below a commit record's)
            if k < end:
                lsn = lsns[k]
                add(lsn, datas[k])
                k += 1
                if lsn >= stop_at:
                    break
        return k

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
                cut = surveyor.cut(len(survey.ranges), tuple(merged_segments(segments)), start_catalog, in_range,
                                   first_lsn, last_lsn)
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
        tail = surveyor.cut(len(survey.ranges), tuple(merged_segments(segments)), start_catalog, in_range, first_lsn,
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
