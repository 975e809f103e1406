"""Faults on the way: each recovers by itself with bounded retries, or stops with an error that says
what to do; the slot is never confirmed past what Delta holds, and the tables end equal to Postgres.

Real parts only: the PostgreSQL server is restarted with pg_ctl, the walsender is terminated with
pg_terminate_backend, a slot is invalidated by max_slot_wal_keep_size, OPTIMIZE runs concurrently
in a second Spark session, and the spill directory is a 1 MiB tmpfs.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest
from background import captured_log
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.drivers.replay import replay_log
from applier.errors import SourceError, SpillError
from applier.lsn import parse_lsn

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _config(pg, target: Path, **source: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="f", publication="rw_pub", **source),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=5, max_group_seconds=0.5))


def _assert_equal(spark, pg, target: Path) -> None:
    with pg.connect() as conn:
        for r in verify_against_postgres(spark, conn, str(target), TABLES):
            assert r.equal, (r.source_name, r.source_rows, r.target_rows, r.only_in_source[:3], r.only_in_target[:3])


class MirrorThread:
    """A continuous mirror in a thread (stopped like Ctrl-C stops it), its progress lines kept."""

    def __init__(self, spark, config: MirrorConfig) -> None:
        self.stop = threading.Event()
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(spark, config), daemon=True)

    def _run(self, spark, config) -> None:
        try:
            mirror(spark, config, stop=self.stop, progress=self.lines.append)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def __enter__(self) -> MirrorThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive()


def _wait_caught_up(pg, slot: str, m: MirrorThread, *, timeout: float = 180) -> None:
    """Until the slot's confirmed position reaches the server's flush position as of now."""
    with pg.connect() as conn:
        (tip,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and m.thread.is_alive():
        try:
            with pg.connect() as conn:
                row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                   (slot,)).fetchone()
            if row and row[0] and parse_lsn(row[0]) >= parse_lsn(tip):
                return
        except psycopg.OperationalError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the mirror did not catch up to {tip} in {timeout}s: {m.error!r}; {m.lines[-8:]}")


def _wait_for_slot(pg, slot: str, *, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with pg.connect() as conn:
            if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                            (slot,)).fetchone():
                return
        time.sleep(0.3)
    raise AssertionError("the mirror never started streaming")


@pytest.mark.parametrize("fault", ["server_restart", "walsender_terminated"])
def test_mirror_rides_out_a_server_restart_and_a_dropped_connection(pg, spark, tmp_path, fault):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        random_workload(conn, seed=11, transactions=6)
    cfg = _config(pg, target, read_mode="replication", proto_version=2, streaming="on")
    with MirrorThread(spark, cfg) as m:
        _wait_for_slot(pg, "f")
        with pg.connect() as conn:
            random_workload(conn, seed=12, transactions=6)
        if fault == "server_restart":  # a crash and recovery, while the mirror is applying
            pg.cluster.restart("immediate")
        else:
            with pg.connect() as conn:
                killed = conn.execute("SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots "
                                      "WHERE slot_name = 'f' AND active").fetchone()[0]
            assert killed == 1
        with pg.connect() as conn:
            random_workload(conn, seed=13, transactions=6)
        _wait_caught_up(pg, "f", m)
    assert m.error is None, m.error
    assert any("reconnecting in" in line for line in m.lines), m.lines
    _assert_equal(spark, pg, target)


def test_invalidated_slot_stops_with_the_way_back_and_the_way_back_works(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CREATE TABLE filler (id int)")
        random_workload(conn, seed=21, transactions=10)
        mirror(spark, _config(pg, target, read_mode="sql"), once=True)
        random_workload(conn, seed=22, transactions=10)  # not mirrored before the slot is lost
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            for _ in range(4):
                conn.execute("INSERT INTO filler VALUES (1)")
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            (status,) = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'f'").fetchone()
            assert status == "lost", status
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
        with pytest.raises(SourceError, match="can no longer be read") as info:
            mirror(spark, _config(pg, target, read_mode="sql"), once=True)
        assert "pg_drop_replication_slot('f')" in str(info.value)
        # The way back the error gives: drop the slot, run again (new slot, new snapshot).
        conn.execute("SELECT pg_drop_replication_slot('f')")
        lines: list[str] = []
        mirror(spark, _config(pg, target, read_mode="sql"), once=True, progress=lines.append)
        assert any("is gone" in line for line in lines), lines
    _assert_equal(spark, pg, target)


def _captured_log(pg, tmp_path: Path, value_column: str, statements: list[str]) -> Path:
    """Table k (id key + ``value_column``), published and slotted, the statements run, the slot's
    messages stored as a raw log."""
    return captured_log(pg, tmp_path, f"CREATE TABLE k (id int PRIMARY KEY, {value_column})", statements)


@pytest.mark.parametrize("engine", ["spark", "auto"])
def test_delta_conflicts_with_a_concurrent_optimize_are_retried(pg, spark, tmp_path, caplog, engine):
    """Spark's MERGE meets the concurrent OPTIMIZE's commits as conflicts and is retried; delta-rs's
    commits (``auto``) are checked by its own conflict checker (a conflict it cannot resolve is a
    CommitFailedError, retried the same way). Either way the table ends equal to Postgres."""
    target = tmp_path / "delta"
    log = _captured_log(pg, tmp_path, "v int", ["INSERT INTO k SELECT g, 0 FROM generate_series(1, 200) g"]
                        + [f"UPDATE k SET v = v + 1 WHERE id % 8 = {i % 8}" for i in range(8)])
    cfg = ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                       apply=ApplySettings(grouping="transaction", merge_engine=engine))
    other = spark.newSession()  # a concurrent writer: its own SQL conf, so none of our txnAppId settings
    done = threading.Event()
    optimized = [0]
    table = target / "public" / "k"

    def conflicted() -> bool:  # once a retry happened, the compactions only cost time (backoff doubles)
        return any("Delta commit conflict" in r.getMessage() for r in caplog.records)

    def optimize_loop() -> None:
        from delta.tables import DeltaTable

        while not done.is_set() and not conflicted():
            if (table / "_delta_log").is_dir():
                try:
                    DeltaTable.forPath(other, str(table)).optimize().executeCompaction()
                    optimized[0] += 1
                except Exception:  # noqa: BLE001 - the optimizer's own conflicts are not under test
                    pass
            time.sleep(0.05)

    caplog.set_level(logging.WARNING, logger="applier.sink.conflicts")
    worker = threading.Thread(target=optimize_loop, daemon=True)
    worker.start()
    try:
        replay_log(spark, cfg)
    finally:
        done.set()
        worker.join(60)
    assert optimized[0] > 0
    _assert_k_equal(spark, pg, target, rows=200)
    conflicts = [r for r in caplog.records if "Delta commit conflict" in r.getMessage()]
    if engine == "spark":
        assert conflicts, "no conflict happened: the test did not exercise the retry"


def _assert_k_equal(spark, pg, target: Path, *, rows: int) -> None:
    with pg.connect() as conn:
        [r] = verify_against_postgres(spark, conn, str(target), [("public", "k")])
        assert r.equal and r.source_rows == rows, (r.only_in_source[:3], r.only_in_target[:3])


@pytest.fixture
def tiny_spill_dir(tmp_path):
    """A 1 MiB tmpfs: a real full disk for the spill files."""
    mount = tmp_path / "spill"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs for the disk-full test: {done.stderr!r}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_in_the_spill_directory_stops_cleanly_and_resumes(pg, spark, tmp_path, tiny_spill_dir):
    target = tmp_path / "delta"
    log = _captured_log(pg, tmp_path, "v text", [
        "INSERT INTO k VALUES (0, 'first')",
        "INSERT INTO k SELECT g, repeat('x', 200) FROM generate_series(1, 30000) g"])  # ~7 MB of changes
    full = ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target), state_dir=str(tiny_spill_dir)),
                        apply=ApplySettings(memory_budget_mb=1))
    with pytest.raises(SpillError, match="cannot spill") as info:
        replay_log(spark, full)
    assert "memory_budget_mb" in str(info.value)
    df = spark.read.format("delta").load(str(target / "public" / "k"))
    assert [tuple(r) for r in df.collect()] == [(0, "first")]  # as after the last good transaction
    # More room (a state directory elsewhere): the run resumes and ends equal.
    ok = full.model_copy(update={"target": TargetSettings(path=str(target), state_dir=str(tmp_path / "state"))})
    replay_log(spark, ok)
    _assert_k_equal(spark, pg, target, rows=30001)


def test_an_idle_mirror_lets_unrelated_wal_be_recycled(pg, spark, tmp_path):
    """Nothing published changes, but the server writes plenty of WAL (an unpublished table): the
    mirror confirms the keepalive positions, so the slot does not hold that WAL back."""
    target = tmp_path / "delta"
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("CREATE TABLE unpublished (id int, pad text)")
        random_workload(conn, seed=31, transactions=5)
    with MirrorThread(spark, _config(pg, target, read_mode="replication")) as m:
        _wait_for_slot(pg, "f")
        with pg.connect() as conn:
            (start,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            for _ in range(6):  # ~48 MB of WAL nobody subscribed to
                conn.execute("INSERT INTO unpublished SELECT g, repeat('w', 900) FROM generate_series(1, 8000) g")
            (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            written = parse_lsn(end) - parse_lsn(start)
            assert written > 40 << 20
            retained: int | None = None
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                conn.execute("CHECKPOINT")  # logs running xacts: lets restart_lsn move with the confirmation
                confirmed, retained = conn.execute(
                    "SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
                    "FROM pg_replication_slots WHERE slot_name = 'f'").fetchone()
                if parse_lsn(confirmed) >= parse_lsn(end) and retained < 8 << 20:
                    break
                time.sleep(1)
            assert parse_lsn(confirmed) >= parse_lsn(end), (confirmed, end)
            assert retained is not None and retained < 8 << 20, \
                f"the idle slot still retains {retained} bytes of {written} written"
    assert m.error is None, m.error
    _assert_equal(spark, pg, target)
