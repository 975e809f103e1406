"""Replication-protocol framing against a real walsender (psycopg 3 COPY_BOTH on replication=database)."""

from __future__ import annotations

import select
import time

import psycopg
import pytest
from psycopg import pq

from applier.lsn import parse_lsn
from applier.protocol import MessageDecoder
from applier.protocol.messages import Begin, Commit, Insert
from applier.protocol.replication import (
    PrimaryKeepalive,
    XLogData,
    parse_copy_data,
    pg_now,
    standby_status_update,
)


def _read_frame(pgconn: pq.abc.PGconn, deadline: float) -> bytes:
    """Next CopyData payload, waiting on the socket (never blocking past ``deadline``)."""
    while True:
        n, data = pgconn.get_copy_data(1)
        if n > 0:
            return bytes(data)
        assert n == 0, f"COPY ended unexpectedly ({n}): {pgconn.error_message!r}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no CopyData from the walsender")
        select.select([pgconn.socket], [], [], remaining)
        pgconn.consume_input()


def _confirmed_flush(conn: psycopg.Connection, slot: str) -> int:
    row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    assert row is not None
    (lsn,) = row
    return parse_lsn(lsn)


@pytest.mark.postgres
def test_stream_from_walsender_and_confirm_with_standby_status_update(pg):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        before = _confirmed_flush(conn, "s")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")

        repl = psycopg.connect(pg.dsn + " replication=database", autocommit=True)
        try:
            pgconn = repl.pgconn
            res = pgconn.exec_(b"START_REPLICATION SLOT s LOGICAL 0/0 "
                               b"(proto_version '1', publication_names 'p')")
            assert res.status == pq.ExecStatus.COPY_BOTH, pgconn.error_message
            decoder = MessageDecoder()
            deadline = time.monotonic() + 30
            messages = []
            commit = None
            while commit is None:
                frame = parse_copy_data(_read_frame(pgconn, deadline))
                if isinstance(frame, XLogData):
                    msg = decoder.decode(frame.payload, lsn=frame.wal_start)
                    messages.append(msg)
                    if isinstance(msg, Commit):
                        commit = msg
                        assert frame.wal_end >= msg.end_lsn
            assert isinstance(messages[0], Begin)
            assert [m.new.values for m in messages if isinstance(m, Insert)] == [(b"1", b"a"), (b"2", b"b")]
            assert commit.end_lsn > before

            # Confirm the transaction; asking for a reply makes the walsender send a keepalive now.
            pgconn.put_copy_data(standby_status_update(commit.end_lsn, reply_requested=True))
            assert pgconn.flush() == 0
            keepalive = None
            while keepalive is None:
                frame = parse_copy_data(_read_frame(pgconn, deadline))
                if isinstance(frame, PrimaryKeepalive):
                    keepalive = frame
            assert keepalive.wal_end >= commit.end_lsn
            assert abs(keepalive.send_time - pg_now()) < 60_000_000  # same clock, same epoch

            while _confirmed_flush(conn, "s") != commit.end_lsn:
                assert time.monotonic() < deadline, "confirmed_flush_lsn did not move"
                time.sleep(0.05)
        finally:
            repl.close()
