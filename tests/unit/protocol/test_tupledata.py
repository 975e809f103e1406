"""The one TupleData scanner (applier.protocol.tupledata) and the header readers (protocol.headers)
against bytes captured from real PostgreSQL 15, 16 and 18 (tests/fixtures/pgoutput).

The decoder's messages are the reference: the scanner must find exactly the kinds and values the
decoder put in each TupleData, its fast and careful readers must agree, and damaged bytes (every
message cut short) must raise only the errors the callers catch."""

from __future__ import annotations

import random

import pytest
from pgoutput_fixtures import Captured, all_messages, files, load

from applier.lsn import parse_lsn
from applier.protocol import decode_message
from applier.protocol.headers import (
    CHANGE_TUPLE_AT,
    ROW_KINDS,
    STREAM_CHANGE_OID_AT,
    change_relation_oid,
    kind_of,
    prepared_xid,
)
from applier.protocol.messages import (
    CommitPrepared,
    Delete,
    Insert,
    Prepare,
    RollbackPrepared,
    StreamPrepare,
    TupleData,
    Update,
)
from applier.protocol.order import OpenTransactions
from applier.protocol.tupledata import (
    ALL_TEXT,
    SCAN_ERRORS,
    SCANNERS,
    UNROLL_UP_TO,
    Malformed,
    _scan_loop,
    scan_row_change,
    scan_tuple,
    scan_tuple_checked,
)

Change = Insert | Update | Delete


def _row_messages(in_stream: bool | None = None) -> list[tuple[Captured, Change]]:
    """Every captured Insert, Update and Delete with its decoded message (``in_stream``: only those
    inside (True) or outside (False) a stream block)."""
    out = []
    for m in all_messages():
        if m.data[0] in ROW_KINDS and (in_stream is None or m.in_stream == in_stream):
            msg = decode_message(m.data, in_stream=m.in_stream)
            assert isinstance(msg, (Insert, Update, Delete))
            out.append((m, msg))
    return out


def _as_tuple_data(kinds: bytes | None, values: tuple[bytes | None, ...]) -> TupleData:
    assert kinds is not None
    return TupleData(kinds, values)


def _tuples(msg: Change) -> list[TupleData]:
    if isinstance(msg, Insert):
        return [msg.new]
    if isinstance(msg, Update):
        return [t for t in (msg.old, msg.new) if t is not None]
    return [msg.old]


def test_the_fixtures_hold_every_column_kind() -> None:
    """Otherwise the tests below would not cover them."""
    kinds = {k for _, msg in _row_messages() for t in _tuples(msg) for k in t.kinds}
    assert kinds == set(b"tnub")


def test_first_tuple_scans_to_what_the_decoder_decoded() -> None:
    """The first tuple of every change, in and out of stream blocks, both readers."""
    checked = 0
    for m, msg in _row_messages():
        pos = CHANGE_TUPLE_AT + (4 if m.in_stream else 0)
        first = _tuples(msg)[0]
        kinds, values, end = scan_tuple(m.data, pos, len(m.data))
        assert _as_tuple_data(kinds, values) == first, m
        assert (kinds is ALL_TEXT[len(values)]) == (kinds == b"t" * len(values)), "all-text kinds are shared"
        checked_kinds, checked_values, checked_end = scan_tuple_checked(m.data, pos)
        assert (TupleData(checked_kinds, tuple(checked_values)), checked_end) == (first, end)
        checked += 1
    assert checked > 100


def test_row_changes_scan_to_what_the_decoder_decoded() -> None:
    """scan_row_change on every change outside a stream block: kind, old tag, old and new tuple."""
    for m, msg in _row_messages(in_stream=False):
        kind, old_tag, old_kinds, old, new_kinds, new = scan_row_change(m.data)
        assert kind == m.data[0]
        if isinstance(msg, Insert):
            assert (old_tag, old) == (0, None)
            assert new is not None and _as_tuple_data(new_kinds, new) == msg.new
        elif isinstance(msg, Update):
            assert old_tag == (ord(msg.old_kind) if msg.old_kind else 0)
            assert (None if old is None else _as_tuple_data(old_kinds, old)) == msg.old
            assert new is not None and _as_tuple_data(new_kinds, new) == msg.new
        else:
            assert old_tag == ord(msg.old_kind) and new is None
            assert old is not None and _as_tuple_data(old_kinds, old) == msg.old


@pytest.mark.parametrize("file", files())
def test_cut_short_changes_raise_only_what_callers_catch(file: str) -> None:
    """Every change cut at every length: the fast readers raise one of SCAN_ERRORS (never return a
    tuple from bytes that are not all there), the careful one says where (Malformed)."""
    for m in load(file):
        if m.data[0] not in ROW_KINDS:
            continue
        pos = CHANGE_TUPLE_AT + (4 if m.in_stream else 0)
        for cut in range(pos, len(m.data)):
            short = m.data[:cut]
            if not m.in_stream:
                with pytest.raises(SCAN_ERRORS):
                    scan_row_change(short)
            try:
                kinds, values, end = scan_tuple(short, pos, cut)
            except SCAN_ERRORS:
                with pytest.raises(Malformed):
                    scan_tuple_checked(short, pos)
            else:  # an Update's old tuple ends before the cut: the same tuple, carefully
                assert end <= cut
                assert scan_tuple_checked(short, pos) == (kinds, values, end)


def test_trailing_bytes_and_unknown_tags_are_refused() -> None:
    for m, _msg in _row_messages(in_stream=False)[:50]:
        with pytest.raises(SCAN_ERRORS):
            scan_row_change(m.data + b"n")
        bad_tag = m.data[:CHANGE_TUPLE_AT - 1] + b"X" + m.data[CHANGE_TUPLE_AT:]
        with pytest.raises(SCAN_ERRORS):
            scan_row_change(bad_tag)


def _random_tuple(rng: random.Random, natts: int) -> bytes:
    """TupleData of ``natts`` columns of random kinds: mostly text, some NULL, unchanged TOAST and binary,
    values of 0 to 300 bytes (lengths past one byte too)."""
    out = [natts.to_bytes(2, "big")]
    for _ in range(natts):
        kind = rng.choice(b"ttttnub")
        out.append(bytes((kind,)))
        if kind in b"tb":
            value = rng.randbytes(rng.choice((0, 1, 5, 17, 300)))
            out.append(len(value).to_bytes(4, "big") + value)
    return b"".join(out)


@pytest.mark.parametrize("natts", [0, 1, 2, 3, 4, 5, 6, 7, 12, 42, UNROLL_UP_TO, UNROLL_UP_TO + 1, 100])
def test_the_scanner_of_every_column_count_scans_as_the_careful_one(natts: int) -> None:
    """The scanner of each column count (unrolled up to UNROLL_UP_TO, the loop beyond) on random tuples:
    ending the message (an Insert's: its last columns are the guarded ones) and followed by more bytes
    (an Update's old tuple): the careful scanner's result, the loop's too; cut short anywhere: one of
    SCAN_ERRORS, or a tuple that ended before the cut; an unknown kind anywhere: refused."""
    rng = random.Random(f"columns {natts}")
    head = b"I\x00\x00\x40\x00N"
    pos = len(head)
    expected_scanner = _scan_loop if natts > UNROLL_UP_TO else None
    for round_ in range(60):
        tup = _random_tuple(rng, natts)
        for data in (head + tup, head + tup + b"N" + _random_tuple(rng, natts)):
            n = len(data)
            got = scan_tuple(data, pos, n)
            assert got == scan_tuple_checked(data, pos) == _scan_loop(data, pos, n)
            assert got[2] == pos + len(tup) and type(got[1]) is tuple
            assert (got[0] is ALL_TEXT[natts]) == (got[0] == b"t" * natts)
        if expected_scanner is not None:
            assert SCANNERS[natts] is expected_scanner
        data = head + tup
        for cut in range(pos, len(data)) if round_ < 10 else ():
            with pytest.raises(SCAN_ERRORS):
                scan_tuple(data[:cut], pos, cut)
    for at in range(natts):  # an unknown kind in each column: refused by the fast scan, placed by the careful one
        bad = bytearray(natts.to_bytes(2, "big") + b"n" * natts)
        bad[2 + at] = ord("x")
        with pytest.raises(SCAN_ERRORS):
            scan_tuple(head + bytes(bad), pos, pos + len(bad))
        with pytest.raises(Malformed):
            scan_tuple_checked(head + bytes(bad), pos)


# -- headers ---------------------------------------------------------------------------------------


def test_relation_oid_read_in_place_is_the_decoded_one() -> None:
    for m, msg in _row_messages():
        assert change_relation_oid(m.data, m.in_stream) == msg.relation_oid
    assert change_relation_oid(b"I\x00\x00") is None
    assert change_relation_oid(b"B" + bytes(20)) is None
    assert STREAM_CHANGE_OID_AT == 5


def test_prepared_xid_read_in_place_is_the_decoded_one() -> None:
    seen = set()
    for m in all_messages():
        msg = decode_message(m.data, in_stream=m.in_stream)
        assert kind_of(m.data) == m.data[0]
        if isinstance(msg, (Prepare, StreamPrepare, CommitPrepared, RollbackPrepared)):
            assert prepared_xid(m.data) == msg.xid
            seen.add(type(msg))
        else:
            with pytest.raises(ValueError):
                prepared_xid(m.data)
    assert seen == {Prepare, StreamPrepare, CommitPrepared, RollbackPrepared}
    assert kind_of(b"") == 0


# -- open transactions -----------------------------------------------------------------------------


@pytest.mark.parametrize("file", files())
def test_open_transactions_follow_prepares_and_their_ends(file: str) -> None:
    """A prepared xid is open from its Prepare (or Stream Prepare) to its Commit or Rollback Prepared;
    a whole captured session ends with nothing open but what it left prepared."""
    state = OpenTransactions()
    left_prepared: set[int] = set()
    for m in load(file):
        assert state.add(parse_lsn(m.lsn), m.data) == []
        assert state.in_stream == (m.data[:1] == b"S" or (m.in_stream and m.data[:1] != b"E"))
        msg = decode_message(m.data, in_stream=m.in_stream)
        if isinstance(msg, (Prepare, StreamPrepare)):
            assert msg.xid in state.prepared
            left_prepared.add(msg.xid)
        elif isinstance(msg, (CommitPrepared, RollbackPrepared)):
            assert msg.xid not in state.prepared
            left_prepared.discard(msg.xid)
    assert state.prepared == left_prepared
    assert state.nothing_open() == (not left_prepared and state.checker.current is None
                                    and not state.checker.streams)


def _state(state: OpenTransactions) -> tuple[object, ...]:
    checker = state.checker
    current = checker.current
    return (checker.rows, state.last_kind, state.nothing_open(), None if current is None else
            (current.xid, current.final_lsn, current.last_lsn, current.last_kind, current.last_data))


def _problems_one_by_one(lsns: list[int], datas: list[bytes]) -> tuple[list[tuple[int, str]], tuple[object, ...]]:
    state = OpenTransactions()
    problems = [(i, p.message) for i, (lsn, data) in enumerate(zip(lsns, datas, strict=True))
                for p in state.add(lsn, data)]
    return problems, _state(state)


def _problems_in_runs(lsns: list[int], datas: list[bytes], rng: random.Random) -> tuple[list[tuple[int, str]],
                                                                                       tuple[object, ...]]:
    """As Surveyor.add_run drives it: add_rows over a run, add for the message it stops at."""
    state = OpenTransactions()
    problems: list[tuple[int, str]] = []
    k, n = 0, len(datas)
    while k < n:
        end = min(n, k + rng.randint(1, 50))  # runs end anywhere: where the reader's batches end
        k = state.add_rows(lsns, datas, k, end)
        if k < end:
            problems += [(k, p.message) for p in state.add(lsns[k], datas[k])]
            k += 1
    return problems, _state(state)


@pytest.mark.parametrize("file", files())
def test_rows_added_in_runs_leave_what_one_by_one_leaves(file: str) -> None:
    """OpenTransactions.add_rows (the catch-up reader's loop over row changes) ends in the state, and
    lets add find the problems, that adding every message alone gives: on the captured sessions, with
    their changes at position 0 as the replication protocol sends them, and with messages repeated,
    swapped and dropped."""
    rng = random.Random(f"runs {file}")
    captured = load(file)
    lsns, datas = [parse_lsn(m.lsn) for m in captured], [m.data for m in captured]
    zeroed = [0 if d[:1] in (b"I", b"U", b"D") else lsn for lsn, d in zip(lsns, datas, strict=True)]
    variants = [(lsns, datas), (zeroed, datas)]
    for _ in range(20):
        at = list(range(len(datas)))
        i = rng.randrange(len(at))
        how = rng.randrange(3)
        if how == 0:
            at.insert(i, at[i])  # repeated
        elif how == 1 and i + 1 < len(at):
            at[i], at[i + 1] = at[i + 1], at[i]  # swapped
        else:
            del at[i]  # missing
        base = rng.choice((lsns, zeroed))
        variants.append(([base[j] for j in at], [datas[j] for j in at]))
    for v_lsns, v_datas in variants:
        assert _problems_in_runs(v_lsns, v_datas, rng) == _problems_one_by_one(v_lsns, v_datas)
