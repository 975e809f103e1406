"""Framing of the streaming replication protocol (``START_REPLICATION ... LOGICAL``).

After START_REPLICATION the server and the client exchange CopyData messages. The server sends
XLogData 'w' (one pgoutput message each, with the WAL positions around it) and primary keepalives
'k'; the client answers with standby status updates 'r' saying how far it has written, flushed and
applied. Only the flush position matters to a logical slot: it becomes ``confirmed_flush_lsn``,
the point from which the server will resend after a reconnect. So report as flushed only what is
durably applied. Layouts: PostgreSQL's ``walsender.c`` (``XLogSendLogical``, ``WalSndKeepalive``,
``ProcessStandbyReplyMessage``) and the "Streaming Replication Protocol" chapter of the docs.

Like the pgoutput decoder, this is pure: bytes in, frozen dataclasses out (and bytes out for the
reply); the connection is the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from applier.errors import ApplierError, DecodeError
from applier.protocol import wire

__all__ = ["XLogData", "PrimaryKeepalive", "parse_copy_data", "standby_status_update", "pg_now", "xlog_payload"]

#: Seconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
_PG_EPOCH_UNIX = 946_684_800


@dataclass(frozen=True, slots=True)
class XLogData:
    """'w': one pgoutput message (``payload``) and where the server is in the WAL."""

    wal_start: int  # LSN the payload starts at (0 for some logical messages)
    wal_end: int  # current end of WAL on the server
    send_time: int  # server clock, microseconds since 2000-01-01 UTC
    payload: bytes


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """'k': the server is alive; with ``reply_requested`` it disconnects us unless we answer soon
    (wal_sender_timeout)."""

    wal_end: int
    send_time: int
    reply_requested: bool


#: CopyData type bytes sent by a walsender.
XLOG_DATA_TAG = 0x77  # 'w'
PRIMARY_KEEPALIVE_TAG = 0x6B  # 'k'
#: Where an XLogData's pgoutput message starts: after the tag and ``wire.XLOG_DATA``.
XLOG_PAYLOAD_AT = 1 + wire.XLOG_DATA.size


def xlog_payload(data: bytes | bytearray | memoryview, _head: int = XLOG_PAYLOAD_AT,
                 _start: Callable[..., tuple[int]] = wire.UINT64.unpack_from,
                 _tag: int = XLOG_DATA_TAG) -> tuple[int, bytes] | None:
    """``(wal_start, payload)`` of an XLogData frame, None for anything else (a keepalive, a damaged
    frame: :func:`parse_copy_data` then says which). The reader's per-message fast path: no object
    but the payload's bytes."""
    if data[0] == _tag and len(data) >= _head:  # (locals: a call per message of a catch-up)
        return _start(data, 1)[0], bytes(data[_head:])
    return None


def parse_copy_data(data: bytes, *, lsn: int | None = None) -> XLogData | PrimaryKeepalive:
    """Parse one CopyData payload sent by a walsender. ``lsn`` only adds error context."""
    if data.__class__ is not bytes:
        data = bytes(data)
    n = len(data)
    if not n:
        raise DecodeError("empty CopyData message", offset=0, lsn=lsn)
    tag = data[0]
    if tag == XLOG_DATA_TAG:
        head = XLOG_PAYLOAD_AT
        if n < head:
            raise DecodeError("truncated XLogData header", kind="XLogData", offset=n, lsn=lsn)
        wal_start, wal_end, send_time = wire.XLOG_DATA.unpack_from(data, 1)
        return XLogData(wal_start, wal_end, send_time, data[head:])
    if tag == PRIMARY_KEEPALIVE_TAG:
        size = 1 + wire.PRIMARY_KEEPALIVE.size
        if n != size:
            raise DecodeError("truncated primary keepalive" if n < size else "trailing bytes after keepalive",
                              kind="Primary keepalive", offset=min(n, size), lsn=lsn)
        wal_end, send_time, reply = wire.PRIMARY_KEEPALIVE.unpack_from(data, 1)
        return PrimaryKeepalive(wal_end, send_time, bool(reply))
    raise DecodeError("unknown replication message type byte", type_byte=repr(data[:1]), offset=0, lsn=lsn)


def pg_now() -> int:
    """Now on PostgreSQL's wire clock: microseconds since 2000-01-01 UTC."""
    return time.time_ns() // 1000 - _PG_EPOCH_UNIX * 1_000_000


def standby_status_update(write_lsn: int, flush_lsn: int | None = None, apply_lsn: int | None = None, *,
                          client_time: int | None = None, reply_requested: bool = False) -> bytes:
    """The 'r' CopyData payload. ``flush_lsn`` (default: ``write_lsn``) is what the slot confirms;
    ``apply_lsn`` defaults to ``flush_lsn``; ``client_time`` defaults to now."""
    flush = write_lsn if flush_lsn is None else flush_lsn
    apply = flush if apply_lsn is None else apply_lsn
    for name, value in (("write_lsn", write_lsn), ("flush_lsn", flush), ("apply_lsn", apply)):
        if not 0 <= value < 1 << 64:
            raise ApplierError("LSN out of range for a standby status update", field=name, value=value)
    now = pg_now() if client_time is None else client_time
    return b"r" + wire.STANDBY_STATUS_UPDATE.pack(write_lsn, flush, apply, now, 1 if reply_requested else 0)
