"""Turn the decoded message sequence into committed transactions, in commit order.

Follows PostgreSQL's apply worker (worker.c):
- regular transactions arrive whole: Begin ... Commit;
- streamed transactions (protocol 2+) arrive in chunks Stream Start ... Stream Stop, interleaved with
  each other and with regular transactions, and are applied at Stream Commit; Stream Abort with
  xid == subxid drops the whole transaction, with a subxid it drops that subtransaction's changes
  and everything received after its first change (stream_abort_internal truncates the spool there);
- two-phase (protocol 3+): Begin Prepare ... Prepare (or a streamed transaction ... Stream Prepare)
  stages the transaction durably under its gid, because a slot advanced past the Prepare never sends
  those changes again; Commit Prepared applies it at that point in commit order (one with nothing
  staged is a no-op only where the store proves no Prepare was sent for it: staging.py); Rollback
  Prepared discards it (also when the prepare was never seen here);
- a new decoding session re-sends every unfinished transaction from its start: a Begin for an xid
  we still hold, or Stream Start with first_segment for it, discards the stale buffer.

Relation and Type messages update the catalog when they arrive (as the worker does), and every
change is stored with the schema version it was decoded with.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from applier.assembly.buffer import ChangeBuffer
from applier.assembly.staging import PreparedStore
from applier.catalog import RelationCache, SchemaVersion
from applier.changes import SkippedTransaction
from applier.errors import ApplierError, AssemblyError, CatalogError
from applier.infra.crashpoints import crashpoint
from applier.infra.fastobj import fast_constructor
from applier.protocol.messages import (
    KIND_OF,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
)

log = logging.getLogger(__name__)

ChangeMessage = Insert | Update | Delete | Truncate | LogicalMessage


@dataclass(frozen=True, slots=True)
class Change:
    """One change as received: its LSN, ordinal in the transaction and the schema(s) it was decoded with."""

    lsn: int
    ordinal: int
    message: ChangeMessage
    schemas: tuple[SchemaVersion, ...]  # one for I/U/D, one per listed relation for T, none for M


_make_change = fast_constructor(Change)


@dataclass(frozen=True, slots=True)
class CommittedTransaction:
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    origin: str | None
    kind: Literal["regular", "streamed", "prepared"]
    gid: str | None
    changes: Iterable[Change]  # SpooledChanges or staged changes: re-iterable until finished()


@dataclass
class _Open:
    """A transaction being received."""

    xid: int
    buffer: ChangeBuffer
    origin: str | None = None
    first_change_of: dict[int, int] = field(default_factory=dict)  # subxid -> index of its first change
    error: ApplierError | None = None  # first bad message in it: raised at its commit unless skipped
    error_at: int = 0  # number of changes received before the bad message (a subxact abort may drop it)


#: Kinds whose bad bytes lose one change of the transaction they sit in, not the stream's framing; a
#: bad one is held against its transaction (raised at commit, or dropped with it). ``None``: an
#: unknown type byte (a message a newer server sends inside a transaction).
CHANGE_KINDS = frozenset({"Insert", "Update", "Delete", "Truncate", "Message", "Origin", None})


class TransactionAssembler:
    """Feed ``(lsn, message)`` in stream order; get committed transactions back as they complete."""

    def __init__(self, catalog: RelationCache | None = None, *, prepared: PreparedStore | None = None,
                 memory_budget_bytes: int = 256 << 20, spill_dir: Path | None = None,
                 on_message: Callable[[LogicalMessage, int], None] | None = None,
                 skip_lsns: Set[int] = frozenset(),
                 on_skip: Callable[[SkippedTransaction], None] | None = None) -> None:
        self.catalog = catalog or RelationCache()
        self.skip_lsns = skip_lsns
        self._on_skip = on_skip
        self.prepared = prepared
        self._budget = memory_budget_bytes
        self._spill_said = 0.0  # when a spill was last logged (every 10 s at most while a transaction spills)
        self._spill_dir = spill_dir
        self._on_message = on_message
        self._regular: _Open | None = None
        self._regular_prepare: tuple[_Open, BeginPrepare] | None = None
        self._streams: dict[int, _Open] = {}
        self._stream_xid: int | None = None  # top-level xid of the open stream block
        self._last_seen_origin: str | None = None
        #: called by :meth:`session_start` (the feeder's order checker forgets the old session there)
        self.on_session_start: Callable[[], None] | None = None

    # --- public ---------------------------------------------------------------------------------

    def session_start(self) -> None:
        """A new decoding session: everything unfinished will be re-sent from its start."""
        for tx in self._streams.values():
            tx.buffer.discard()
        self._streams.clear()
        if self._regular is not None:
            self._regular.buffer.discard()
        self._regular = None
        self._regular_prepare = None
        self._stream_xid = None
        if self.on_session_start is not None:
            self.on_session_start()

    def feed(self, lsn: int, msg: Message) -> list[CommittedTransaction]:
        handler = _DISPATCH.get(type(msg))
        if handler is None:
            raise AssemblyError("message kind not handled by the assembler", kind=KIND_OF.get(type(msg)), lsn=lsn)
        return handler(self, lsn, msg)

    def feed_error(self, lsn: int, error: ApplierError) -> None:
        """A message that could not be decoded. Inside a transaction, a bad change is held against it:
        the transaction stops the run at its commit (with its commit LSN, so it can be skipped), or is
        dropped with it (aborted, or listed in ``skip_lsns``). A bad framing or catalog message, or
        one outside any transaction, is raised at once."""
        tx = self._current(lsn, "", allow_none=True)
        if tx is None or error.kind not in CHANGE_KINDS:
            if tx is not None:
                error.add_context(xid=tx.xid)
            raise error
        self._hold(tx, error)

    def _hold(self, tx: _Open, error: ApplierError) -> None:
        error.add_context(xid=tx.xid)
        if tx.error is None:
            tx.error, tx.error_at = error, len(tx.buffer)

    def _finish_bad(self, tx: _Open | None, commit_lsn: int, end_lsn: int, what: str,
                    error: ApplierError | None = None) -> bool:
        """For a transaction about to commit (or be staged): False when it is fine; True when it is
        bad and listed in ``skip_lsns`` (dropped and reported to ``on_skip``); raises when it is bad
        and not listed."""
        error = error or (tx.error if tx is not None else None)
        if error is None and commit_lsn not in self.skip_lsns:
            return False
        xid = tx.xid if tx is not None else 0
        if commit_lsn in self.skip_lsns:
            if tx is not None:
                tx.buffer.discard()
            self._report_skip(commit_lsn, xid, end_lsn, str(error) if error is not None else "listed to skip")
            return True
        assert error is not None
        error.add_context(xid=xid if tx is not None else None, **{what: commit_lsn})
        raise error

    def _report_skip(self, commit_lsn: int, xid: int, end_lsn: int, reason: str) -> None:
        if self._on_skip is not None:
            self._on_skip(SkippedTransaction(commit_lsn, xid, end_lsn, reason))

    @property
    def between_transactions(self) -> bool:
        """No regular transaction, prepare or stream block is open (streamed transactions may be, between
        their blocks): a Begin here starts afresh, as ``committed_whole`` assumes."""
        return self._regular is None and self._regular_prepare is None and self._stream_xid is None

    def committed_whole(self, begin: Begin, commit: Commit) -> CommittedTransaction:
        """What Begin and Commit do around a regular transaction that a caller holding it whole took
        apart itself (TransactionFeeder.feed_range: nothing buffered, so ``changes`` is empty). Only
        when ``between_transactions`` held at its Begin, and its commit LSN is not in ``skip_lsns``."""
        self._drop_stream_if_resent(begin.xid)
        return CommittedTransaction(begin.xid, commit.commit_lsn, commit.end_lsn, commit.commit_time, None,
                                    "regular", None, ())

    def open_transactions(self) -> int:
        return len(self._streams) + (self._regular is not None) + (self._regular_prepare is not None)

    # --- framing --------------------------------------------------------------------------------

    def _new(self, xid: int) -> _Open:
        return _Open(xid, ChangeBuffer(self._budget, self._spill_dir))

    def _begin(self, lsn: int, msg: Begin) -> list[CommittedTransaction]:
        if self._regular is not None:
            log.warning("Begin at %X/%X while xid %s was open: a new decoding session; discarding it",
                        lsn >> 32, lsn & 0xFFFFFFFF, self._regular.xid)
            self._regular.buffer.discard()
        self._drop_stream_if_resent(msg.xid)
        self._regular = self._new(msg.xid)
        return []

    def _commit(self, lsn: int, msg: Commit) -> list[CommittedTransaction]:
        tx = self._regular
        if tx is None:
            error = AssemblyError("Commit without Begin", kind="Commit", lsn=lsn, end_lsn=msg.end_lsn)
            self._finish_bad(None, msg.commit_lsn, msg.end_lsn, "commit_lsn", error)
            return []
        self._regular = None
        if self._finish_bad(tx, msg.commit_lsn, msg.end_lsn, "commit_lsn"):
            return []
        return [CommittedTransaction(tx.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, tx.origin,
                                     "regular", None, _drain(tx.buffer))]

    def _origin(self, lsn: int, msg: Origin) -> list[CommittedTransaction]:
        target = self._current(lsn, "Origin", allow_none=True)
        if target is not None:
            target.origin = msg.name
        return []

    def _drop_stream_if_resent(self, xid: int) -> None:
        stale = self._streams.pop(xid, None)
        if stale is not None:
            log.warning("xid %s re-sent from its start (new decoding session); discarding its old buffer", xid)
            stale.buffer.discard()

    # --- catalog ----------------------------------------------------------------------------------

    def _relation(self, lsn: int, msg: Relation) -> list[CommittedTransaction]:
        self.catalog.update(msg)
        return []

    def _type(self, lsn: int, msg: Type) -> list[CommittedTransaction]:
        self.catalog.update_type(msg)
        return []

    # --- changes ----------------------------------------------------------------------------------

    def _current(self, lsn: int, kind: str, *, allow_none: bool = False) -> _Open | None:
        if self._stream_xid is not None:
            return self._streams[self._stream_xid]
        if self._regular is not None:
            return self._regular
        if self._regular_prepare is not None:
            return self._regular_prepare[0]
        if allow_none:
            return None
        raise AssemblyError("change outside a transaction (no Begin or Stream Start before it)", kind=kind, lsn=lsn)

    def _change(self, lsn: int, msg: Insert | Update | Delete | Truncate) -> list[CommittedTransaction]:
        tx = self._current(lsn, type(msg).__name__)
        assert tx is not None
        if tx.error is not None:
            return []  # it cannot be applied anyway; keep nothing more of it
        try:
            if isinstance(msg, Truncate):
                schemas = tuple(self.catalog.get(oid) for oid in msg.relation_oids)
            else:
                schemas = (self.catalog.get(msg.relation_oid),)
        except CatalogError as e:  # held like a bad message: the transaction may still abort or be skipped
            e.add_context(lsn=lsn, kind=type(msg).__name__)
            self._hold(tx, e)
            return []
        self._append(tx, lsn, msg, schemas)
        return []

    def _append(self, tx: _Open, lsn: int, msg: ChangeMessage, schemas: tuple[SchemaVersion, ...]) -> None:
        sub = msg.xid
        if self._stream_xid is not None and sub is not None and sub != tx.xid and sub not in tx.first_change_of:
            tx.first_change_of[sub] = len(tx.buffer)
        spills = tx.buffer.spill_events
        tx.buffer.append(_make_change(lsn, len(tx.buffer), msg, schemas), _size(msg))
        if tx.buffer.spill_events != spills and (spills == 0 or time.monotonic() - self._spill_said >= 10.0):
            self._spill_said = time.monotonic()
            log.info("transaction xid %s: %s changes so far, over apply.memory_budget_mb (%d MB): spilled to disk",
                     tx.xid, f"{len(tx.buffer):,}", self._budget >> 20)

    def _message(self, lsn: int, msg: LogicalMessage) -> list[CommittedTransaction]:
        if not msg.transactional:
            # Arrives at once, outside any transaction, even if its transaction later rolls back.
            if self._on_message is not None:
                self._on_message(msg, lsn)
            return []
        tx = self._current(lsn, "Message")
        assert tx is not None
        self._append(tx, lsn, msg, ())
        return []

    # --- streaming ------------------------------------------------------------------------------

    def _stream_start(self, lsn: int, msg: StreamStart) -> list[CommittedTransaction]:
        if self._stream_xid is not None:
            raise AssemblyError("Stream Start inside a stream block", kind="Stream Start", lsn=lsn, xid=msg.xid)
        if msg.first_segment:
            self._drop_stream_if_resent(msg.xid)
        if msg.xid not in self._streams:
            if not msg.first_segment:
                raise AssemblyError("Stream Start continues a transaction whose first segment was not seen",
                                    kind="Stream Start", lsn=lsn, xid=msg.xid)
            self._streams[msg.xid] = self._new(msg.xid)
        self._stream_xid = msg.xid
        return []

    def _stream_stop(self, lsn: int, msg: StreamStop) -> list[CommittedTransaction]:
        if self._stream_xid is None:
            raise AssemblyError("Stream Stop outside a stream block", kind="Stream Stop", lsn=lsn)
        self._stream_xid = None
        return []

    def _stream_commit(self, lsn: int, msg: StreamCommit) -> list[CommittedTransaction]:
        tx = self._streams.pop(msg.xid, None)
        if tx is None:
            error = AssemblyError("Stream Commit for a transaction never streamed here", kind="Stream Commit",
                                  lsn=lsn, xid=msg.xid)
            self._finish_bad(None, msg.commit_lsn, msg.end_lsn, "commit_lsn", error)
            return []
        if self._finish_bad(tx, msg.commit_lsn, msg.end_lsn, "commit_lsn"):
            return []
        return [CommittedTransaction(tx.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, tx.origin,
                                     "streamed", None, _drain(tx.buffer))]

    def _stream_abort(self, lsn: int, msg: StreamAbort) -> list[CommittedTransaction]:
        tx = self._streams.get(msg.xid)
        if tx is None:
            return []  # nothing of it was kept (e.g. aborted before a re-sent first segment)
        if msg.subxid == msg.xid:
            tx.buffer.discard()
            del self._streams[msg.xid]
            return []
        first = tx.first_change_of.get(msg.subxid)
        if first is None:
            return []  # the subtransaction sent no changes
        tx.buffer.truncate(first)
        tx.first_change_of = {s: i for s, i in tx.first_change_of.items() if i < first}
        if tx.error is not None and tx.error_at >= first:
            tx.error = None  # the bad message belonged to the rolled-back part
        return []

    # --- two-phase --------------------------------------------------------------------------------

    def _begin_prepare(self, lsn: int, msg: BeginPrepare) -> list[CommittedTransaction]:
        if self._regular_prepare is not None:
            self._regular_prepare[0].buffer.discard()
        self._drop_stream_if_resent(msg.xid)
        self._regular_prepare = (self._new(msg.xid), msg)
        return []

    def _prepare(self, lsn: int, msg: Prepare) -> list[CommittedTransaction]:
        if self._regular_prepare is None:
            raise AssemblyError("Prepare without Begin Prepare", kind="Prepare", lsn=lsn, gid=msg.gid)
        tx, _begin = self._regular_prepare
        self._regular_prepare = None
        self._stage(lsn, msg.gid, tx, msg.prepare_lsn, msg.end_lsn)
        return []

    def _stream_prepare(self, lsn: int, msg: StreamPrepare) -> list[CommittedTransaction]:
        tx = self._streams.pop(msg.xid, None)
        if tx is None:
            raise AssemblyError("Stream Prepare for a transaction never streamed here", kind="Stream Prepare",
                                lsn=lsn, xid=msg.xid, gid=msg.gid)
        self._stage(lsn, msg.gid, tx, msg.prepare_lsn, msg.end_lsn)
        return []

    def _stage(self, lsn: int, gid: str, tx: _Open, prepare_lsn: int, end_lsn: int) -> None:
        if self.prepared is None:
            raise AssemblyError("two-phase transaction received but no staging directory is configured",
                                kind="Prepare", lsn=lsn, gid=gid)
        if self._finish_bad(tx, prepare_lsn, end_lsn, "prepare_lsn"):
            tx.buffer = self._new(tx.xid).buffer  # staged empty: its Commit Prepared applies nothing
        self.prepared.stage(gid, tx.xid, tx.origin, prepare_lsn, end_lsn, tx.buffer)
        tx.buffer.discard()
        crashpoint("prepared_staged")

    def _commit_prepared(self, lsn: int, msg: CommitPrepared) -> list[CommittedTransaction]:
        if self.prepared is not None and not self.prepared.has(msg.gid) \
                and self.prepared.committed_end_lsn(msg.gid) == msg.end_lsn:
            return []  # re-sent after a crash: applied already (the slot had not been advanced past it)
        if self.prepared is not None and not self.prepared.has(msg.gid) \
                and self.prepared.never_prepared(msg.commit_lsn):
            # PostgreSQL 15-17 send Commit Prepared alone for a prepared transaction that decoded to no
            # change (staging.py says how this is told from lost changes): an empty transaction
            log.info("Commit Prepared of %r (xid %s) at %X/%X with no Prepare sent: it changed nothing "
                     "published; nothing to apply", msg.gid, msg.xid, msg.commit_lsn >> 32,
                     msg.commit_lsn & 0xFFFFFFFF)
            return []
        if msg.commit_lsn in self.skip_lsns:  # also the way past a lone one known to have changed nothing
            if self.prepared is not None:
                self.prepared.discard(msg.gid)
            self._report_skip(msg.commit_lsn, msg.xid, msg.end_lsn, "listed to skip")
            return []
        if self.prepared is None or not self.prepared.has(msg.gid):
            raise AssemblyError(
                "Commit Prepared for a transaction whose prepared changes are not staged here: either the "
                "slot moved past its Prepare without this applier (moved by something else, or a staging "
                "directory that is not this slot's) and its changes are lost — rebuild the affected tables "
                "from a snapshot — or it changed nothing published (PostgreSQL 15-17 then send Commit "
                "Prepared alone) and this state cannot prove it, as it did not follow the slot from its "
                "creation or the slot was moved beyond what it confirmed: then skip it with "
                "--skip-transaction and its commit LSN", kind="Commit Prepared", lsn=lsn, gid=msg.gid,
                commit_lsn=msg.commit_lsn)
        staged = self.prepared.load(msg.gid)
        return [CommittedTransaction(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, staged.origin,
                                     "prepared", msg.gid, staged.changes)]

    def _rollback_prepared(self, lsn: int, msg: RollbackPrepared) -> list[CommittedTransaction]:
        if self.prepared is not None:
            self.prepared.discard(msg.gid)
        return []

    @staticmethod
    def release(txn: CommittedTransaction) -> None:
        """Free a committed transaction's buffered changes (memory and spill file) once they have been
        read for the last time; its staged copy, if it was prepared, stays until :meth:`finished`."""
        close = getattr(txn.changes, "close", None)
        if close is not None:
            close()

    def finished(self, txn: CommittedTransaction) -> None:
        """Tell the assembler a committed transaction is durably applied: release its spill file and
        drop its staged copy."""
        self.release(txn)
        if txn.kind == "prepared" and txn.gid is not None and self.prepared is not None:
            self.prepared.committed(txn.gid, txn.end_lsn)


class SpooledChanges:
    """The changes of a committed transaction, read back in order from its buffer (memory + spill file).

    Re-iterable until :meth:`close`; a transaction larger than memory is never materialized here.
    """

    __slots__ = ("_buffer",)

    def __init__(self, buffer: ChangeBuffer) -> None:
        self._buffer: ChangeBuffer | None = buffer

    def __iter__(self) -> Iterator[Change]:
        if self._buffer is None:
            raise AssemblyError("the changes of this transaction were released already")
        return iter(self._buffer)

    def __len__(self) -> int:
        return len(self._buffer) if self._buffer is not None else 0

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.discard()
            self._buffer = None


def _drain(buffer: ChangeBuffer) -> SpooledChanges:
    return SpooledChanges(buffer)


# Rough Python object cost of one buffered change (dataclasses, tuples, bytes headers), measured
# with tracemalloc: ~390 bytes for a two-column insert. The budget counts this, not just payload.
_CHANGE_OVERHEAD = 320
_COLUMN_OVERHEAD = 40


def _tuple_size(t: TupleData | None) -> int:
    if t is None:
        return 0
    return _COLUMN_OVERHEAD * len(t.kinds) + sum(map(len, filter(None, t.values)))  # None and b"" add 0


def _size(msg: ChangeMessage) -> int:
    if isinstance(msg, Insert):
        return _CHANGE_OVERHEAD + _tuple_size(msg.new)
    if isinstance(msg, Update):
        return _CHANGE_OVERHEAD + _tuple_size(msg.new) + _tuple_size(msg.old)
    if isinstance(msg, Delete):
        return _CHANGE_OVERHEAD + _tuple_size(msg.old)
    if isinstance(msg, LogicalMessage):
        return _CHANGE_OVERHEAD + len(msg.content)
    return _CHANGE_OVERHEAD


#: Each handler takes its own message class: the dict pairs them, so the message argument is typed Any.
_DISPATCH: dict[type, Callable[[TransactionAssembler, int, Any], list[CommittedTransaction]]] = {
    Begin: TransactionAssembler._begin, Commit: TransactionAssembler._commit,
    Origin: TransactionAssembler._origin, Relation: TransactionAssembler._relation,
    Type: TransactionAssembler._type, Insert: TransactionAssembler._change,
    Update: TransactionAssembler._change, Delete: TransactionAssembler._change,
    Truncate: TransactionAssembler._change, LogicalMessage: TransactionAssembler._message,
    StreamStart: TransactionAssembler._stream_start, StreamStop: TransactionAssembler._stream_stop,
    StreamCommit: TransactionAssembler._stream_commit, StreamAbort: TransactionAssembler._stream_abort,
    BeginPrepare: TransactionAssembler._begin_prepare, Prepare: TransactionAssembler._prepare,
    StreamPrepare: TransactionAssembler._stream_prepare,
    CommitPrepared: TransactionAssembler._commit_prepared,
    RollbackPrepared: TransactionAssembler._rollback_prepared,
}

