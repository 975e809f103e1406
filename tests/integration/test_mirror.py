"""`applier mirror` against a real PostgreSQL: snapshot under the slot's exported snapshot, then the
stream; tables must equal Postgres row by row, positions are confirmed only once applied, and a
mirror killed with SIGKILL at random points and restarted still ends equal (no duplicates, no loss)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror, mirror
from applier.errors import ConfigError, SourceError
from applier.lsn import parse_lsn

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]

READ_MODES = {
    # the replication protocol with the richest option set: streamed big transactions, two-phase
    "replication-proto3": dict(read_mode="replication", proto_version=3, streaming="on", two_phase=True),
    "sql-proto1": dict(read_mode="sql", proto_version=1),
}


def _config(pg, target: Path, **source: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="rw_pub", **source),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=5, max_group_seconds=1.0))


def _assert_equal(spark, conn, target: Path) -> None:
    for result in verify_against_postgres(spark, conn, str(target), TABLES):
        assert result.equal, (result.source_name, result.source_rows, result.target_rows,
                              result.only_in_source[:3], result.only_in_target[:3])


def _confirmed(conn: psycopg.Connection, slot: str) -> int:
    row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    assert row is not None
    (lsn,) = row
    return parse_lsn(lsn)


def _mirror_in_background(spark, config: MirrorConfig, log_dir: Path, **kwargs: Any):
    """Run the mirror (no --once) on a thread until the returned event is set; returns once the
    snapshot of the table whose Delta log is ``log_dir`` is written. Errors land in the list."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            mirror(spark, config, stop=stop, **kwargs)
        except BaseException as e:  # noqa: BLE001  (reported by the test thread)
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not log_dir.exists() or not any(log_dir.glob("*.json")):  # snapshot written
        assert not errors and time.monotonic() < deadline, errors
        time.sleep(0.2)
    return thread, stop, errors


@pytest.mark.parametrize("mode", sorted(READ_MODES))
def test_mirror_once_while_a_workload_runs_ends_equal_to_postgres(pg, spark, tmp_path, mode):
    two_phase = bool(READ_MODES[mode].get("two_phase"))
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        random_workload(conn, 11, transactions=25, prepared=two_phase)  # rows the snapshot must carry
        if two_phase:  # slot creation waits for every open transaction, prepared ones included
            conn.execute("COMMIT PREPARED 'rw-11-3'")
        target = tmp_path / "delta"
        cfg = _config(pg, target, **READ_MODES[mode])

        first = mirror(spark, cfg, once=True)
        assert first.snapshot_lsn is not None and sum(first.snapshot_rows.values()) > 0
        _assert_equal(spark, conn, target)  # the snapshot alone equals Postgres

        failures: list[BaseException] = []

        def workload() -> None:
            try:
                with pg.connect() as other:
                    random_workload(other, 12, transactions=40, prepared=two_phase)
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
                failures.append(e)

        runner = threading.Thread(target=workload)
        runner.start()
        rounds = 0
        while runner.is_alive() or rounds == 0:
            summary = mirror(spark, cfg, once=True, progress=print)  # drains whatever has committed by now
            assert summary.snapshot_lsn is None  # the slot is followed, never re-copied
            rounds += 1
        runner.join()
        assert not failures, failures
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        (wanted,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        last = mirror(spark, cfg, once=True)
        assert last.transactions >= 1
        _assert_equal(spark, conn, target)
        # everything drained is confirmed to the server, and not a byte before it is applied
        assert _confirmed(conn, "m") >= parse_lsn(wanted)
        assert mirror(spark, cfg, once=True).transactions == 0  # nothing left, nothing re-applied


def test_mirror_refuses_a_slot_it_did_not_snapshot_with(pg, spark, tmp_path):
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT pg_create_logical_replication_slot('m', 'pgoutput')")
        with pytest.raises(SourceError, match="has no record of a snapshot taken with it") as refused:
            mirror(spark, _config(pg, tmp_path / "delta"), once=True)
        # it names the state directory it looked in, and the setting that points at another one
        assert str(tmp_path / "delta" / "_applier") in str(refused.value) and "target.state_dir" in str(refused.value)
        from applier.commands.exitcodes import ExitCode, for_exception

        assert for_exception(refused.value) == ExitCode.USAGE  # a restart meets the same state: exit 2, not 3
        with pytest.raises(ConfigError, match="publication 'nope' does not exist"):
            cfg = _config(pg, tmp_path / "delta2")
            mirror(spark, cfg.model_copy(update={"source": cfg.source.model_copy(update={"publication": "nope"})}),
                   once=True)


def test_mirror_killed_at_random_points_and_restarted_ends_equal(pg, spark, tmp_path):
    """SIGKILL the CLI mid-snapshot and mid-stream, restart it each time: no loss, no duplicates."""
    rng = random.Random(7)
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"slot": "m", "publication": "rw_pub", "proto_version": 2, "streaming": "on"},
        "target": {"path": str(target)},
        "apply": {"grouping": "transaction"},  # many small commits: kills land between and inside them
    }))
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        random_workload(conn, 21, transactions=30)
        kills = 0
        # Each run starts a JVM (~5 s) and then applies one Delta commit per transaction and table:
        # the delays land the kills in the snapshot, and in the stream after it.
        for run, delay in enumerate((rng.uniform(5, 10), rng.uniform(6, 12), rng.uniform(7, 14))):
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
            random_workload(conn, 22 + run, transactions=20)  # more history between restarts
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        # the last run takes what is left in one group per table: a run may change its grouping, and
        # ninety one-transaction MERGEs would only spend minutes of the suite on what the killed runs test
        # (in the tests' Spark session: only the killed runs need processes of their own)
        settings = yaml.safe_load(config.read_text())
        last = MirrorConfig.model_validate({**settings, "source": {**settings["source"], "dsn": pg.dsn},
                                            "apply": {}})
        mirror(spark, last, once=True)
        assert kills >= 1, "no run was still going when killed; lengthen the workload"
        _assert_equal(spark, conn, target)


def test_status_reports_applied_lsn_rows_and_slot_lag(pg, spark, tmp_path, capsys):
    import json

    from applier.cli import main

    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO rw_bag VALUES (1, 'a'), (2, 'b')")
        mirror(spark, _config(pg, target, read_mode="sql"), once=True)
        conn.execute("INSERT INTO rw_bag VALUES (3, 'c')")
        (tip, committed) = conn.execute("SELECT pg_current_wal_lsn()::text, clock_timestamp()").fetchone()
        mirror(spark, _config(pg, target, read_mode="sql"), once=True)
        (applied,) = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots").fetchone()
        conn.execute("INSERT INTO rw_bag VALUES (4, 'not mirrored yet')")
        capsys.readouterr()
        assert main(["status", "--target", str(target), "--dsn", pg.dsn, "--slot", "m", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    tables = {t["table"]: t for t in report["tables"]}
    assert set(tables) == {f"{ns}.{name}" for ns, name in TABLES}
    assert tables["public.rw_bag"]["rows"] == 3
    # the source commit time of the last transaction applied (the insert of 3), and how long it took to Delta
    from datetime import datetime

    source_time = datetime.fromisoformat(tables["public.rw_bag"]["source_commit_time"])
    assert abs((source_time - committed).total_seconds()) < 5, (source_time, committed)
    assert 0 <= tables["public.rw_bag"]["lag_seconds"] < 120
    # the last insert is applied and confirmed; an idle slot is confirmed up to the server's position, which
    # may have moved past the bag's last transaction by a record of the server's own (xl_running_xacts,
    # written every 15 s while a loaded machine runs this test)
    table_applied = parse_lsn(tables["public.rw_bag"]["applied_lsn"])
    assert parse_lsn(applied) >= table_applied and parse_lsn(applied) >= parse_lsn(tip)
    slot = report["slot"]
    assert slot["exists"] and slot["confirmed_lsn"] == applied and slot["lag_bytes"] > 0
    assert slot["wal_status"] == "reserved" and slot["risk"] is None
    import pyarrow as pa
    from deltalake import DeltaTable

    bag = DeltaTable(str(target / "public" / "rw_bag"))
    assert tables["public.rw_bag"]["files"] == len(bag.file_uris()) > 0
    sizes = pa.table(bag.get_add_actions()).column("size_bytes").to_pylist()
    assert tables["public.rw_bag"]["size_bytes"] == sum(sizes)

    # on a terminal: one aligned row per table under a header, then the slot
    assert main(["status", "--target", str(target), "--dsn", pg.dsn, "--slot", "m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["table", "applied", "last", "commit", "source", "commit", "lag", "rows", "files",
                                "size"]
    row = next(line for line in lines if line.startswith("public.rw_bag "))
    assert row.split()[-4:-2] == ["3", str(tables["public.rw_bag"]["files"])], row
    assert len({len(line) for line in lines[:len(TABLES) + 1]}) == 1, lines  # aligned: same width
    assert lines[len(TABLES) + 1].startswith("slot m: idle") and "wal_status reserved" in lines[len(TABLES) + 1]

    # --watch refreshes until Ctrl-C (here: JSON lines), then exits 0
    watch = subprocess.Popen([sys.executable, "-m", "applier.cli", "status", "--target", str(target), "--dsn", pg.dsn,
                              "--slot", "m", "--json", "--watch", "0.2"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert watch.stdout is not None
    first = json.loads(watch.stdout.readline())
    with pg.connect() as conn:
        conn.execute("INSERT INTO rw_bag VALUES (5, 'e')")
        mirror(spark, _config(pg, target, read_mode="sql"), once=True)
    deadline = time.monotonic() + 60
    while True:  # a later refresh shows the new rows
        later = json.loads(watch.stdout.readline())
        if {t["table"]: t for t in later["tables"]}["public.rw_bag"]["rows"] == 5:  # with the row inserted before
            break
        assert time.monotonic() < deadline, later
    watch.send_signal(signal.SIGINT)
    assert watch.wait(30) == 0
    assert {t["table"]: t for t in first["tables"]}["public.rw_bag"]["rows"] == 3


def test_under_steady_load_groups_are_applied_when_the_backlog_is_drained_not_when_a_limit_is_hit(
        pg, spark, tmp_path):
    """With limits that a load never reaches (a group may wait 10 minutes, hold 100,000
    transactions) and transactions arriving every ~20 ms (so the stream is never idle for the
    0.5 s that also applies a group), the mirror must still commit to Delta while the load runs:
    a group is applied as soon as nothing more is buffered. Stopped, and restarted with --once,
    it ends equal to Postgres."""
    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="load_pub"),
                          target=TargetSettings(path=str(target)),
                          apply=ApplySettings(max_group_transactions=100_000, max_group_seconds=600))
    log_dir = target / "public" / "load_events" / "_delta_log"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE load_events (id bigserial PRIMARY KEY, payload text NOT NULL)")
        conn.execute("CREATE PUBLICATION load_pub FOR TABLE load_events")
        thread, stop, errors = _mirror_in_background(spark, config, log_dir)
        commits_before = len(list(log_dir.glob("*.json")))
        started = time.monotonic()
        while time.monotonic() - started < 25:
            conn.execute("INSERT INTO load_events (payload) VALUES ('event')")
            time.sleep(0.02)
        commits_during = len(list(log_dir.glob("*.json"))) - commits_before
        stop.set()
        thread.join(timeout=120)
        assert not errors, errors
        assert commits_during >= 3, f"only {commits_during} Delta commits during 25 s of load"
        mirror(spark, config, once=True)  # what was still on its way when the thread stopped
        results = verify_against_postgres(spark, conn, str(target), [("public", "load_events")])
        assert all(r.equal for r in results), results


def test_an_idle_sql_mirror_confirms_wal_other_databases_write(pg, spark, tmp_path):
    """`mirror --sql` on a slot whose tables do not change, while another database writes WAL: each
    --once run confirms the slot up to the server's flush position, so the WAL it retains stays
    bounded (it used to stay at the snapshot's position forever)."""
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO rw_keyed VALUES (1, 'a', NULL)")
        conn.execute("DROP DATABASE IF EXISTS idle_other")
        conn.execute("CREATE DATABASE idle_other")
    other_dsn = pg.cluster.dsn("idle_other")
    config = _config(pg, tmp_path / "delta", read_mode="sql", proto_version=1)
    mirror(spark, config, once=True)
    with psycopg.connect(other_dsn, autocommit=True) as other, pg.connect() as conn:
        for _ in range(2):
            other.execute("CREATE TABLE IF NOT EXISTS filler (v text)")
            other.execute("INSERT INTO filler SELECT repeat('x', 200) FROM generate_series(1, 20000)")
            (flush,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
            summary = mirror(spark, config, once=True)
            assert summary.transactions == 0
            assert _confirmed(conn, "m") >= parse_lsn(flush), "the idle slot was not advanced"
        _assert_equal(spark, conn, tmp_path / "delta")
        conn.execute("DROP DATABASE idle_other WITH (FORCE)")


@pytest.mark.parametrize("mode", ["replication", "sql"])
def test_a_table_added_to_the_publication_while_the_mirror_runs_is_copied_then_followed(pg, spark, tmp_path,
                                                                                        mode):
    """ALTER PUBLICATION ... ADD TABLE under a running mirror: the table's rows from before the ALTER
    (which the stream never sends) are copied at a known position, and its later changes, including
    ones made while the copy was taken, are applied exactly once (tablesync.c's job)."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="late_pub", read_mode=mode),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          apply=ApplySettings(max_group_transactions=50, max_group_seconds=0.5))
    log_dir = tmp_path / "delta" / "public" / "early" / "_delta_log"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE early (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE late (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO late SELECT g, 'before ' || g FROM generate_series(1, 300) g")
        conn.execute("CREATE PUBLICATION late_pub FOR TABLE early")
        lines: list[str] = []
        thread, stop, errors = _mirror_in_background(spark, config, log_dir, progress=lines.append)
        deadline = time.monotonic() + 180
        for i in range(1, 40):
            conn.execute("INSERT INTO early VALUES (%s, 'e')", (i,))
            if i == 10:
                conn.execute("ALTER PUBLICATION late_pub ADD TABLE late")
            conn.execute("UPDATE late SET v = v || '+' WHERE id = %s", (i,))
            conn.execute("INSERT INTO late VALUES (%s, 'after')", (1000 + i,))
            conn.execute("DELETE FROM late WHERE id = %s", (300 - i,))
            time.sleep(0.05)
        conn.execute("INSERT INTO early VALUES (-1, 'last')")
        while not any("late: " in line and "rows at" in line for line in lines):
            assert not errors and time.monotonic() < deadline, (errors, lines[-5:])
            time.sleep(0.2)
        time.sleep(3)
        stop.set()
        thread.join(timeout=120)
        assert not errors, errors
        summary = mirror(spark, config, once=True)  # what was still on its way when the thread stopped
        assert summary.synced_rows == {}  # known now: never copied twice
        results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), [("public", "early"),
                                                                                  ("public", "late")])
        assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:3], r.only_in_target[:3])
                                               for r in results]
        assert any(r.source_name == "public.late" and r.source_rows == 300 for r in results)


def test_the_lag_line_of_an_idle_mirror_is_measured_from_the_confirmed_position(pg, spark, tmp_path):
    """Issue 21 row 16: a caught-up continuous mirror used to report the whole WAL since its start as
    lag ("lag 79864664 bytes") while the slot was fully confirmed. Other databases write WAL meanwhile."""
    from applier.drivers.mirror import Mirror

    with pg.connect() as conn:
        conn.execute("CREATE TABLE idle_t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION idle_pub FOR TABLE idle_t")
        conn.execute("DROP DATABASE IF EXISTS lag_other")
        conn.execute("CREATE DATABASE lag_other")
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication="idle_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")))
    mirror(spark, config, once=True)  # the snapshot
    lines: list[str] = []
    stop = threading.Event()
    runner = Mirror(spark, config, progress=lines.append, stop=stop, progress_every=1.0)
    thread = threading.Thread(target=lambda: runner.run(once=False), daemon=True)
    thread.start()
    with psycopg.connect(pg.cluster.dsn("lag_other"), autocommit=True) as other:
        other.execute("CREATE TABLE filler (v text)")
        for _ in range(6):
            other.execute("INSERT INTO filler SELECT repeat('x', 200) FROM generate_series(1, 5000)")
            time.sleep(1)
    time.sleep(3)
    stop.set()
    thread.join(timeout=60)
    lags = [line for line in lines if "lag " in line]
    assert lags, lines
    behind = int(lags[-1].split("lag ")[1].split(" bytes")[0])
    assert behind < 1 << 20, lags[-3:]  # the filler alone wrote ~6 MB of WAL
    # after the first line, each says how the backlog goes ("caught up", or behind with a rate and ETA)
    assert all(" bytes (" in line and ("caught up" in line or " behind" in line) for line in lags[1:]), lags
    with pg.connect() as conn:
        conn.execute("DROP DATABASE lag_other WITH (FORCE)")


def test_a_column_added_with_a_default_gives_existing_rows_postgres_values_not_null(pg, spark, tmp_path):
    """ADD COLUMN ... DEFAULT sends no row changes: the rows that existed show the default (a
    constant: attmissingval; a volatile one: values the table rewrite computed). A constant is
    filled in Delta from the catalog; a table with a volatile one is copied again at a known
    position; a column added without a default stays NULL as it is in Postgres, with no copy."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="ac", publication="ac_pub"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          apply=ApplySettings(max_group_transactions=3))
    tables = [("public", "plain"), ("public", "constant"), ("public", "volatile")]
    with pg.connect() as conn:
        for name in ("plain", "constant", "volatile"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION ac_pub FOR TABLE plain, constant, volatile")
        first = mirror(spark, config, once=True)
        assert first.snapshot_rows == {"public.plain": 50, "public.constant": 50, "public.volatile": 50}
        conn.execute("UPDATE constant SET v = 'before' WHERE id = 1")
        conn.execute("ALTER TABLE plain ADD COLUMN n int")
        conn.execute("ALTER TABLE constant ADD COLUMN d int DEFAULT 42, ADD COLUMN t text DEFAULT 'x'")
        conn.execute("ALTER TABLE volatile ADD COLUMN r float8 DEFAULT random()")
        for name in ("plain", "constant", "volatile"):  # the next change brings the new Relation
            conn.execute(f"INSERT INTO {name} (id, v) VALUES (100, 'after')")
            conn.execute(f"UPDATE {name} SET v = 'changed' WHERE id = 2")
        lines: list[str] = []
        summary = Mirror(spark, config, progress=lines.append).run(once=True)
        assert set(summary.synced_rows) == {"public.volatile"}, lines  # the constant is filled, not copied
        results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), tables)
        assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:3], r.only_in_target[:3])
                                               for r in results]
        rows = spark.read.format("delta").load(str(tmp_path / "delta" / "public" / "constant"))
        assert rows.filter("d = 42 AND t = 'x'").count() == 51  # every row, the ones from before too
        conn.execute("INSERT INTO constant (id, v, d) VALUES (101, 'later', 7)")
        again = mirror(spark, config, once=True)
        assert again.synced_rows == {}  # the columns are known now: no second copy
        results = verify_against_postgres(spark, conn, str(tmp_path / "delta"), tables)
        assert all(r.equal for r in results)
