"""verify must be able to fail: a tampered Delta table is reported, with the differing rows."""

from __future__ import annotations

import pytest

from applier.checks.verify import compare, verify_table

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def test_compare_is_order_independent_and_multiset_aware():
    assert compare("t", iter([(1, "a"), (2, None)]), iter([(2, None), (1, "a")])).equal
    res = compare("t", iter([(1, "a"), (1, "a")]), iter([(1, "a")]))
    assert not res.equal and res.only_in_source == ["1\x1fa"]
    assert not compare("t", iter([(1, None)]), iter([(1, "\\N")])).equal  # NULL is not the text \N


def test_tampered_delta_table_is_reported(pg, spark, tmp_path):
    from delta.tables import DeltaTable

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, flag boolean, c char(4), d numeric(6,2))")
        conn.execute("INSERT INTO t VALUES (1, true, 'ab', 1.50), (2, false, NULL, NULL)")
        path = str(tmp_path / "t")
        spark.createDataFrame([(1, True, "ab  ", "1.50"), (2, False, None, None)],
                              "id int, flag boolean, c string, d string") \
            .selectExpr("id", "flag", "c", "cast(d as decimal(6,2)) as d").write.format("delta").save(path)
        assert verify_table(spark, conn, path, "public", "t").equal
        DeltaTable.forPath(spark, path).update("id = 2", {"flag": "true"})
        res = verify_table(spark, conn, path, "public", "t")
        assert not res.equal
        assert res.source_rows == res.target_rows == 2
        assert res.only_in_source == ["2\x1ff\x1f\\N\x1f\\N"] and res.only_in_target == ["2\x1ft\x1f\\N\x1f\\N"]


def test_verify_command_exit_codes_and_no_dsn_in_output(pg, spark, tmp_path, capsys, no_spark):
    """``no_spark``: delta-rs reads these tables, so the command starts no JVM."""
    from applier.cli import main

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
    path = tmp_path / "public" / "t"
    spark.createDataFrame([(1, "a")], "id int, v string").write.format("delta").save(str(path))
    dsn = pg.dsn + " password=hunter2"
    assert main(["verify", "--dsn", dsn, "--target", str(tmp_path)]) == 0
    spark.createDataFrame([(2, "b")], "id int, v string").write.format("delta").mode("append").save(str(path))
    assert main(["verify", "--dsn", dsn, "--target", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "only in delta:    2 | b" in out.out
    assert "hunter2" not in out.out + out.err and "port=" not in out.out + out.err
