"""A backlog read from a temporary copy of the slot (applier.sources.slotcopy) against a real server: the
messages must be exactly those the slot itself holds (a peek without streaming), in order, across
pieces cut in the middle of WAL pages, read by one copy in turn or by two at once (each piece describes
its relations again); the slot must not move, and the copies must be gone afterwards. A transaction
still open at the target, streamed on a walsender, is not read at all: the walsender gets it whole once
it commits."""

from __future__ import annotations

import psycopg
import pytest

from applier.sources import slotcopy
from applier.sources.slotcopy import SlotCopyReader, SlotCopyUnavailable
from applier.sources.sql_slot import current_flush_lsn, peek, pgoutput_options
from applier.sources.walsender import WalSenderStream

pytestmark = pytest.mark.postgres

BACKLOG = """
CREATE TABLE sc (id int PRIMARY KEY, v text);
CREATE TABLE sc_bag (v text);
ALTER TABLE sc_bag REPLICA IDENTITY FULL;
CREATE PUBLICATION sc_pub FOR TABLE sc, sc_bag;
CREATE PROCEDURE sc_run(first int, last int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN first..last LOOP
    INSERT INTO sc SELECT i * 10 + k, 'row ' || i FROM generate_series(0, 2 + i % 7) k;
    UPDATE sc SET v = v || '+' WHERE id = (i - 1) * 10;
    IF i % 3 = 0 THEN DELETE FROM sc WHERE id = (i - 2) * 10 + 1; END IF;
    INSERT INTO sc_bag VALUES (repeat('x', i % 50));
    COMMIT;
  END LOOP;
END $$;
"""


def _read_all(reader: SlotCopyReader) -> list[tuple[int, bytes]]:
    lsns: list[int] = []
    datas: list[bytes] = []
    while True:
        n = len(lsns)
        reader.read_buffered(lsns, datas, 1000)
        if len(lsns) == n:
            break
    assert reader.read_message(0.1) is None  # the end stays the end
    return list(zip(lsns, datas, strict=True))


def _without_relations(messages: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    return [(lsn, data) for lsn, data in messages if data[:1] != b"R"]


def _slots(conn: psycopg.Connection) -> dict[str, str]:
    return {name: str(lsn) for name, lsn in conn.execute(
        "SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots").fetchall()}


@pytest.mark.parametrize("copies", [1, 2])
def test_a_copy_read_in_small_pieces_gives_the_slots_messages(pg_any, monkeypatch, copies):
    """Pieces of one to four WAL pages: a cut in nearly every page, so cuts meet commit records, records
    that cross pages and records that end where the cut is; a transaction given to two pieces, or to
    none, changes the messages."""
    pg = pg_any  # every installed major: the copy, get and advance are the server's own
    monkeypatch.setattr(slotcopy, "FIRST_PIECE_BYTES", 8192)  # pieces of 8, 16, 16-32, ... kB of WAL
    monkeypatch.setattr(slotcopy, "STEADY_PIECE_BYTES", 16384)
    monkeypatch.setattr(slotcopy, "LARGEST_PIECE_BYTES", 32768)
    monkeypatch.setattr(slotcopy, "CHUNK_MESSAGES", 64)
    options = pgoutput_options("sc_pub", proto_version=2, streaming="on")
    with pg.connect() as conn:
        conn.execute(BACKLOG)
        conn.execute("SELECT pg_create_logical_replication_slot('sc_slot', 'pgoutput')")
        conn.execute("CALL sc_run(1, 400)")
        opened = psycopg.connect(pg.dsn, autocommit=False)  # a big transaction open at the target:
        opened.execute("INSERT INTO sc SELECT g, repeat('y', 100) FROM generate_series(100000, 103000) g")
        conn.execute("CALL sc_run(401, 500)")  # (streamed by a walsender: 64kB logical_decoding_work_mem)
        target = current_flush_lsn(conn)
        conn.execute("CALL sc_run(501, 520)")  # past the target: not read
        before = _slots(conn)

        expected = [(m.lsn, m.data) for m in peek(conn, "sc_slot", {**options, "streaming": "off"}, upto_lsn=target)]
        reader = SlotCopyReader(pg.dsn, "sc_slot", options, target=target, copies=copies)
        assert len(reader.copies) == copies
        assert set(_slots(conn)) == {"sc_slot", *(c.name for c in reader.copies)}
        try:
            got = _read_all(reader)
        finally:
            reader.close()
        assert reader.exhausted
        assert reader.pieces == len(reader.ends) >= 10, reader.pieces  # many pieces, each a decoding session
        # the same messages, LSNs and bytes, in the same order; each piece is a decoding session of its own,
        # which describes a relation again before its first change there (as a walsender does after a
        # reconnect): the same Relation message, repeated
        assert _without_relations(got) == _without_relations(expected)
        assert len(expected) > 3000
        assert {d for _, d in got if d[:1] == b"R"} == {d for _, d in expected if d[:1] == b"R"}
        assert sum(d[:1] == b"R" for _, d in got) >= reader.pieces // 2  # (a piece may hold no commit)
        assert not any(data[:1] in (b"S", b"E", b"c", b"A") for _, data in got)  # nothing streamed
        assert _slots(conn) == before  # the slot did not move; the copy is gone

        # the open transaction commits after the target: a read to the new flush position has it, whole
        opened.commit()
        opened.close()
        reader = SlotCopyReader(pg.dsn, "sc_slot", options, target=current_flush_lsn(conn), copies=copies)
        try:
            again = _read_all(reader)
        finally:
            reader.close()
        assert _without_relations(again)[:len(_without_relations(got))] == _without_relations(got)
        inserted = [d for _, d in _without_relations(again)[len(_without_relations(got)):] if d[:1] == b"I"]
        assert len(inserted) >= 3001 + 20 * 3


def test_a_slot_that_cannot_be_copied_is_said_so(pg):
    with pytest.raises(SlotCopyUnavailable, match="no_such_slot"):
        SlotCopyReader(pg.dsn, "no_such_slot", pgoutput_options("sc_pub", proto_version=2), target=1 << 40)


def test_a_slot_in_use_is_not_copied(pg):
    """Another reader holds the slot (a mirror already following it): its walsender would refuse a second
    one, so the copy is refused too, and the caller's walsender then says who holds it."""
    with pg.connect() as conn:
        conn.execute(BACKLOG)
        conn.execute("SELECT pg_create_logical_replication_slot('sc_busy', 'pgoutput')")
        holder = WalSenderStream(pg.dsn)
        try:
            holder.start("sc_busy", pgoutput_options("sc_pub", proto_version=2))
            with pytest.raises(SlotCopyUnavailable, match="in use by the process with PID"):
                SlotCopyReader(pg.dsn, "sc_busy", pgoutput_options("sc_pub", proto_version=2), target=1 << 40)
        finally:
            holder.close()
        assert [name for (name,) in conn.execute("SELECT slot_name FROM pg_replication_slots")] == ["sc_busy"]
