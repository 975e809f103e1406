"""What the stages after decoding read from a pgoutput message's bytes without decoding it: the type
byte, a change's relation OID, a prepared transaction's xid, named here.

Why: the survey of a log (applier.drivers.executors) and the feeder's short way through plain
transactions (applier.assembly.feeder) look at millions of messages of which they need one field.
Decoding each into a dataclass would cost most of their time, so they read the field in place; the
offsets they read at are this package's knowledge (the layouts of ``wire.py``, PostgreSQL's
``proto.c``), kept here beside the decoder that reads the same layouts, instead of as bare numbers
in the stages that use them. Every reader is a pure function; none checks more than that the bytes
are long enough (a damaged message is the decoder's to report, with its offset).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from applier.protocol import wire

# --- message type bytes (the first byte of every pgoutput message) ---------------------------------

BEGIN: Final = 0x42  # 'B'
COMMIT: Final = 0x43  # 'C'
ORIGIN: Final = 0x4F  # 'O'
RELATION: Final = 0x52  # 'R'
TYPE: Final = 0x59  # 'Y'
INSERT: Final = 0x49  # 'I'
UPDATE: Final = 0x55  # 'U'
DELETE: Final = 0x44  # 'D'
TRUNCATE: Final = 0x54  # 'T'
MESSAGE: Final = 0x4D  # 'M'
STREAM_START: Final = 0x53  # 'S'
STREAM_STOP: Final = 0x45  # 'E'
STREAM_COMMIT: Final = 0x63  # 'c'
STREAM_ABORT: Final = 0x41  # 'A'
BEGIN_PREPARE: Final = 0x62  # 'b'
PREPARE: Final = 0x50  # 'P'
COMMIT_PREPARED: Final = 0x4B  # 'K'
ROLLBACK_PREPARED: Final = 0x72  # 'r'
STREAM_PREPARE: Final = 0x70  # 'p'

#: Insert, Update, Delete: the row changes.
ROW_KINDS: Final = frozenset((INSERT, UPDATE, DELETE))
#: Messages that belong to the transaction around them (inside a stream block they carry its xid).
IN_TRANSACTION_KINDS: Final = frozenset((INSERT, UPDATE, DELETE, TRUNCATE, RELATION, TYPE, MESSAGE))

# --- tuple tags inside Insert/Update/Delete ---------------------------------------------------------

NEW_TUPLE: Final = 0x4E  # 'N'
OLD_KEY: Final = 0x4B  # 'K': the old row's replica identity columns
OLD_ROW: Final = 0x4F  # 'O': the whole old row (REPLICA IDENTITY FULL)

# --- where the fields sit ---------------------------------------------------------------------------

#: Insert/Update/Delete outside a stream block: type byte, relation OID, first tuple tag, tuple.
CHANGE_OID_AT: Final = 1
CHANGE_TAG_AT: Final = CHANGE_OID_AT + 4
CHANGE_TUPLE_AT: Final = CHANGE_TAG_AT + 1
#: Inside a stream block the (sub)transaction's xid comes first.
STREAM_CHANGE_OID_AT: Final = CHANGE_OID_AT + 4
#: Prepare, Stream Prepare, Commit Prepared: the xid ends the fixed part (``wire.PREPARE``).
_PREPARE_XID_AT: Final = 1 + wire.PREPARE.size - 4
#: Rollback Prepared: likewise (``wire.ROLLBACK_PREPARED``).
_ROLLBACK_XID_AT: Final = 1 + wire.ROLLBACK_PREPARED.size - 4


def kind_of(data: bytes) -> int:
    """The message's type byte, 0 for an empty message."""
    return data[0] if data else 0


def change_relation_oid(data: bytes, in_stream: bool = False) -> int | None:
    """The relation OID of an Insert, Update or Delete (``in_stream``: inside a stream block, where the
    xid comes first); None for another kind or bytes too short to hold it."""
    if kind_of(data) not in ROW_KINDS:
        return None
    at = STREAM_CHANGE_OID_AT if in_stream else CHANGE_OID_AT
    if len(data) < at + 4:
        return None
    return wire.UINT32.unpack_from(data, at)[0]  # type: ignore[no-any-return]


def end_of_row_changes(datas: Sequence[bytes], start: int, _kinds: frozenset[int] = ROW_KINDS) -> int:
    """The index of the first message at or after ``start`` that is not an Insert, Update or Delete
    (``len(datas)`` when there is none): the run of row changes a plain transaction holds. One tight
    loop here instead of a call per message in the caller's (millions of messages per range)."""
    n = len(datas)
    j = start
    while j < n:
        data = datas[j]
        if not data or data[0] not in _kinds:
            return j
        j += 1
    return n


def plain_change_oid(data: bytes, _unpack: Callable[[bytes, int], tuple[int]] = wire.UINT32.unpack_from) -> int:
    """The relation OID of an Insert, Update or Delete outside a stream block whose kind the caller
    has checked (``end_of_row_changes``); raises ``struct.error`` when the bytes are too short."""
    return _unpack(data, CHANGE_OID_AT)[0]


def prepared_xid(data: bytes) -> int:
    """The xid of the prepared transaction a Prepare, Stream Prepare, Commit Prepared or Rollback
    Prepared names. Raises ValueError for another kind or bytes too short to hold it."""
    kind = kind_of(data)
    if kind == ROLLBACK_PREPARED:
        at = _ROLLBACK_XID_AT
    elif kind in (PREPARE, STREAM_PREPARE, COMMIT_PREPARED):
        at = _PREPARE_XID_AT
    else:
        raise ValueError(f"not a two-phase end message: {bytes((kind,))!r}")
    if len(data) < at + 4:
        raise ValueError("message too short for its xid")
    return wire.UINT32.unpack_from(data, at)[0]  # type: ignore[no-any-return]
