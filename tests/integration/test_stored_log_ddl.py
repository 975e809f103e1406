"""A log written by ``applier capture`` replays exactly through DDL (issue 46, item 5): renamed columns,
tables and schemas, a name reused by a new table, a table dropped and created again, a key changed.
Capture notes on each Relation row what the live catalog said of it (applier.sources.catalog_lookup);
replay answers from those notes what a live mirror asks the catalog. A bare log (lsn, xid, data) of the
same workload still stops where nothing can tell, with the message it always had. Every table is
compared with Postgres row by row."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import ApplySettings, CaptureConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.capture import capture
from applier.drivers.replay import replay_log
from applier.sink.identity import UnprovenRenameError
from applier.sink.naming import table_location
from applier.sources.rawlog import read_raw_log
from applier.sources.rawlog_writer import write_raw_log

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("public", "cols"), ("public", "t1"), ("public", "t2"), ("sch1", "s"), ("sch2", "s"), ("public", "d"),
          ("public", "k")]


def _capture_config(pg, log: Path) -> CaptureConfig:
    return CaptureConfig(source=SourceSettings(dsn=pg.dsn, slot="ddl", publication="ddl_pub"), log_path=str(log))


def _workload(pg, spark, conn, log: Path) -> None:
    """The DDL of a schema's life, with ``applier capture`` running between the steps as a capture
    that follows the slot would (each capture's notes are read just after its peek)."""
    cfg = _capture_config(pg, log)
    conn.execute("CREATE SCHEMA sch1")
    conn.execute("CREATE TABLE cols (id int PRIMARY KEY, a text, n int)")
    conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE sch1.s (a int PRIMARY KEY)")
    conn.execute("CREATE TABLE d (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE k (id int PRIMARY KEY, code int NOT NULL, v text)")
    conn.execute("CREATE PUBLICATION ddl_pub FOR ALL TABLES")
    capture(spark, cfg)  # creates the slot: the log starts here
    conn.execute("INSERT INTO cols SELECT g, 'v' || g, g FROM generate_series(1, 10) g")
    conn.execute("INSERT INTO t1 SELECT g, 'old' || g FROM generate_series(1, 5) g")
    conn.execute("INSERT INTO sch1.s VALUES (1), (2)")
    conn.execute("INSERT INTO d SELECT g, 'first' FROM generate_series(1, 3) g")
    conn.execute("INSERT INTO k SELECT g, 10 * g, 'k' || g FROM generate_series(1, 5) g")
    capture(spark, cfg)

    conn.execute("ALTER TABLE cols RENAME COLUMN a TO b")  # a rename: only attnums tell it from drop + add
    conn.execute("UPDATE cols SET n = n + 100 WHERE id <= 3")
    conn.execute("ALTER TABLE t1 RENAME TO t2")  # renamed, and nothing written to it before its name is reused
    conn.execute("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO t1 VALUES (1, 'new1'), (100, 'new100')")
    conn.execute("ALTER SCHEMA sch1 RENAME TO sch2")
    conn.execute("CREATE SCHEMA sch1")
    conn.execute("CREATE TABLE sch1.s (a int PRIMARY KEY)")
    conn.execute("INSERT INTO sch1.s VALUES (3)")
    conn.execute("DROP TABLE d")
    conn.execute("CREATE TABLE d (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO d VALUES (1, 'second')")
    conn.execute("ALTER TABLE k DROP CONSTRAINT k_pkey, ADD PRIMARY KEY (code)")
    conn.execute("UPDATE k SET id = id + 100 WHERE code = 20")
    conn.execute("DELETE FROM k WHERE code = 30")
    capture(spark, cfg)

    conn.execute("INSERT INTO t2 VALUES (6, 'old6')")
    conn.execute("UPDATE t2 SET v = 'changed' WHERE id = 1")
    conn.execute("INSERT INTO t1 VALUES (2, 'new2')")
    conn.execute("INSERT INTO sch2.s VALUES (4)")
    conn.execute("INSERT INTO cols VALUES (11, 'eleven', 11)")
    conn.execute("UPDATE k SET v = 'changed' WHERE code = 40")
    capture(spark, cfg)


def _replay(spark, log: Path, target: Path) -> None:
    replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                                   apply=ApplySettings(max_group_transactions=2)))


def _assert_equal(spark, conn, target: Path) -> None:
    for result in verify_against_postgres(spark, conn, str(target), TABLES):
        assert result.equal, (result.source_name, result.source_rows, result.target_rows,
                              result.only_in_source[:3], result.only_in_target[:3])


def test_a_captured_log_replays_exactly_through_ddl(pg, spark, tmp_path, replay_path):
    log, target = tmp_path / "raw-log", tmp_path / "replayed"
    with pg.connect() as conn:
        _workload(pg, spark, conn, log)
        _replay(spark, log, target)
        if replay_path.name == "executors":  # the notes are read on the driver path, in log order
            assert any("catalog notes" in why for why in replay_path.driver_only), replay_path
        _assert_equal(spark, conn, target)
        # the renamed table's Delta table followed its name, with its rows from before the rename
        t2 = spark.read.format("delta").load(table_location(target, "public", "t2"))
        assert sorted(r["id"] for r in t2.collect()) == [1, 2, 3, 4, 5, 6]
        cols = spark.read.format("delta").load(table_location(target, "public", "cols"))
        assert "b" in cols.columns and "a" not in cols.columns
        assert {r["id"]: r["b"] for r in cols.collect()}[7] == "v7"  # renamed in place: values kept
        retired = list((target / "_retired" / "public").iterdir())  # the dropped d, never merged into
        assert [p.name.split("@")[0] for p in retired] == ["d"]
        # a second replay of the same log writes nothing new and leaves the same tables
        _replay(spark, log, target)
        _assert_equal(spark, conn, target)


def test_a_bare_log_of_the_same_workload_stops_as_before(pg, spark, tmp_path):
    """The captured log notes the catalog on its Relation rows, and only there. The same messages without
    the notes (lsn, xid, data): nothing can tell whether cols.a was renamed to b or dropped, and the replay
    stops there (exit 4) with the message it has always had, before writing to that table."""
    log, bare = tmp_path / "raw-log", tmp_path / "bare.parquet"
    with pg.connect() as conn:
        _workload(pg, spark, conn, log)
    messages = list(read_raw_log(log))
    assert {m.data[:1] for m in messages if m.catalog is not None} == {b"R"}
    assert all(m.catalog is not None for m in messages if m.data[:1] == b"R")
    write_raw_log(bare, ((m.lsn, m.xid, m.data) for m in messages))
    with pytest.raises(UnprovenRenameError) as stopped:
        _replay(spark, bare, tmp_path / "replayed")
    assert for_exception(stopped.value) == ExitCode.BAD_DATA
    assert str(stopped.value).startswith(
        "public.cols: column(s) a are gone and b are new in the same schema change: a rename or a drop and an add, "
        "which the stream alone cannot tell apart (no catalog to ask: a stored log)."), stopped.value


def test_a_capture_log_from_before_the_notes_gains_them_and_still_replays(pg, spark, tmp_path):
    """A log written before the catalog column existed: the next capture adds it (Delta schema evolution),
    the older rows read with no note, and the log replays; a table renamed and its name reused after the
    upgrade is followed, its Relation being noted again in the new capture's round."""
    log, target = tmp_path / "raw-log", tmp_path / "replayed"
    cfg = _capture_config(pg, log)
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION ddl_pub FOR ALL TABLES")
        capture(spark, cfg)
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        capture(spark, cfg)
        # what a capture before the notes wrote: the same rows and commits, without the column
        before = spark.read.format("delta").load(str(log)).drop("catalog")
        before.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(log))
        conn.execute("INSERT INTO t VALUES (3, 'c')")
        conn.execute("ALTER TABLE t RENAME TO t2")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'new')")
        conn.execute("UPDATE t2 SET v = 'changed' WHERE id = 2")
        assert capture(spark, cfg).messages > 0
        rows = spark.read.format("delta").load(str(log)).orderBy("seq").collect()
        relations = [r for r in rows if bytes(r["data"][:1]) == b"R"]
        assert relations[0]["catalog"] is None and relations[-1]["catalog"] is not None
        _replay(spark, log, target)
        for result in verify_against_postgres(spark, conn, str(target), [("public", "t"), ("public", "t2")]):
            assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])
