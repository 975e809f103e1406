"""Issue 77, case 4: a table whose Delta history went backwards (its newest commit file deleted, or its
directory restored from a copy taken before a run) stops the next mirror with exit 2, naming the table,
the version and applied LSN found against those recorded, and the remedy, ``applier resync --table``,
which copies it anew at a new position: the mirror after it ends equal to Postgres. Without the check
the run went on from the slot with exit 0, and the transaction the table lost was gone for good.
Real PostgreSQL and Spark (the resync's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import applier
from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode, for_exception
from applier.errors import TableBehindError
from applier.lsn import format_lsn

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


@pytest.fixture
def source(pg):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE x (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE y (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO x SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("INSERT INTO y SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE x, y")
    return pg


def _config(pg, tmp_path: Path) -> tuple[Path, Path]:
    target = tmp_path / "T"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: pub\n  slot: back\ntarget:\n  path: {target}\n")
    return cfg, target


def _oid(pg, table: str) -> int:
    with pg.connect() as conn:
        row = conn.execute("SELECT %s::regclass::oid::int8", (table,)).fetchone()
    assert row is not None
    return int(row[0])


def _mirror(cfg: Path) -> int:
    return cli_main(["mirror", "--config", str(cfg), "--once"])


def _resync_then_equal(cfg: Path, target: Path, capsys) -> None:
    """The printed remedy, then a mirror that ends equal to Postgres (and stays so)."""
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.y"]) == ExitCode.OK, capsys.readouterr().err
    assert _mirror(cfg) == ExitCode.OK, capsys.readouterr().err
    assert _mirror(cfg) == ExitCode.OK, capsys.readouterr().err
    assert cli_main(["verify", "--config", str(cfg)]) == ExitCode.OK, capsys.readouterr()


def test_a_deleted_newest_commit_stops_the_mirror_and_resync_mends_it(source, spark, tmp_path, capsys):
    cfg, target = _config(source, tmp_path)
    assert _mirror(cfg) == ExitCode.OK
    with source.connect() as conn:
        conn.execute("UPDATE y SET v = 0 WHERE id = 1")
    assert _mirror(cfg) == ExitCode.OK
    recorded = json.loads((target / "_applier" / "table_versions.json").read_text())["tables"]
    y = "public/y"  # (relative to the target's root)
    assert recorded[y]["version"] == 2 and recorded[y]["table"] == "public.y", recorded
    newest = max((target / "public" / "y" / "_delta_log").glob("*.json"))
    assert newest.name == "00000000000000000002.json"
    newest.unlink()  # the commit of UPDATE y SET v = 0 is gone from Delta, and the slot is past it
    with source.connect() as conn:
        conn.execute("UPDATE y SET v = 1 WHERE id = 2")
    capsys.readouterr()

    assert _mirror(cfg) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"table public.y (relation OID {_oid(source, 'y')}) went back in its Delta history" in err, err
    assert "its Delta log ends at version 1" in err and "recorded version 2" in err, err
    assert f"`applier resync --config {cfg} --table public.y`" in err, err
    assert "public.x" not in err, err
    assert _mirror(cfg) == ExitCode.USAGE  # and again: a stop does not forget what was recorded
    capsys.readouterr()
    assert cli_main(["verify", "--config", str(cfg)]) == ExitCode.DIFFERENCES  # the loss the check reports

    _resync_then_equal(cfg, target, capsys)


def test_a_table_restored_from_an_older_copy_stops_the_mirror_and_resync_mends_it(source, spark, tmp_path, capsys):
    cfg, target = _config(source, tmp_path)
    assert _mirror(cfg) == ExitCode.OK
    y = target / "public" / "y"
    backup = tmp_path / "y-backup"
    shutil.copytree(y, backup)  # taken before the run below
    with source.connect() as conn:
        conn.execute("UPDATE y SET v = 0 WHERE id = 1")
        conn.execute("INSERT INTO x VALUES (6, 6)")
    assert _mirror(cfg) == ExitCode.OK
    recorded = json.loads((target / "_applier" / "table_versions.json").read_text())["tables"]["public/y"]
    shutil.rmtree(y)
    shutil.copytree(backup, y)  # the same Delta table (its id), older: the registry cannot tell
    with source.connect() as conn:
        conn.execute("UPDATE y SET v = 1 WHERE id = 2")
    capsys.readouterr()

    # in-process (the Python API, as the CLI: the same start path), the exception and its exit code
    with pytest.raises(TableBehindError) as caught:
        applier.mirror(spark, str(cfg))
    error = caught.value
    assert for_exception(error) == ExitCode.USAGE
    assert error.context["table"] == "public.y" and error.context["relation_oid"] == _oid(source, "y")
    assert error.context["version"] == 1 and error.context["recorded_version"] == recorded["version"] == 2
    assert format_lsn(error.context["recorded_lsn"]) == recorded["applied_lsn"]
    assert error.context["applied_lsn"] < error.context["recorded_lsn"]
    assert "applier resync --config" in str(error) and "--table public.y" in str(error)

    # the same stop through the CLI, also when a commit that changes no row lifts the version past the
    # record (a maintenance commit on the old copy): the applied LSN is behind all the same
    from deltalake import DeltaTable

    table = DeltaTable(str(y))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 31 days"})
    assert DeltaTable(str(y)).version() == 3
    assert _mirror(cfg) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "table public.y" in err and f"transactions applied up to {recorded['applied_lsn']}" in err, err
    assert "--table public.y" in err, err

    _resync_then_equal(cfg, target, capsys)


def test_what_a_mirror_does_itself_never_trips_the_check(pg, spark, tmp_path, capsys):
    """Renames (the table moves to the new name's path), a new table at a path another had, a dropped
    table retired, a table taken out of the publication, a resync, maintenance and a parked table: every
    run through the CLI goes on with exit 0 and ends equal to Postgres."""
    with pg.connect() as conn:
        for name in ("a", "b", "c", "d"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
            conn.execute(f"INSERT INTO {name} SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE a, b, c, d")
    target = tmp_path / "T"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"source:\n  dsn: '{pg.dsn}'\n  publication: pub\n  slot: life\ntarget:\n  path: {target}\n"
                   "apply:\n  on_table_error: park\n")

    def run(*sql: str) -> None:
        with pg.connect() as conn:
            for statement in sql:
                conn.execute(statement)
        assert _mirror(cfg) == ExitCode.OK, capsys.readouterr().err

    run()
    for _ in range(3):  # versions for a to have more of than the table that takes its path later
        run("UPDATE a SET v = v + 1")
    run("ALTER TABLE a RENAME TO a2", "INSERT INTO a2 VALUES (6, 6)")
    run("CREATE TABLE a (id int PRIMARY KEY, v int)", "INSERT INTO a VALUES (1, 1)",  # a new a at public/a
        "ALTER PUBLICATION pub ADD TABLE a")
    run("UPDATE a SET v = 2")
    run("DROP TABLE b", "CREATE TABLE b (id int PRIMARY KEY, v int)", "INSERT INTO b VALUES (7, 7)",  # retired
        "ALTER PUBLICATION pub ADD TABLE b")
    run("ALTER PUBLICATION pub DROP TABLE d", "INSERT INTO d VALUES (6, 6)", "UPDATE c SET v = 0")
    run("ALTER TABLE c ALTER COLUMN v TYPE text", "UPDATE c SET v = 'x' WHERE id = 1")  # parked
    assert cli_main(["maintain", "--config", str(cfg), "--min-small-files", "2"]) == ExitCode.OK, capsys.readouterr()
    run("UPDATE a2 SET v = 9")
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.c", "--table", "public.a2"]) == ExitCode.OK
    run("UPDATE c SET v = 'y' WHERE id = 2", "UPDATE a2 SET v = 10 WHERE id = 1")
    run()
    assert (target / "_retired" / "public").is_dir()
    with pg.connect() as conn:
        conn.execute("ALTER PUBLICATION pub ADD TABLE d")  # (verify compares the published tables)
    capsys.readouterr()
    assert _mirror(cfg) == ExitCode.OK, capsys.readouterr().err
    assert cli_main(["verify", "--config", str(cfg)]) == ExitCode.OK, capsys.readouterr()


def test_a_replay_into_a_table_that_went_back_stops_and_says_how_to_go_on(pg, spark, tmp_path, capsys):
    """``replay`` opens the target as ``mirror`` does: the same check. A stored log can bring the lost
    transactions back: with the table's entry removed (the remedy printed), the log replayed again is
    applied to it from where its Delta log ends, and the target ends equal to Postgres."""
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    raw, target = tmp_path / "raw.parquet", tmp_path / "T"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE x (id int PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE y (id int PRIMARY KEY, v int)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE x, y")
        create_slot(conn, "raw")
        conn.execute("INSERT INTO x SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("INSERT INTO y SELECT g, g FROM generate_series(1, 5) g")
        conn.execute("UPDATE y SET v = 0 WHERE id = 1")
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "raw", pgoutput_options("pub"))))
    argv = ["replay", "--source", str(raw), "--target", str(target), "--distributed", "off"]
    assert cli_main(argv) == ExitCode.OK, capsys.readouterr().err
    max((target / "public" / "y" / "_delta_log").glob("*.json")).unlink()
    capsys.readouterr()

    assert cli_main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "table public.y" in err and "went back in its Delta history" in err and "applier replay" in err, err
    versions = target / "_applier" / "table_versions.json"
    assert str(versions) in err, err
    saved = json.loads(versions.read_text())
    saved["tables"].pop("public/y")  # (relative to the target's root)
    versions.write_text(json.dumps(saved))
    assert cli_main(argv) == ExitCode.OK, capsys.readouterr().err
    assert cli_main(argv) == ExitCode.OK, capsys.readouterr().err
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == ExitCode.OK, capsys.readouterr()
