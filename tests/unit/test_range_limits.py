"""The group limits in the cuts of a backlog or a stored log into ranges, and in the group of their folds
(issue 74, item 6), without a server: synthetic message sequences (Begin, Inserts, Commit: what the survey
reads of them is their headers) cut by StreamRanges over a fake stream and by survey_log over a raw log
file, and fold_and_commit's GroupLimits. tests/integration/test_group_limits.py runs the whole apply
against PostgreSQL and reads every group back from Delta."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from applier.config import ApplySettings
from applier.drivers.backlog import StreamRanges
from applier.drivers.executors.commit import GroupLimits
from applier.drivers.executors.ranges import LogRange, RangeFold, range_messages
from applier.drivers.executors.scheduler import FoldGroup
from applier.drivers.executors.survey import survey_log
from applier.protocol.replication import PrimaryKeepalive
from applier.sources.rawlog_writer import write_raw_log

#: rows of each transaction: 1 to 5, every 10th 12 (more than a range of 8 messages holds)
SIZES = [12 if i % 10 == 0 else 1 + (i * 7) % 5 for i in range(1, 121)]


def _relation(oid: int) -> bytes:
    """A Relation message: table ``public.t<oid>`` (id int4, replica identity default)."""
    return (b"R" + oid.to_bytes(4, "big") + b"public\0" + f"t{oid}".encode() + b"\0" + b"d" + (1).to_bytes(2, "big")
            + b"\x01" + b"id\0" + (23).to_bytes(4, "big") + (-1).to_bytes(4, "big", signed=True))


def _messages(sizes: list[int], relations: dict[int, int] | None = None) -> list[tuple[int, bytes]]:
    """Transactions of ``sizes`` Inserts each: Begin (final LSN, time, xid), Inserts (position 0, as the
    walsender sends them), Commit (flags, commit LSN, end LSN, time); ``relations``: transaction -> the OID
    of a relation it describes first (a Relation message after its Begin, as pgoutput sends one)."""
    out: list[tuple[int, bytes]] = []
    lsn = 0x1000
    for i, rows in enumerate(sizes):
        xid, commit = 700 + i, lsn + 0x100
        out.append((lsn, b"B" + commit.to_bytes(8, "big") + bytes(8) + xid.to_bytes(4, "big")))
        if relations and i in relations:
            out.append((0, _relation(relations[i])))
        out += [(0, b"I" + (16384).to_bytes(4, "big") + b"N" + bytes(2) + bytes(k)) for k in range(rows)]
        out.append((commit, b"C" + bytes(1) + commit.to_bytes(8, "big") + (commit + 8).to_bytes(8, "big") + bytes(8)))
        lsn = commit + 0x10
    return out


class _Stream:
    """A BacklogStream that has every message buffered at once, then goes quiet."""

    def __init__(self, messages: list[tuple[int, bytes]]) -> None:
        self.left = list(messages)

    def read_buffered(self, lsns: list[int], datas: list[bytes], limit: int) -> PrimaryKeepalive | None:
        taken, self.left = self.left[:limit], self.left[limit:]
        for lsn, data in taken:
            lsns.append(lsn)
            datas.append(data)
        return None

    def read_message(self, timeout: float, *, gather: float = 0.0) -> tuple[int, bytes] | None:
        if self.left:
            return self.left.pop(0)
        return None

    @contextmanager
    def hot_reader(self) -> Iterator[None]:
        yield

    def keep_alive(self) -> None:
        pass

    def reading_note(self) -> str:
        return ""


def _check(ranges: list[LogRange], messages: list[tuple[int, bytes]], *, transactions: int, rows: int) -> int:
    """The ranges hold the messages once, in order, whole transactions each, within the limits (more rows
    only in a range of one transaction); returns how many (but the last) were cut short of both limits."""
    at = short = 0
    for r in ranges:
        held = [(m.lsn, bytes(m.data)) for m in range_messages(r)]
        assert held == messages[at:at + len(held)] and len(held) == r.messages, r.index
        at += len(held)
        kinds = [data[:1] for _lsn, data in held]
        commits, inserts = kinds.count(b"C"), kinds.count(b"I")
        assert kinds[0] == b"B" and kinds[-1] == b"C", kinds
        assert commits <= transactions, (r.index, commits)
        assert inserts <= rows or commits == 1, (r.index, inserts, commits)
        assert r.size == sum(len(data) for _lsn, data in held)
        short += r is not ranges[-1] and r.messages < rows and commits < transactions
    assert at == len(messages)
    return short


def _stream_ranges(messages: list[tuple[int, bytes]], **kwargs: object) -> list[LogRange]:
    source = StreamRanges(_Stream(messages), None, queued=1000, quiet_seconds=0.01, **kwargs)  # type: ignore[arg-type]
    ranges = list(source.ranges())
    assert source.result().tail is None
    return ranges


def test_a_catch_up_cuts_its_ranges_within_the_limits():
    messages = _messages(SIZES)
    ranges = _stream_ranges(messages, partition_messages=8, target=messages[-1][0], max_transactions=5)
    _check(ranges, messages, transactions=5, rows=8)
    ranges = _stream_ranges(messages, partition_messages=100, target=messages[-1][0], max_transactions=5)
    _check(ranges, messages, transactions=5, rows=100)


def test_a_round_cuts_what_it_read_past_its_time_within_the_limits():
    """A follower's round whose time is up when its first range is cut: what was read with it (here the
    whole backlog, in one read of libpq's buffer) was one range, of 211 transactions in the issue."""
    messages = _messages(SIZES)
    ranges = _stream_ranges(messages, partition_messages=8, target=0, until=time.monotonic() - 1,
                            max_transactions=5)
    _check(ranges, messages, transactions=5, rows=8)


def test_a_range_that_reaches_its_size_inside_a_transaction_ends_before_it():
    """Transactions of 3 Inserts (5 messages): a range of 8 messages reaches its size inside the second one,
    and ends before its Begin, not after its Commit (10 messages, 6 rows)."""
    messages = _messages([3] * 20)
    ranges = _stream_ranges(messages, partition_messages=8, target=messages[-1][0])
    assert [r.messages for r in ranges] == [5] * 20


@pytest.mark.parametrize("stored", [False, True])
def test_a_range_ends_before_a_transaction_that_describes_a_relation_with_the_catalog_before_it(tmp_path, stored):
    """pgoutput describes a relation inside the first transaction that changes it (after its Begin): a range
    that reaches its size inside such a transaction still ends before its Begin, and the next range starts
    from the catalog as it was there (the Relation is its own), each range from the catalog at its start."""
    relations = {i: 20000 + i for i in range(0, 30, 3)}
    messages = _messages([3] * 30, relations)
    if stored:
        log = tmp_path / "raw.parquet"
        write_raw_log(log, [(lsn, 0, data) for lsn, data in messages])
        ranges = survey_log(str(log), None, partition_messages=8).ranges
    else:
        ranges = _stream_ranges(messages, partition_messages=8, target=messages[-1][0])
    assert [r.messages for r in ranges] == [6 if i in relations else 5 for i in range(30)]
    described: set[int] = set()
    for r in ranges:
        assert {v["oid"] for v in r.catalog["relations"]} == described, r.index
        described |= {int.from_bytes(bytes(m.data)[1:5], "big") for m in range_messages(r) if m.data[:1] == b"R"}


def test_group_bytes_cut_ranges_as_their_size_does():
    messages = _messages([1] * 50)  # 3 messages, 3 x 80 + 55 bytes held a transaction
    ranges = _stream_ranges(messages, partition_messages=1000, target=messages[-1][0], group_bytes=1000)
    assert all(r.messages <= 9 for r in ranges), [r.messages for r in ranges]
    _check(ranges, messages, transactions=50, rows=1000)


def test_a_stored_log_is_cut_within_the_limits(tmp_path: Path):
    messages = _messages(SIZES)
    log = tmp_path / "raw.parquet"
    write_raw_log(log, [(lsn, 0, data) for lsn, data in messages])
    survey = survey_log(str(log), None, partition_messages=8, max_transactions=5)
    assert survey.tail is None
    assert _check(survey.ranges, messages, transactions=5, rows=8) >= 5
    # max_bytes: a range ends before a transaction that would take it past them (by a Commit at most: a
    # range is cut after the message that reaches them), or holds one transaction alone (12 rows: 209 bytes)
    survey = survey_log(str(log), None, partition_messages=1000, max_bytes=200)
    assert all(r.size <= 200 + 26 or r.messages == 14 for r in survey.ranges), [r.size for r in survey.ranges]
    assert max(r.size for r in survey.ranges if r.messages < 14) > 150
    _check(survey.ranges, messages, transactions=1000, rows=1000)


@pytest.mark.parametrize("batch_rows", [3, 7, 97, 50_000])
def test_a_stored_log_is_cut_where_a_stream_is_whatever_its_batches(tmp_path: Path, monkeypatch, batch_rows: int):
    """survey_log reads a log a batch at a time: a range that reaches its size inside a transaction begun in
    the batch before still ends before that transaction (its pieces of files and its bytes split there),
    as a stream's reader cuts it (a round's, read at once: cut by the limits alone)."""
    from applier.sources import rawlog

    monkeypatch.setattr("applier.drivers.executors.survey.log_batches",
                        lambda path: rawlog.log_batches(path, batch_rows))
    messages = _messages(SIZES, {i: 20000 + i for i in range(0, 120, 7)})
    log = tmp_path / "raw.parquet"
    write_raw_log(log, [(lsn, 0, data) for lsn, data in messages], batch_rows=batch_rows)
    stored = survey_log(str(log), None, partition_messages=8, max_transactions=5).ranges
    streamed = _stream_ranges(messages, partition_messages=8, target=0, until=time.monotonic() + 60,
                              max_transactions=5)
    assert [r.messages for r in stored] == [r.messages for r in streamed]
    assert [r.size for r in stored] == [r.size for r in streamed]
    assert [r.catalog for r in stored] == [r.catalog for r in streamed]
    _check(stored, messages, transactions=5, rows=8)


def _fold(transactions: int) -> tuple[RangeFold, LogRange]:
    return (RangeFold(0, transactions=transactions, last_end_lsn=1000 + transactions),
            LogRange(0, (), {}, transactions * 3, 1, 2, size=100 * transactions))


@pytest.mark.parametrize("timed", [True, False])
def test_group_limits_commit_before_a_fold_that_would_pass_one(monkeypatch, timed):
    now = [100.0]
    monkeypatch.setattr("applier.drivers.executors.commit.time.monotonic", lambda: now[0])
    limits = GroupLimits(ApplySettings(max_group_transactions=5, max_group_rows=8, max_group_bytes_mb=1,
                                       max_group_seconds=2.0), timed=timed)
    group = FoldGroup()
    fold, cut = _fold(3)
    assert not limits.past(group, fold, cut, rows=100)  # nothing joined yet: a fold joins whatever it holds
    limits.joins(cut)
    group.add(fold)
    assert not limits.reached(group)
    assert limits.past(group, *_fold(3), rows=1)  # 6 transactions
    assert not limits.past(group, *_fold(2), rows=8)  # 5 transactions, 8 rows (the group's plans hold none)
    assert limits.past(group, *_fold(2), rows=9)
    big = LogRange(0, (), {}, 3, 1, 2, size=(1 << 20) - 299)
    assert limits.past(group, _fold(1)[0], big, rows=1)  # 300 + (1 MiB - 299) bytes
    now[0] += 2.0
    assert limits.past(group, *_fold(1), rows=1) == timed  # open for max_group_seconds: a live stream's
    assert limits.reached(group) == timed
    limits.clear()
    assert not limits.past(FoldGroup(), *_fold(1), rows=1)
