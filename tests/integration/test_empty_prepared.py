"""Empty prepared transactions (issue 30, row 5) on a real PostgreSQL of each major: with two_phase,
``BEGIN; SELECT ... FOR SHARE; PREPARE TRANSACTION 'x'; COMMIT PREPARED 'x'`` sends (on 15 and 16)
a Commit Prepared with no Prepare before it. The mirror commits it as the no-op it is, run after run,
while a Commit Prepared whose Prepare the slot was moved past without the mirror still stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.errors import AssemblyError

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("public", "t")]


def _assert_equal(spark, conn, target: Path) -> None:
    for r in verify_against_postgres(spark, conn, str(target), TABLES):
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


@pytest.mark.parametrize("read_mode", ["replication", "sql"])
def test_an_empty_prepared_transaction_commits_as_a_no_op_and_lost_prepared_changes_still_stop(pg_any, spark,
                                                                                                  tmp_path, read_mode):
    with pg_any.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE unpublished (id int PRIMARY KEY);"
                     "INSERT INTO t VALUES (1, 'a'), (2, 'b'); CREATE PUBLICATION p FOR TABLE t")
        target = tmp_path / "delta"
        cfg = MirrorConfig(source=SourceSettings(dsn=pg_any.dsn, slot="m", publication="p", read_mode=read_mode,
                                                 proto_version=3, two_phase=True),
                           target=TargetSettings(path=str(target)), apply=ApplySettings())
        mirror(spark, cfg, once=True)

        # the exact SQL, and its variants: changes only to an unpublished table, a rollback
        for sql in ("BEGIN; SELECT * FROM t FOR SHARE; PREPARE TRANSACTION 'x'; COMMIT PREPARED 'x'",
                    "INSERT INTO t VALUES (3, 'c')",
                    "BEGIN; INSERT INTO unpublished VALUES (1); PREPARE TRANSACTION 'y'; COMMIT PREPARED 'y'",
                    "BEGIN; SELECT * FROM t FOR UPDATE; PREPARE TRANSACTION 'z'; ROLLBACK PREPARED 'z'",
                    "BEGIN; UPDATE t SET v = 'b2' WHERE id = 2; PREPARE TRANSACTION 'w'; COMMIT PREPARED 'w'",
                    "BEGIN; SELECT * FROM t FOR SHARE; PREPARE TRANSACTION 'x'; COMMIT PREPARED 'x'"):
            for statement in sql.split("; "):
                conn.execute(statement)
        mirror(spark, cfg, once=True)  # stopped with exit 4 "... not staged here" before
        _assert_equal(spark, conn, target)
        assert sorted(conn.execute("SELECT id, v FROM t").fetchall()) == [(1, "a"), (2, "b2"), (3, "c")]
        assert mirror(spark, cfg, once=True).transactions == 0  # the next run too, with nothing re-applied
        _assert_equal(spark, conn, target)

        # Real loss: the slot is moved past a Prepare by someone else; its Commit Prepared must not be
        # taken for an empty one.
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (4, 'lost')")
        conn.execute("PREPARE TRANSACTION 'lost'")
        conn.execute("SELECT pg_replication_slot_advance('m', pg_current_wal_lsn())")
        conn.execute("COMMIT PREPARED 'lost'")
        with pytest.raises(AssemblyError, match="not staged here"):
            mirror(spark, cfg, once=True)
