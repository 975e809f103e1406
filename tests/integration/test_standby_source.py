"""A hot standby as the source (PostgreSQL 16+ decodes logical replication there), with a real primary
and a real standby made by pg_basebackup: ``mirror`` (the copy under the standby's exported snapshot,
``--once``, following), ``status``, ``verify`` and ``capture`` take their positions from what the standby
has replayed (pg_current_wal_flush_lsn() is an error during recovery: every run used to exit 3), and the
mirror goes on, ending equal to Postgres, when that standby is promoted while the mirror follows it.

On PostgreSQL 17+ with failover slots: while ``synchronized_standby_slots`` names the physical slot of a
standby that is down, the server holds the mirror's changes back; the log says so and names that slot,
``mirror --once`` stops after ``source.standby_wait_seconds`` with exit 6 (never "caught up", never ahead
of the standby), and once the standby is back the mirror drains, and follows the promoted standby's
synchronized slot copy after a failover. ``proto_version: 4`` on PostgreSQL 15 is exit 2 before any slot.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from background import Background
from conftest import StandbyPair

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import ApplySettings, CaptureConfig, MirrorConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.capture import capture
from applier.drivers.mirror import Mirror, mirror
from applier.drivers.replay import replay_log
from applier.errors import ConfigError, HeldBackError
from applier.lsn import parse_lsn

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("public", "t"), ("public", "k")]
SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v text, n numeric);
CREATE TABLE k (a int, b text);
ALTER TABLE k REPLICA IDENTITY FULL;
CREATE PUBLICATION p FOR TABLE t, k;
"""



def _one(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """A query's one row (mypy: ``fetchone`` may give None)."""
    assert row is not None
    return row

def _step(conn: psycopg.Connection, i: int) -> None:
    """One step of the workload: inserts, an update, a key change, a delete, a key-less duplicate."""
    base = i * 100
    conn.execute("INSERT INTO t SELECT g, 'v' || g, g * 1.5 FROM generate_series(%s::int, %s::int) g",
                 (base, base + 20))
    conn.execute("UPDATE t SET v = v || '+', n = n + 1 WHERE id %% 3 = 0 AND id >= %s", (base,))
    conn.execute("UPDATE t SET id = id + 50 WHERE id = %s", (base + 1,))
    conn.execute("DELETE FROM t WHERE id = %s", (base + 2,))
    conn.execute("INSERT INTO k VALUES (%s, 'x'), (%s, 'x')", (i, i))
    conn.execute("DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE a = %s)", (i,))


def _assert_equal(spark, dsn: str, target: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for result in verify_against_postgres(spark, conn, str(target), TABLES, publication="p"):
            assert result.equal, (result.source_name, result.source_rows, result.target_rows,
                                  result.only_in_source[:3], result.only_in_target[:3])
            assert result.source_rows > 0


def _position(dsn: str) -> tuple[int, int]:
    """(the slot ``m``'s confirmed position, the server's own: replayed on a standby, flushed on a primary)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        (confirmed, server) = _one(conn.execute(
            "SELECT confirmed_flush_lsn::text, (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_flush_lsn() END)::text FROM pg_replication_slots WHERE slot_name = 'm'").fetchone())
    return parse_lsn(confirmed), parse_lsn(server)


def _applied_past(bg: Background, dsn: str, lsn: int, what: str) -> None:
    """Until the following mirror has confirmed ``lsn`` (it confirms only what Delta holds)."""
    bg.wait_for(lambda: _position(dsn)[0] >= lsn, what)


@pytest.mark.parametrize("major", [16, 18])
def test_a_standby_is_the_source_of_mirror_status_verify_and_capture_and_the_mirror_goes_on_after_its_promotion(
        standby_pairs, spark, tmp_path, capsys, major):
    pair: StandbyPair = standby_pairs(major)
    target, log = tmp_path / "delta", tmp_path / "raw-log"
    config = MirrorConfig(source=SourceSettings(dsn=pair.standby_dsn, slot="m", publication="p"),
                          target=TargetSettings(path=str(target)))
    capturing = CaptureConfig(source=SourceSettings(dsn=pair.standby_dsn, slot="c", publication="p"),
                              log_path=str(log))
    with psycopg.connect(pair.primary_dsn, autocommit=True) as primary, pair.logging_snapshots():
        primary.execute(SCHEMA)
        pair.replayed()
        capture(spark, capturing)  # its slot is made on the standby: the log starts here
        _step(primary, 1)
        pair.replayed()

        mirror(spark, config, once=True)  # the copy, under the snapshot the standby exported
        _assert_equal(spark, pair.standby_dsn, target)
        _step(primary, 2)
        pair.replayed()
        replayed = _position(pair.standby_dsn)[1]
        summary = mirror(spark, config, once=True)
        assert summary.transactions == 6 and summary.stopped_by.startswith("--once: reached")
        _assert_equal(spark, pair.standby_dsn, target)
        assert _position(pair.standby_dsn)[0] >= replayed  # drained up to what the standby replayed

        capsys.readouterr()
        assert cli_main(["status", "--target", str(target), "--dsn", pair.standby_dsn, "--slot", "m", "--json"]) == 0
        slot = json.loads(capsys.readouterr().out)["slot"]
        assert slot["standby"] is True and parse_lsn(slot["server_lsn"]) >= replayed and slot["held_back"] is None
        assert cli_main(["verify", "--dsn", pair.standby_dsn, "--target", str(target)]) == 0
        assert capture(spark, capturing).messages > 0  # drained up to what the standby replayed

        def follow(stop, progress) -> None:
            mirror(spark, config, stop=stop, progress=progress)

        with Background(follow, seconds=50).running() as bg:
            _step(primary, 3)
            pair.replayed()
            _applied_past(bg, pair.standby_dsn, _position(pair.standby_dsn)[1], "step 3 applied from the standby")
            pair.primary.halt("immediate")  # the primary is gone: the standby takes over
            with psycopg.connect(pair.standby_dsn, autocommit=True) as promoted:
                assert promoted.execute("SELECT pg_promote()").fetchone() == (True,)
                _step(promoted, 4)
                (flushed,) = _one(promoted.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone())
            _applied_past(bg, pair.standby_dsn, parse_lsn(flushed), "step 4 applied from the promoted standby")
    _assert_equal(spark, pair.standby_dsn, target)
    with psycopg.connect(pair.standby_dsn, autocommit=True) as promoted:
        _step(promoted, 5)
    assert mirror(spark, config, once=True).transactions == 6
    _assert_equal(spark, pair.standby_dsn, target)

    capture(spark, capturing)  # its slot lives on in the promoted server
    replayed_target = tmp_path / "replayed"
    replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(replayed_target)),
                                   apply=ApplySettings(schema_changes="evolve")))  # (a log has nothing to re-copy from)
    _assert_equal(spark, pair.standby_dsn, replayed_target)


def test_a_server_holding_changes_back_for_a_standby_says_so_and_a_drain_stops_with_exit_6(
        standby_pairs, spark, tmp_path, caplog, capsys):
    pair: StandbyPair = standby_pairs(18, primary_settings={"synchronized_standby_slots": "'standby1'"})
    target = tmp_path / "delta"

    def config(dsn: str, **source: object) -> MirrorConfig:
        return MirrorConfig(source=SourceSettings(dsn=dsn, slot="m", publication="p", failover=True,
                                                  standby_wait_seconds=2, **source),
                            target=TargetSettings(path=str(target)))

    with psycopg.connect(pair.primary_dsn, autocommit=True) as primary:
        primary.execute(SCHEMA)
        _step(primary, 1)
        mirror(spark, config(pair.primary_dsn), once=True)
        _step(primary, 2)
        mirror(spark, config(pair.primary_dsn), once=True)
        _assert_equal(spark, pair.primary_dsn, target)

        pair.standby.halt()  # the standby is down: the server holds the failover slot's changes back for it
        _step(primary, 3)
        for mode in ("replication", "sql"):
            caplog.clear()
            with caplog.at_level(logging.INFO):
                started = time.monotonic()
                with pytest.raises(HeldBackError) as held:
                    mirror(spark, config(pair.primary_dsn, read_mode=mode), once=True)
            assert time.monotonic() - started < 30
            assert for_exception(held.value) == ExitCode.HELD_BACK and int(ExitCode.HELD_BACK) == 6
            assert "standby1" in str(held.value) and "no standby connected" in str(held.value)
            said = caplog.text
            assert "holding changes of slot m back" in said and "standby1" in said and "caught up" not in said
            # nothing past what the standby confirmed reached Delta: the tables are as after step 2
            with psycopg.connect(pair.primary_dsn, autocommit=True) as check:
                (t_rows,) = _one(check.execute("SELECT count(*) FROM t WHERE id < 300").fetchone())
            results = {r.source_name: r for r in verify_against_postgres(
                spark, primary, str(target), TABLES, publication="p")}
            assert results["public.t"].target_rows == t_rows
            assert not results["public.t"].equal and results["public.t"].source_rows > t_rows

        capsys.readouterr()
        assert cli_main(["status", "--target", str(target), "--dsn", pair.primary_dsn, "--slot", "m"]) == 0
        out = capsys.readouterr().out
        assert "HELD BACK: the server is holding changes of slot m back" in out and "standby1" in out, out

        def follow(stop, progress) -> None:
            Mirror(spark, config(pair.primary_dsn), stop=stop, progress=progress, progress_every=0.5).run(once=False)

        with Background(follow, seconds=40).running() as bg:  # following waits, and says so in its lag line
            bg.wait_for(lambda: any("HELD BACK" in line and "standby1" in line for line in bg.lines),
                        "a lag line saying the server holds changes back")
            assert not any("caught up" in line for line in bg.lines), bg.lines[-5:]
            pair.standby.start()  # back: it catches up, and the server sends the changes again
            pair.replayed()
            (flushed,) = _one(primary.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone())
            _applied_past(bg, pair.primary_dsn, parse_lsn(flushed), "step 3 applied once the standby is back")
        _assert_equal(spark, pair.primary_dsn, target)

        # the check before promoting (docs/operations.md, "Failover"): the standby's copy is synced, not temporary.
        # Synced here by pg_sync_replication_slots(), not by sync_replication_slots' worker: a new slot's copy is
        # temporary until the primary's slot has moved past what the standby holds, and the worker, finding
        # nothing to sync meanwhile, backs off up to 30 s between tries
        _step(primary, 4)
        deadline = time.monotonic() + 30
        with psycopg.connect(pair.standby_dsn, autocommit=True) as standby:
            while True:
                primary.execute("SELECT pg_log_standby_snapshot()")  # a point the slot's positions can move to
                mirror(spark, config(pair.primary_dsn), once=True)
                (confirmed,) = _one(primary.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots "
                                               "WHERE slot_name = 'm'").fetchone())
                pair.replayed()
                standby.execute("SELECT pg_sync_replication_slots()")
                if standby.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'm' AND synced "
                                   "AND NOT temporary AND confirmed_flush_lsn >= %s", (confirmed,)).fetchone() == (1,):
                    break
                assert time.monotonic() < deadline, "the standby's copy of slot m was not synced"
            pair.primary.halt("immediate")  # the failover
            assert standby.execute("SELECT pg_promote()").fetchone() == (True,)
            _step(standby, 5)
            # the new primary has the old one's synchronized_standby_slots (pg_basebackup copied the config),
            # naming a slot it does not have: it holds the synced slot's changes back, and the mirror says so
            with pytest.raises(HeldBackError, match="standby1 \\(no such slot on this server\\)"):
                mirror(spark, config(pair.standby_dsn), once=True)
            standby.execute("ALTER SYSTEM SET synchronized_standby_slots = ''")
            standby.execute("SELECT pg_reload_conf()")
    assert mirror(spark, config(pair.standby_dsn), once=True).transactions == 6  # from the synced copy
    _assert_equal(spark, pair.standby_dsn, target)


def test_protocol_4_on_postgresql_15_is_a_config_error_before_any_slot(pg, spark, tmp_path):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
    source = SourceSettings(dsn=pg.dsn, slot="m", publication="p", proto_version=4, streaming="parallel")
    with pytest.raises(ConfigError) as refused:
        mirror(spark, MirrorConfig(source=source, target=TargetSettings(path=str(tmp_path / "d"))), once=True)
    assert for_exception(refused.value) == ExitCode.USAGE
    assert "proto_version 4 needs PostgreSQL 16" in str(refused.value) and "set source.proto_version to 3" \
        in str(refused.value)
    with pytest.raises(ConfigError, match="proto_version 4 needs PostgreSQL 16"):
        capture(spark, CaptureConfig(source=source, log_path=str(tmp_path / "log")))
    with pg.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
                            ).fetchone() == (0,)
    assert not (tmp_path / "d" / "public").exists()
