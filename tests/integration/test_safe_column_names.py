"""``tables.column_names: safe`` (issue 50 item 4): a Postgres column name Delta cannot hold without column
mapping (a space, ``,;{}()=``) is written under a reversible safe name (``Weird col`` -> ``Weird%20col``),
so the table needs no column mapping and pandas, Polars and delta-rs's pyarrow path open it. Real
PostgreSQL and Spark: the copy, the stream (an unchanged TOAST value, a key with a space, a keyless table,
a rename of such a column, a column added with a default), history and change feed tables, verify,
and every reader compared with Postgres. A table written under one choice and then configured with the
other stops with exit 4 before anything is written, and the remedy it names (a fresh copy) works."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from readers import assert_equals_postgres, readers

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink.naming import postgres_column_name, safe_column_name
from applier.sink.spec import PROP_COLUMN_NAMES

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

deltalake = pytest.importorskip("deltalake")
pl = pytest.importorskip("polars")

REPO = Path(__file__).resolve().parents[2]

SCHEMA = """
CREATE SCHEMA sn;
CREATE TABLE sn.odd ("the id" int PRIMARY KEY, "Weird col" text, "a=b" int, "100%" numeric(6, 2),
                     "n (units)" numeric(8, 2), plain text);
ALTER TABLE sn.odd ALTER COLUMN "Weird col" SET STORAGE EXTERNAL;
CREATE TABLE sn.bag ("x y" int, "z,w" text);
CREATE TABLE sn.hist ("the id" int PRIMARY KEY, "v w" text, "{n}" int);
ALTER TABLE sn.bag REPLICA IDENTITY FULL;
CREATE PUBLICATION sn_pub FOR TABLES IN SCHEMA sn;
INSERT INTO sn.odd SELECT g, CASE WHEN g = 1 THEN repeat('toast', 2000) ELSE 'w' || g END, g * 2, g / 3.0,
    g * 0.5, 'p' || g FROM generate_series(1, 20) g;
INSERT INTO sn.bag SELECT g % 4, 'b' || (g % 4) FROM generate_series(1, 12) g;
INSERT INTO sn.hist SELECT g, 'h' || g, g FROM generate_series(1, 10) g;
"""
# after the copy: an unchanged TOAST value, a rename, a column added with a default, a keyless table's duplicates
CHANGES = """
UPDATE sn.odd SET "a=b" = -1 WHERE "the id" <= 3;
DELETE FROM sn.odd WHERE "the id" > 18;
ALTER TABLE sn.odd RENAME COLUMN "Weird col" TO "Weirder col";
UPDATE sn.odd SET "100%" = 99.5 WHERE "the id" = 1;
ALTER TABLE sn.odd ADD COLUMN "new col" int DEFAULT 7;
INSERT INTO sn.odd VALUES (30, 'late', 1, 1.5, 2.5, NULL, 8);
DELETE FROM sn.bag WHERE ctid = (SELECT min(ctid) FROM sn.bag WHERE "x y" = 1);
INSERT INTO sn.bag VALUES (2, 'b2'), (9, 'b9');
UPDATE sn.hist SET "v w" = 'again' WHERE "the id" <= 4;
DELETE FROM sn.hist WHERE "the id" = 10;
ALTER TABLE sn.hist RENAME COLUMN "{n}" TO "(n)";
UPDATE sn.hist SET "(n)" = -"(n)" WHERE "the id" IN (1, 5);
"""

TABLES = [("sn", "odd"), ("sn", "bag"), ("sn", "hist")]


def rows_equal(conn, table: str, rows: list[dict[str, Any]], what: str) -> int:
    """Rows a reader gave of a ``safe`` table (Delta names) against Postgres' ``sn.table``."""
    return assert_equals_postgres(conn, "sn", table, rows, what, delta_name=safe_column_name)


def test_safe_names_keep_every_reader_and_a_switch_stops_with_a_remedy(pg, spark, tmp_path, capsys):
    target = tmp_path / "delta"
    tables = TablesSettings(column_names="safe",
                            rules=[TableRule(match="sn.hist", history=True, changes=True)])
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="sn", publication="sn_pub"),
                       target=TargetSettings(path=str(target)), tables=tables,
                       apply=ApplySettings(max_group_seconds=1.0))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(spark, cfg, once=True)  # the copy
        conn.execute(CHANGES)
        mirror(spark, cfg, once=True)  # the stream

        for result in verify_against_postgres(spark, conn, str(target), TABLES, tables):
            assert result.equal, (result.source_name, result.problems, result.only_in_source[:3],
                                  result.only_in_target[:3])
        odd = deltalake.DeltaTable(str(target / "sn" / "odd"))
        assert [f.name for f in odd.schema().fields] == [
            "the%20id", "Weirder%20col", "a%3Db", "100%25", "n%20%28units%29", "plain", "new%20col"]
        assert json.loads(odd.metadata().configuration[PROP_COLUMN_NAMES]) == {
            "the%20id": "the id", "Weirder%20col": "Weirder col", "a%3Db": "a=b", "100%25": "100%",
            "n%20%28units%29": "n (units)", "new%20col": "new col"}
        assert all(postgres_column_name(k) == v for k, v in json.loads(
            odd.metadata().configuration[PROP_COLUMN_NAMES]).items())
        with_rows = [r for r in pl.read_delta(str(target / "sn" / "odd")).to_dicts() if r["the%20id"] == 1]
        assert with_rows[0]["Weirder%20col"] == "toast" * 2000 and with_rows[0]["new%20col"] == 7

        history = target / "_history" / "sn" / "hist"
        changes = target / "_changes" / "sn" / "hist"
        for path in (target / "sn" / "odd", target / "sn" / "bag", history, changes):
            table = deltalake.DeltaTable(str(path))
            assert not (table.protocol().reader_features or []), (path, table.protocol())
            assert "delta.columnMapping.mode" not in table.metadata().configuration, path
        for reader, read in readers(spark).items():
            assert rows_equal(conn, "odd", read(target / "sn" / "odd"), reader) == 19
            assert rows_equal(conn, "bag", read(target / "sn" / "bag"), reader) == 13
            open_versions = [r for r in read(history) if r["__end_lsn"] is None]
            assert rows_equal(conn, "hist", open_versions, f"{reader} on history") == 9
            last: dict[Any, dict[str, Any]] = {}
            for row in sorted(read(changes), key=lambda r: (r["__commit_lsn"], r["__ordinal"])):
                last[row["the%20id"]] = row
            feed = [r for r in last.values() if r["__op"] != "D"]
            assert rows_equal(conn, "hist", feed, f"{reader} on the change feed") == 9

        # the same target configured with keep names for sn.bag: it stops before writing, exit 4
        conn.execute("INSERT INTO sn.bag VALUES (5, 'b5')")
        settings = {"source": {"dsn": pg.dsn, "slot": "sn", "publication": "sn_pub"},
                    "target": {"path": str(target)}, "apply": {"max_group_seconds": 1},
                    "tables": {"column_names": "safe", "rules": [
                        {"match": "sn.hist", "history": True, "changes": True},
                        {"match": "sn.bag", "column_names": "keep"}]}}
        config = tmp_path / "keep.yaml"
        config.write_text(yaml.safe_dump(settings))
        capsys.readouterr()
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.BAD_DATA
        err = capsys.readouterr().err
        assert "written with column_names: safe" in err, err
        assert "'x y' as 'x%20y' (keep writes 'x y')" in err and "--table sn.bag" in err, err
        assert deltalake.DeltaTable(str(target / "sn" / "bag")).to_pyarrow_table().num_rows == 13  # nothing written

        # the remedy it names: a fresh copy under the names the config says now, then the mirror goes on
        assert cli_main(["resync", "--config", str(config), "--table", "sn.bag"]) == ExitCode.OK
        conn.execute("INSERT INTO sn.bag VALUES (6, 'b6')")
        assert cli_main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
        bag = spark.read.format("delta").load(str(target / "sn" / "bag"))
        assert bag.columns == ["x y", "z,w"]
        keep = TablesSettings(column_names="safe", rules=[TableRule(match="sn.bag", column_names="keep")])
        for result in verify_against_postgres(spark, conn, str(target), TABLES, keep):
            assert result.equal, (result.source_name, result.problems, result.only_in_source[:3],
                                  result.only_in_target[:3])
        # without a config, each table's own property says how its columns are named
        capsys.readouterr()
        assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == ExitCode.OK, capsys.readouterr()


def test_a_crash_between_the_mirror_table_rename_and_its_history_renames_them_on_the_re_run(pg, spark, tmp_path):
    """The mirror table's rename is in, its history and change feed tables' not yet: the note of the rename
    is still there (it is marked done only after them), so the re-run renames them, values kept."""
    source = {"slot": "sc", "publication": "sn_pub"}
    settings: dict[str, Any] = {"source": source, "target": {"path": str(tmp_path / "delta")},
                "apply": {"max_group_seconds": 1},
                "tables": {"column_names": "safe", "include": ["sn.hist"],
                           "rules": [{"match": "sn.hist", "history": True, "changes": True}]}}
    config = tmp_path / "crash.yaml"
    config.write_text(yaml.safe_dump(settings))
    cfg = MirrorConfig.model_validate({**settings, "source": {**source, "dsn": pg.dsn}})
    history = tmp_path / "delta" / "_history" / "sn" / "hist"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        mirror(spark, cfg, once=True)
        conn.execute(CHANGES)
        env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO), "APPLIER_CRASH_AT": "column_renamed:1"}
        done = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-3000:])
        assert "%28n%29" in deltalake.DeltaTable(str(tmp_path / "delta" / "sn" / "hist")).schema().to_arrow().names
        assert "%7Bn%7D" in deltalake.DeltaTable(str(history)).schema().to_arrow().names  # not renamed yet

        mirror(spark, cfg, once=True)
        names = deltalake.DeltaTable(str(history)).schema().to_arrow().names
        assert "%28n%29" in names and "%7Bn%7D" not in names, names
        open_versions = [r for r in pl.read_delta(str(history)).to_dicts() if r["__end_lsn"] is None]
        assert rows_equal(conn, "hist", open_versions, "polars on history") == 9


def test_a_replay_maps_names_alike_on_the_driver_and_on_the_executors(pg, spark, tmp_path, replay_path):
    """The fold on Spark's executors (conftest ``replay_path``: this test runs on both paths) names the
    columns as the driver does: the same rule, no state. A captured log of the copy-less history (inserts,
    an unchanged TOAST value, deletes, a key-less table's duplicates) replayed under ``safe``. Without
    history or change-feed tables: those keep a replay on the driver (the tests above cover them under
    ``safe``), and the executors run then folded nothing there."""
    from applier.config import ReplayConfig
    from applier.drivers.replay import replay_log
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    ddl, data = SCHEMA.split("INSERT INTO sn.odd", 1)
    without_ddl = [s for s in CHANGES.strip().splitlines() if not s.startswith("ALTER") and '"(n)"' not in s]
    without_ddl[without_ddl.index("INSERT INTO sn.odd VALUES (30, 'late', 1, 1.5, 2.5, NULL, 8);")] = \
        "INSERT INTO sn.odd VALUES (30, 'late', 1, 1.5, 2.5, NULL);"
    tables = TablesSettings(column_names="safe")
    with pg.connect() as conn:
        conn.execute(ddl)
        create_slot(conn, "sr")
        conn.execute("INSERT INTO sn.odd" + data)
        for statement in without_ddl:
            conn.execute(statement)
        raw = tmp_path / "log.parquet"
        write_raw_log(raw, [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, "sr", pgoutput_options("sn_pub"))])
        target = tmp_path / "delta"
        replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)), tables=tables,
                                       apply=ApplySettings(max_group_transactions=3)))
        for result in verify_against_postgres(spark, conn, str(target), TABLES, tables):
            assert result.equal, (result.source_name, result.problems, result.only_in_source[:3],
                                  result.only_in_target[:3])
        assert not (deltalake.DeltaTable(str(target / "sn" / "odd")).protocol().reader_features or [])
    if replay_path.name == "executors":
        assert sum(replay_path.ranges) > 0 and not replay_path.driver_only, replay_path
