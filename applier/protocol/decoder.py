"""Decode pgoutput messages (protocol versions 1 to 4) into the dataclasses of ``messages.py``.

Pure: bytes in, one frozen dataclass out; no catalog lookups, no type conversion. The layouts follow
PostgreSQL's ``src/backend/replication/logical/proto.c`` (``logicalrep_write_*``), which is the
only specification that matches what servers really send. Facts that break naive decoders:

* Inside a stream block (between Stream Start 'S' and Stream Stop 'E') the messages I, U, D, T, R,
  Y and M carry an extra Int32 xid right after the type byte. A single message does not say whether
  it is in a stream, so the caller tells us (``in_stream``) or uses :class:`MessageDecoder`, which
  follows S/E itself.
* Stream Abort is 9 bytes after the type byte (xid, subxid) or 25 with ``streaming = parallel``
  (protocol 4: plus abort LSN and abort time). Nothing in the message says which: the length does.
* Begin Prepare has no flags byte; Prepare, Stream Prepare, Commit Prepared and Rollback Prepared do.
* Relation and Type send the namespace ``""`` for ``pg_catalog`` (``logicalrep_write_namespace``);
  we pass it through as sent so that the catalog layer decides, and nothing is silently renamed.
* Strings are NUL-terminated and, because the decoding session is pinned to client_encoding UTF8,
  UTF-8.

Bad input never escapes as ``IndexError``/``struct.error``/``UnicodeDecodeError`` and never yields a
partial message: every read is bounds-checked, trailing bytes are an error, and the resulting
:class:`~applier.errors.DecodeError` names the message kind, the byte offset and (when the caller
passes it) the LSN.

Speed matters (a busy slot is mostly small inserts and updates): fixed headers are unpacked with
one precompiled ``Struct`` call (``wire.py``) and TupleData is walked by the scanners of
``tupledata.py`` (also used by the short-row reader), one per column count, its loop unrolled.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct, unpack_from
from typing import Any

from applier.errors import DecodeError
from applier.infra.fastobj import layout_twin
from applier.protocol import wire
from applier.protocol.messages import (
    KIND_NAMES,
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
    RelationColumn,
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
from applier.protocol.tupledata import (
    SCAN_ERRORS,
    SCANNERS,
    VIEW_FROM_BYTES,
    Scanned,
    ScannedViews,
    scan_tuple_checked,
    scan_tuple_views,
)
from applier.protocol.tupledata import Malformed as _Malformed

__all__ = ["decode_message", "MessageDecoder"]

# Fast constructors for the hot message classes. A frozen dataclass's __init__ sets each field via
# object.__setattr__(self, "name", value), a by-name lookup per field, which is most of the cost of a
# Begin or Commit. Instead the decoder fills a "layout twin": a plain class with the very same
# __slots__ (so the same memory layout) and no __setattr__, whose attribute stores are CPython's
# fastest (STORE_ATTR specialised for slots), and then re-labels the object as the frozen class
# (``__class__`` assignment, which CPython only allows between identical layouts). The result IS a
# frozen instance: same fields, equality, hash and immutability. About a third cheaper per message
# than calling the slot descriptors; tests/protocol check that every decoded message equals the one
# its regular constructor builds.
# applier.infra.fastobj has the general form (a generated constructor function). These six are
# inlined into their decoders by hand on purpose: calling the generated constructor instead made
# bench/decode.py 25-35% slower on a log of small transactions (ratio to pypgoutput 3.9 vs 5.3,
# interleaved runs), since B/I/C and their TupleData are most of what a busy slot carries.
_new = object.__new__
_BeginTwin: Any = layout_twin(Begin)
_CommitTwin: Any = layout_twin(Commit)
_InsertTwin: Any = layout_twin(Insert)
_UpdateTwin: Any = layout_twin(Update)
_DeleteTwin: Any = layout_twin(Delete)
_TupleTwin: Any = layout_twin(TupleData)

#: The TupleData scanners by column count (``tupledata.SCANNERS``): the hot messages call the one for
#: their tuple's count themselves, one call less than ``scan_tuple``.
Scanners = dict[int, Callable[[bytes, int, int], Scanned]]


def _truncated(what: str, offset: int) -> _Malformed:
    return _Malformed(f"truncated {what}", offset)


def _check_end(data: bytes, pos: int) -> None:
    """A complete message must use every byte: trailing bytes mean we misread the layout."""
    if pos != len(data):
        raise _Malformed(f"{len(data) - pos} trailing bytes after a complete message", pos)


def _fixed(data: bytes, layout: Struct, pos: int) -> None:
    """Check that ``data`` is exactly ``pos`` bytes plus one fixed-size ``layout``."""
    size = layout.size
    n = len(data)
    if n < pos + size:
        raise _truncated(f"message: needs {pos + size} bytes, has {n}", n)
    _check_end(data, pos + size)


def _string(data: bytes, pos: int, what: str) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string starting at ``pos``; returns it and the position after the NUL."""
    end = data.find(b"\0", pos)
    if end < 0:
        raise _Malformed(f"{what} has no NUL terminator", len(data))
    try:
        return data[pos:end].decode("utf-8"), end + 1
    except UnicodeDecodeError as e:
        raise _Malformed(f"{what} is not valid UTF-8", pos + e.start) from e


def _tuple(data: bytes, pos: int, n: int, _new: Callable[[type], Any] = _new, _twin: Any = _TupleTwin,
           _cls: type = TupleData, _large: int = VIEW_FROM_BYTES, _scanners: Scanners = SCANNERS
           ) -> tuple[TupleData, int]:
    """The TupleData at ``pos`` (``n`` = ``len(data)``) and the position after it: walked by the one
    scanner (``tupledata.py``), built as a layout twin (see above). Anything unusual goes to the
    careful scanner. The hot messages, Insert and Update's new tuple, inline this body
    by hand (one Python call less per row: measurable on bench/decode.py)."""
    try:
        values: tuple[bytes | memoryview | None, ...]
        if n < _large:
            kinds, values, p = _scanners[(data[pos] << 8) | data[pos + 1]](data, pos, n)
        else:
            kinds, values, p = scan_tuple_views(data, pos, n)
    except SCAN_ERRORS:
        return _tuple_carefully(data, pos)
    obj = _new(_twin)
    obj.kinds = kinds
    obj.values = values
    obj.__class__ = _cls
    return obj, p


def _tuple_carefully(data: bytes, pos: int) -> tuple[TupleData, int]:
    """After the fast scan gave up: the careful scanner reports the exact byte (or, for a tuple the
    fast scan cannot take, reads it)."""
    kinds, values, p = scan_tuple_checked(data, pos)
    return TupleData(kinds, values), p


# --- transaction framing -------------------------------------------------------------------------


def _begin(data: bytes, in_stream: bool, _unpack: Callable[..., tuple[int, ...]] = wire.BEGIN.unpack_from,
           _new: Callable[[type], Any] = _new, _twin: type = _BeginTwin, _cls: type = Begin) -> Begin:
    if len(data) != 21:
        _fixed(data, wire.BEGIN, 1)
    obj = _new(_twin)
    obj.final_lsn, obj.commit_time, obj.xid = _unpack(data, 1)
    obj.__class__ = _cls
    return obj  # type: ignore[no-any-return]  # the twin re-labelled as the frozen class


def _commit(data: bytes, in_stream: bool, _unpack: Callable[..., tuple[int, ...]] = wire.COMMIT.unpack_from,
            _new: Callable[[type], Any] = _new, _twin: type = _CommitTwin, _cls: type = Commit) -> Commit:
    if len(data) != 26:
        _fixed(data, wire.COMMIT, 1)
    obj = _new(_twin)
    obj.flags, obj.commit_lsn, obj.end_lsn, obj.commit_time = _unpack(data, 1)
    obj.__class__ = _cls
    return obj  # type: ignore[no-any-return]  # the twin re-labelled as the frozen class


def _origin(data: bytes, in_stream: bool) -> Origin:
    if len(data) < 9:
        raise _truncated("origin LSN", len(data))
    (commit_lsn,) = wire.ORIGIN.unpack_from(data, 1)
    name, pos = _string(data, 9, "origin name")
    _check_end(data, pos)
    return Origin(commit_lsn, name)


# --- catalog -------------------------------------------------------------------------------------


def _stream_xid(data: bytes, in_stream: bool) -> tuple[int | None, int]:
    """The in-stream xid right after the type byte, and where the body starts."""
    if not in_stream:
        return None, 1
    if len(data) < 5:
        raise _truncated("in-stream xid", len(data))
    return wire.UINT32.unpack_from(data, 1)[0], 5


_REPLICA_IDENTITIES = frozenset(b"dnfi")


def _relation(data: bytes, in_stream: bool) -> Relation:
    xid, pos = _stream_xid(data, in_stream)
    n = len(data)
    if pos + 4 > n:
        raise _truncated("relation OID", n)
    (oid,) = wire.UINT32.unpack_from(data, pos)
    namespace, pos = _string(data, pos + 4, "namespace")
    name, pos = _string(data, pos, "relation name")
    if pos + 3 > n:
        raise _truncated("replica identity and column count", n)
    ident, natts = wire.RELATION_TAIL.unpack_from(data, pos)
    if ident not in _REPLICA_IDENTITIES:
        raise _Malformed(f"unknown replica identity {bytes((ident,))!r}", pos)
    pos += 3
    columns = []
    col_tail = wire.COLUMN_TAIL
    for i in range(natts):
        if pos >= n:
            raise _truncated(f"column {i + 1} of {natts}", n)
        flags = data[pos]
        col_name, pos = _string(data, pos + 1, f"name of column {i + 1}")
        if pos + 8 > n:
            raise _truncated(f"type of column {i + 1}", n)
        type_oid, typmod = col_tail.unpack_from(data, pos)
        pos += 8
        columns.append(RelationColumn(flags, col_name, type_oid, typmod))
    _check_end(data, pos)
    return Relation(xid, oid, namespace, name, chr(ident), tuple(columns))


def _type(data: bytes, in_stream: bool) -> Type:
    xid, pos = _stream_xid(data, in_stream)
    if pos + 4 > len(data):
        raise _truncated("type OID", len(data))
    (oid,) = wire.UINT32.unpack_from(data, pos)
    namespace, pos = _string(data, pos + 4, "namespace")
    name, pos = _string(data, pos, "type name")
    _check_end(data, pos)
    return Type(xid, oid, namespace, name)


# --- changes -------------------------------------------------------------------------------------


def _change_head(data: bytes, in_stream: bool) -> tuple[int | None, int, int, int]:
    """(xid, relation OID, first tuple tag, position after the tag) of I/U/D."""
    n = len(data)
    if in_stream:
        if n < 10:
            raise _truncated("change header", n)
        xid, relid, tag = wire.STREAM_CHANGE_HEAD.unpack_from(data, 1)
        return xid, relid, tag, 10
    if n < 6:
        raise _truncated("change header", n)
    relid, tag = wire.CHANGE_HEAD.unpack_from(data, 1)
    return None, relid, tag, 6


def _insert(data: bytes, in_stream: bool, _head: Callable[..., tuple[int, ...]] = wire.CHANGE_HEAD.unpack_from,
            _scanners: Scanners = SCANNERS, _errors: Any = SCAN_ERRORS,
            _views: Callable[[bytes, int, int], ScannedViews] = scan_tuple_views, _large: int = VIEW_FROM_BYTES,
            _new: Callable[[type], Any] = _new, _twin: type = _InsertTwin, _cls: type = Insert,
            _ttwin: Any = _TupleTwin, _tcls: type = TupleData) -> Insert:
    n = len(data)
    if in_stream:
        if n < 10:
            raise _truncated("change header", n)
        xid, relid, tag = wire.STREAM_CHANGE_HEAD.unpack_from(data, 1)
        pos = 10
    else:
        if n < 6:
            raise _truncated("change header", n)
        relid, tag = _head(data, 1)
        xid, pos = None, 6
    if tag != 78:  # 'N'
        raise _Malformed(f"expected new tuple 'N', got {bytes((tag,))!r}", pos - 1)
    try:  # _tuple, inlined
        values: tuple[bytes | memoryview | None, ...]
        if n < _large:
            kinds, values, pos = _scanners[(data[pos] << 8) | data[pos + 1]](data, pos, n)
        else:
            kinds, values, pos = _views(data, pos, n)
    except _errors:
        new, pos = _tuple_carefully(data, pos)
    else:
        new = _new(_ttwin)
        new.kinds = kinds
        new.values = values
        new.__class__ = _tcls
    if pos != n:
        _check_end(data, pos)
    obj = _new(_twin)
    obj.xid = xid
    obj.relation_oid = relid
    obj.new = new
    obj.__class__ = _cls
    return obj  # type: ignore[no-any-return]  # the twin re-labelled as the frozen class


def _update(data: bytes, in_stream: bool, _head: Callable[..., tuple[int, ...]] = wire.CHANGE_HEAD.unpack_from,
            _scanners: Scanners = SCANNERS, _errors: Any = SCAN_ERRORS,
            _views: Callable[[bytes, int, int], ScannedViews] = scan_tuple_views, _large: int = VIEW_FROM_BYTES,
            _new: Callable[[type], Any] = _new, _twin: type = _UpdateTwin, _cls: type = Update,
            _ttwin: Any = _TupleTwin, _tcls: type = TupleData) -> Update:
    n = len(data)
    if in_stream:
        xid, relid, tag, pos = _change_head(data, in_stream)
    else:
        if n < 6:
            raise _truncated("change header", n)
        relid, tag = _head(data, 1)
        xid, pos = None, 6
    old = None
    old_kind = None
    if tag == 75 or tag == 79:  # 'K' old key, 'O' old row
        old_kind = "K" if tag == 75 else "O"
        old, pos = _tuple(data, pos, n)
        if pos >= n:
            raise _truncated("update: new tuple tag", n)
        tag = data[pos]
        pos += 1
    if tag != 78:
        raise _Malformed(f"expected new tuple 'N', got {bytes((tag,))!r}", pos - 1)
    try:  # _tuple, inlined
        values: tuple[bytes | memoryview | None, ...]
        if n < _large:
            kinds, values, pos = _scanners[(data[pos] << 8) | data[pos + 1]](data, pos, n)
        else:
            kinds, values, pos = _views(data, pos, n)
    except _errors:
        new, pos = _tuple_carefully(data, pos)
    else:
        new = _new(_ttwin)
        new.kinds = kinds
        new.values = values
        new.__class__ = _tcls
    if pos != n:
        _check_end(data, pos)
    obj = _new(_twin)
    obj.xid = xid
    obj.relation_oid = relid
    obj.old_kind = old_kind
    obj.old = old
    obj.new = new
    obj.__class__ = _cls
    return obj  # type: ignore[no-any-return]  # the twin re-labelled as the frozen class


def _delete(data: bytes, in_stream: bool, _head: Callable[..., tuple[int, ...]] = wire.CHANGE_HEAD.unpack_from,
            _new: Callable[[type], Any] = _new, _twin: type = _DeleteTwin, _cls: type = Delete) -> Delete:
    n = len(data)
    if in_stream:
        xid, relid, tag, pos = _change_head(data, in_stream)
    else:
        if n < 6:
            raise _truncated("change header", n)
        relid, tag = _head(data, 1)
        xid, pos = None, 6
    if tag == 75:  # 'K' old key
        old_kind = "K"
    elif tag == 79:  # 'O' old row
        old_kind = "O"
    else:
        raise _Malformed(f"expected old tuple 'K' or 'O', got {bytes((tag,))!r}", pos - 1)
    old, pos = _tuple(data, pos, n)
    if pos != n:
        _check_end(data, pos)
    obj = _new(_twin)
    obj.xid = xid
    obj.relation_oid = relid
    obj.old_kind = old_kind
    obj.old = old
    obj.__class__ = _cls
    return obj  # type: ignore[no-any-return]  # the twin re-labelled as the frozen class


def _truncate_message(data: bytes, in_stream: bool) -> Truncate:
    xid, pos = _stream_xid(data, in_stream)
    n = len(data)
    if pos + 5 > n:
        raise _truncated("truncate header", n)
    nrels, options = wire.TRUNCATE_HEAD.unpack_from(data, pos)
    pos += 5
    end = pos + 4 * nrels
    if end > n:
        raise _truncated(f"relation OIDs ({nrels} announced)", n)
    _check_end(data, end)
    return Truncate(xid, options, unpack_from(f"!{nrels}I", data, pos))


def _message(data: bytes, in_stream: bool) -> LogicalMessage:
    xid, pos = _stream_xid(data, in_stream)
    n = len(data)
    if pos + 9 > n:
        raise _truncated("message header", n)
    flags, lsn = wire.MESSAGE_HEAD.unpack_from(data, pos)
    prefix, pos = _string(data, pos + 9, "message prefix")
    if pos + 4 > n:
        raise _truncated("message content length", n)
    (length,) = wire.INT32.unpack_from(data, pos)
    if length < 0:
        raise _Malformed(f"negative message content length {length}", pos)
    pos += 4
    if pos + length > n:
        raise _truncated(f"message content ({length} bytes)", n)
    _check_end(data, pos + length)
    return LogicalMessage(xid, flags, lsn, prefix, data[pos:pos + length])


# --- streaming (protocol 2+) ---------------------------------------------------------------------


def _stream_start(data: bytes, in_stream: bool) -> StreamStart:
    _fixed(data, wire.STREAM_START, 1)
    xid, first = wire.STREAM_START.unpack_from(data, 1)
    return StreamStart(xid, first == 1)


def _stream_stop(data: bytes, in_stream: bool) -> StreamStop:
    _check_end(data, 1)
    return StreamStop()


def _stream_commit(data: bytes, in_stream: bool) -> StreamCommit:
    _fixed(data, wire.STREAM_COMMIT, 1)
    return StreamCommit(*wire.STREAM_COMMIT.unpack_from(data, 1))


def _stream_abort(data: bytes, in_stream: bool) -> StreamAbort:
    # 1 + 8 bytes normally, 1 + 24 with streaming=parallel (protocol 4): decided by length.
    n = len(data)
    if n == 1 + wire.STREAM_ABORT.size:
        return StreamAbort(*wire.STREAM_ABORT.unpack_from(data, 1))
    if n == 1 + wire.STREAM_ABORT_PARALLEL.size:
        return StreamAbort(*wire.STREAM_ABORT_PARALLEL.unpack_from(data, 1))
    if n < 1 + wire.STREAM_ABORT.size or n > 1 + wire.STREAM_ABORT_PARALLEL.size:
        _fixed(data, wire.STREAM_ABORT if n < 9 else wire.STREAM_ABORT_PARALLEL, 1)
    # Between the two forms: trailing bytes after the short one, or a cut-off long one.
    raise _Malformed(f"length {n - 1} is neither 8 (xid, subxid) nor 24 (with abort LSN and time)",
                     1 + wire.STREAM_ABORT.size)


# --- two-phase (protocol 3+) ---------------------------------------------------------------------


def _with_gid(data: bytes, layout: Struct) -> tuple[Any, ...]:
    """The fixed fields of ``layout`` followed by the gid string: the constructor's arguments."""
    size = layout.size
    if len(data) < 1 + size:
        raise _truncated("message header", len(data))
    fields = layout.unpack_from(data, 1)
    gid, pos = _string(data, 1 + size, "gid")
    _check_end(data, pos)
    return (*fields, gid)


def _begin_prepare(data: bytes, in_stream: bool) -> BeginPrepare:
    return BeginPrepare(*_with_gid(data, wire.BEGIN_PREPARE))


def _prepare(data: bytes, in_stream: bool) -> Prepare:
    return Prepare(*_with_gid(data, wire.PREPARE))


def _commit_prepared(data: bytes, in_stream: bool) -> CommitPrepared:
    return CommitPrepared(*_with_gid(data, wire.PREPARE))


def _rollback_prepared(data: bytes, in_stream: bool) -> RollbackPrepared:
    return RollbackPrepared(*_with_gid(data, wire.ROLLBACK_PREPARED))


def _stream_prepare(data: bytes, in_stream: bool) -> StreamPrepare:
    return StreamPrepare(*_with_gid(data, wire.PREPARE))


_Decoder = Callable[[bytes, bool], Message]

_DECODERS: dict[str, _Decoder] = {
    "B": _begin, "C": _commit, "O": _origin, "R": _relation, "Y": _type, "I": _insert,
    "U": _update, "D": _delete, "T": _truncate_message, "M": _message, "S": _stream_start,
    "E": _stream_stop, "c": _stream_commit, "A": _stream_abort, "b": _begin_prepare,
    "P": _prepare, "K": _commit_prepared, "r": _rollback_prepared, "p": _stream_prepare,
}

#: The one dispatch table: type byte -> (human name, decoder).
_DISPATCH: dict[int, tuple[str, _Decoder]] = {ord(byte): (KIND_NAMES[byte], fn) for byte, fn in _DECODERS.items()}

#: Type byte -> decoder only, for the per-message fast path of MessageDecoder.
_FUNCS: dict[int, _Decoder] = {byte: fn for byte, (_, fn) in _DISPATCH.items()}

#: Type bytes whose messages carry an xid after the type byte inside a stream block.
STREAM_XID_KINDS = frozenset("IUDTRYM")


def decode_message(data: bytes, *, in_stream: bool = False, lsn: int | None = None) -> Message:
    """Decode one pgoutput message. ``in_stream``: the message sits between Stream Start and Stream
    Stop (so I/U/D/T/R/Y/M carry an xid). ``lsn`` is only used for error context."""
    if data.__class__ is not bytes:
        data = bytes(data)
    if not data:
        raise DecodeError("empty pgoutput message", offset=0, lsn=lsn)
    entry = _DISPATCH.get(data[0])
    if entry is None:
        raise DecodeError("unknown pgoutput message type byte", type_byte=repr(data[:1]), offset=0, lsn=lsn)
    try:
        return entry[1](data, in_stream)
    except _Malformed as e:
        raise DecodeError(e.reason, kind=entry[0], offset=e.offset, lsn=lsn,
                          in_stream=True if in_stream else None) from e


class MessageDecoder:
    """Decodes a message sequence, following Stream Start / Stream Stop to know whether the next
    message is inside a stream block. That flag is the only state; :meth:`reset` clears it when a
    new decoding session (a new peek, a new START_REPLICATION) begins, because a session never
    starts inside a stream block."""

    __slots__ = ("_in_stream",)

    def __init__(self) -> None:
        self._in_stream = False

    @property
    def in_stream(self) -> bool:
        return self._in_stream

    def reset(self) -> None:
        self._in_stream = False

    def decode(self, data: bytes, lsn: int | None = None) -> Message:
        # decode_message inlined for the common case (one call less per message); anything unusual
        # (not bytes, empty, unknown type byte, malformed) goes through decode_message for the error.
        if data.__class__ is not bytes:
            data = bytes(data)
        try:
            kind = data[0]
            msg = _FUNCS[kind](data, self._in_stream)
        except (_Malformed, KeyError, IndexError):
            return self._decode_carefully(data, lsn)
        if kind == 83 or kind == 69:  # 'S' Stream Start, 'E' Stream Stop
            self._in_stream = kind == 83
        return msg

    def _decode_carefully(self, data: bytes, lsn: int | None) -> Message:
        """The error (or, for a message the fast path cannot tell apart, the result) of decode_message."""
        msg = decode_message(data, in_stream=self._in_stream, lsn=lsn)
        if data[0] == 83 or data[0] == 69:
            self._in_stream = data[0] == 83
        return msg
