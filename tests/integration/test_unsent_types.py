"""Column types changed in Postgres with no later change to the table's rows reach Delta by the end of the run.

pgoutput sends a table's Relation only before a change of that table, so ``ALTER COLUMN ... TYPE`` followed
by changes of other tables only never reached the stream: the run ended with exit 0 and the Delta column
kept its old type and, where ``USING`` rewrote them, its old values (tests/scenario/test_schema_walk.py's
seed 33: numeric 4450.40 stayed a decimal while Postgres held the text '4450.40'). Each case here runs the
mirror on a real server and verifies the table, types included, after the run that follows the ALTER.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _config(pg, tmp_path: Path, name: str) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=name, publication=f"{name}_pub"),
                        target=TargetSettings(path=str(tmp_path / "delta")), apply=ApplySettings())


def _delta_types(tmp_path: Path, table: str) -> dict[str, object]:
    from deltalake import DeltaTable

    fields = json.loads(DeltaTable(str(tmp_path / "delta" / "public" / table)).schema().to_json())["fields"]
    return {f["name"]: f["type"] for f in fields}


def _assert_equal(spark, conn, tmp_path: Path, tables: list[str], publication: str) -> None:
    results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), [("public", t) for t in tables],
                                      publication=publication)
    assert all(r.equal for r in results), [(r.source_name, r.problems, r.only_in_source[:3], r.only_in_target[:3])
                                           for r in results]


def _messages(progress: list[str], table: str) -> list[str]:
    return [m for m in progress if table in m]


def test_a_retype_delta_cannot_widen_copies_the_table_again(pg_any, spark, tmp_path):
    """The reduction of the schema walk's seed 33 (numeric to text), and bool to text (from a soak): Delta
    cannot make a string of a decimal or a boolean, and the boolean's values read otherwise as text, so the
    table is copied again by the end of the run, on each PostgreSQL major."""
    pg = pg_any
    config = _config(pg, tmp_path, "ut")
    progress: list[str] = []
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, n numeric(10,2))")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY, c bool)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1, 4450.40), (2, 12.34)")
        conn.execute("INSERT INTO b VALUES (1, true), (2, false), (3, NULL)")
        conn.execute("CREATE PUBLICATION ut_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t ALTER COLUMN n TYPE text USING n::text")
        conn.execute("ALTER TABLE b ALTER COLUMN c TYPE text USING c::text")
        conn.execute("INSERT INTO other VALUES (1)")
        mirror(spark, config, once=True, progress=progress.append)
        assert _delta_types(tmp_path, "t")["n"] == "string"
        assert _delta_types(tmp_path, "b")["c"] == "string"
        _assert_equal(spark, conn, tmp_path, ["t", "b", "other"], "ut_pub")
        assert any("which Delta cannot widen" in m and "copying the table again" in m
                   for m in _messages(progress, "public.t")), progress
        # the stream goes on from the copy, and a run with nothing new copies nothing again
        conn.execute("UPDATE t SET n = 'x' WHERE id = 1")
        progress.clear()
        mirror(spark, config, once=True, progress=progress.append)
        _assert_equal(spark, conn, tmp_path, ["t", "b", "other"], "ut_pub")
        assert not any("copying" in m for m in progress), progress


def test_a_widening_with_values_kept_is_made_in_place_and_one_with_new_values_copies(pg, spark, tmp_path):
    """int to bigint rewrites the table but keeps every value (the catalog proves it): the Delta column is
    widened, no copy. int to bigint USING v * 2 rewrote the values: the table is copied again."""
    config = _config(pg, tmp_path, "uw")
    progress: list[str] = []
    with pg.connect() as conn:
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE doubled (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO kept SELECT g, g * 10 FROM generate_series(1, 20) g")
        conn.execute("INSERT INTO doubled SELECT g, g * 10 FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION uw_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE kept ALTER COLUMN v TYPE bigint")
        conn.execute("ALTER TABLE doubled ALTER COLUMN v TYPE bigint USING v * 2")
        conn.execute("INSERT INTO other VALUES (1)")
        mirror(spark, config, once=True, progress=progress.append)
        assert _delta_types(tmp_path, "kept")["v"] == "long"
        _assert_equal(spark, conn, tmp_path, ["kept", "doubled", "other"], "uw_pub")
        assert not any("copying" in m for m in _messages(progress, "public.kept")), progress
        assert any("widened from int to bigint, values kept" in m for m in _messages(progress, "public.kept")), \
            progress
        assert any("copying the table again" in m for m in _messages(progress, "public.doubled")), progress


def test_a_retype_delta_does_not_see_is_still_proven(pg, spark, tmp_path):
    """varchar(10) to text USING upper(s) is no change of the Delta type (both strings), but it rewrote the
    values: the table is copied again, whether the stream's last Relation of it had the old type (``up``)
    or the stream never sent one (``never``: only copied); so is a boolean turned around with a USING to
    its own type (``flip``: no type changed at all). varchar(10) to varchar(40), which rewrites nothing,
    and text to varchar(40), whose rewrite keeps every value, copy nothing."""
    config = _config(pg, tmp_path, "us")
    progress: list[str] = []
    with pg.connect() as conn:
        for table in ("up", "wide", "never"):
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, s varchar(10))")
        conn.execute("CREATE TABLE flip (id int PRIMARY KEY, c bool)")
        conn.execute("CREATE TABLE narrow (id int PRIMARY KEY, s text)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO never VALUES (1, 'ab'), (2, NULL)")
        conn.execute("INSERT INTO flip VALUES (1, true), (2, false)")
        conn.execute("INSERT INTO narrow VALUES (1, 'ab'), (2, 'cd')")
        conn.execute("CREATE PUBLICATION us_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("INSERT INTO up VALUES (1, 'ab'), (2, 'cd')")  # through the stream: its Relation too
        conn.execute("INSERT INTO wide VALUES (1, 'ab'), (2, 'cd')")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE up ALTER COLUMN s TYPE text USING upper(s)")
        conn.execute("ALTER TABLE never ALTER COLUMN s TYPE text USING upper(s)")
        conn.execute("ALTER TABLE flip ALTER COLUMN c TYPE bool USING NOT c")
        conn.execute("ALTER TABLE wide ALTER COLUMN s TYPE varchar(40)")
        conn.execute("ALTER TABLE narrow ALTER COLUMN s TYPE varchar(40)")
        conn.execute("INSERT INTO other VALUES (1)")
        mirror(spark, config, once=True, progress=progress.append)
        tables = ["up", "wide", "never", "flip", "narrow", "other"]
        _assert_equal(spark, conn, tmp_path, tables, "us_pub")
        for table in ("up", "never", "flip"):
            assert any("copying the table again" in m for m in _messages(progress, f"public.{table}")), progress
        for table in ("wide", "narrow"):
            assert not any("copying" in m for m in _messages(progress, f"public.{table}")), progress
        conn.execute("INSERT INTO wide VALUES (3, repeat('x', 30))")
        conn.execute("INSERT INTO narrow VALUES (3, repeat('x', 30))")
        conn.execute("INSERT INTO up VALUES (3, 'ef')")
        progress.clear()
        mirror(spark, config, once=True, progress=progress.append)
        _assert_equal(spark, conn, tmp_path, tables, "us_pub")
        assert not any("copying" in m for m in progress), progress
