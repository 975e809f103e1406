"""A copy whose snapshot's exporting session ended (the soak, seed 2 on PostgreSQL 18, step 127: a
walsender terminated while a table sync's slot waited) stopped the run with "the initial copy failed:
snapshot ... does not exist" (exit 3, a stop nobody needed): it is an outage the mirror's reconnect cures,
copying the table again at a new snapshot. The errors are the server's own."""

from __future__ import annotations

import psycopg
import pytest

from applier.drivers.initial_copy import copy_session_lost

pytestmark = [pytest.mark.postgres]


def _error(conn: psycopg.Connection, statement: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(statement)
    if not conn.broken:
        conn.rollback()
    return info.value


def test_a_snapshot_whose_exporter_ended_is_a_lost_session_and_other_errors_are_not(pg):
    with pg.connect() as exporter:
        exporter.autocommit = False
        exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        name = exporter.execute("SELECT pg_export_snapshot()").fetchone()[0]
    with pg.connect() as conn:  # (the exporter's transaction ended with its session)
        conn.autocommit = False
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        gone = _error(conn, f"SET TRANSACTION SNAPSHOT '{name}'")
        assert "snapshot" in str(gone) and copy_session_lost(gone)  # (15: "invalid snapshot identifier")
        assert not copy_session_lost(_error(conn, "SELECT * FROM no_such_table"))
    with pg.connect() as conn, pg.connect() as other:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        terminated = _error(conn, "SELECT 1")
        assert copy_session_lost(terminated), (terminated.sqlstate, str(terminated))
