"""Bad input: DecodeError naming kind, offset and LSN; never another exception, never a partial message.

Byte strings here are real captured messages, cut, extended or bit-flipped.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgoutput_fixtures import Captured, all_messages, files, load

from applier.errors import DecodeError
from applier.protocol import decode_message
from applier.protocol.messages import KIND_NAMES, Message, StreamAbort

MESSAGES = all_messages()
FIRST_OF_KIND: dict[tuple[str, bool], Captured] = {}
for _m in MESSAGES:
    FIRST_OF_KIND.setdefault((chr(_m.data[0]), _m.in_stream), _m)


def _decode_or_error(data: bytes, in_stream: bool) -> Message | DecodeError:
    try:
        return decode_message(data, in_stream=in_stream, lsn=0x16B3748)
    except DecodeError as e:
        assert e.offset is not None and 0 <= e.offset <= len(data), e
        assert e.lsn == 0x16B3748
        assert "lsn=0/16B3748" in str(e)
        if data and chr(data[0]) in KIND_NAMES:
            assert e.kind == KIND_NAMES[chr(data[0])]
        return e


@pytest.mark.parametrize("key", sorted(FIRST_OF_KIND), ids=lambda k: f"{k[0]}{'-stream' if k[1] else ''}")
def test_every_truncation_of_every_kind_is_a_decode_error(key):
    m = FIRST_OF_KIND[key]
    for cut in range(len(m.data)):
        short = m.data[:cut]
        if key[0] == "A" and cut == 9:
            continue  # the 9-byte Stream Abort is itself a valid message (protocol < 4 form)
        result = _decode_or_error(short, m.in_stream)
        assert isinstance(result, DecodeError), (key, cut)


@pytest.mark.parametrize("key", sorted(FIRST_OF_KIND), ids=lambda k: f"{k[0]}{'-stream' if k[1] else ''}")
def test_trailing_bytes_are_an_error(key):
    m = FIRST_OF_KIND[key]
    result = _decode_or_error(m.data + b"\x00", m.in_stream)
    assert isinstance(result, DecodeError)
    assert result.offset == len(m.data)


def test_error_names_kind_offset_and_lsn():
    insert = next(m for m in load(files("basic", "proto1_text")[0]) if m.data[:1] == b"I")
    with pytest.raises(DecodeError) as info:
        decode_message(insert.data[:-1], lsn=0x16B3748)
    err = info.value
    assert (err.kind, err.offset) == ("Insert", len(insert.data) - 1)
    assert str(err).startswith("truncated TupleData") and "kind=Insert" in str(err) and "lsn=0/16B3748" in str(err)


def test_unknown_type_byte_and_empty_input():
    with pytest.raises(DecodeError, match="unknown pgoutput message type byte") as info:
        decode_message(b"Z\x00\x00", lsn=1)
    assert info.value.offset == 0 and info.value.context["type_byte"] == "b'Z'"
    with pytest.raises(DecodeError, match="empty"):
        decode_message(b"")


def test_invalid_utf8_in_a_name_points_at_the_bad_byte():
    rel = next(m for m in load(files("basic", "proto1_text")[0]) if m.data[:1] == b"R")
    name_at = rel.data.index(b"public\x00") + len("public\x00")
    bad = rel.data[:name_at] + b"\xff" + rel.data[name_at + 1:]
    with pytest.raises(DecodeError, match="not valid UTF-8") as info:
        decode_message(bad)
    assert (info.value.kind, info.value.offset) == ("Relation", name_at)


def test_stream_abort_length_must_be_9_or_25():
    abort = next(m for m in MESSAGES if m.data[:1] == b"A" and len(m.data) == 9)
    decoded = decode_message(abort.data + bytes(16))
    assert isinstance(decoded, StreamAbort) and decoded.abort_lsn == 0
    for extra in (1, 8, 15, 17):
        with pytest.raises(DecodeError) as info:
            decode_message(abort.data + bytes(extra))
        assert info.value.kind == "Stream Abort"


def test_unknown_column_kind_is_an_error():
    insert = next(m for m in load(files("basic", "proto1_text")[0]) if m.data[:1] == b"I")
    bad = bytearray(insert.data)
    bad[8] = ord("x")  # first column's kind byte: 'I', oid(4), 'N', natts(2)
    with pytest.raises(DecodeError, match="unknown column kind") as info:
        decode_message(bytes(bad))
    assert info.value.offset == 8


@pytest.mark.parametrize("column", [0, -1], ids=["first", "last"])
@pytest.mark.parametrize("length", [-1, -(2**31), 2**31 - 1], ids=["minus-one", "min-int", "max-int"])
def test_bad_column_length_is_reported_at_its_bytes(column, length):
    """The fast tuple loop reads lengths unsigned and checks the bound once, after the loop: a bad
    length of ANY column, the last one included, must still be a DecodeError at that length's bytes."""
    import struct

    insert = next(m for m in load(files("basic", "proto1_text")[0]) if m.data[:1] == b"I")
    data = insert.data
    pos, offsets = 8, []  # 'I', oid(4), 'N', natts(2)
    for _ in range(struct.unpack_from("!H", data, 6)[0]):
        offsets.append(pos)
        pos += 1 if data[pos] in b"nu" else 5 + struct.unpack_from("!i", data, pos + 1)[0]
    at = offsets[column]
    assert data[at] == ord("t")
    bad = data[:at + 1] + struct.pack("!i", length) + data[at + 5:]
    with pytest.raises(DecodeError) as info:
        decode_message(bad, lsn=0x10)
    assert info.value.kind == "Insert" and info.value.lsn == 0x10
    if length < 0:
        assert "negative length" in str(info.value) and info.value.offset == at + 1
    else:
        assert "truncated" in str(info.value)


_FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.sampled_from(MESSAGES), st.data())
def test_fuzz_truncated(m, data):
    cut = data.draw(st.integers(0, len(m.data)))
    _decode_or_error(m.data[:cut], m.in_stream)


@_FUZZ
@given(st.sampled_from(MESSAGES), st.binary(min_size=1, max_size=40))
def test_fuzz_extended(m, extra):
    _decode_or_error(m.data + extra, m.in_stream)


@_FUZZ
@given(st.sampled_from(MESSAGES), st.data())
def test_fuzz_bit_flipped(m, data):
    flips = data.draw(st.lists(st.integers(0, len(m.data) * 8 - 1), min_size=1, max_size=4))
    buf = bytearray(m.data)
    for bit in flips:
        buf[bit // 8] ^= 1 << (bit % 8)
    in_stream = data.draw(st.booleans()) if data.draw(st.integers(0, 9)) == 0 else m.in_stream
    _decode_or_error(bytes(buf), in_stream)
