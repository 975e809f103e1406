"""The initial copy reads ``COPY ... TO STDOUT`` straight off libpq (``applier.sources.copy.copy_out``)
instead of through psycopg's ``Copy``, which spent 1 µs of Python on each row. Reading a protocol by
hand is where bytes get lost at a message boundary, or where a server's error mid-COPY turns into a
silently short table: these compare with psycopg's own reading, byte for byte, and make the server fail
before, in the middle of, and under a COPY."""

from __future__ import annotations

import psycopg
import pytest

from applier.sources.copy import copy_out

pytestmark = [pytest.mark.postgres]

ROWS = """SELECT i, repeat(chr(913 + i % 20), i % 300), CASE WHEN i % 7 = 0 THEN E'two\\nlines, "quoted"' END,
    CASE WHEN i % 1000 = 0 THEN repeat('x', 300000) END FROM generate_series(1, 60000) i"""


def _psycopg_copy(conn: psycopg.Connection, statement: str) -> bytes:
    data = bytearray()
    with conn.cursor().copy(statement) as copy:
        for block in copy:
            data += block
    return bytes(data)


@pytest.mark.parametrize("form", ["csv", "text", "binary"])
def test_every_byte_is_what_psycopg_reads_and_the_session_goes_on(pg, form):
    with pg.connect() as conn:
        conn.autocommit = False
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        statement = f"COPY ({ROWS}) TO STDOUT (FORMAT {form})"
        ours = copy_out(conn, statement)
        assert len(ours) > 10_000_000  # many socket reads, messages split across them
        assert bytes(ours) == _psycopg_copy(conn, statement)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still in its snapshot
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        assert copy_out(conn, "COPY (SELECT 1 WHERE false) TO STDOUT") == b""


def test_a_server_error_before_or_during_the_copy_is_raised_and_the_session_can_go_on(pg):
    with pg.connect() as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            copy_out(conn, "COPY (SELECT * FROM no_such_table) TO STDOUT")
        # rows sent, then the server fails: an error, never the rows before it as if they were all
        with pytest.raises(psycopg.errors.DivisionByZero):
            copy_out(conn, "COPY (SELECT i, 1 / (i - 50000) FROM generate_series(1, 60000) i) TO STDOUT")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.ProgrammingError):
            copy_out(conn, "SELECT 1")  # not a COPY: said so, not read as an empty one
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_session_terminated_under_the_copy_is_a_lost_connection(pg):
    with pg.connect() as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        statement = ("COPY (SELECT i, pg_sleep(0.5) FROM generate_series(1, 3) i "
                     f"WHERE i < 3 OR (SELECT pg_terminate_backend({pid}) FROM pg_sleep(0))) TO STDOUT")
        with pytest.raises(psycopg.OperationalError):
            copy_out(conn, statement)
        assert conn.broken or conn.closed
