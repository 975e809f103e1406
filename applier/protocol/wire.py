"""Precompiled ``struct.Struct`` unpackers for every fixed-size part of the pgoutput and
replication-protocol wire formats, in one place.

Why one module: the layouts below are the only place where byte widths and signedness are written
down, so a reader can check them against PostgreSQL's ``proto.c`` (``pq_sendint8/16/32/64``) and
``walsender.c`` side by side. All integers are network byte order. LSNs, xids and OIDs are
unsigned on the server (``XLogRecPtr``, ``TransactionId``, ``Oid``); timestamps (``TimestampTz``,
microseconds since 2000-01-01), type modifiers and lengths are signed.

Each fixed header is unpacked with ONE call: per-field calls are what makes naive Python decoders
slow.
"""

from __future__ import annotations

from struct import Struct

# --- scalars -------------------------------------------------------------------------------------

UINT8 = Struct("!B")
INT16 = Struct("!h")
UINT16 = Struct("!H")
INT32 = Struct("!i")
UINT32 = Struct("!I")  # xid, OID
UINT64 = Struct("!Q")  # LSN
INT64 = Struct("!q")  # TimestampTz

# --- transaction framing -------------------------------------------------------------------------

#: Begin 'B': final LSN, commit time, xid.
BEGIN = Struct("!QqI")
#: Commit 'C': flags, commit LSN, end LSN, commit time.
COMMIT = Struct("!BQQq")
#: Origin 'O': origin's commit LSN (then the origin name as a string).
ORIGIN = UINT64

# --- catalog -------------------------------------------------------------------------------------

#: Relation 'R' after the names: replica identity (one byte, a letter), number of columns.
RELATION_TAIL = Struct("!BH")
#: Per column after its name: type OID, type modifier.
COLUMN_TAIL = Struct("!Ii")

# --- changes -------------------------------------------------------------------------------------

#: Insert/Update/Delete head: relation OID, then the first tuple tag ('N', 'K' or 'O').
CHANGE_HEAD = Struct("!IB")
#: The same inside a stream block: xid of the (sub)transaction, relation OID, first tuple tag.
STREAM_CHANGE_HEAD = Struct("!IIB")
#: Truncate 'T': number of relations, option bits (then that many relation OIDs).
TRUNCATE_HEAD = Struct("!IB")
#: Logical message 'M': flags, LSN of the message (then prefix string, content length, content).
MESSAGE_HEAD = Struct("!BQ")

# --- streaming (protocol 2+) ---------------------------------------------------------------------

#: Stream Start 'S': top-level xid, first-segment flag.
STREAM_START = Struct("!IB")
#: Stream Commit 'c': xid, flags, commit LSN, end LSN, commit time.
STREAM_COMMIT = Struct("!IBQQq")
#: Stream Abort 'A': xid, subxid.
STREAM_ABORT = Struct("!II")
#: Stream Abort 'A' with streaming=parallel (protocol 4): xid, subxid, abort LSN, abort time.
STREAM_ABORT_PARALLEL = Struct("!IIQq")

# --- two-phase (protocol 3+) ---------------------------------------------------------------------

#: Begin Prepare 'b' (no flags byte): prepare LSN, end LSN, prepare time, xid (then the gid).
BEGIN_PREPARE = Struct("!QQqI")
#: Prepare 'P', Commit Prepared 'K', Stream Prepare 'p': flags, LSN, end LSN, time, xid (then gid).
PREPARE = Struct("!BQQqI")
#: Rollback Prepared 'r': flags, prepare end LSN, rollback end LSN, prepare time, rollback time, xid.
ROLLBACK_PREPARED = Struct("!BQQqqI")

# --- streaming replication protocol (CopyData payloads, walsender.c) ------------------------------

#: XLogData 'w': WAL start, WAL end, server send time (then the pgoutput message).
XLOG_DATA = Struct("!QQq")
#: Primary keepalive 'k': WAL end, server send time, reply-requested.
PRIMARY_KEEPALIVE = Struct("!QqB")
#: Standby status update 'r' (without its type byte): write, flush, apply LSNs, client time,
#: reply-requested.
STANDBY_STATUS_UPDATE = Struct("!QQQqB")
