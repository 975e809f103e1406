"""Columns a mirror does not see arrive as row changes, against real PostgreSQL (issue 30, rows 11
and 14): PostgreSQL 18's published generated columns, and columns added with a default while a
prepared transaction stays open. Each case ends equal to Postgres, row by row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from background import scrape_metrics

from applier.checks.status import slot_status
from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MetricsSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror, mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]


def _assert_equal(spark, conn, target: Path, tables, publication: str) -> None:
    results = verify_against_postgres(spark, conn, str(target), tables, publication=publication)
    assert all(r.equal for r in results), [(r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3],
                                            r.only_in_target[:3]) for r in results]


def _columns(spark, path: Path) -> list[str]:
    return spark.read.format("delta").load(str(path)).columns


def test_generated_columns_arrive_where_the_publication_publishes_them(pg_any, spark, tmp_path):
    """PostgreSQL 18 with ``publish_generated_columns = stored``: the stored generated column is in
    the stream, so it is in the copy and in Delta like any other column, and no run copies the table
    again for it. PostgreSQL 15 and 16 never send generated columns: Delta has none, verify expects
    none. A virtual generated column (18) is never sent."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg_any.dsn, slot="gen", publication="gen_pub"),
                          target=TargetSettings(path=str(target)),
                          apply=ApplySettings(max_group_transactions=3))
    pg18 = pg_any.major >= 18
    with pg_any.connect() as conn:
        virtual = ", v int GENERATED ALWAYS AS (a * 3) VIRTUAL" if pg18 else ""
        conn.execute(f"CREATE TABLE gen (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED{virtual})")
        conn.execute("INSERT INTO gen (id, a) SELECT i, i FROM generate_series(1, 20) i")
        conn.execute("CREATE PUBLICATION gen_pub FOR TABLE gen"
                     + (" WITH (publish_generated_columns = stored)" if pg18 else ""))
        first = mirror(spark, config, once=True)
        assert first.snapshot_rows == {"public.gen": 20}
        conn.execute("INSERT INTO gen (id, a) VALUES (21, 21), (22, NULL)")
        conn.execute("UPDATE gen SET a = a + 100 WHERE id IN (1, 2)")
        conn.execute("DELETE FROM gen WHERE id = 3")
        second = mirror(spark, config, once=True)
        assert second.synced_rows == {}, second.synced_rows  # no "gained column g" copy
        assert second.transactions == 3
        assert _columns(spark, target / "public" / "gen") == (["id", "a", "g"] if pg18 else ["id", "a"])
        _assert_equal(spark, conn, target, [("public", "gen")], "gen_pub")
        if pg18:
            rows = {r["id"]: r["g"] for r in spark.read.format("delta").load(str(target / "public" / "gen")).collect()}
            assert rows[1] == 202 and rows[20] == 40 and rows[21] == 42 and rows[22] is None, rows
        conn.execute("UPDATE gen SET a = 7 WHERE id = 4")
        third = mirror(spark, config, once=True)
        assert third.synced_rows == {} and third.transactions == 1
        _assert_equal(spark, conn, target, [("public", "gen")], "gen_pub")


#: the mirror of the events tests: ``_cli`` runs it as a process, ``_in_process`` in the tests' Spark session
#: (the same config and state: the runs around a killed one)
_EV_SOURCE = {"slot": "ev", "publication": "ev_pub"}
_EV_SETTINGS = {"source": _EV_SOURCE, "apply": {"max_group_transactions": 100}}


def _in_process(spark, tmp_path: Path, dsn: str, *, max_group_transactions: int = 100) -> None:
    """``mirror --once`` with ``_cli``'s config, in the tests' Spark session."""
    config = MirrorConfig.model_validate({**_EV_SETTINGS, "source": {**_EV_SOURCE, "dsn": dsn},
                                         "target": {"path": str(tmp_path / "delta")},
                                         "apply": {"max_group_transactions": max_group_transactions}})
    mirror(spark, config, once=True)


def _cli(tmp_path: Path, dsn: str, *, crash_at: str | None = None,
         timeout: float = 240) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({**_EV_SETTINGS, "target": {"path": str(tmp_path / "delta")}}))
    env = {**os.environ, "APPLIER_DSN": dsn, "PYTHONPATH": str(REPO)}
    env.pop("APPLIER_CRASH_AT", None)
    if crash_at is not None:
        env["APPLIER_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                          env=env, capture_output=True, text=True, timeout=timeout)


def _row14(conn) -> None:
    """Issue 30, row 14: a constant default added while an unrelated prepared transaction is open,
    with changes to the table before the ALTER and after it in the same group."""
    conn.execute("INSERT INTO events VALUES (100, 'before')")  # written before the ALTER: reads 'dflt'
    conn.execute("UPDATE events SET v = 'touched' WHERE id = 2")  # so does this one
    conn.execute("BEGIN")
    conn.execute("INSERT INTO other VALUES (1)")
    conn.execute("PREPARE TRANSACTION 'gid-pending'")
    conn.execute("ALTER TABLE events ADD COLUMN extra text DEFAULT 'dflt'")
    conn.execute("INSERT INTO events VALUES (101, 'after', NULL)")  # an explicit NULL stays NULL
    conn.execute("INSERT INTO events (id, v) VALUES (102, 'after')")
    conn.execute("UPDATE events SET extra = NULL WHERE id = 3")
    conn.execute("UPDATE events SET v = 'late' WHERE id = 4")  # keeps 'dflt'


def _events(conn) -> None:
    conn.execute("CREATE TABLE events (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE other (id int)")
    conn.execute("INSERT INTO events SELECT i, 'v' || i FROM generate_series(1, 30) i")
    conn.execute("CREATE PUBLICATION ev_pub FOR TABLE events")


def _expect_filled(spark, target: Path) -> None:
    rows = {r["id"]: (r["v"], r["extra"])
            for r in spark.read.format("delta").load(str(target / "public" / "events")).collect()}
    assert rows[1] == ("v1", "dflt") and rows[2] == ("touched", "dflt") and rows[100] == ("before", "dflt")
    assert rows[101] == ("after", None) and rows[102] == ("after", "dflt") and rows[3] == ("v3", None)
    assert rows[4] == ("late", "dflt") and len(rows) == 33


def test_a_constant_default_added_while_a_prepared_transaction_is_open_is_filled_without_a_copy(pg, spark,
                                                                                                tmp_path):
    """Row 14: creating a copy's slot would wait for 'gid-pending' for ever. The default is in the
    catalog (attmissingval), so the rows that existed get it in Delta with no copy and no slot:
    ``mirror --once`` returns, and the table equals Postgres (rows before the ALTER hold 'dflt', an
    explicit NULL after it stays NULL)."""
    with pg.connect() as conn:
        _events(conn)
        first = _cli(tmp_path, pg.dsn)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
        _row14(conn)
        run = _cli(tmp_path, pg.dsn, timeout=240)  # hung for ever before
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-4000:]
        assert "filled with it from the catalog" in output and "copying the table again" not in output, output[-3000:]
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (1,)  # still open
        _expect_filled(spark, tmp_path / "delta")
        _assert_equal(spark, conn, tmp_path / "delta", [("public", "events")], "ev_pub")
        conn.execute("COMMIT PREPARED 'gid-pending'")
        conn.execute("INSERT INTO events VALUES (103, 'later', 'x')")
        again = _cli(tmp_path, pg.dsn)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "filled with it" not in again.stdout + again.stderr  # filled once
        _assert_equal(spark, conn, tmp_path / "delta", [("public", "events")], "ev_pub")


@pytest.mark.parametrize("restart_group", [100, 1])
def test_killed_after_the_fill_before_the_group_commit_and_restarted_ends_equal(pg, spark, tmp_path,
                                                                               restart_group):
    """SIGKILL when the Delta table has the new column and its filled rows but the group holding the
    ALTER is not committed: the restart re-reads the group and must fill its changes from before
    the ALTER again (from the state), not leave NULL there nor overwrite the later NULL. The restart
    may cut the stream into other groups (``restart_group``: one transaction each): a group that ends
    before the ALTER lacks the column, which is not a column dropped again, and its rows are filled by
    the group that reaches the ALTER (a CI run cut it so by chance and found row 2 NULL)."""
    with pg.connect() as conn:
        _events(conn)
        _in_process(spark, tmp_path, pg.dsn)  # the copy; only the killed run needs a process of its own
        _row14(conn)
        killed = _cli(tmp_path, pg.dsn, crash_at="column_filled:1")
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        assert "extra" in _columns(spark, tmp_path / "delta" / "public" / "events")  # the fill was written
        _in_process(spark, tmp_path, pg.dsn, max_group_transactions=restart_group)  # the restart, with its state
        _expect_filled(spark, tmp_path / "delta")
        _assert_equal(spark, conn, tmp_path / "delta", [("public", "events")], "ev_pub")


def _delta_ids(target: Path, table: str) -> list[int]:
    from deltalake import DeltaTable

    path = target / "public" / table
    if not (path / "_delta_log").exists():
        return []
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def test_a_volatile_default_copies_the_table_again_without_holding_up_the_other_tables(pg, spark, tmp_path):
    """A volatile default rewrote the table: its values are only in the rows, so the table is copied
    again under a new slot. While a prepared transaction is open that slot waits: the log names it (and
    the open transactions) instead of hanging silently, and so does ``status``. Meanwhile the other
    tables go on (issue 30 item 8: PostgreSQL's tablesync waits alone while the apply worker goes on):
    their changes reach Delta while the copy still waits, and the changes of the waiting table, held
    meanwhile, are applied on its copy once the slot exists. ``--once`` returns only then. The metrics
    say so too (the waiting table, the prepared transaction), and stop saying it once the copy is made."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="vol", publication="vol_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          metrics=MetricsSettings(port=0, host="127.0.0.1"))
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE vol (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE busy (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE other (id int)")
        conn.execute("INSERT INTO vol SELECT i, 'v' || i FROM generate_series(1, 30) i")
        conn.execute("CREATE PUBLICATION vol_pub FOR TABLE vol, busy")
        mirror(spark, config, once=True)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO other VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'gid-waited'")
        conn.execute("ALTER TABLE vol ADD COLUMN t timestamptz DEFAULT clock_timestamp()")
        conn.execute("INSERT INTO vol (id, v) VALUES (31, 'after')")
        conn.execute("INSERT INTO busy VALUES (1, 'before the wait')")
        lines: list[str] = []
        errors: list[BaseException] = []
        summaries = []

        mirrors: list[Mirror] = []

        def run() -> None:
            try:
                mirrors.append(Mirror(spark, config, progress=lines.append))
                summaries.append(mirrors[0].run(once=True))
            except BaseException as e:  # noqa: BLE001  (reported by the test thread)
                errors.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 180
        while not any("gid-waited" in line for line in lines):
            assert not errors and thread.is_alive() and time.monotonic() < deadline, (errors, lines)
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while not (waits := slot_status(pg.dsn, "vol").sync_waits):  # `status` shows the wait as well
            assert thread.is_alive() and time.monotonic() < deadline, (errors, lines)
            time.sleep(0.2)
        assert "prepared transaction gid-waited" in waits, waits
        port = mirrors[0].metrics_port
        assert port is not None
        scraped = scrape_metrics(port)
        assert scraped['applier_table_sync_waiting{table="public.vol"}'] == 1.0, scraped
        assert scraped['applier_table_sync_blocking_transactions{kind="prepared"}'] == 1.0, scraped
        # the other table is not held up: its change reaches Delta while the copy of vol waits
        deadline = time.monotonic() + 120
        while _delta_ids(target, "busy") != [1]:
            assert thread.is_alive() and not errors and time.monotonic() < deadline, (errors, lines)
            time.sleep(0.5)
        conn.execute("INSERT INTO vol (id, v) VALUES (32, 'while waiting')")  # held, then applied on the copy
        conn.execute("UPDATE vol SET v = 'changed while waiting' WHERE id = 1")
        time.sleep(2)
        assert thread.is_alive(), lines  # --once waits for the copy: it must not end with vol's changes held
        conn.execute("ROLLBACK PREPARED 'gid-waited'")
        thread.join(timeout=180)
        assert not thread.is_alive() and not errors, (errors, lines)
        assert summaries[0].synced_rows["public.vol"] >= 31, lines
        assert mirrors[0].loop.metrics is not None
        assert mirrors[0].loop.metrics.sync_waiting.labels("public.vol")._value.get() == 0.0
        assert mirrors[0].loop.metrics.sync_blockers.labels("prepared")._value.get() == 0.0
        _assert_equal(spark, conn, target, [("public", "vol"), ("public", "busy")], "vol_pub")


def test_a_mirror_stopped_while_a_copy_waits_copies_the_table_on_its_next_run(pg, spark, tmp_path):
    """The waiting table's changes are confirmed to the slot with the other tables' while they are held
    in memory: a run that stops then (here a stop request; a crash is the same) must leave the table to
    the next run's copy, which holds them, and never present it as copied."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="volstop", publication="volstop_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")))
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE vol (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE busy (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE other (id int)")
        conn.execute("INSERT INTO vol SELECT i, 'v' || i FROM generate_series(1, 10) i")
        conn.execute("CREATE PUBLICATION volstop_pub FOR TABLE vol, busy")
        mirror(spark, config, once=True)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO other VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'gid-stop'")
        conn.execute("ALTER TABLE vol ADD COLUMN r float8 DEFAULT random()")
        conn.execute("UPDATE vol SET v = 'held' WHERE id <= 5")
        conn.execute("INSERT INTO busy VALUES (1, 'goes on')")
        lines: list[str] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                Mirror(spark, config, progress=lines.append, stop=stop).run(once=False)
            except BaseException as e:  # noqa: BLE001  (reported by the test thread)
                errors.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 180
        while _delta_ids(target, "busy") != [1]:
            assert thread.is_alive() and not errors and time.monotonic() < deadline, (errors, lines)
            time.sleep(0.5)
        conn.execute("UPDATE vol SET v = 'held too' WHERE id = 10")
        time.sleep(3)  # confirmed to the slot with the busy table's next change
        conn.execute("INSERT INTO busy VALUES (2, 'confirms past the held change')")
        while _delta_ids(target, "busy") != [1, 2]:
            assert thread.is_alive() and not errors and time.monotonic() < deadline, (errors, lines)
            time.sleep(0.5)
        stop.set()
        thread.join(timeout=120)
        assert not thread.is_alive() and not errors, (errors, lines)
        assert any("the next run copies" in line for line in lines), lines
        conn.execute("ROLLBACK PREPARED 'gid-stop'")
        summary = mirror(spark, config, once=True)
        assert summary.synced_rows == {"public.vol": 10}, summary
        _assert_equal(spark, conn, target, [("public", "vol"), ("public", "busy")], "volstop_pub")


def test_constant_defaults_of_many_types_are_filled_with_the_streams_values(pg, spark, tmp_path):
    """The missing value is read as its type's output text and converted by the stream's own value
    code: quotes and commas in text, numeric scale, time zones, bytea, json, an enum, a composite
    and a domain (without constraints: one with a CHECK makes PostgreSQL rewrite the table) end
    equal to Postgres. An array column (whose missing value is not read back) is copied instead. A
    transaction that alters the table between its changes: those before the ALTER read the default."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="ty", publication="ty_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")))
    with pg.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
        conn.execute("CREATE TYPE pair AS (x int, y text)")
        conn.execute("CREATE DOMAIN posint AS int")
        for name in ("typed", "arr", "same"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
            conn.execute(f"INSERT INTO {name} SELECT generate_series(1, 10)")
        conn.execute("CREATE PUBLICATION ty_pub FOR TABLE typed, arr, same")
        mirror(spark, config, once=True)
        conn.execute("""ALTER TABLE typed ADD COLUMN t text DEFAULT 'a,"b''c}', ADD COLUMN i int8 DEFAULT -42,
            ADD COLUMN n numeric(10, 2) DEFAULT 3.1, ADD COLUMN ts timestamptz DEFAULT '2020-02-29 23:59:59.5+05',
            ADD COLUMN d date DEFAULT '1999-12-31', ADD COLUMN b bool DEFAULT true,
            ADD COLUMN by bytea DEFAULT '\\x00ff', ADD COLUMN j jsonb DEFAULT '{"k": [1, "x"]}',
            ADD COLUMN m mood DEFAULT 'ok', ADD COLUMN p pair DEFAULT ROW(1, 'y z'), ADD COLUMN dp posint DEFAULT 5,
            ADD COLUMN f float8 DEFAULT 0.1""")
        conn.execute("ALTER TABLE arr ADD COLUMN a int[] DEFAULT '{1,2}'")
        conn.execute("INSERT INTO typed (id) VALUES (11)")
        with conn.transaction():  # a transaction that alters the table between two changes
            conn.execute("INSERT INTO same VALUES (11), (12)")
            conn.execute("UPDATE same SET id = 13 WHERE id = 1")
            conn.execute("ALTER TABLE same ADD COLUMN s text DEFAULT 'in-txn'")
            conn.execute("INSERT INTO same VALUES (14, NULL)")
            conn.execute("INSERT INTO same (id) VALUES (15)")
            conn.execute("UPDATE same SET s = 'set' WHERE id = 11")
        conn.execute("INSERT INTO arr (id) VALUES (11)")
        lines: list[str] = []
        summary = Mirror(spark, config, progress=lines.append).run(once=True)
        assert summary.synced_rows == {"public.arr": 11}, lines
        assert any("typed: column(s)" in line and "filled with it from the catalog" in line for line in lines), lines
        _assert_equal(spark, conn, tmp_path / "delta", [("public", "typed"), ("public", "arr"), ("public", "same")],
                      "ty_pub")
        same = {r["id"]: r["s"] for r in spark.read.format("delta").load(str(tmp_path / "delta" / "public" / "same"))
                .collect()}
        assert same[2] == same[12] == same[13] == same[15] == "in-txn" and same[14] is None and same[11] == "set"
        row = spark.read.format("delta").load(str(tmp_path / "delta" / "public" / "typed")).filter("id = 1").first()
        assert row["t"] == 'a,"b\'c}' and row["i"] == -42 and str(row["n"]) == "3.10" and row["by"] == b"\x00\xff"


def test_a_column_renamed_then_a_column_added_with_a_default_keeps_the_renamed_values(pg, spark, tmp_path):
    """Issue 47, repro 21a: RENAME COLUMN a TO b, then ADD COLUMN d ... DEFAULT 7, then one update. The
    fill of d evolved the Delta table without the catalog's rename decision: a was taken for a drop and
    b was NULL in 99 of 100 rows, with exit 0."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="o21n", publication="pub21n"),
                          target=TargetSettings(path=str(target)))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE o21n (id int PRIMARY KEY, a int, c text)")
        conn.execute("INSERT INTO o21n SELECT g, g, 'c' || g FROM generate_series(1, 100) g")
        conn.execute("CREATE PUBLICATION pub21n FOR TABLE o21n")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE o21n RENAME COLUMN a TO b")
        conn.execute("ALTER TABLE o21n ADD COLUMN d int DEFAULT 7")
        conn.execute("UPDATE o21n SET d = 8 WHERE id = 1")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "o21n")], "pub21n")
        assert sorted(_columns(spark, target / "public" / "o21n")) == ["b", "c", "d", "id"]


def test_a_first_run_waiting_for_a_prepared_transaction_says_so_and_stops_on_request(pg, tmp_path, monkeypatch):
    """Issue 47: a first run while a prepared transaction exists printed nothing for 11 minutes, ignored
    Ctrl-C and left a walsender in CREATE_REPLICATION_SLOT that made the next run fail. The creation now
    runs on a thread: the mirror says what it waits for, a stop ends the wait, and nothing is left behind."""
    import applier.drivers.mirror as mirror_module
    from applier.spark.session import SparkProvider

    monkeypatch.setattr(mirror_module, "SLOT_FIRST_REPORT_SECONDS", 1.0)
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="waits", publication="waits_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")))
    lines: list[str] = []
    stop = threading.Event()
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION waits_pub FOR TABLE w")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO w VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'forgotten'")
        run = threading.Thread(target=lambda: mirror(no_spark, config, once=True, progress=lines.append, stop=stop))
        run.start()
        deadline = time.monotonic() + 30
        while not any("forgotten" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any("creating slot waits has waited" in line and "1 prepared transaction(s) (forgotten)" in line
                   and "COMMIT PREPARED or ROLLBACK PREPARED" in line for line in lines), lines
        stop.set()
        run.join(15)
        assert not run.is_alive()
        # no slot, and no walsender still waiting in CREATE_REPLICATION_SLOT
        time.sleep(0.5)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'waits'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' "
                            "AND datname = current_database()").fetchone() == (0,)
        conn.execute("COMMIT PREPARED 'forgotten'")
    mirror(no_spark, config, once=True)  # the next run creates the slot and copies
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "delta" / "public" / "w")).to_pyarrow_table().to_pylist() == [{"id": 1}]


@pytest.mark.parametrize("group", [250_000, 1])
def test_a_column_added_with_a_default_then_renamed_is_not_filled_again(pg, spark, tmp_path, group):
    """Found by a schema walk (seed 1): a column added with a constant default and mirrored, then another
    added with a default and the first renamed, in one run. The renamed column still has its missing
    value in the catalog, so it was taken for a new column to fill: every row got the old default in it,
    and its values went to the other column."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="refill", publication="refill"),
                          target=TargetSettings(path=str(target)), apply=ApplySettings(max_group_transactions=group))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE o (id int PRIMARY KEY, c text)")
        conn.execute("INSERT INTO o SELECT g, 'c' || g FROM generate_series(1, 30) g")
        conn.execute("CREATE PUBLICATION refill FOR TABLE o")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE o ADD COLUMN a int DEFAULT 8")
        conn.execute("UPDATE o SET a = id * 10 WHERE id <= 10")
        mirror(spark, config, once=True)
        conn.execute("ALTER TABLE o ADD COLUMN b int DEFAULT 6")
        conn.execute("UPDATE o SET a = -id WHERE id IN (11, 12)")
        conn.execute("ALTER TABLE o RENAME COLUMN a TO r")
        conn.execute("UPDATE o SET r = 1000 + id WHERE id IN (1, 13)")
        conn.execute("UPDATE o SET c = 'later' WHERE id = 14")  # a group after the rename's (group 1)
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "o")], "refill")


@pytest.mark.parametrize("default", ["clock_timestamp()", "'2020-02-29 12:00:00+00'"])
def test_a_column_added_and_dropped_again_in_a_key_less_table_ends_equal_whatever_the_group_cut(
        pg, spark, tmp_path, default):
    """Found by a schema walk (seed 7, public.items): a key-less table (REPLICA IDENTITY FULL, jsonb) gains
    a column with a default and loses it again before the mirror asks. The old images of the changes made
    in between carry what the rows that existed had in it (the rewrite's or the default's value), but the
    catalog no longer has the column, so nothing was filled or copied: a group whose newest schema still
    had the column gave it to the Delta table as NULL, and matching those old images on every column found
    no row ("Postgres deleted more copies of a row than the Delta table holds"). A group reaching past the
    DROP left the column out and ended equal. One transaction a group (the cut that failed) must end equal."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="gone", publication="gone_pub"),
                          target=TargetSettings(path=str(target)), apply=ApplySettings(max_group_transactions=1))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE bag (id int, doc jsonb)")
        conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
        conn.execute("""INSERT INTO bag SELECT i % 6, jsonb_build_object('k', i % 3) FROM generate_series(1, 12) i""")
        conn.execute("CREATE PUBLICATION gone_pub FOR TABLE bag")
        mirror(spark, config, once=True)
        conn.execute(f"ALTER TABLE bag ADD COLUMN t timestamptz DEFAULT {default}")
        conn.execute("""UPDATE bag SET doc = '{"k": 9}' WHERE ctid = (SELECT min(ctid) FROM bag WHERE id = 1)""")
        conn.execute("DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE id = 2)")
        conn.execute("""INSERT INTO bag (id, doc) VALUES (7, '{"k": 7}')""")
        conn.execute("ALTER TABLE bag DROP COLUMN t")
        conn.execute("""UPDATE bag SET doc = '{"k": 8}' WHERE id = 3""")
        lines: list[str] = []
        Mirror(spark, config, progress=lines.append).run(once=True)
        assert any("bag gained column(s) t that were dropped again" in line for line in lines), lines
        _assert_equal(spark, conn, target, [("public", "bag")], "gone_pub")
