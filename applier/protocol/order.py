"""Order and continuity of a pgoutput message sequence, checked from the raw bytes.

Why: the assembler trusts the order it is given. A log whose transactions were swapped, whose
changes inside a transaction were reordered, or that holds a message or a whole transaction twice
decodes fine and would be applied as given - exit 0 over data that differs from Postgres, and the
idempotence ids (the end LSN of the last transaction) would then call the correct log "already
applied". PostgreSQL itself guarantees an order that such damage breaks, so the damage is
detectable without a catalog:

* transactions are sent in commit order: the commit record of each (Begin's ``final_lsn``,
  Commit's ``commit_lsn``, a prepare's or COMMIT PREPARED's LSN) starts at or after the end
  (``end_lsn``) of the previous transaction's commit record;
* a transaction's changes come in WAL order: their LSNs never go down, and each lies before the
  transaction's commit record. Several messages may share an LSN (a Relation and the change after
  it; the rows of one multi-insert record), but two Updates or two Deletes cannot (one record each),
  and an Insert repeated byte for byte at the same LSN is a duplicated message;
* Begin's ``final_lsn`` equals its Commit's ``commit_lsn``.

Only headers are read (type byte, xid, LSN fields), so a full pass over a log is cheap; damaged or
unknown messages are left to the decoder, which reports them with their offset. LSN 0 means
"not known" (the replication protocol frames a transaction's changes without their WAL
position): such changes are checked only through their transaction's Begin and Commit. A new decoding
session re-sends what was not confirmed: the caller says so with :meth:`OrderChecker.session_start`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from applier.errors import SourceError
from applier.protocol.headers import (
    BEGIN,
    BEGIN_PREPARE,
    COMMIT_PREPARED,
    PREPARE,
    ROLLBACK_PREPARED,
    STREAM_PREPARE,
    prepared_xid,
)

__all__ = ["LogOrderError", "OpenTransactions", "OrderChecker", "OrderProblem"]

_CHANGES = frozenset(b"IUDTRYM")
_SINGLE_RECORD = frozenset(b"UD")  # one WAL record per message: two cannot share an LSN


class LogOrderError(SourceError):
    """The message sequence is out of log order, or holds a message or transaction twice. Not a
    :class:`DataError`: skipping one transaction cannot repair an order, only a fixed log can."""


@dataclass(frozen=True, slots=True)
class OrderProblem:
    """One finding: what is wrong, at which row (0-based position in the sequence) and LSN."""

    message: str
    kind: str
    lsn: int
    row: int
    xid: int | None = None

    def error(self) -> LogOrderError:
        return LogOrderError(self.message, kind=self.kind, lsn=self.lsn, row=self.row, xid=self.xid)


@dataclass(slots=True)
class _Open:
    xid: int | None
    final_lsn: int | None  # the commit (or prepare) record's LSN, when the protocol gives it up front
    last_lsn: int = 0
    last_kind: int = 0
    last_data: bytes = b""
    first_row: int = -1  # the row of its Begin (the messages checked before it)


@dataclass(slots=True)
class OrderChecker:
    """Feed every message with :meth:`check`; each call returns the problems that message shows.

    ``structure`` also reports framing problems the assembler catches on its own (a Commit without
    its Begin, a change outside any transaction): ``inspect`` wants them, the apply path leaves them
    to the assembler, whose error lets the transaction be skipped by its commit LSN."""

    structure: bool = False
    rows: int = 0
    last_end: int | None = None  # end LSN of the previous transaction's commit/prepare/rollback record
    current: _Open | None = None  # the open regular (or two-phase) transaction
    streams: dict[int, _Open] = field(default_factory=dict)  # open streamed transactions by top-level xid
    in_stream: int | None = None
    recent: dict[tuple[int | None, int], None] = field(default_factory=dict)  # (xid, commit LSN) of past txns

    def session_start(self) -> None:
        """A new decoding session: the server re-sends everything after the confirmed position."""
        self.last_end, self.current, self.in_stream = None, None, None
        self.streams.clear()
        self.recent.clear()

    def check(self, lsn: int, data: bytes) -> list[OrderProblem]:
        row = self.rows
        self.rows += 1
        if not data:
            return []
        kind = data[0]
        # The common case first, without calls: a change of the open regular transaction at a later
        # LSN than the one before it and not past its commit record (it checks what _change checks).
        txn = self.current
        if (txn is not None and kind in _CHANGES and self.in_stream is None and lsn > txn.last_lsn
                and (txn.final_lsn is None or lsn <= txn.final_lsn)):
            txn.last_lsn, txn.last_kind = lsn, kind
            txn.last_data = data if kind == 0x49 else b""
            return []
        try:
            return self._check(kind, lsn, data, row)
        except (IndexError, ValueError):  # a damaged header: the decoder reports it with its offset
            return []

    # -- per kind -------------------------------------------------------------------------------

    def _problem(self, text: str, kind: int, lsn: int, row: int, xid: int | None = None) -> list[OrderProblem]:
        return [OrderProblem(text, _name(kind), lsn, row, xid)]

    def _check(self, kind: int, lsn: int, data: bytes, row: int) -> list[OrderProblem]:
        if kind in _CHANGES:
            return self._change(kind, lsn, data, row)
        if kind == 0x42:  # B: final_lsn, commit time, xid
            return self._begin(kind, lsn, row, _u64(data, 1), _u32(data, 17))
        if kind == 0x62:  # b: prepare_lsn, end_lsn, prepare time, xid, gid
            return self._begin(kind, lsn, row, _u64(data, 1), _u32(data, 25))
        if kind in (0x43, 0x50):  # C / P: flags, commit (prepare) lsn, end lsn
            return self._end_regular(kind, lsn, row, _u64(data, 2), _u64(data, 10))
        if kind == 0x4B:  # K: flags, commit lsn, end lsn, time, xid, gid
            return self._end_alone(kind, lsn, row, _u64(data, 2), _u64(data, 10), _u32(data, 26))
        if kind == 0x72:  # r: flags, prepare end lsn, rollback end lsn, prepare time, rollback time, xid
            return self._end_alone(kind, lsn, row, None, _u64(data, 10), _u32(data, 34))
        if kind == 0x53:  # S: xid, first_segment
            xid = _u32(data, 1)
            self.in_stream = xid
            if data[5] == 1 or xid not in self.streams:
                self.streams[xid] = _Open(xid, None)
            return []
        if kind == 0x45:  # E
            self.in_stream = None
            return []
        if kind == 0x63:  # c: xid, flags, commit lsn, end lsn
            return self._end_stream(kind, lsn, row, _u32(data, 1), _u64(data, 6), _u64(data, 14))
        if kind == 0x70:  # p: flags, prepare lsn, end lsn, prepare time, xid, gid
            return self._end_stream(kind, lsn, row, _u32(data, 26), _u64(data, 2), _u64(data, 10))
        if kind == 0x41:  # A: xid, subxid
            xid, subxid = _u32(data, 1), _u32(data, 5)
            if xid == subxid:
                self.streams.pop(xid, None)
            return []
        return []

    def _begin(self, kind: int, lsn: int, row: int, final_lsn: int, xid: int) -> list[OrderProblem]:
        # An open transaction here is a new decoding session re-sending it: the assembler handles that.
        # (-1: a Begin inside an open transaction, a new session re-sending it: no place to cut before it)
        self.current = _Open(xid, final_lsn, lsn, kind, first_row=row if self.current is None else -1)
        if (xid, final_lsn) in self.recent:
            return self._problem("transaction seen twice (the same xid and commit LSN came before)",
                                 kind, lsn, row, xid)
        if self.last_end is not None and final_lsn < self.last_end:
            return self._problem(f"transaction out of commit order: its commit record at {_fmt(final_lsn)} "
                                 f"lies before the end of the previous transaction ({_fmt(self.last_end)})",
                                 kind, lsn, row, xid)
        return []

    def _change(self, kind: int, lsn: int, data: bytes, row: int) -> list[OrderProblem]:
        if self.in_stream is not None:
            txn = self.streams.setdefault(self.in_stream, _Open(self.in_stream, None))
        elif self.current is not None:
            txn = self.current
        else:
            if kind == 0x4D and len(data) > 1 and not data[1] & 1:  # non-transactional logical message
                return []
            if self.structure:
                return self._problem("change outside a transaction (its Begin is missing, or it came "
                                     "after its Commit)", kind, lsn, row)
            return []
        if lsn == 0:  # the replication protocol sends in-transaction messages without their WAL position
            return []
        out: list[OrderProblem] = []
        if lsn < txn.last_lsn:
            out = self._problem(f"changes out of order inside a transaction: LSN goes back from "
                                f"{_fmt(txn.last_lsn)}", kind, lsn, row, txn.xid)
        elif lsn == txn.last_lsn and kind == txn.last_kind and (
                kind in _SINGLE_RECORD or (kind == 0x49 and data == txn.last_data)):
            out = self._problem("message seen twice inside a transaction (same kind at the same LSN)",
                                kind, lsn, row, txn.xid)
        elif txn.final_lsn is not None and lsn > txn.final_lsn:
            out = self._problem(f"change after its transaction's commit record ({_fmt(txn.final_lsn)})",
                                kind, lsn, row, txn.xid)
        txn.last_lsn, txn.last_kind = max(txn.last_lsn, lsn), kind
        txn.last_data = data if kind == 0x49 else b""
        return out

    def _end_regular(self, kind: int, lsn: int, row: int, commit_lsn: int, end_lsn: int) -> list[OrderProblem]:
        txn, self.current = self.current, None
        if txn is None:
            if self.structure:
                return self._problem("Commit without Begin", kind, lsn, row)
            return self._advance(kind, lsn, row, None, commit_lsn, end_lsn)
        out: list[OrderProblem] = []
        if txn.final_lsn is not None and commit_lsn != txn.final_lsn:
            out = self._problem(f"{_name(kind)} LSN {_fmt(commit_lsn)} does not match its Begin's "
                                f"{_fmt(txn.final_lsn)}", kind, lsn, row, txn.xid)
        return out or self._advance(kind, lsn, row, txn.xid, commit_lsn, end_lsn)

    def _end_stream(self, kind: int, lsn: int, row: int, xid: int, commit_lsn: int, end_lsn: int) -> list[OrderProblem]:
        txn = self.streams.pop(xid, None)
        if txn is not None and txn.last_lsn > commit_lsn:
            return self._problem(f"streamed transaction has a change at {_fmt(txn.last_lsn)}, after its "
                                 f"commit record", kind, lsn, row, xid)
        if (xid, commit_lsn) in self.recent:
            return self._problem("transaction seen twice (the same xid and commit LSN came before)",
                                 kind, lsn, row, xid)
        return self._advance(kind, lsn, row, xid, commit_lsn, end_lsn)

    def _end_alone(self, kind: int, lsn: int, row: int, commit_lsn: int | None, end_lsn: int,
                   xid: int) -> list[OrderProblem]:
        return self._advance(kind, lsn, row, xid, commit_lsn, end_lsn)

    def _advance(self, kind: int, lsn: int, row: int, xid: int | None, commit_lsn: int | None,
                 end_lsn: int) -> list[OrderProblem]:
        out: list[OrderProblem] = []
        start = commit_lsn if commit_lsn is not None else end_lsn
        if self.last_end is not None and (start < self.last_end or end_lsn <= self.last_end):
            out = self._problem(f"transaction out of commit order: it ends at {_fmt(end_lsn)}, not after "
                                f"the previous transaction's end {_fmt(self.last_end)}", kind, lsn, row, xid)
        if commit_lsn is not None:
            self.recent[(xid, commit_lsn)] = None
            if len(self.recent) > 4096:
                del self.recent[next(iter(self.recent))]
        self.last_end = end_lsn if self.last_end is None else max(self.last_end, end_lsn)
        return out


@dataclass(slots=True)
class OpenTransactions:
    """Which transactions are open at the current point of a message sequence, from the raw bytes:
    the order checker's open regular/two-phase transaction, its open streamed ones and the stream
    block it is in, plus the prepared transactions still waiting for their Commit/Rollback Prepared.

    Why here: a place where :meth:`nothing_open` holds is where a log may be cut into independently
    applicable ranges (applier.drivers.executors.survey). Knowing what a Prepare, a Stream
    Prepare or a Commit Prepared opens or closes means reading their bytes, which is this package's
    business; the survey only asks."""

    checker: OrderChecker = field(default_factory=OrderChecker)
    prepared: set[int] = field(default_factory=set)  # xids prepared, not yet committed or rolled back
    preparing: int | None = None  # xid of the open two-phase transaction (between b and P)
    last_kind: int = 0  # type byte of the message added last (so callers need not read it again)

    @property
    def in_stream(self) -> bool:
        """Whether the next message is inside a stream block (it then carries an xid)."""
        return self.checker.in_stream is not None

    def add(self, lsn: int, data: bytes) -> list[OrderProblem]:
        """Check one message's place (the order checker's problems, returned: nothing followed then)
        and follow what it opens or closes."""
        self.last_kind = kind = data[0] if data else 0  # kind_of, inlined: once per message of a survey
        if problems := self.checker.check(lsn, data):
            return problems
        if kind in _CHANGES:
            return []
        if kind == BEGIN_PREPARE:
            current = self.checker.current
            self.preparing = current.xid if current is not None else None
        elif kind == PREPARE:
            if self.preparing is not None:
                self.prepared.add(self.preparing)
                self.preparing = None
        elif kind == BEGIN:  # a Begin while a two-phase one is open re-sends it (new session)
            self.preparing = None
        elif kind in (STREAM_PREPARE, COMMIT_PREPARED, ROLLBACK_PREPARED):
            try:
                xid = prepared_xid(data)
            except ValueError:  # damaged: the decoder reports it (and its stream stays open above)
                return []
            if kind == STREAM_PREPARE:
                self.prepared.add(xid)
            else:
                self.prepared.discard(xid)
        return []

    def add_rows(self, lsns: list[int], datas: list[bytes], start: int, end: int) -> int:
        """:meth:`add` for the messages from ``start`` while they are Inserts, Updates and Deletes of the
        open regular transaction that :meth:`add` would pass without a word; the index of the first
        message it left (``end`` when none), for :meth:`add`. Why: a backlog is mostly such messages,
        and the catch-up's reader checked each with three calls (about 1 us a message, a third of
        the reader's CPU); here it is one loop over locals, with the order checker's own tests:
        the position inside the transaction moving forward, not past its commit record, or no
        position at all (the replication protocol sends changes at position 0, which says nothing)."""
        checker = self.checker
        txn = checker.current
        if txn is None or checker.in_stream is not None or start >= end:
            return start
        last_lsn, last_kind, last_data, final = txn.last_lsn, txn.last_kind, txn.last_data, txn.final_lsn
        if final is None:
            final = 1 << 64
        k = start
        while k < end:
            data = datas[k]
            if not data:
                break
            kind = data[0]
            if kind != 0x49 and kind != 0x55 and kind != 0x44:  # I, U, D
                break
            lsn = lsns[k]
            if lsn:
                if lsn <= last_lsn or lsn > final:
                    break  # the careful check says what is wrong
                last_lsn, last_kind, last_data = lsn, kind, data if kind == 0x49 else b""
            k += 1
        if k > start:
            txn.last_lsn, txn.last_kind, txn.last_data = last_lsn, last_kind, last_data
            checker.rows += k - start
            self.last_kind = datas[k - 1][0]
        return k

    def nothing_open(self) -> bool:
        """No regular, two-phase or streamed transaction open, none in a stream block, none prepared."""
        checker = self.checker
        return checker.current is None and not checker.streams and checker.in_stream is None and not self.prepared


def _u64(data: bytes, at: int) -> int:
    if len(data) < at + 8:
        raise ValueError("short")
    return int.from_bytes(data[at:at + 8], "big")


def _u32(data: bytes, at: int) -> int:
    if len(data) < at + 4:
        raise ValueError("short")
    return int.from_bytes(data[at:at + 4], "big")


def _fmt(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _name(kind: int) -> str:
    from applier.protocol.messages import KIND_NAMES

    return KIND_NAMES.get(chr(kind), repr(chr(kind)))
