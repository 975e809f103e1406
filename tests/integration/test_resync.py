"""Issue 30 rows 9 and item 3: a type change Delta cannot widen stops the mirror with exit 4 and the
way forward, `applier resync --table`, which re-copies just that table at a new position; with
`apply.schema_changes: resync` the mirror does it by itself. Real PostgreSQL 15 and Spark.

Exactly once across the resync is checked with a key-less table (REPLICA IDENTITY FULL, a multiset):
an insert between the slot's confirmed position and the copy's position applied twice would be a
duplicate row, one skipped a missing row, and both make the comparison with Postgres fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.errors import TypeChangeError

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("public", "t"), ("public", "k"), ("public", "other")]


@pytest.fixture
def source(pg):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, c int, v text)")
        conn.execute("CREATE TABLE k (c int, v text)")
        conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, g * 10, 'r' || g FROM generate_series(1, 20) g")
        conn.execute("INSERT INTO k SELECT g % 5, 'k' || g FROM generate_series(1, 12) g")  # duplicates
        conn.execute("INSERT INTO other SELECT g, 'o' || g FROM generate_series(1, 5) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t, k, other")
    return pg


def assert_equal(spark, pg, target: Path) -> None:
    with pg.connect() as conn:
        for result in verify_against_postgres(spark, conn, str(target), TABLES):
            assert result.equal, (result.source_name, result.source_rows, result.target_rows,
                                  result.only_in_source[:3], result.only_in_target[:3])


def delta_type(spark, target: Path, table: str, column: str) -> str:
    return spark.read.format("delta").load(str(target / "public" / table)).schema[column].dataType.simpleString()


def test_alter_type_stops_with_exit_4_and_resync_then_mirror_ends_equal(source, spark, tmp_path, capsys):
    target = tmp_path / "delta"
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{source.dsn}'\n  publication: pub\n  slot: rs\ntarget:\n  path: {target}\n"
                   "apply:\n  max_group_seconds: 1\n  schema_changes: evolve\n")  # (the default copies by itself)
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    capsys.readouterr()
    with source.connect() as conn:
        conn.execute("UPDATE t SET v = 'before' WHERE id <= 3")
        conn.execute("INSERT INTO k VALUES (7, 'before')")
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        conn.execute("UPDATE t SET c = c || '-txt' WHERE id = 1")
        conn.execute("INSERT INTO t VALUES (21, 'abc', 'new')")
        conn.execute("ALTER TABLE k ALTER COLUMN c TYPE text")
        conn.execute("INSERT INTO k VALUES ('x', 'after text')")
        conn.execute("INSERT INTO other VALUES (6, 'between')")

    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.BAD_DATA
    err = capsys.readouterr().err
    assert "changed type from int to string" in err and "column 'c'" in err, err
    assert "applier resync --config FILE --table public." in err and "apply.schema_changes: resync" in err, err
    assert "restart" not in err and "map the column" not in err and "Traceback" not in err, err
    assert delta_type(spark, target, "t", "c") == "int"  # nothing written over the old table
    # a second run stops on the same table: a stall, shown as such by status (and its JSON)
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.BAD_DATA
    assert "stopped on this error 2 runs in a row" in capsys.readouterr().err
    assert cli_main(["status", "--config", str(cfg)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "mirror: STALLED: the last 2 runs stopped with TypeChangeError on public.t" in out, out
    assert cli_main(["status", "--config", str(cfg), "--json"]) == ExitCode.OK
    stops = json.loads(capsys.readouterr().out)["stops"]
    assert (stops["error"], stops["table"], stops["count"]) == ("TypeChangeError", "public.t", 2), stops

    with source.connect() as conn:  # while the mirror is stopped: before the copy's position
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE int USING CASE WHEN c ~ '^[0-9]+$' THEN c::int END")
        conn.execute("INSERT INTO k VALUES ('y', 'between C and P')")
        conn.execute("DELETE FROM k WHERE v = 'k3'")
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.t", "--table", "public.k"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "resync: public.t: 21 rows copied" in out and "resync: public.k: 14 rows copied" in out, out
    assert delta_type(spark, target, "t", "c") == "int" and delta_type(spark, target, "k", "c") == "string"
    with source.connect() as conn:  # after the copy's position: applied on top
        conn.execute("INSERT INTO k VALUES ('z', 'after P')")
        conn.execute("UPDATE t SET c = 99 WHERE id = 2")
        conn.execute("INSERT INTO other VALUES (7, 'after')")

    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK, capsys.readouterr().err
    assert_equal(spark, source, target)
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK  # and it stays so
    assert_equal(spark, source, target)
    capsys.readouterr()
    assert cli_main(["status", "--config", str(cfg), "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["stops"] == {}  # the run that went on cleared the stall


def test_resync_of_a_table_the_mirror_does_not_follow_is_exit_2_before_spark(source, tmp_path, capsys, no_spark):
    target = tmp_path / "delta"
    argv = ["resync", "--dsn", source.dsn, "--publication", "pub", "--slot", "rs", "--target", str(target)]
    assert cli_main([*argv, "--table", "public.nope"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "not a table this mirror follows: public.nope" in err and "public.k, public.other, public.t" in err, err
    assert cli_main([*argv, "--table", "public.t"]) == ExitCode.USAGE  # no mirror there yet
    err = capsys.readouterr().err
    assert "no mirror with slot 'rs' that finished its first copy; run `applier mirror` first" in err, err
    assert len(err.strip().splitlines()) == 1, err


def _config(pg, target: Path, schema_changes: str) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="ra", publication="pub"),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=3, max_group_seconds=1.0,
                                            schema_changes=schema_changes))


def test_schema_changes_resync_copies_the_table_again_by_itself(source, spark, tmp_path):
    target = tmp_path / "delta"
    cfg = _config(source, target, "resync")
    mirror(spark, cfg, once=True)
    with source.connect() as conn:
        conn.execute("INSERT INTO k VALUES (8, 'before')")
        conn.execute("UPDATE t SET v = 'before' WHERE id <= 3")
        conn.execute("ALTER TABLE k DROP COLUMN c")  # dropped and added again with another type
        conn.execute("ALTER TABLE k ADD COLUMN c text")
        conn.execute("INSERT INTO k VALUES ('after drop', 'x')")
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        for i in range(30, 40):
            conn.execute("INSERT INTO t VALUES (%s, %s, 'txt')", (i, f"c{i}"))
            conn.execute("INSERT INTO other VALUES (%s, 'o')", (i,))
    lines: list[str] = []
    summary = mirror(spark, cfg, once=True, progress=lines.append)
    assert set(summary.synced_rows) == {"public.t", "public.k"}, summary.lines()
    resyncs = sorted(line.split(":")[1].strip() for line in lines if "(apply.schema_changes: resync)" in line)
    assert resyncs == ["public.k", "public.t"], lines  # once each: the copies are not redone
    assert any("changed type from int to string" in line for line in lines), lines
    assert delta_type(spark, target, "t", "c") == "string" and delta_type(spark, target, "k", "c") == "string"
    assert_equal(spark, source, target)
    with source.connect() as conn:
        conn.execute("INSERT INTO k VALUES ('later', 'y')")
        conn.execute("UPDATE t SET c = 'changed' WHERE id = 30")
    assert mirror(spark, cfg, once=True).synced_rows == {}
    assert_equal(spark, source, target)


def test_evolve_stops_on_drop_and_add_with_another_type(source, spark, tmp_path):
    from applier.sink.identity import ColumnIdentityError

    target = tmp_path / "delta"
    cfg = _config(source, target, "evolve")
    mirror(spark, cfg, once=True)
    with source.connect() as conn:
        conn.execute("ALTER TABLE t DROP COLUMN c")
        conn.execute("ALTER TABLE t ADD COLUMN c text")
        conn.execute("UPDATE t SET c = 'x' WHERE id = 1")
    # the catalog says c is another column (another attnum) before the sink meets its other type
    with pytest.raises(ColumnIdentityError, match="column.s. c of public.t are not the columns of that name") as info:
        mirror(spark, cfg, once=True)
    assert info.value.context["table"] == "public.t" and "applier resync" in str(info.value)


def test_schema_decisions_are_exit_4_not_3() -> None:
    """A restart meets the same schema again: 3 would make a service manager restart the mirror forever."""
    from applier.commands.exitcodes import for_exception
    from applier.errors import SchemaDecisionError
    from applier.sink.store.sparkddl import type_change_error

    assert for_exception(type_change_error("public.t", "c", "int", "string")) == ExitCode.BAD_DATA
    assert for_exception(SchemaDecisionError("schema changed and apply.schema_changes is 'stop'")) == ExitCode.BAD_DATA


def test_resync_help_explains_when_and_how(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["resync", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("--table SCHEMA.TABLE", "Delta cannot widen", "exactly once", "apply.schema_changes: resync",
                  "run `applier mirror` again"):
        assert words in text, (words, text)
    with pytest.raises(SystemExit) as done:
        cli_main(["resync", "--config", "x.yaml"])  # --table is required
    assert done.value.code == ExitCode.USAGE


def test_a_resync_cut_short_is_finished_by_the_next_mirror(source, spark, tmp_path, monkeypatch):
    """Killed after the Delta table was emptied and before its copy: the table is no longer in the
    mirror's list of copied tables, so the next mirror copies it (and never applies the stream to the
    empty table as if it held the rows)."""
    from applier.drivers.resync_mirror import resync
    from applier.drivers.tablesync import TableSync

    target = tmp_path / "delta"
    cfg = _config(source, target, "evolve")
    mirror(spark, cfg, once=True)
    with source.connect() as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        conn.execute("UPDATE t SET c = 'x' WHERE id = 1")
        conn.execute("INSERT INTO k VALUES (9, 'during')")
    with pytest.raises(TypeChangeError):
        mirror(spark, cfg, once=True)

    def killed(self: TableSync, *_a: object, **_k: object) -> None:
        raise KeyboardInterrupt  # as a kill would: nothing after this point runs

    monkeypatch.setattr(TableSync, "sync", killed)
    with pytest.raises(KeyboardInterrupt):
        resync(spark, cfg, ["public.t"])
    monkeypatch.undo()
    assert spark.read.format("delta").load(str(target / "public" / "t")).count() == 0  # emptied, not copied
    with source.connect() as conn:
        conn.execute("UPDATE t SET c = 'y' WHERE id = 2")
    summary = mirror(spark, cfg, once=True)
    assert set(summary.synced_rows) == {"public.t"}, summary.lines()
    assert_equal(spark, source, target)



@pytest.mark.parametrize("schema_changes", ["stop"])
@pytest.mark.parametrize("reused", [False, True])
def test_a_retype_of_a_table_dropped_since_stops_with_exit_4_and_a_way_forward(source, spark, tmp_path,
                                                                              schema_changes, reused):
    """The stream holds a retype Delta cannot widen of t, and t has been dropped since (its name maybe
    taken by a new t): no copy of the dropped t can be taken. It stopped with `applier resync --table
    public.t` as the way forward, which failed (exit 2: not a table this mirror follows) or copied the
    new t, after which the dropped t's retype stopped the mirror again, forever; with
    apply.schema_changes: resync the mirror itself stopped with exit 2, or copied the new t 20 times.
    Now, under schema_changes: stop: exit 4 naming the dropped table and its Delta directory, and moving
    that away lets it go on. Under the other policies the mirror sets the dropped relation aside by itself
    (tests/integration/test_mend_gone.py)."""
    import shutil

    from applier.errors import DroppedTypeChangeError

    target = tmp_path / "delta"
    cfg = _config(source, target, schema_changes)
    mirror(spark, cfg, once=True)
    with source.connect() as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        conn.execute("INSERT INTO t VALUES (30, 'x', 'old t')")
        conn.execute("DROP TABLE t")
        if reused:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, c int, v text)")
            conn.execute("ALTER PUBLICATION pub ADD TABLE t")
            conn.execute("INSERT INTO t VALUES (1, 1, 'new t')")
        conn.execute("INSERT INTO other VALUES (6, 'after')")
    with pytest.raises(DroppedTypeChangeError) as info:
        mirror(spark, cfg, once=True)
    message = str(info.value)
    assert for_exception(info.value) == ExitCode.BAD_DATA
    assert "column 'c' of public.t (relation OID" in message and "dropped in Postgres since" in message, message
    assert ("is now another table" in message) == reused, message
    path = Path(str(info.value.context["path"]))
    # (a new t that joined the publication had the dropped t's Delta table retired first, by table sync)
    assert (path.parent == target / "_retired" / "public" if reused else path == target / "public" / "t"), path
    assert (path / "_delta_log").is_dir()
    shutil.move(str(path), str(tmp_path / "dropped_t"))  # the way forward the message gives
    mirror(spark, cfg, once=True)
    tables = [("public", "k"), ("public", "other")] + ([("public", "t")] if reused else [])
    with source.connect() as conn:
        for result in verify_against_postgres(spark, conn, str(target), tables):
            assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])
    last = list(target.glob("_retired/public/t@*")) if reused else [path]
    assert len(last) == 1, last  # the dropped t's last changes: its one row changed after the retype
    assert [tuple(r) for r in spark.read.format("delta").load(str(last[0])).select("id", "c").collect()] == \
        [(30, "x")]


def test_a_parked_table_lets_the_others_flow_and_resync_brings_it_back(source, spark, tmp_path, capsys):
    """apply.on_table_error: park (issue 46 item 3): a table that cannot be applied past a point is set
    aside, the other tables go on (exit 0), status lists it as PARKED, and `applier resync --table` copies
    it again and brings it back; every table then ends equal to Postgres."""
    target = tmp_path / "delta"
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{source.dsn}'\n  publication: pub\n  slot: park\ntarget:\n  path: {target}\n"
                   "apply:\n  on_table_error: park\n  schema_changes: evolve\n")
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    with source.connect() as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        conn.execute("UPDATE t SET c = c || '-txt' WHERE id = 1")
        conn.execute("INSERT INTO other VALUES (6, 'flows')")
        conn.execute("INSERT INTO k VALUES (9, 'flows too')")
    capsys.readouterr()
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    assert "public.t is PARKED" in capsys.readouterr().err
    with source.connect() as conn:
        conn.execute("INSERT INTO other VALUES (7, 'still flows')")
        conn.execute("UPDATE t SET v = 'left out while parked' WHERE id = 2")
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    results = {r.source_name: r for r in verify_against_postgres(spark, source.connect(), str(target), TABLES)}
    assert results["public.other"].equal and results["public.k"].equal and not results["public.t"].equal
    capsys.readouterr()
    assert cli_main(["status", "--config", str(cfg)]) == ExitCode.OK
    assert "public.t: PARKED since" in capsys.readouterr().out
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.t"]) == ExitCode.OK
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    assert_equal(spark, source, target)
    capsys.readouterr()
    assert cli_main(["status", "--config", str(cfg), "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["parked"] == {}


def test_a_diverged_table_dropped_since_is_set_aside_and_the_mirror_goes_on(source, spark, tmp_path, capsys):
    """Issue 46 item 2: a stop named a table that was dropped afterwards. `applier resync --table` refused it
    ("not a table this mirror follows"), and every run stopped on it again: stalled for good, with no command
    left. Now resync sets it aside (parked, its Delta table retired under _retired), and the mirror goes on;
    the other tables end equal to Postgres."""
    import deltalake

    target = tmp_path / "delta"
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"source:\n  dsn: '{source.dsn}'\n  publication: pub\n  slot: gone\ntarget:\n  path: {target}\n"
                   "apply:\n  schema_changes: stop\n")  # (any other sets a dropped table aside by itself)
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    deltalake.DeltaTable(str(target / "public" / "k")).delete("c = 1")  # the Delta table diverges
    with source.connect() as conn:
        conn.execute("DELETE FROM k WHERE c = 1")  # deletes rows Delta no longer holds
        conn.execute("INSERT INTO other VALUES (6, 'after')")
        conn.execute("DROP TABLE k")
        conn.execute("INSERT INTO other VALUES (7, 'after the drop')")
    capsys.readouterr()
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.BAD_DATA
    assert "applier resync" in capsys.readouterr().err
    assert cli_main(["resync", "--config", str(cfg), "--table", "public.k"]) == ExitCode.OK
    said = capsys.readouterr().err
    assert "public.k (relation OID" in said and "was dropped in Postgres: its Delta table is retired" in said, said
    assert cli_main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.OK
    with source.connect() as conn:
        for result in verify_against_postgres(spark, conn, str(target), [("public", "t"), ("public", "other")]):
            assert result.equal, (result.source_name, result.source_rows, result.target_rows)
    assert not (target / "public" / "k").exists() and list((target / "_retired" / "public").iterdir())
    capsys.readouterr()
    assert cli_main(["status", "--config", str(cfg), "--json"]) == ExitCode.OK
    parked = json.loads(capsys.readouterr().out)["parked"]  # by name and OID: a new public.k would be followed
    assert [e["error"] for name, e in parked.items() if name.startswith("public.k (relation OID")] == ["Gone"], parked
