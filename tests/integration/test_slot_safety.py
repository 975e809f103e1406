"""Slot safety on real servers: the mirror warns while its slot holds WAL past ``max_wal_size`` or
close to ``max_slot_wal_keep_size`` (``wal_status`` extended/unreserved, ``safe_wal_size`` low),
``status`` shows it, a lost slot stops the mirror with exit 3 and the way back, and on PostgreSQL 17+
``source.failover`` creates (or alters) the slot with FAILOVER (before 17 it is a config error, exit 2)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import PgDatabase, _fresh_database

from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import MirrorConfig, SourceSettings, TargetSettings
from applier.devtools.pgcluster import PgCluster, find_installation
from applier.drivers.mirror import mirror
from applier.errors import ConfigError, SourceError

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

MB = 1 << 20


def _config(dsn: str, target: Path, slot: str = "s", **source: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=dsn, slot=slot, publication="p", **source),
                        target=TargetSettings(path=str(target)))


def _wal_state(conn: psycopg.Connection, slot: str) -> tuple[str, int | None]:
    row = conn.execute("SELECT wal_status, safe_wal_size FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    assert row is not None
    return row[0], row[1]


def _write_wal(conn: psycopg.Connection, megabytes: int) -> None:
    """About ``megabytes`` of WAL in a table the publication does not hold, then a checkpoint (which
    recycles or removes the segments no slot needs)."""
    conn.execute("INSERT INTO junk SELECT g, repeat('x', 1000) FROM generate_series(1, %s) g", (megabytes * 900,))
    conn.execute("SELECT pg_switch_wal()")
    conn.execute("CHECKPOINT")


@pytest.fixture
def small_wal(tmp_path: Path) -> Iterator[PgDatabase]:
    """A server of its own whose slot may keep at most 64 MB of WAL (max_wal_size 32 MB): the other
    tests' server is left alone."""
    cluster = PgCluster(find_installation(15), {"max_wal_size": "32MB", "min_wal_size": "32MB",
                                                "max_slot_wal_keep_size": "64MB"}).start()
    try:
        yield from _fresh_database(cluster)
    finally:
        cluster.stop()


def test_a_slot_at_risk_is_warned_about_and_a_lost_slot_stops_with_exit_2(small_wal, spark, tmp_path, caplog,
                                                                          capsys):
    target = tmp_path / "delta"
    config = _config(small_wal.dsn, target)
    with small_wal.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE junk (id int, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        mirror(spark, config, once=True)
        assert _wal_state(conn, "s")[0] == "reserved"

        # the mirror is down while 45 MB are written: the slot holds WAL past max_wal_size
        conn.execute("INSERT INTO t VALUES (2, 'b')")
        _write_wal(conn, 45)
        status, safe = _wal_state(conn, "s")
        assert status in ("extended", "unreserved") and safe is not None and safe < 64 * MB, (status, safe)
        capsys.readouterr()
        assert cli_main(["status", "--target", str(target), "--dsn", small_wal.dsn, "--slot", "s", "--json"]) == 0
        slot = json.loads(capsys.readouterr().out)["slot"]
        assert slot["wal_status"] == status and slot["safe_wal_size"] == safe and slot["risk"], slot
        assert cli_main(["status", "--target", str(target), "--dsn", small_wal.dsn, "--slot", "s"]) == 0
        assert "WARNING: the slot is at risk" in capsys.readouterr().out

        with caplog.at_level(logging.WARNING, logger="applier.slot"):
            mirror(spark, config, once=True)  # warns, then catches up: the slot is safe again
        assert any("slot s is at risk" in r.getMessage() for r in caplog.records), caplog.text
        # The server moves restart_lsn only to a candidate taken at a running-xacts record it decoded, one
        # candidate at a time, so a confirm may leave restart_lsn at an older candidate. A checkpoint logs
        # a fresh running-xacts record; a few more runs that confirm past it must bring the slot back.
        for _ in range(4):
            if _wal_state(conn, "s")[0] == "reserved":
                break
            conn.execute("CHECKPOINT")
            mirror(spark, config, once=True)
        assert _wal_state(conn, "s")[0] == "reserved"

        # down again while more than max_slot_wal_keep_size is written: the checkpoint removes WAL the
        # slot needs, and the next run stops with the way back instead of skipping changes: exit 2, not 3 (a
        # supervisor restarting it would meet the same lost slot forever)
        conn.execute("INSERT INTO t VALUES (3, 'lost')")
        for _ in range(3):
            _write_wal(conn, 40)
        assert _wal_state(conn, "s")[0] == "lost"
        with pytest.raises(SourceError) as stopped:
            mirror(spark, config, once=True)
        assert for_exception(stopped.value) == ExitCode.USAGE
        assert "pg_drop_replication_slot('s')" in str(stopped.value) and "copied again" in str(stopped.value)
        capsys.readouterr()
        assert cli_main(["status", "--target", str(target), "--dsn", small_wal.dsn, "--slot", "s", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["slot"]["wal_status"] == "lost"
        assert cli_main(["status", "--target", str(target), "--dsn", small_wal.dsn, "--slot", "s"]) == 0
        out = capsys.readouterr().out
        assert "safe_wal_size none (lost)" in out and "unlimited" not in out, out


@pytest.fixture
def pg18(pg_pool) -> Iterator[PgDatabase]:
    yield from _fresh_database(pg_pool.get(18))


def test_failover_creates_or_alters_the_slot_on_postgresql_18_and_is_refused_before_17(pg18, pg, spark, tmp_path):
    for db in (pg18, pg):
        with db.connect() as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            conn.execute("CREATE PUBLICATION p FOR TABLE t")
            conn.execute("INSERT INTO t VALUES (1, 'a')")
    mirror(spark, _config(pg18.dsn, tmp_path / "new", slot="created", failover=True), once=True)
    mirror(spark, _config(pg18.dsn, tmp_path / "old", slot="altered"), once=True)
    with pg18.connect() as conn:
        conn.execute("INSERT INTO t VALUES (2, 'b')")
        assert conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = 'altered'").fetchone() \
            == (False,)
        mirror(spark, _config(pg18.dsn, tmp_path / "old", slot="altered", failover=True), once=True)
        flags = dict(conn.execute("SELECT slot_name, failover FROM pg_replication_slots").fetchall())
    assert flags == {"created": True, "altered": True}

    with pytest.raises(ConfigError, match="PostgreSQL 17 or later") as refused:
        mirror(spark, _config(pg.dsn, tmp_path / "pg15", failover=True), once=True)
    assert for_exception(refused.value) == ExitCode.USAGE
    with pg.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)


@pytest.mark.parametrize("read_mode", ["replication", "sql"])
def test_a_quiet_publication_on_a_busy_server_does_not_hold_wal(small_wal, spark, tmp_path, read_mode):
    """Another database writes about 190 MB of WAL (three times the slot's 64 MB limit, at 20 MB/s) while
    the published table is idle: the running mirror confirms the WAL that carries nothing for it, so the slot's
    restart_lsn follows the server and the slot is never at risk (no heartbeat needed)."""
    import threading
    import time

    from applier.lsn import parse_lsn

    target = tmp_path / "delta"
    config = _config(small_wal.dsn, target, read_mode=read_mode)
    with small_wal.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            mirror(spark, config, stop=stop)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        with psycopg.connect(small_wal.cluster.dsn(), autocommit=True) as busy, small_wal.connect() as conn:
            deadline = time.monotonic() + 120
            while not (target / "public").exists() or conn.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's' AND "
                    "confirmed_flush_lsn IS NOT NULL").fetchone() != (1,):
                assert not errors and time.monotonic() < deadline, errors
                time.sleep(0.2)
            (start,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            busy.execute("CREATE TABLE IF NOT EXISTS busy (id int, v text)")
            worst = "reserved"
            for _ in range(10):  # 20 MB a second, each followed by a checkpoint (the sql mode polls every second)
                busy.execute("INSERT INTO busy SELECT g, repeat('y', 1000) FROM generate_series(1, 18000) g")
                busy.execute("CHECKPOINT")
                time.sleep(1.0)
                status = _wal_state(conn, "s")[0]
                worst = status if status in ("unreserved", "lost") else worst
                assert not errors, errors
            (written,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert parse_lsn(written) - parse_lsn(start) > 160 * MB
            deadline = time.monotonic() + 60
            while True:  # the slot follows: at most one segment and a checkpoint's worth behind
                (restart,) = conn.execute("SELECT restart_lsn::text FROM pg_replication_slots "
                                          "WHERE slot_name = 's'").fetchone()
                if parse_lsn(written) - parse_lsn(restart) < 48 * MB:
                    break
                assert time.monotonic() < deadline, (start, restart, written)
                busy.execute("CHECKPOINT")
                time.sleep(0.5)
            assert worst not in ("unreserved", "lost") and _wal_state(conn, "s")[0] != "lost"
            conn.execute("INSERT INTO t VALUES (2, 'after')")
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    mirror(spark, config, once=True)
    from deltalake import DeltaTable

    assert sorted(DeltaTable(str(target / "public" / "t")).to_pyarrow_table().column("id").to_pylist()) == [1, 2]


@pytest.mark.parametrize("kind", ["test_decoding", "physical"])
def test_a_slot_of_another_kind_is_a_config_error_that_says_what_it_is(pg, tmp_path, capsys, kind):
    """Issue 47: a test_decoding or a physical slot under the mirror's slot name was exit 3 with "uses the
    None plugin": a restart cannot fix it, and the message did not say what the slot is."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        if kind == "physical":
            conn.execute("SELECT pg_create_physical_replication_slot('s')")
        else:
            conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
    argv = ["mirror", "--dsn", pg.dsn, "--slot", "s", "--publication", "p", "--target", str(tmp_path / "d"), "--once"]
    assert cli_main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    said = "is a physical replication slot" if kind == "physical" else "decodes with the 'test_decoding' plugin"
    assert said in err and "None" not in err and "Traceback" not in err, err
    with pg.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot('s')")


def test_a_target_pointed_at_a_new_slot_says_the_old_one_still_holds_wal(pg, spark, tmp_path, caplog):
    """Issue 47: a target pointed at a new slot re-copied everything and left the old slot holding WAL,
    with no word. The copy again is right (the new slot's stream starts at its own snapshot); the old
    slot is named, with the statement that drops it."""
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="first", publication="p"),
                          target=TargetSettings(path=str(tmp_path / "d")))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        mirror(spark, config, once=True)
        moved = config.model_copy(update={"source": SourceSettings(dsn=pg.dsn, slot="second", publication="p")})
        with caplog.at_level(logging.WARNING, logger="applier.drivers.mirror"):
            mirror(spark, moved, once=True)
        assert any("mirrored with slot first" in r.getMessage() and "pg_drop_replication_slot('first')"
                   in r.getMessage() for r in caplog.records), caplog.text
        conn.execute("SELECT pg_drop_replication_slot('first')")
