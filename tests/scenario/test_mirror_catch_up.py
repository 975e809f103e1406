"""A mirror's backlog caught up on Spark's executors (applier.drivers.backlog): the driver reads and
surveys the stream, executors decode and fold ranges of it, the driver commits them, and the same
stream is then followed on the driver. Each case ends equal to Postgres, row by row: the random
workloads (TOAST, key changes, truncates, schema changes, streamed and two-phase transactions), a
prepared transaction left open in the backlog (no cut after it: the apply loop takes the rest), a
column added with a default inside the backlog (its existing rows must be filled first: the
driver path takes over from that group), and a table that joined the publication."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, DistributedSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sources.sql_slot import peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

CASES = {
    "proto2-streaming": dict(proto_version=2, streaming="on"),
    "proto3-two-phase": dict(proto_version=3, streaming="on", two_phase=True),
}


def _config(pg, target: Path, publication: str, folds: str = "executors", reader: str = "auto",
            **source: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="m", publication=publication, **source),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=9, max_group_seconds=1.0),
                        distributed=DistributedSettings(mode="on", partition_messages=37, backlog_folds=folds,
                                                        backlog_reader=reader))


#: the line of a catch-up that reads a copy of the slot (applier.sources.slotcopy), not the walsender
FROM_A_COPY = "read from a temporary copy of slot"


def _assert_equal(spark, conn, target: Path, tables: list[tuple[str, str]]) -> None:
    for r in verify_against_postgres(spark, conn, str(target), tables):
        assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


def _sixty_rows_copied(spark, conn, config: MirrorConfig, table: str, columns: str, value: str,
                       publication: str) -> None:
    """``table (id int PRIMARY KEY, <columns>)`` with 60 rows (``value``, an expression of ``g``), published
    by ``publication`` and copied by the mirror's first run."""
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})")
    conn.execute(f"INSERT INTO {table} SELECT g, {value} FROM generate_series(1, 60) g")
    conn.execute(publication)
    mirror(spark, config, once=True)


def _executor_lines(lines: list[str], folds: str = "executors") -> list[str]:
    where = "on executors" if folds == "executors" else "on the driver"
    return [line for line in lines if line.startswith(f"catch-up {where}:")]


@pytest.mark.parametrize(("case", "folds", "reader"), [*((c, f, "auto") for f in ("executors", "driver")
                                                           for c in sorted(CASES)),
                                                         ("proto2-streaming", "driver", "walsender")])
def test_a_backlog_caught_up_on_executors_equals_postgres(pg, spark, tmp_path, case, folds, reader):
    """Folded on Spark's executors, or in the mirror's process (``distributed.backlog_folds: driver``, the
    default on a local Spark): the same ranges, combined and committed alike. Read from a temporary copy
    of the slot (``distributed.backlog_reader: auto``; a two-phase slot's backlog from the walsender), or
    from the walsender."""
    two_phase = bool(CASES[case].get("two_phase"))
    target = tmp_path / "delta"
    config = _config(pg, target, "rw_pub", folds, reader, **CASES[case])
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        random_workload(conn, 21, transactions=15)
        assert mirror(spark, config, once=True).snapshot_lsn is not None

        random_workload(conn, 22, transactions=50, prepared=two_phase)  # the backlog
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        lines: list[str] = []
        summary = mirror(spark, config, once=True, progress=lines.append)
        done = _executor_lines(lines, folds)
        assert len(done) == 1 and " 0 ranges" not in done[0], lines
        assert any(FROM_A_COPY in line for line in lines) == (reader == "auto" and not two_phase), lines
        print("\n".join(lines))
        assert summary.transactions >= 40
        if two_phase:  # one prepared transaction is left open: the apply loop holds it, and the rest
            conn.execute("COMMIT PREPARED 'rw-22-3'")
            mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, TABLES)
        if two_phase:
            return

        random_workload(conn, 23, transactions=30)  # a second backlog, on the same target
        conn.execute("INSERT INTO rw_bag VALUES (-2, 'last')")
        lines.clear()
        mirror(spark, config, once=True, progress=lines.append)
        assert _executor_lines(lines, folds), lines
        _assert_equal(spark, conn, target, TABLES)
        assert mirror(spark, config, once=True).transactions == 0  # everything confirmed, nothing re-applied


def test_a_transaction_open_at_the_end_of_a_backlog_read_from_a_copy_comes_whole_afterwards(pg, spark, tmp_path):
    """The copy of the slot is read without streaming (applier.sources.slotcopy): a big transaction still
    open when the mirror starts is not in what it reads, though a walsender would have streamed part of
    it (64kB logical_decoding_work_mem), and the slot is advanced past where it began, to the server's
    flush position. Once it commits, the next run gets it whole. The copy is gone after each run."""
    target = tmp_path / "delta"
    config = _config(pg, target, "rw_pub", "driver", proto_version=2, streaming="on")
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CREATE TABLE rw_open (id int PRIMARY KEY, v text)")  # (the workload truncates its own)
        conn.execute("ALTER PUBLICATION rw_pub ADD TABLE rw_open")
        random_workload(conn, 41, transactions=10)
        mirror(spark, config, once=True)
        random_workload(conn, 42, transactions=30)
        with psycopg.connect(pg.dsn) as opened:
            opened.execute("INSERT INTO rw_open SELECT g, 'open ' || g FROM generate_series(1, 3000) g")
            random_workload(conn, 43, transactions=20)
            lines: list[str] = []
            summary = mirror(spark, config, once=True, progress=lines.append)
            assert any(FROM_A_COPY in line for line in lines), lines
            assert summary.transactions >= 40, lines
            slots = conn.execute("SELECT slot_name, confirmed_flush_lsn, pg_current_wal_flush_lsn() "
                                 "FROM pg_replication_slots").fetchall()
            assert [name for name, _, _ in slots] == ["m"], slots  # the temporary copy is gone
            _assert_equal(spark, conn, target, [*TABLES, ("public", "rw_open")])  # without the open transaction
            opened.commit()
        summary = mirror(spark, config, once=True)
        assert summary.transactions >= 1
        _assert_equal(spark, conn, target, [*TABLES, ("public", "rw_open")])
        assert conn.execute("SELECT count(*) FROM rw_open").fetchone() == (3000,)
        assert mirror(spark, config, once=True).transactions == 0


@pytest.mark.parametrize("reader", ["auto", "walsender"])
def test_changes_before_a_rename_whose_name_is_reused_reach_the_renamed_tables_delta_table(pg, spark, tmp_path,
                                                                                           reader):
    """A table changed, then renamed, and its name given to a new table, all inside the backlog. The run's
    table sync meets the new table in the catalog before the stream reaches the rename: it follows the
    rename (the old table's Delta table moves) and copies the new table under the old name. The ranges
    are folded by name: the changes from before the rename, described under the old name, led to the new
    table's Delta table and were left out as older than its copy (found by the schema walks, seeds 5 and
    6 at 150 steps). Such a range goes to the driver path, which follows relations, not names."""
    target = tmp_path / "delta"
    config = _config(pg, target, "reuse_pub", "driver", reader=reader, proto_version=2, streaming="on")
    with pg.connect() as conn:
        _sixty_rows_copied(spark, conn, config, "items", "v text", "'v' || g",
                           "CREATE PUBLICATION reuse_pub FOR TABLES IN SCHEMA public")
        for i in range(1, 61):  # transactions of their own: ranges (of 37 messages) are cut between them
            if i % 7 == 0:
                conn.execute("DELETE FROM items WHERE id = %s", (i,))
            elif i % 3 == 0:
                conn.execute("UPDATE items SET v = 'changed' WHERE id = %s", (i,))
        conn.execute("INSERT INTO items VALUES (100, 'new')")
        conn.execute("ALTER TABLE items RENAME TO items_old")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, w int)")
        conn.execute("INSERT INTO items SELECT g, g FROM generate_series(1, 5) g")
        lines: list[str] = []
        mirror(spark, config, once=True, progress=lines.append)
        assert any("items is a new table" in line for line in lines), lines  # the table sync ran first
        _assert_equal(spark, conn, target, [("public", "items_old"), ("public", "items")])
        conn.execute("UPDATE items_old SET v = 'later' WHERE id < 10; UPDATE items SET w = -w")
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "items_old"), ("public", "items")])


@pytest.mark.parametrize(("reader", "in_one_transaction"), [("auto", False), ("walsender", True)])
def test_a_row_last_changed_before_a_column_rename_in_the_backlog_keeps_its_value(pg, spark, tmp_path, reader,
                                                                                  in_one_transaction):
    """A column renamed inside the backlog, with rows whose last change came before it. A range's fold sees
    a column dropped and another added (only the driver's catalog proves a rename), and such a row came out
    NULL in the renamed column (found by the schema walks, seed 5 at 150 steps). The survey now ends the
    ranges at the rename: the driver path takes it and the rest."""
    target = tmp_path / "delta"
    config = _config(pg, target, "cr_pub", "driver", reader=reader, proto_version=2, streaming="on")
    with pg.connect() as conn:
        _sixty_rows_copied(spark, conn, config, "cr", "c5 numeric", "g", "CREATE PUBLICATION cr_pub FOR TABLE cr")
        for i in range(1, 40):  # transactions of their own: ranges (of 37 messages) are cut between them
            conn.execute("UPDATE cr SET c5 = c5 + 1000 WHERE id = %s", (i,))
        with conn.transaction() if in_one_transaction else contextlib.nullcontext():
            conn.execute("UPDATE cr SET c5 = -1 WHERE id = 12")  # its last change
            conn.execute("ALTER TABLE cr RENAME COLUMN c5 TO r27")
            conn.execute("UPDATE cr SET id = 112, r27 = -3 WHERE id = 13")
        for i in range(16, 55):
            conn.execute("UPDATE cr SET r27 = r27 + 1 WHERE id = %s", (i,))
        mirror(spark, config, once=True)
        _assert_equal(spark, conn, target, [("public", "cr")])
        assert conn.execute("SELECT r27 FROM cr WHERE id = 12").fetchone() == (-1,)


def test_a_column_with_a_default_added_inside_the_backlog_hands_over_to_the_driver_path(pg, spark, tmp_path,
                                                                                       caplog):
    """ADD COLUMN ... DEFAULT in the backlog: the existing rows' values are not in the stream, so the
    table's rows must be filled with the default (a constant, from the catalog) before the group
    holding the new column commits. The executors' groups before it commit; from that group on the
    driver path applies (and fills; a volatile default would copy the table again)."""
    target = tmp_path / "delta"
    config = _config(pg, target, "ac_pub")
    tables = [("public", "plain"), ("public", "constant")]
    with pg.connect() as conn:
        for name in ("plain", "constant"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION ac_pub FOR TABLE plain, constant")
        mirror(spark, config, once=True)
        for i in range(1, 120):
            conn.execute("UPDATE plain SET v = v || '+' WHERE id = %s", (i % 50 + 1,))
            conn.execute("INSERT INTO constant (id, v) VALUES (%s, 'after')", (1000 + i,))
            if i == 70:
                conn.execute("ALTER TABLE plain ADD COLUMN n int")  # no default: no copy needed
            if i == 80:
                conn.execute("ALTER TABLE constant ADD COLUMN d int DEFAULT 42")
        lines: list[str] = []
        caplog.set_level(logging.INFO, logger="applier.drivers.executors")
        summary = mirror(spark, config, once=True, progress=lines.append)
        assert _executor_lines(lines), lines
        assert "public.constant gained columns ['d']" in caplog.text  # the executors' part ended there
        assert summary.synced_rows == {}, (summary.synced_rows, lines)  # filled from the catalog, not copied
        assert any("filled with it from the catalog" in line for line in lines), lines
        _assert_equal(spark, conn, target, tables)
        assert mirror(spark, config, once=True).transactions == 0


def test_killed_inside_a_catch_up_on_executors_and_restarted_ends_equal(pg, spark, tmp_path):
    """SIGKILL between two tables' commits of a group folded on executors, and after all of the
    catch-up's commits but before the slot is confirmed; each restart catches up again from the
    slot's confirmed position, and what a table already holds is left out of the new folds. Only the
    killed runs are processes of their own (the CLI); the first copy and the last run use the tests'
    Spark session, as the CLI's run does (same config)."""
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    source = {"slot": "k", "publication": "rw_pub", "proto_version": 2, "streaming": "on"}
    settings = {
        "source": source,
        "target": {"path": str(target)},
        "apply": {"max_group_transactions": 5},
        "distributed": {"mode": "on", "partition_messages": 37, "backlog_folds": "executors"},
    }
    config.write_text(yaml.safe_dump(settings))
    in_process = MirrorConfig.model_validate({**settings, "source": {**source, "dsn": pg.dsn}})
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("APPLIER_CRASH_AT", None)
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        random_workload(conn, 31, transactions=10)
        assert mirror(spark, in_process, once=True).snapshot_lsn is not None
        for run, (point, hit) in enumerate([("between_tables", 5), ("before_confirm", 1)]):
            random_workload(conn, 32 + run, transactions=20)
            killed = subprocess.run(command, env={**env, "APPLIER_CRASH_AT": f"{point}:{hit}"},
                                    capture_output=True, text=True, timeout=600)
            output = killed.stdout + killed.stderr
            assert killed.returncode == -signal.SIGKILL, (point, output[-3000:])
            assert "on Spark's executors" in output and "catch-up on executors:" not in output, output[-3000:]
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        lines: list[str] = []
        mirror(spark, in_process, once=True, progress=lines.append)
        assert _executor_lines(lines), lines  # the restart caught up on executors too
        _assert_equal(spark, conn, target, TABLES)
        # everything confirmed: the slot would send a next run nothing (read without consuming it; a
        # restarted mirror applying nothing again is tested in process above)
        pending = list(peek(conn, "k", pgoutput_options("rw_pub", proto_version=2, streaming="on")))
        assert pending == [], pending[:5]


BURST = """
CREATE TABLE fb_keyed (id int PRIMARY KEY, v text NOT NULL, n int NOT NULL);
CREATE TABLE fb_bag (v text);
CREATE PUBLICATION fb_pub FOR TABLE fb_keyed, fb_bag;
CREATE PROCEDURE fb_burst(first int, last int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN first..last LOOP  -- one small transaction per step, as an OLTP load makes them
    INSERT INTO fb_keyed VALUES (i % 700, 'v' || i, 0) ON CONFLICT (id) DO UPDATE SET n = fb_keyed.n + 1;
    UPDATE fb_keyed SET v = v || '+', n = n + 1 WHERE id = (i * 7) % 700;
    IF i % 5 = 0 THEN DELETE FROM fb_keyed WHERE id = (i * 3) % 700; END IF;
    IF i % 11 = 0 THEN UPDATE fb_keyed SET id = 1000 + i WHERE id = (i * 13) % 700; END IF;
    IF first < 10000 THEN INSERT INTO fb_bag VALUES ('b' || i % 3); END IF;  -- keyless: the reference fold
    COMMIT;
  END LOOP;
END $$;
"""


def test_a_mirror_that_falls_behind_while_following_catches_up_in_ranges(pg, spark, tmp_path):
    """``distributed.follow_backlog_mb`` (its default): a following mirror (not ``--once``) that a burst
    of small transactions leaves behind the server (messages arriving for 0.25 s without a pause, the
    server 64 kB ahead) catches the backlog up in ranges folded on the driver, then follows on; what it
    applied, before, during and after, equals Postgres. The loop's catalog is rebuilt from the ranges'
    JSON there: the same schema must not read as a change (``schema_changes: stop`` would stop the
    mirror). WAL of a table outside the publication flows all the while and after: once caught up the
    rounds stop, and that WAL is confirmed. Between the two bursts the server closes the connection the
    rounds ask the publication on; they go on with a new one."""
    from background import Background

    target = tmp_path / "delta"
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="fb", publication="fb_pub"),
                          target=TargetSettings(path=str(target)),
                          apply=ApplySettings(max_group_seconds=0.2, schema_changes="stop"),
                          distributed=DistributedSettings(backlog_folds="driver"))
    tables = [("public", "fb_keyed"), ("public", "fb_bag")]
    with pg.connect() as conn:
        conn.execute(BURST)
        conn.execute("CALL fb_burst(1, 50)")  # copied by the snapshot
        job = Background(lambda stop, progress: mirror(spark, config, stop=stop, progress=progress), seconds=300)

        def confirmed_past(flush: str) -> bool:
            row = conn.execute("SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = 'fb'",
                               (flush,)).fetchone()
            return bool(row and row[0])

        with job.running():
            job.wait_for(lambda: conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0],
                         "the mirror's slot")
            copied = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
            job.wait_for(lambda: confirmed_past(copied), "the mirror to follow its slot")
            others = threading.Event()
            other = threading.Thread(target=_unpublished_load, args=(pg.dsn, others))
            other.start()  # WAL of a table not published goes on while the bursts run, and after them
            try:
                conn.execute("CALL fb_burst(51, 12050)")  # ~48k changes, MiBs of WAL
                flush = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                job.wait_for(lambda: confirmed_past(flush), "the mirror to catch up the first burst")
                # the connection that asks before each round's commit is kept between rounds: the server
                # closing it (a restart, idle_session_timeout) costs the next round nothing but a new one
                killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                      "WHERE application_name = 'applier tablesync'").fetchone()[0]
                assert killed == 1
                conn.execute("CALL fb_burst(12051, 24050)")
                flush = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                job.wait_for(lambda: confirmed_past(flush), "the mirror to catch up")
                # caught up, with only WAL that is not ours coming: rounds stop (nothing of ours in one),
                # and the loop confirms that WAL as it follows
                time.sleep(1.5)
                rounds = _rounds(job.lines)
                time.sleep(3)
                assert _rounds(job.lines) == rounds, job.lines[-6:]
                later = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                job.wait_for(lambda: confirmed_past(later), "the WAL that is not ours to be confirmed")
            finally:
                others.set()
                other.join()
        assert rounds and _executor_lines([line.split(" ", 1)[1] for line in job.lines], "driver"), job.lines
        assert not [line for line in job.lines if "connection lost" in line]  # (a new session: 1 s and a re-read)
        _assert_equal(spark, conn, target, tables)


def _rounds(lines: list[str]) -> int:
    """The rounds a following mirror started (a progress line each)."""
    return sum("behind while following" in line for line in lines)


def _unpublished_load(dsn: str, stop: threading.Event) -> None:
    """Rows into a table no publication holds, until ``stop``: WAL the mirror's slot reads past."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fb_other (v int)")
        while not stop.is_set():
            conn.execute("INSERT INTO fb_other SELECT g FROM generate_series(1, 500) g")
            stop.wait(0.01)
