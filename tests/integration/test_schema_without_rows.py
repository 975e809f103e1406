"""Columns renamed or added in Postgres with no later change to the table's rows (issue 73 item 4).

pgoutput sends a table's Relation only before a change of that table, so such a change never reached the
stream: every run ended with exit 0 and the Delta table kept the old columns until a row changed
(``../shared/repro/t5/rename-without-row-change/``). Each case here runs the mirror on a real server and
compares the Delta table with Postgres row by row and by column names, after the run that follows the DDL.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror, mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _config(pg, tmp_path: Path, name: str, **apply: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=name, publication=f"{name}_pub"),
                        target=TargetSettings(path=str(tmp_path / "delta")), apply=ApplySettings(**apply))


def _delta_columns(tmp_path: Path, table: str) -> list[str]:
    from deltalake import DeltaTable

    return [f.name for f in DeltaTable(str(tmp_path / "delta" / "public" / table)).schema().fields]


def _pg_columns(conn, table: str) -> list[str]:
    """The columns pgoutput sends (no generated ones: none of these publications publishes them)."""
    return [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                       "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", (table,))]


def _assert_equal(spark, conn, tmp_path: Path, tables: list[str], publication: str) -> None:
    """Every table equal to Postgres row by row, and its Delta columns exactly Postgres' (no old name kept)."""
    results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), [("public", t) for t in tables],
                                      publication=publication)
    assert all(r.equal for r in results), [(r.source_name, r.problems, r.source_rows, r.target_rows,
                                            r.only_in_source[:3], r.only_in_target[:3]) for r in results]
    for table in tables:
        assert sorted(_delta_columns(tmp_path, table)) == sorted(_pg_columns(conn, table)), table


def test_renamed_and_added_columns_reach_delta_without_a_row_change(pg_any, spark, tmp_path):
    """The reproduction, on each PostgreSQL major: RENAME COLUMN followed by changes of another table only,
    then ADD COLUMN without a default and with a constant default followed by nothing at all. The run after
    each ends with the Delta table equal to Postgres, names included (a generated column, which pgoutput
    sends only on 18 when published, is never taken for an added column)."""
    pg = pg_any
    config = _config(pg, tmp_path, "nr")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, c int, g int GENERATED ALWAYS AS (c + 1) STORED)")
        conn.execute("INSERT INTO t SELECT g, g * 10, g * 100 FROM generate_series(1, 20) g")
        conn.execute("CREATE TABLE u (id int PRIMARY KEY, v int)")
        conn.execute("CREATE PUBLICATION nr_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
        conn.execute("INSERT INTO u VALUES (1, 1)")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t", "u"], "nr_pub")
        conn.execute("ALTER TABLE t ADD COLUMN d int")
        conn.execute("ALTER TABLE t ADD COLUMN e text DEFAULT 'seven'")
        mirror(spark, config, once=True)  # nothing of ours in the stream at all
        _assert_equal(spark, conn, tmp_path, ["t", "u"], "nr_pub")


def test_a_column_added_with_a_volatile_default_copies_the_table_again(pg, spark, tmp_path):
    """ADD COLUMN ... DEFAULT random() rewrote the table: its values exist only in Postgres' rows, so the
    table is copied again (a rename in the same run rides along); the stream then goes on under the new
    names, and a later rename with no row change is applied as well."""
    config = _config(pg, tmp_path, "nv")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, b int, c int)")
        conn.execute("INSERT INTO t SELECT g, g * 10, g * 100 FROM generate_series(1, 20) g")
        conn.execute("CREATE TABLE u (id int PRIMARY KEY, v int)")
        conn.execute("CREATE PUBLICATION nv_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t ADD COLUMN f float8 DEFAULT random()")
        conn.execute("ALTER TABLE t RENAME COLUMN c TO c2")
        conn.execute("INSERT INTO u VALUES (2, 2)")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t", "u"], "nv_pub")
        # and the stream goes on from there: changes under the new names, then one more rename
        conn.execute("UPDATE t SET b = -b, f = 0.5 WHERE id <= 5")
        conn.execute("ALTER TABLE t RENAME COLUMN b TO b3")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t", "u"], "nv_pub")


def test_changes_made_before_the_rename_are_applied_under_their_own_shape(pg, spark, tmp_path):
    """The catalog is ahead of the stream when a run starts: rows changed before the RENAME (and an ADD
    COLUMN with a default) are still in the slot, decoded with the old columns. They are applied first,
    under the old names, and only then the shape the catalog shows, once the slot is past it."""
    config = _config(pg, tmp_path, "nb")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, c text)")
        conn.execute("INSERT INTO t SELECT g, g, 'x' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION nb_pub FOR TABLE t")
        mirror(spark, config, once=True)
        conn.execute("UPDATE t SET a = a + 1000 WHERE id <= 10")
        conn.execute("INSERT INTO t VALUES (21, 21, 'new')")
        conn.execute("DELETE FROM t WHERE id = 20")
        conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
        conn.execute("ALTER TABLE t ADD COLUMN d int DEFAULT 4")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t"], "nb_pub")


def test_an_alter_after_the_catalog_was_read_is_never_applied_in_its_place(pg, spark, tmp_path, monkeypatch):
    """The catalog showed a column added as ``int DEFAULT 5``; after the run's drain, before that shape is
    applied, the column is dropped and added again as ``text DEFAULT 'six'``. The shape read earlier is not
    applied (the table's catalog rows changed since: its column would get a value of another type); the
    next run reads the catalog again and applies the new column, with no row change at all."""
    from applier.drivers import unsentshapes

    config = _config(pg, tmp_path, "la")
    settle = unsentshapes.UnsentShapes.settle
    late: list[str] = []

    def settle_after_more_ddl(self, conn, **kwargs):
        if self.pending is not None and late:
            with pg.connect() as other:
                for statement in late:
                    other.execute(statement)
            late.clear()
        return settle(self, conn, **kwargs)

    monkeypatch.setattr(unsentshapes.UnsentShapes, "settle", settle_after_more_ddl)
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int)")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION la_pub FOR TABLE t")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t ADD COLUMN d int DEFAULT 5")
        late.extend(["ALTER TABLE t DROP COLUMN d", "ALTER TABLE t ADD COLUMN d text DEFAULT 'six'"])
        mirror(spark, config, once=True)
        assert not late
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t"], "la_pub")


def test_a_table_copied_by_table_sync_takes_its_renames_without_a_row_change(pg, spark, tmp_path):
    """A table that joined the publication after the mirror's first copy is copied by a table sync and has
    no Relation in the stream until it changes: its rename is proven from the attnums recorded at its copy."""
    config = _config(pg, tmp_path, "ts")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE first (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION ts_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, c text)")
        conn.execute("INSERT INTO t SELECT g, g, 'x' || g FROM generate_series(1, 20) g")
        mirror(spark, config, once=True)  # copied by a table sync
        conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
        conn.execute("ALTER TABLE t ADD COLUMN d int DEFAULT 4")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t", "first"], "ts_pub")


def test_a_name_given_to_another_column_copies_the_table_again(pg, spark, tmp_path):
    """A column dropped and added again under its name, with no row change: the Delta table held the old
    column's values under that name; the catalog's attnums say so, and the table is copied again."""
    config = _config(pg, tmp_path, "da")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, c text)")
        conn.execute("INSERT INTO t SELECT g, g, 'x' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION da_pub FOR TABLE t")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t DROP COLUMN a")
        conn.execute("ALTER TABLE t ADD COLUMN a int DEFAULT 7")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t"], "da_pub")


def test_a_following_mirror_applies_a_rename_while_idle(pg, spark, tmp_path, monkeypatch):
    """Not only at the end of a drain: a mirror that follows the slot asks the catalog again while idle and
    applies the rename once the slot is past it."""
    from applier.drivers import unsentshapes

    monkeypatch.setattr(unsentshapes, "OBSERVE_EVERY_SECONDS", 0.5)
    config = _config(pg, tmp_path, "fo")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int)")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION fo_pub FOR TABLE t")
        mirror(spark, config, once=True)
        stop = threading.Event()
        run = Mirror(spark, config, stop=stop)
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                run.run(once=False)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        thread = threading.Thread(target=follow)
        thread.start()
        try:
            time.sleep(2)
            conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
            deadline = time.monotonic() + 40
            while "b" not in _delta_columns(tmp_path, "t") and time.monotonic() < deadline and not errors:
                time.sleep(0.5)
        finally:
            stop.set()
            thread.join(60)
        assert not errors, errors
        _assert_equal(spark, conn, tmp_path, ["t"], "fo_pub")


@pytest.mark.parametrize("change", ["rename", "set_schema", "drop"])
def test_verify_reports_a_table_renamed_moved_or_dropped_since_the_last_run(pg, spark, tmp_path, capsys, change):
    """``applier verify`` on a table renamed, moved to another schema or dropped since the mirror last ran
    (``../shared/repro/t5/verify-renamed-table/``): exit 1, the table named as a difference, with or without
    a config; it exited 5 with a traceback (UndefinedTable). After the next mirror run, verify with the config
    is equal again (a renamed or moved table's Delta table followed it; a dropped one is no longer followed)."""
    import yaml

    from applier.cli import main as cli_main

    config = _config(pg, tmp_path, "vr")
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump({"source": {"dsn": pg.dsn, "slot": "vr", "publication": "vr_pub"},
                                    "target": {"path": str(tmp_path / "delta")}}))
    with pg.connect() as conn:
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
        conn.execute("INSERT INTO kept VALUES (1)")
        conn.execute("CREATE PUBLICATION vr_pub FOR ALL TABLES")
        mirror(spark, config, once=True)
        assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(tmp_path / "delta")]) == 0
        conn.execute({"rename": "ALTER TABLE orders RENAME TO t2", "set_schema": "ALTER TABLE orders SET SCHEMA other",
                      "drop": "DROP TABLE orders"}[change])
        capsys.readouterr()
        assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(tmp_path / "delta")]) == 1
        out = capsys.readouterr().out
        assert "public.orders: postgres 0 rows, delta 5 rows: DIFFERENT" in out, out
        assert "public.kept: postgres 1 rows, delta 1 rows: equal" in out, out
        assert cli_main(["verify", "--config", str(path)]) == 1
        out = capsys.readouterr().out
        assert "public.orders: postgres 0 rows, delta 5 rows: DIFFERENT" in out, out
        mirror(spark, config, once=True)
        capsys.readouterr()
        assert cli_main(["verify", "--config", str(path)]) == 0, capsys.readouterr().out


def test_a_run_killed_while_it_applies_the_catalog_shape_is_finished_by_the_next(pg, spark, tmp_path):
    """The run that applies a rename and a column added with a constant default (no row change) is SIGKILLed
    right after the rename reached Delta, before the new column's values were written: the next run finishes
    it from the note the first one saved, and the table ends equal."""
    import os
    import signal
    import subprocess
    import sys

    import yaml

    config = _config(pg, tmp_path, "ck")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, c text)")
        conn.execute("INSERT INTO t SELECT g, g, 'x' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION ck_pub FOR TABLE t")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE t RENAME COLUMN a TO b")
        conn.execute("ALTER TABLE t ADD COLUMN d int DEFAULT 5")
        path = tmp_path / "mirror.yaml"
        path.write_text(yaml.safe_dump({"source": {"slot": "ck", "publication": "ck_pub"},
                                        "target": {"path": str(tmp_path / "delta")}}))
        env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
               "APPLIER_CRASH_AT": "column_renamed:1"}
        killed = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(path), "--once"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, tmp_path, ["t"], "ck_pub")
