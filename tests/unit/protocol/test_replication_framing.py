"""Replication-protocol framing: the standby status update's bytes, and a damaged CopyData frame
(tests/integration/test_walsender_framing.py reads frames from a real walsender)."""

from __future__ import annotations

import struct

import pytest

from applier.errors import DecodeError
from applier.protocol.replication import (
    parse_copy_data,
    standby_status_update,
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
