"""A published table with no columns (``CREATE TABLE tab_no_col()``, as in PostgreSQL's 001_rep_changes)
holds nothing but a number of rows: it is mirrored as exactly that, a Delta table of one applier column
(``_applier_row``, always NULL) with one row per Postgres row, kept equal under inserts, deletes and
truncates by the initial copy and by the stream, and ``applier verify`` compares the counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.drivers.replay import replay_log
from applier.sink.zerocol import ROW_COLUMN
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SETUP = """
CREATE TABLE tab_no_col();
CREATE TABLE tab_ins (a int PRIMARY KEY);
ALTER TABLE tab_no_col REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE tab_no_col, tab_ins;
INSERT INTO tab_no_col DEFAULT VALUES;
INSERT INTO tab_no_col DEFAULT VALUES;
INSERT INTO tab_no_col DEFAULT VALUES;
INSERT INTO tab_ins VALUES (1), (2);
"""


def delta_count(spark, path: Path) -> int:
    frame = spark.read.format("delta").load(str(path))
    assert frame.columns == [ROW_COLUMN]
    assert frame.where(f"{ROW_COLUMN} IS NOT NULL").count() == 0
    return frame.count()


def pg_count(conn) -> int:
    (n,) = conn.execute("SELECT count(*) FROM tab_no_col").fetchone()
    return int(n)


def test_a_table_without_columns_is_mirrored_as_its_row_count(pg, spark, tmp_path):
    with pg.connect() as conn:
        conn.execute(SETUP)
        target = tmp_path / "delta"
        cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="pub"),
                           target=TargetSettings(path=str(target)), apply=ApplySettings(max_group_seconds=1.0))
        path = target / "public" / "tab_no_col"
        mirror(spark, cfg, once=True)  # the initial copy
        assert delta_count(spark, path) == pg_count(conn) == 3

        # The stream: inserts, a delete of one row (REPLICA IDENTITY FULL: an old image of no columns,
        # so it removes one of the identical rows), a truncate, and both in one transaction.
        conn.execute("INSERT INTO tab_no_col DEFAULT VALUES; INSERT INTO tab_no_col SELECT FROM generate_series(1, 4)")
        conn.execute("DELETE FROM tab_no_col WHERE ctid = (SELECT min(ctid) FROM tab_no_col)")
        conn.execute("INSERT INTO tab_ins VALUES (3)")
        # and one that joins the publication later, with rows: copied by the table sync
        conn.execute("CREATE TABLE tab_no_col2(); INSERT INTO tab_no_col2 SELECT FROM generate_series(1, 5);"
                     "ALTER PUBLICATION pub ADD TABLE tab_no_col2")
        mirror(spark, cfg, once=True)
        assert delta_count(spark, path) == pg_count(conn) == 7
        assert delta_count(spark, target / "public" / "tab_no_col2") == 5

        conn.execute("DELETE FROM tab_no_col WHERE ctid IN (SELECT ctid FROM tab_no_col LIMIT 2)")
        mirror(spark, cfg, once=True)
        assert delta_count(spark, path) == pg_count(conn) == 5

        with conn.transaction():
            conn.execute("INSERT INTO tab_no_col DEFAULT VALUES; TRUNCATE tab_no_col;"
                         "INSERT INTO tab_no_col SELECT FROM generate_series(1, 2)")
        mirror(spark, cfg, once=True)
        assert delta_count(spark, path) == pg_count(conn) == 2
        conn.execute("TRUNCATE tab_no_col")
        mirror(spark, cfg, once=True)
        assert delta_count(spark, path) == pg_count(conn) == 0
        conn.execute("INSERT INTO tab_no_col DEFAULT VALUES")
        mirror(spark, cfg, once=True)
        assert delta_count(spark, path) == pg_count(conn) == 1

        results = {r.source_name: r for r in verify_against_postgres(spark, conn, str(target),
                                                                     [("public", "tab_no_col"), ("public", "tab_ins")])}
        assert results["public.tab_no_col"].equal and results["public.tab_no_col"].source_rows == 1
        assert results["public.tab_ins"].equal
        # The table gains a column: the rows that were there are NULL in it (as in Postgres), the Delta
        # table keeps _applier_row (NULL), and the table is still equal.
        conn.execute("ALTER TABLE tab_no_col ADD COLUMN a int; INSERT INTO tab_no_col VALUES (5), (6);"
                     "DELETE FROM tab_no_col WHERE a IS NULL")
        mirror(spark, cfg, once=True)
        frame = spark.read.format("delta").load(str(path))
        assert frame.columns == [ROW_COLUMN, "a"]
        assert sorted(r["a"] for r in frame.collect()) == [5, 6]
        (result,) = verify_against_postgres(spark, conn, str(target), [("public", "tab_no_col")])
        assert result.equal and result.source_rows == 2
        conn.execute("ALTER TABLE tab_no_col DROP COLUMN a")

        # verify sees a difference in the count
        conn.execute("ALTER PUBLICATION pub DROP TABLE tab_no_col; INSERT INTO tab_no_col DEFAULT VALUES")
        (result,) = verify_against_postgres(spark, conn, str(target), [("public", "tab_no_col")])
        assert not result.equal and (result.source_rows, result.target_rows) == (3, 2)


@pytest.mark.usefixtures("replay_path")
def test_a_replayed_log_keeps_the_row_count_of_a_table_without_columns(pg, spark, tmp_path):
    """The stored-log path (and the fold on Spark's executors): no copy, every row from the stream."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE tab_no_col(); ALTER TABLE tab_no_col REPLICA IDENTITY FULL;"
                     "CREATE TABLE tab_ins (a int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE tab_no_col, tab_ins")
        create_slot(conn, "s")
        for i in range(12):  # many small transactions, so that the executors' ranges cut between them
            conn.execute(f"INSERT INTO tab_no_col SELECT FROM generate_series(1, {i % 3 + 1});"
                         f"INSERT INTO tab_ins VALUES ({i})")
            if i % 4 == 3:
                conn.execute("DELETE FROM tab_no_col WHERE ctid = (SELECT min(ctid) FROM tab_no_col)")
            if i == 6:
                conn.execute("TRUNCATE tab_no_col")
        raw = tmp_path / "raw.parquet"
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("pub"))))
        target = tmp_path / "delta"
        replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target))))
        assert delta_count(spark, target / "public" / "tab_no_col") == pg_count(conn) == 9  # since the TRUNCATE
        tables = [("public", "tab_no_col"), ("public", "tab_ins")]
        for result in verify_against_postgres(spark, conn, str(target), tables):
            assert result.equal, result.source_name
