"""A log written by ``applier capture`` replays exactly through several renames of one table between two
captures (issue 73 item 5, ``../shared/repro/t5/stored-log-two-renames/``).

The capture notes each Relation with what the live catalog said of it after the round was peeked. When a
table's columns were renamed twice before a capture, the catalog no longer had the first Relation's
columns, so its note had no attnums, and replay could not prove the first rename: it stopped (exit 4),
or, in grouped mode, a REPLICA IDENTITY FULL table's changes met rows it could not find. Every table is
compared with Postgres row by row and by column names, in both groupings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, CaptureConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.capture import capture
from applier.drivers.replay import replay_log
from applier.sources.rawlog import read_raw_log

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _capture(spark, pg, log: Path) -> None:
    capture(spark, CaptureConfig(source=SourceSettings(dsn=pg.dsn, slot="cap", publication="pub"), log_path=str(log)))


def _assert_equal(spark, conn, target: Path, tables: list[str]) -> None:
    from deltalake import DeltaTable

    results = verify_against_postgres(spark, conn, str(target), [("public", t) for t in tables])
    assert all(r.equal for r in results), [(r.source_name, r.problems, r.source_rows, r.target_rows,
                                            r.only_in_source[:3], r.only_in_target[:3]) for r in results]
    for table in tables:
        live = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND "
                                           "attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,))]
        delta = [f.name for f in DeltaTable(str(target / "public" / table)).schema().fields]
        assert sorted(delta) == sorted(live), (table, delta, live)


def _two_renames(conn) -> None:
    for table in ("t", "k"):
        conn.execute(f"ALTER TABLE {table} RENAME COLUMN b TO b2")
        conn.execute(f"UPDATE {table} SET a = 10 WHERE id = 1")
    for table in ("t", "k"):
        conn.execute(f"ALTER TABLE {table} RENAME COLUMN a TO a2")
        conn.execute(f"UPDATE {table} SET b2 = 20 WHERE id = 2")


@pytest.mark.parametrize("grouping", ["grouped", "transaction"])
def test_a_log_replays_through_two_renames_between_two_captures(pg, spark, tmp_path, grouping):
    """The reproduction: a keyed table and a REPLICA IDENTITY FULL one, each with two columns renamed (and a
    row changed after each rename) between two captures."""
    log = tmp_path / "rawlog"
    with pg.connect() as conn:
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        _capture(spark, pg, log)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b int)")
        conn.execute("CREATE TABLE k (id int, a int, b int)")
        conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO t VALUES (1, 1, 1), (2, 2, 2)")
        conn.execute("INSERT INTO k VALUES (1, 1, 1), (2, 2, 2)")
        _capture(spark, pg, log)
        _two_renames(conn)
        _capture(spark, pg, log)
        notes = [json.loads(m.catalog) for m in read_raw_log(str(log)) if m.catalog is not None]
        assert all(n["attnums"] is not None for n in notes), notes
        target = tmp_path / "replay"
        replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                                       apply=ApplySettings(grouping=grouping)))
        _assert_equal(spark, conn, target, ["t", "k"])


def test_a_table_with_a_column_dropped_earlier_replays_through_two_renames(pg, spark, tmp_path):
    """The same with a column dropped (and its drop captured) before: the capture knows the attnum was
    dropped before the renamed columns' Relations were written, so it still gives their attnums."""
    log = tmp_path / "rawlog"
    with pg.connect() as conn:
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        _capture(spark, pg, log)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, gone int, a int, b int)")
        conn.execute("CREATE TABLE k (id int, a int, b int, gone int)")
        conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO t VALUES (1, 0, 1, 1), (2, 0, 2, 2)")
        conn.execute("INSERT INTO k VALUES (1, 1, 1, 0), (2, 2, 2, 0)")
        conn.execute("ALTER TABLE t DROP COLUMN gone")
        conn.execute("ALTER TABLE k DROP COLUMN gone")
        conn.execute("INSERT INTO t VALUES (3, 3, 3)")
        conn.execute("INSERT INTO k VALUES (3, 3, 3)")
        _capture(spark, pg, log)
        _two_renames(conn)
        _capture(spark, pg, log)
        target = tmp_path / "replay"
        replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target))))
        _assert_equal(spark, conn, target, ["t", "k"])
