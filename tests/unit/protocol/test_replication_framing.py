"""Replication-protocol framing: the standby status update's bytes, and a damaged CopyData frame
(tests/integration/test_walsender_framing.py reads frames from a real walsender)."""

from __future__ import annotations

import struct

import pytest
from pgoutput_fixtures import all_messages

from applier.errors import DecodeError
from applier.lsn import parse_lsn
from applier.protocol.replication import (
    XLogData,
    parse_copy_data,
    standby_status_update,
    xlog_payload,
)


def test_standby_status_update_layout():
    frame = standby_status_update(0x10, 0x20, 0x30, client_time=7, reply_requested=True)
    assert frame == b"r" + struct.pack("!QQQqB", 0x10, 0x20, 0x30, 7, 1)
    assert standby_status_update(5, client_time=0)[1:25] == struct.pack("!QQQ", 5, 5, 5)


def test_bad_copy_data_is_a_decode_error():
    with pytest.raises(DecodeError) as info:
        parse_copy_data(b"w" + bytes(10), lsn=0x100)
    assert (info.value.kind, info.value.offset, info.value.lsn) == ("XLogData", 11, 0x100)
    with pytest.raises(DecodeError):
        parse_copy_data(b"k" + bytes(18))
    with pytest.raises(DecodeError, match="unknown replication message type"):
        parse_copy_data(b"x")


def test_the_fast_xlog_reader_gives_what_parse_copy_data_gives():
    """Every captured pgoutput message framed as a walsender frames it: the reader's fast path
    (xlog_payload) and parse_copy_data agree; a keepalive or a cut header is left to parse_copy_data."""
    for m in all_messages():
        lsn = parse_lsn(m.lsn)
        frame = b"w" + struct.pack("!QQq", lsn, lsn + 8, 12345) + m.data
        parsed = parse_copy_data(frame)
        assert isinstance(parsed, XLogData)
        assert xlog_payload(frame) == xlog_payload(memoryview(frame)) == (parsed.wal_start, parsed.payload)
        assert (parsed.wal_start, parsed.payload) == (lsn, m.data)
        assert xlog_payload(frame[:24]) is None
    assert xlog_payload(b"k" + struct.pack("!QqB", 1, 2, 0)) is None
