"""`verify` follows everything the mirror follows (issue 30, rows 7 and 8): a mirror of a publication
with row filters (PostgreSQL's 028_row_filter shapes: filters on some tables, one table in two
publications with different filters, a FOR TABLES IN SCHEMA publication) holds exactly the filtered
rows and verifies equal; a mirror of PostgreSQL's 002_types workload (arrays, enums, composites,
ranges, hstore, a domain) verifies equal. Each test then makes a real difference and verify must
report it (exit 1), so the equal verdicts are not vacuous."""

from __future__ import annotations

from pathlib import Path

import pytest
import tap_types_002 as types002
import yaml

from applier.checks.verify import verify_table
from applier.cli import main as cli_main
from applier.config import MirrorConfig
from applier.drivers.mirror import mirror
from applier.errors import ApplierError, ConfigError
from applier.sources.publication import published_tables

pytestmark = [pytest.mark.postgres]


def _config(pg, tmp_path: Path, publication: str, slot: str) -> tuple[MirrorConfig, Path]:
    raw = {"source": {"dsn": pg.dsn, "slot": slot, "publication": publication},
           "target": {"path": str(tmp_path / "delta")},
           "apply": {"max_group_seconds": 1.0}}
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump(raw))
    return MirrorConfig.model_validate(raw), path


def _verify(config: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["verify", "--config", str(config)])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.spark
def test_002_types_workload_verifies_equal(pg, spark, tmp_path, capsys):
    with pg.connect() as conn:
        conn.execute(types002.DDL)
        conn.execute("CREATE PUBLICATION tap_pub FOR ALL TABLES")
    cfg, path = _config(pg, tmp_path, "tap_pub", "tap_sub_slot")
    mirror(spark, cfg, once=True)
    with pg.connect() as conn:
        conn.execute(types002.INSERTS)
    mirror(spark, cfg, once=True)
    code, out = _verify(path, capsys)
    assert code == 0, out
    with pg.connect() as conn:
        conn.execute(types002.UPDATES)
        conn.execute(types002.DELETES)
    mirror(spark, cfg, once=True)
    code, out = _verify(path, capsys)
    assert code == 0, out
    for table in types002.TABLES:
        assert f"public.{table}: " in out and "DIFFERENT" not in out
    assert "public.tst_comp_enum_what: postgres 3 rows, delta 3 rows: equal" in out
    # a real difference in a nested composite is still seen
    with pg.connect() as conn:
        conn.execute("UPDATE tst_comp_enum_what SET b = ARRAY[ROW(5, '{a, b, d}', 5)::tst_comp_enum_array_t] "
                     "WHERE (a).a = 4")
    code, out = _verify(path, capsys)
    assert code == 1, out
    assert "public.tst_comp_enum_what: postgres 3 rows, delta 3 rows: DIFFERENT" in out


ROW_FILTER_DDL = """
CREATE TABLE tab_rowfilter_1 (a int primary key, b text);
ALTER TABLE tab_rowfilter_1 REPLICA IDENTITY FULL;
CREATE TABLE tab_rowfilter_2 (c int primary key);
CREATE TABLE tab_rowfilter_3 (a int primary key, b boolean);
CREATE TABLE tab_rowfilter_4 (c int primary key);
CREATE SCHEMA schema_rf_x;
CREATE TABLE schema_rf_x.tab_rf_x (x int primary key);
CREATE TABLE tab_unpublished (a int primary key);
CREATE TABLE tab_rowfilter_inherited (a int);
CREATE TABLE tab_rowfilter_child (b text) INHERITS (tab_rowfilter_inherited);
CREATE TABLE tab_gen (a int primary key, g int GENERATED ALWAYS AS (a * 2) STORED);
CREATE PUBLICATION tap_pub_1 FOR TABLE tab_rowfilter_1 WHERE (a > 1000 AND b <> 'filtered'),
    tab_rowfilter_2 WHERE (c % 2 = 0), tab_rowfilter_3;
CREATE PUBLICATION tap_pub_2 FOR TABLE tab_rowfilter_2 WHERE (c % 3 = 0);
CREATE PUBLICATION tap_pub_not_used FOR TABLE tab_rowfilter_1 WHERE (a < 0);
CREATE PUBLICATION tap_pub_4a FOR TABLE tab_rowfilter_4 WHERE (c % 2 = 0);
CREATE PUBLICATION tap_pub_4b FOR TABLE tab_rowfilter_4;
CREATE PUBLICATION tap_pub_x FOR TABLE schema_rf_x.tab_rf_x WHERE (x > 10);
CREATE PUBLICATION tap_pub_allinschema FOR TABLES IN SCHEMA schema_rf_x;
CREATE PUBLICATION tap_pub_inherits FOR TABLE tab_rowfilter_inherited WHERE (a > 15);
CREATE PUBLICATION tap_pub_gen FOR TABLE tab_gen WHERE (a > 2);
"""

# before the mirror starts (the initial copy filters these) ...
ROW_FILTER_BEFORE = """
INSERT INTO tab_rowfilter_1 (a, b) VALUES (1, 'not replicated'), (1500, 'filtered'), (1980, 'not filtered');
INSERT INTO tab_rowfilter_1 (a, b) SELECT x, 'test ' || x FROM generate_series(990, 1002) x;
INSERT INTO tab_rowfilter_2 (c) SELECT generate_series(1, 20);
INSERT INTO tab_rowfilter_3 (a, b) SELECT x, (x % 3 = 0) FROM generate_series(1, 10) x;
INSERT INTO tab_rowfilter_4 (c) SELECT generate_series(1, 10);
INSERT INTO schema_rf_x.tab_rf_x (x) VALUES (0), (5), (10), (15), (20);
INSERT INTO tab_unpublished VALUES (1);
INSERT INTO tab_rowfilter_inherited (a) VALUES (10), (20);
INSERT INTO tab_rowfilter_child (a, b) VALUES (0, '0'), (30, '30'), (40, '40');
INSERT INTO tab_gen (a) SELECT generate_series(1, 5);
"""

# ... and the stream: rows moving into and out of the filters (an UPDATE becomes an INSERT or a DELETE)
ROW_FILTER_AFTER = """
INSERT INTO tab_rowfilter_1 (a, b) VALUES (800, 'test 800'), (1600, 'test 1600'), (1601, 'test 1601'),
    (1602, 'filtered'), (1700, 'test 1700');
UPDATE tab_rowfilter_1 SET b = NULL WHERE a = 1600;
UPDATE tab_rowfilter_1 SET b = 'test 1601 updated' WHERE a = 1601;
UPDATE tab_rowfilter_1 SET b = 'test 1602 updated' WHERE a = 1602;
UPDATE tab_rowfilter_1 SET b = 'filtered' WHERE a = 1700;
DELETE FROM tab_rowfilter_1 WHERE a IN (1001, 1002);
INSERT INTO tab_rowfilter_2 (c) SELECT generate_series(21, 40);
UPDATE tab_rowfilter_2 SET c = c + 100 WHERE c IN (4, 9, 11);
DELETE FROM tab_rowfilter_2 WHERE c IN (6, 8, 13);
INSERT INTO tab_rowfilter_4 (c) SELECT generate_series(11, 20);
INSERT INTO schema_rf_x.tab_rf_x (x) VALUES (-99), (99);
INSERT INTO tab_rowfilter_inherited (a) VALUES (14), (16);
INSERT INTO tab_rowfilter_child (a, b) VALUES (13, '13'), (17, '17');
INSERT INTO tab_gen (a) SELECT generate_series(-3, 0);
UPDATE tab_gen SET a = a + 10 WHERE a IN (1, 5);
"""


@pytest.mark.spark
def test_row_filtered_publications_verify_equal(pg, spark, tmp_path, capsys):
    with pg.connect() as conn:
        conn.execute(ROW_FILTER_DDL)
        conn.execute(ROW_FILTER_BEFORE)
    # mixed spelling and blanks, as pgoutput's publication_names reads it
    publications = ("tap_pub_1, TAP_PUB_2,tap_pub_4a , tap_pub_4b, tap_pub_x, \"tap_pub_allinschema\", "
                    "tap_pub_inherits, tap_pub_gen")
    cfg, path = _config(pg, tmp_path, publications, "tap_sub")
    mirror(spark, cfg, once=True)
    code, out = _verify(path, capsys)
    assert code == 0, out
    with pg.connect() as conn:
        conn.execute(ROW_FILTER_AFTER)
    mirror(spark, cfg, once=True)
    code, out = _verify(path, capsys)
    assert code == 0, out
    with pg.connect() as conn:
        def count(sql: str) -> int:
            return int(conn.execute(sql).fetchone()[0])

        expected = {  # what pgoutput sends: tap_pub_not_used is not in the config and does not count
            "public.tab_rowfilter_1": count("SELECT count(*) FROM tab_rowfilter_1 WHERE a > 1000 AND b <> 'filtered'"),
            "public.tab_rowfilter_2": count("SELECT count(*) FROM tab_rowfilter_2 WHERE c % 2 = 0 OR c % 3 = 0"),
            "public.tab_rowfilter_3": count("SELECT count(*) FROM tab_rowfilter_3"),
            # tap_pub_4b has no filter, tap_pub_allinschema never has one: every row
            "public.tab_rowfilter_4": count("SELECT count(*) FROM tab_rowfilter_4"),
            "schema_rf_x.tab_rf_x": count("SELECT count(*) FROM schema_rf_x.tab_rf_x"),
            # an inheritance parent's own rows (ONLY), its child as a table of its own, both filtered
            "public.tab_rowfilter_inherited": 2, "public.tab_rowfilter_child": 3,
            # a table with a generated column (PG 15 never sends the column, its pg_publication_tables lists it)
            "public.tab_gen": count("SELECT count(*) FROM tab_gen WHERE a > 2"),
        }
        total_2 = count("SELECT count(*) FROM tab_rowfilter_2")
    assert expected["public.tab_rowfilter_1"] == 3 and expected["public.tab_rowfilter_2"] < total_2
    assert expected["public.tab_rowfilter_4"] == 20 and expected["schema_rf_x.tab_rf_x"] == 7
    for name, rows in expected.items():
        assert f"{name}: postgres {rows} rows, delta {rows} rows: equal" in out, out
    assert "tab_unpublished" not in out
    assert spark.read.format("delta").load(str(tmp_path / "delta" / "public" / "tab_rowfilter_2")).count() \
        == expected["public.tab_rowfilter_2"]

    # a row the filters leave out changes nothing; one they pass, not yet mirrored, is a difference
    with pg.connect() as conn:
        conn.execute("INSERT INTO tab_rowfilter_2 VALUES (1001)")  # neither even nor a multiple of 3
    assert _verify(path, capsys)[0] == 0
    with pg.connect() as conn:
        conn.execute("INSERT INTO tab_rowfilter_2 VALUES (1002)")
    code, out = _verify(path, capsys)
    assert code == 1, out
    assert "public.tab_rowfilter_2: postgres" in out and "only in postgres: 1002" in out
    # and a changed Delta row of a filtered table is seen
    from delta.tables import DeltaTable

    mirror(spark, cfg, once=True)
    assert _verify(path, capsys)[0] == 0
    DeltaTable.forPath(spark, str(tmp_path / "delta" / "public" / "tab_rowfilter_1")) \
        .update("a = 1980", {"b": "'tampered'"})
    code, out = _verify(path, capsys)
    assert code == 1 and "public.tab_rowfilter_1: postgres 3 rows, delta 3 rows: DIFFERENT" in out, out
    assert "only in delta:    1980 | tampered" in out


def test_publications_combine_as_pgoutput_combines_them(pg_any):
    """The rule of pgoutput_row_filter_init and table sync, on every major: filters of the named
    publications OR-ed; none when one of them has none (a FOR TABLES IN SCHEMA one never has one);
    publications not named do not count; different column lists refused; every name must exist."""
    with pg_any.connect() as conn:
        conn.execute("""
            CREATE TABLE t1 (a int PRIMARY KEY, b text);
            CREATE TABLE t2 (a int PRIMARY KEY);
            CREATE SCHEMA s;
            CREATE TABLE s.t3 (a int PRIMARY KEY);
            CREATE TABLE t4 (a int PRIMARY KEY, b int, c int);
            INSERT INTO t1 SELECT x, 'v' || x FROM generate_series(-5, 10) x;
            CREATE PUBLICATION pub_a FOR TABLE t1 WHERE (a > 5), t2 WHERE (a > 5);
            CREATE PUBLICATION pub_b FOR TABLE t1 WHERE (a < 0 AND b <> 'v-1');
            CREATE PUBLICATION pub_c FOR TABLE t2;
            CREATE PUBLICATION pub_d FOR TABLE s.t3 WHERE (a > 5);
            CREATE PUBLICATION pub_e FOR TABLES IN SCHEMA s;
            CREATE PUBLICATION "Pub_Cols1" FOR TABLE t4 (a, b);
            CREATE PUBLICATION pub_cols2 FOR TABLE t4 (a, c);
        """)
        tables = {t.qualified_name: t for t in published_tables(conn, 'pub_a,PUB_B , pub_d, "Pub_Cols1"')}
        assert sorted(tables) == ["public.t1", "public.t2", "public.t4", "s.t3"]
        t1 = tables["public.t1"].row_filter
        assert t1 is not None and " OR " in t1
        rows = conn.execute(f"SELECT a FROM t1 WHERE {t1} ORDER BY a").fetchall()
        assert [r[0] for r in rows] == [-5, -4, -3, -2, 6, 7, 8, 9, 10]
        assert tables["public.t2"].row_filter == "(a > 5)" and tables["s.t3"].row_filter == "(a > 5)"
        assert tables["public.t4"].columns == ("a", "b") and tables["public.t4"].row_filter is None
        both = {t.qualified_name: t for t in published_tables(conn, "pub_a, pub_c, pub_d, pub_e")}
        assert both["public.t2"].row_filter is None and both["s.t3"].row_filter is None
        assert both["public.t1"].row_filter == "(a > 5)"
        with pytest.raises(ConfigError, match="different column lists"):  # exit 2: fix the publications
            published_tables(conn, '"Pub_Cols1", pub_cols2')
        with pytest.raises(ApplierError, match="publication 'pub_cols1' does not exist"):
            published_tables(conn, "pub_a, Pub_Cols1")  # unquoted: folded to lower case, as pgoutput does


@pytest.mark.spark
def test_a_missing_column_or_table_is_a_difference_not_a_crash(pg, spark, tmp_path, capsys):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
    target = tmp_path / "delta"
    spark.createDataFrame([(1, "a"), (2, "b")], "id int, v string").write.format("delta") \
        .save(str(target / "public" / "t"))
    spark.createDataFrame([(1,)], "id int").write.format("delta").save(str(target / "public" / "u"))
    with pg.connect() as conn:
        assert verify_table(spark, conn, str(target / "public" / "t"), "public", "t").equal
        conn.execute("ALTER TABLE t ADD COLUMN added int")  # Postgres gained a column the mirror has not seen
        res = verify_table(spark, conn, str(target / "public" / "t"), "public", "t")
        assert not res.equal and res.problems == ["column 'added' is not in the Delta table"]
        assert res.source_rows == res.target_rows == 2 and res.source_checksum == res.target_checksum
        res = verify_table(spark, conn, str(tmp_path / "nowhere"), "public", "t")
        assert not res.equal and res.problems == [f"no Delta table at {tmp_path / 'nowhere'}"]
        assert (res.source_rows, res.target_rows) == (2, 0)
    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 1
    out = capsys.readouterr().out
    assert "public.t: postgres 2 rows, delta 2 rows: DIFFERENT" in out
    assert "  column 'added' is not in the Delta table" in out and "public.u: postgres 0 rows, delta 1 rows" in out
