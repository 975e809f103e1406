"""The decoder against bytes captured from real PostgreSQL 15, 16 and 18 (tests/fixtures/pgoutput)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pgoutput_fixtures import files, load, manifest

from applier.errors import DecodeError
from applier.lsn import parse_lsn
from applier.protocol import KIND_NAMES, MessageDecoder, decode_message
from applier.protocol.messages import (
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
    pg_time_to_datetime,
)


def decoded(file: str) -> list[tuple[str, int, Message]]:
    """(lsn, xid, message) of every captured message of ``file``, through one MessageDecoder."""
    decoder = MessageDecoder()
    out = [(m.lsn, m.xid, decoder.decode(m.data, lsn=parse_lsn(m.lsn))) for m in load(file)]
    assert not decoder.in_stream, "a capture never ends inside a stream block"
    return out


def of_type(file: str, cls: type) -> list:
    return [m for _, _, m in decoded(file) if isinstance(m, cls)]


def test_every_message_kind_is_captured_and_decodes_to_its_class():
    seen: dict[str, set[str]] = {}
    for name in files():
        for _, _, msg in decoded(name):
            seen.setdefault(type(msg).__name__, set()).add(name)
    kinds = {type_name for type_name in seen}
    expected = {"Begin", "Commit", "Origin", "Relation", "Type", "Insert", "Update", "Delete", "Truncate",
                "LogicalMessage", "StreamStart", "StreamStop", "StreamCommit", "StreamAbort", "BeginPrepare",
                "Prepare", "CommitPrepared", "RollbackPrepared", "StreamPrepare"}
    assert kinds == expected
    assert len(KIND_NAMES) == len(expected)


def test_fixtures_come_from_each_installed_major_and_manifest_matches():
    majors = {e["major"] for e in manifest().values()}
    assert 15 in majors
    for name, entry in manifest().items():
        rows = load(name)
        assert len(rows) == entry["messages"]
        assert entry["options"]["publication_names"] == "pub"


@pytest.mark.parametrize("file", files("basic", "proto1_text"))
def test_text_tuples_keep_values_and_nulls_apart(file):
    inserts = of_type(file, Insert)
    first, second = inserts[0], inserts[1]
    assert first.new.kinds == b"ttttttt"
    assert first.new.values == (b"1", b"pen", b"1.50", b"blue ink", b"happy", b"3", b"2024-02-29 12:34:56.789+00")
    assert second.new.kinds == b"ttnnnnn"
    assert second.new.values == (b"2", b"cap", None, None, None, None, None)
    unicode_row = next(i for i in inserts if i.new.values[0] == b"4")
    assert unicode_row.new.values[3].decode("utf-8") == "ünïcode ✓"


@pytest.mark.parametrize("file", files("basic", "proto1_binary"))
def test_binary_tuples_carry_send_format(file):
    first = of_type(file, Insert)[0]
    assert first.new.kinds == b"bbbbbbb"
    assert first.new.values[0] == (1).to_bytes(4, "big")  # int4 send format
    assert first.new.values[1] == b"pen"  # text's send format is its bytes


@pytest.mark.parametrize("file", files("basic", "proto1_text"))
def test_types_relations_and_pg_catalog_namespace(file):
    types = {t.name: t for t in of_type(file, Type)}
    assert types["mood"].namespace == "public"
    # A domain's Type message names its base type, and pg_catalog is sent as "".
    assert types["int4"].namespace == ""
    relations = {r.name: r for r in of_type(file, Relation)}
    items = relations["items"]
    assert items.namespace == "public" and items.replica_identity == "d"
    assert [c.name for c in items.columns] == ["id", "name", "price", "note", "mood", "qty", "created"]
    assert [c.is_key for c in items.columns] == [True] + [False] * 6
    assert items.columns[2].type_modifier == ((10 << 16) | 2) + 4  # numeric(10,2)
    assert items.columns[4].type_oid == types["mood"].oid
    assert items.columns[5].type_oid == types["int4"].oid  # the domain's OID
    assert relations["full_rows"].replica_identity == "f"


@pytest.mark.parametrize("file", files("basic", "proto1_text"))
def test_key_change_with_unchanged_toast_and_full_identity(file):
    relations = {r.name: r.oid for r in of_type(file, Relation)}
    updates = of_type(file, Update)
    key_change = next(u for u in updates if u.relation_oid == relations["docs"] and u.old is not None)
    assert key_change.old_kind == "K"
    assert key_change.old.values[0] == b"1"
    assert key_change.new.kinds == b"ttu" and key_change.new.values == (b"11", b"moved", None)
    full = [u for u in updates if u.relation_oid == relations["full_rows"]]
    assert len(full) == 2
    assert all(u.old_kind == "O" and u.old.values == (b"1", b"one") and u.new.values == (b"1", b"uno")
               for u in full)
    deletes = of_type(file, Delete)
    assert [(d.old_kind, d.old.kinds, d.old.values[0]) for d in deletes] == [
        ("K", b"tnnnnnn", b"2"), ("O", b"tn", b"2")]


@pytest.mark.parametrize("file", files("basic", "proto1_text"))
def test_truncate_cascade_restart_identity_lists_every_table(file):
    relations = {r.name: r.oid for r in of_type(file, Relation)}
    (truncate,) = of_type(file, Truncate)
    assert truncate.cascade and truncate.restart_identity and truncate.options == 3
    assert set(truncate.relation_oids) == {relations["parent"], relations["child"]}


@pytest.mark.parametrize("file", files("basic", "proto1_text"))
def test_origin_follows_begin(file):
    msgs = decoded(file)
    i = next(i for i, (_, _, m) in enumerate(msgs) if isinstance(m, Origin))
    begin = msgs[i - 1][2]
    assert isinstance(begin, Begin)
    origin = msgs[i][2]
    assert isinstance(origin, Origin)
    assert origin.commit_lsn == 0xABCDEF and origin.name == "capture_capture_basic"
    assert pg_time_to_datetime(begin.commit_time) == datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("file", files("basic"))
def test_begin_and_commit_match_the_sql_interface_columns(file):
    for lsn, xid, msg in decoded(file):
        if isinstance(msg, Begin):
            assert msg.xid == xid
            assert msg.final_lsn > 0
        if isinstance(msg, Commit):
            assert msg.end_lsn == parse_lsn(lsn)  # the lsn column of a C row is the end LSN
            assert msg.commit_lsn < msg.end_lsn


@pytest.mark.parametrize("file", files("basic", "proto1_messages"))
def test_transactional_and_non_transactional_messages(file):
    msgs = [m for _, _, m in decoded(file)]
    logical = [(i, m) for i, m in enumerate(msgs) if isinstance(m, LogicalMessage)]
    assert [(m.transactional, m.prefix, m.content) for _, m in logical] == [
        (True, "applier", b"transactional payload"),
        (False, "applier", b"non-transactional payload"),
        (False, "applier", b"sent although rolled back"),
    ]
    assert all(m.xid is None for _, m in logical)
    # Non-transactional messages arrive outside any transaction: right after a Commit.
    assert isinstance(msgs[logical[1][0] - 1], Commit)


@pytest.mark.parametrize("file", files("streaming"))
def test_stream_blocks_carry_xids_only_inside(file):
    in_stream = False
    top_xid = None
    counts = {"I": 0, "U": 0, "D": 0, "T": 0, "R": 0, "Y": 0, "M": 0}
    for _, _, msg in decoded(file):
        if isinstance(msg, StreamStart):
            in_stream, top_xid = True, msg.xid
            continue
        if isinstance(msg, StreamStop):
            in_stream = False
            continue
        kind = {Insert: "I", Update: "U", Delete: "D", Truncate: "T", Relation: "R", Type: "Y",
                LogicalMessage: "M"}.get(type(msg))
        if kind is None:
            continue
        assert isinstance(msg, (Insert, Update, Delete, Truncate, Relation, Type, LogicalMessage))
        if in_stream:
            counts[kind] += 1
            assert msg.xid is not None and top_xid is not None and msg.xid >= top_xid
            if kind == "M":
                assert msg.xid == top_xid  # messages carry the top-level xid
        else:
            assert msg.xid is None
    assert all(counts.values()), counts


@pytest.mark.parametrize("file", files("streaming"))
def test_stream_aborts_and_commit(file):
    major = manifest()[file]["major"]
    parallel = manifest()[file]["options"]["streaming"] == "parallel"
    aborts = of_type(file, StreamAbort)
    subxact = [a for a in aborts if a.xid != a.subxid]
    toplevel = [a for a in aborts if a.xid == a.subxid]
    assert len(subxact) == 1
    # PG 17+ skips streaming a transaction already known to be aborted at decoding time.
    assert len(toplevel) == (1 if major < 17 else 0)
    raw = [m.data for m in load(file) if m.data[:1] == b"A"]
    assert {len(d) for d in raw} == ({25} if parallel else {9})
    assert all((a.abort_lsn is not None) == parallel for a in aborts)
    (commit,) = of_type(file, StreamCommit)
    assert commit.xid == subxact[0].xid


@pytest.mark.parametrize("file", files("twophase"))
def test_two_phase_messages(file):
    begins = {b.gid: b for b in of_type(file, BeginPrepare)}
    prepares = {p.gid: p for p in of_type(file, Prepare)}
    assert set(begins) == set(prepares) == {"g_commit", "g_rollback"}
    for gid, p in prepares.items():
        assert (p.xid, p.prepare_lsn, p.end_lsn) == (begins[gid].xid, begins[gid].prepare_lsn, begins[gid].end_lsn)
    committed = {c.gid: c for c in of_type(file, CommitPrepared)}
    assert set(committed) == {"g_commit", "g_stream"}
    (rollback,) = of_type(file, RollbackPrepared)
    assert rollback.gid == "g_rollback" and rollback.prepare_end_lsn == prepares["g_rollback"].end_lsn
    assert rollback.rollback_end_lsn > rollback.prepare_end_lsn
    (stream_prepare,) = of_type(file, StreamPrepare)
    assert stream_prepare.gid == "g_stream" and stream_prepare.xid == committed["g_stream"].xid


def test_in_stream_flag_matters():
    """An in-stream change read as if outside a stream must not decode silently into garbage."""
    streamed = [m for m in load(files("streaming")[0]) if m.in_stream and m.data[:1] in b"IUD"]
    assert streamed
    for m in streamed:
        change = decode_message(m.data, in_stream=True)
        assert isinstance(change, (Insert, Update, Delete)) and change.xid is not None
        with pytest.raises(DecodeError):
            decode_message(m.data, in_stream=False)


def test_decoder_reset_forgets_stream_state():
    rows = load(files("streaming")[0])
    decoder = MessageDecoder()
    decoder.decode(rows[0].data)
    assert isinstance(decoder.decode(rows[0].data), StreamStart) and decoder.in_stream
    decoder.reset()
    assert not decoder.in_stream


def test_fast_constructed_messages_equal_regular_ones():
    """The decoder builds hot messages through layout twins re-labelled as the frozen class; they must
    be the same objects: equal, same repr and hash, and just as immutable."""
    from dataclasses import FrozenInstanceError, fields

    for name in files():
        for _, _, msg in decoded(name):
            rebuilt = type(msg)(*[getattr(msg, f.name) for f in fields(msg)])
            assert rebuilt == msg and repr(rebuilt) == repr(msg) and hash(rebuilt) == hash(msg)
            assert type(msg).__module__ == "applier.protocol.messages"
            for f in fields(msg)[:1]:
                with pytest.raises(FrozenInstanceError):
                    setattr(msg, f.name, None)
            for tuple_field in ("new", "old"):
                tup = getattr(msg, tuple_field, None)
                if tup is not None:
                    assert type(tup)(tup.kinds, tup.values) == tup and len(tup.kinds) == len(tup.values)
                    assert type(tup) is TupleData
                    with pytest.raises(FrozenInstanceError):
                        tup.kinds = b""  # type: ignore[misc]  # on purpose: the test asserts the assignment raises


def test_message_decoder_reports_errors_like_decode_message():
    decoder = MessageDecoder()
    for bad in (b"", b"Z", b"B\x00", bytearray(b"C" + bytes(3))):
        with pytest.raises(DecodeError) as info:
            decoder.decode(bad, lsn=0x10)  # type: ignore[arg-type]  # a bytearray on purpose: decode copies non-bytes
        assert info.value.lsn == 0x10 and info.value.offset is not None
