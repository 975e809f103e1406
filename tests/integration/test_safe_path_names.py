"""Schema and table names readers mishandle in paths, under ``tables.path_names: safe`` (issue 75, item 5):
a space, '%', non-ASCII, '..'. delta-rs hands Polars a table's files as URLs, and Polars then looks for
``Mixed%20Case`` on disk; a safe directory name holds nothing a URL escapes (``Mixed~20Case``). Each table,
and the history and change feed tables of one, is copied, followed through a rename, verified equal to
Postgres and read by every reader: Spark, delta-rs (``QueryBuilder``, ``to_pyarrow_table``), pandas and
Polars. A target that turns ``safe`` on later keeps its tables where they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from named_tables import change_tables, create_tables
from psycopg import sql
from readers import Rows, assert_equals_postgres, readers

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink.derived import derived_table_dirs
from applier.sink.naming import mirrored_table_dirs, source_name_of

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

pytest.importorskip("polars")
deltalake = pytest.importorskip("deltalake")

TABLES = [("Sales Ü", "Mixed Case"), ("public", "100%"), ("..", ".."), ("public", "日本")]
RENAMED = ("Sales Ü", "Mixed Case 2")
SAFE_DIR = re.compile(r"[A-Za-z0-9_.~@-]+")


def _config(pg, target: Path, slot: str, path_names: str) -> MirrorConfig:
    rule = TableRule(match="Sales Ü.Mixed Case*", history=True, changes=True)
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=slot, publication=f"{slot}_pub"),
                        target=TargetSettings(path=str(target)),
                        tables=TablesSettings(rules=[rule], column_names="safe", path_names=path_names),
                        apply=ApplySettings(max_group_seconds=1.0))


def _weird(name: str) -> str:
    return name.replace(" ", "%20")  # column_names: safe


def _assert_verified(spark, conn, config: MirrorConfig, tables) -> None:
    results = verify_against_postgres(spark, conn, config.target.path, tables, config.tables)
    assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:2], r.only_in_target[:2])
                                           for r in results]


def test_every_reader_opens_tables_whose_names_need_an_escape(pg, spark, tmp_path, capsys):
    target = tmp_path / "delta"
    config = _config(pg, target, "sp", "safe")
    now = [RENAMED, *TABLES[1:]]
    with pg.connect() as conn:
        create_tables(conn, TABLES, weird_column=True)
        conn.execute("CREATE PUBLICATION sp_pub FOR ALL TABLES")
        first = mirror(spark, config, once=True)
        assert first.snapshot_rows == {f"{s}.{t}": 5 for s, t in TABLES}
        change_tables(conn, TABLES)
        mirror(spark, config, once=True)
        conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(*TABLES[0]),
                                                                    sql.Identifier(RENAMED[1])))
        conn.execute(sql.SQL("UPDATE {} SET v = 'after' WHERE id = 3").format(sql.Identifier(*RENAMED)))
        mirror(spark, config, once=True)
        _assert_verified(spark, conn, config, now)

        directories = {f"{d.parent.name}/{d.name}" for d in mirrored_table_dirs(target)}
        assert directories == {"Sales~20~C3~9C/Mixed~20Case~202", "public/100~25", "~2E./~2E.",
                               "public/~E6~97~A5~E6~9C~AC"}
        derived = {(k.name, f"{d.parent.name}/{d.name}") for k, d in derived_table_dirs(target)}
        assert derived == {("history", "Sales~20~C3~9C/Mixed~20Case~202"),
                           ("changes", "Sales~20~C3~9C/Mixed~20Case~202")}  # moved with the rename
        assert sorted(source_name_of(d) for d in mirrored_table_dirs(target)) == sorted(now)

        tables: list[tuple[tuple[str, str], Path, str]] = [
            (t, target / d, "mirror") for t, d in zip(sorted(now), sorted(
                directories, key=lambda d: source_name_of(target / d)), strict=True)]
        tables += [(RENAMED, target / "_history" / "Sales~20~C3~9C" / "Mixed~20Case~202", "history"),
                   (RENAMED, target / "_changes" / "Sales~20~C3~9C" / "Mixed~20Case~202", "changes")]
        for (schema, table), path, kind in tables:
            assert SAFE_DIR.fullmatch(path.name) and SAFE_DIR.fullmatch(path.parent.name), path
            configuration = deltalake.DeltaTable(str(path)).metadata().configuration
            assert configuration["applier.source"] == f"{schema}.{table}"  # the Postgres name, listed
            for reader, read in readers(spark).items():
                rows: Rows = read(path)
                if kind == "history":
                    rows = [r for r in rows if r["__end_lsn"] is None]
                elif kind == "changes":
                    last: dict[int, dict] = {}
                    for row in sorted(rows, key=lambda r: (r["__commit_lsn"], r["__ordinal"])):
                        last[row["id"]] = row
                    rows = [r for r in last.values() if r["__op"] != "D"]
                what = f"{reader} on {kind} {schema}.{table}"
                assert assert_equals_postgres(conn, schema, table, rows, what, delta_name=_weird) == 5, what

    # verify and status without the config find the tables at their safe names
    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert cli_main(["status", "--target", str(target), "--json"]) == 0, capsys.readouterr()
    assert {t["table"] for t in json.loads(capsys.readouterr().out)["tables"]} >= {f"{s}.{t}" for s, t in now}


def test_a_target_that_turns_safe_names_on_keeps_its_tables_where_they_are(pg, spark, tmp_path):
    """Written under keep (a space is kept as it is), then run under safe: the mirrored table (bound to its
    path) and its history and change feed tables (found by name) go on where they are, with no second copy;
    a table that joins the publication afterwards takes its safe name."""
    target = tmp_path / "delta"
    first = [TABLES[0]]
    with pg.connect() as conn:
        create_tables(conn, first, weird_column=True)
        conn.execute(sql.SQL("CREATE PUBLICATION sw_pub FOR TABLE {}").format(sql.Identifier(*TABLES[0])))
        mirror(spark, _config(pg, target, "sw", "keep"), once=True)
        kept = {f"{d.parent.name}/{d.name}" for d in mirrored_table_dirs(target)}
        assert kept == {"Sales Ü/Mixed Case"}

        safe = _config(pg, target, "sw", "safe")
        change_tables(conn, first)
        later = ("public", "late comer")
        create_tables(conn, [later], weird_column=True)
        conn.execute(sql.SQL("ALTER PUBLICATION sw_pub ADD TABLE {}").format(sql.Identifier(*later)))
        mirror(spark, safe, once=True)
        assert {f"{d.parent.name}/{d.name}" for d in mirrored_table_dirs(target)} == kept | {"public/late~20comer"}
        assert {f"{k.name}:{d.parent.name}/{d.name}" for k, d in derived_table_dirs(target)} == {
            "history:Sales Ü/Mixed Case", "changes:Sales Ü/Mixed Case"}
        _assert_verified(spark, conn, safe, [*first, later])
        history = deltalake.DeltaTable(str(target / "_history" / "Sales Ü" / "Mixed Case")).to_pyarrow_table()
        assert history.num_rows == 5 + 2  # the copy's five versions, the update's and the insert's: one table
