"""Typed pgoutput messages: one frozen dataclass per message kind of protocol versions 1 to 4.

These mirror the structs of PostgreSQL's ``src/include/replication/logicalproto.h`` and the
"Logical Replication Message Formats" chapter of the PostgreSQL docs. They hold wire values as they
are: LSNs as ints, timestamps as microseconds since 2000-01-01 UTC (``pg_time_to_datetime``
converts), column values as raw bytes tagged with their kind. Nothing here converts types or looks
anything up; that is the catalog's and the values layer's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

#: PostgreSQL's epoch for TimestampTz on the wire.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# TupleData column kinds, as the byte values that appear on the wire.
COL_NULL = ord("n")
COL_UNCHANGED_TOAST = ord("u")
COL_TEXT = ord("t")
COL_BINARY = ord("b")

# Relation replica identity settings (pg_class.relreplident).
REPLICA_IDENTITY_DEFAULT = "d"
REPLICA_IDENTITY_NOTHING = "n"
REPLICA_IDENTITY_FULL = "f"
REPLICA_IDENTITY_INDEX = "i"

# Truncate option bits.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

# Logical decoding message flag bit.
MESSAGE_TRANSACTIONAL = 1


def pg_time_to_datetime(micros: int) -> datetime:
    """Wire timestamp (microseconds since 2000-01-01 UTC) to an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=micros)


class ValuesWithViews(tuple):  # type: ignore[type-arg]  # the values of TupleData, as a plain tuple's
    """``TupleData.values`` when one of them is a view of its message: a tuple like any other (equal,
    hashed and compared as one), whose type tells the values layer so before it converts the row (one
    identity check, instead of converting the row halfway and starting again)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TupleData:
    """One row image as sent: per published column a kind and the raw bytes.

    ``kinds[i]`` is one of ``COL_NULL`` ('n'), ``COL_UNCHANGED_TOAST`` ('u'), ``COL_TEXT`` ('t'),
    ``COL_BINARY`` ('b') (ints, as indexing ``bytes`` gives). ``values[i]`` is the raw bytes for 't'
    (text in the client encoding) and 'b' (the type's binary send format), and None for 'n' and 'u'.
    Keeping the kinds apart matters: an unchanged TOAST column is *not* NULL.

    A value of ``protocol.tupledata.VIEW_FROM_BYTES`` bytes or more may be a read-only ``memoryview``
    of the message it came in (the decoder does not copy TOAST-sized values; ``values`` is then a
    :class:`ValuesWithViews`). It compares equal to and hashes as its bytes; a copy of the tuple
    (pickle, ``copy``) holds ``bytes``, so a spilled or shipped tuple does not keep the message alive
    and unpickles anywhere.
    """

    kinds: bytes
    values: tuple[bytes | memoryview | None, ...]

    def __len__(self) -> int:
        return len(self.kinds)

    def __reduce__(self) -> tuple[type[TupleData], tuple[bytes, tuple[bytes | None, ...]]]:
        return TupleData, (self.kinds, tuple(v.tobytes() if isinstance(v, memoryview) else v
                                             for v in self.values))


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int  # bit 1: part of the replica identity key
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


# --- transaction framing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


# --- catalog -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None  # set only inside a stream block
    oid: int
    namespace: str  # "" means pg_catalog on the wire; the decoder passes it through as sent
    name: str
    replica_identity: str  # one of REPLICA_IDENTITY_*
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    xid: int | None
    oid: int
    namespace: str
    name: str


# --- changes -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    xid: int | None
    relation_oid: int
    old_kind: str | None  # "K" (old key), "O" (whole old row, REPLICA IDENTITY FULL) or None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relation_oid: int
    old_kind: str  # "K" or "O"
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    options: int  # TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY
    relation_oids: tuple[int, ...]

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """'M': pg_logical_emit_message. Inside a stream block ``xid`` is the top-level xid."""

    xid: int | None
    flags: int
    lsn: int
    prefix: str
    content: bytes

    @property
    def transactional(self) -> bool:
        return bool(self.flags & MESSAGE_TRANSACTIONAL)


# --- streaming (protocol 2+) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int
    abort_lsn: int | None = None  # protocol 4 with streaming=parallel only
    abort_time: int | None = None


# --- two-phase (protocol 3+) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


Message = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | LogicalMessage
    | StreamStart | StreamStop | StreamCommit | StreamAbort
    | BeginPrepare | Prepare | CommitPrepared | RollbackPrepared | StreamPrepare
)

#: The type byte of each message class, as PostgreSQL's LogicalRepMsgType.
KIND_OF: dict[type, str] = {
    Begin: "B", Commit: "C", Origin: "O", Relation: "R", Type: "Y", Insert: "I", Update: "U",
    Delete: "D", Truncate: "T", LogicalMessage: "M", StreamStart: "S", StreamStop: "E",
    StreamCommit: "c", StreamAbort: "A", BeginPrepare: "b", Prepare: "P", CommitPrepared: "K",
    RollbackPrepared: "r", StreamPrepare: "p",
}

#: Human names of the type bytes, for error messages and ``applier inspect``.
KIND_NAMES: dict[str, str] = {
    "B": "Begin", "C": "Commit", "O": "Origin", "R": "Relation", "Y": "Type", "I": "Insert",
    "U": "Update", "D": "Delete", "T": "Truncate", "M": "Message", "S": "Stream Start",
    "E": "Stream Stop", "c": "Stream Commit", "A": "Stream Abort", "b": "Begin Prepare",
    "P": "Prepare", "K": "Commit Prepared", "r": "Rollback Prepared", "p": "Stream Prepare",
}


def transaction_end_lsn(message: Message) -> int | None:
    """The end LSN at which a message closes a transaction on the server's side (Commit, Stream
    Commit, Prepare, Stream Prepare, Commit/Rollback Prepared): a position a consumer may confirm
    once everything before it is stored. None for every other message."""
    if isinstance(message, Commit | StreamCommit | Prepare | StreamPrepare | CommitPrepared):
        return message.end_lsn
    if isinstance(message, RollbackPrepared):
        return message.rollback_end_lsn
    return None
