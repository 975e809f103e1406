"""A live mirror scraped over HTTP: /metrics moves with a workload (transactions, rows per table,
group commits, lag, the slot's WAL state) and /healthz answers 200 while it follows."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from applier.config import MetricsSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.mark.parametrize("read_mode", ["replication", "sql"])
def test_a_running_mirror_serves_metrics_that_move_with_the_workload(pg, spark, tmp_path, read_mode):
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="mx", publication="p", read_mode=read_mode),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          metrics=MetricsSettings(port=0, host="127.0.0.1"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("INSERT INTO t VALUES (0, 'copied')")
        stop = threading.Event()
        lines: list[str] = []  # the mirror's progress, for a failure to say where it was
        runner = Mirror(spark, config, stop=stop, progress_every=0.5,
                        progress=lambda m: lines.append(f"{time.monotonic():.1f} {m}"))
        errors: list[BaseException] = []

        def run() -> None:
            try:
                runner.run(once=False)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            # the workload starts once the copy is taken: rows written before the slot's point are copied,
            # not streamed, and the stream's metrics would never count them
            while runner.metrics_port is None or runner.summary.snapshot_lsn is None:
                assert not errors and time.monotonic() < deadline, (errors, lines)
                time.sleep(0.1)
            port = runner.metrics_port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
                assert health.status == 200
            for i in range(1, 21):  # 20 transactions of one row each
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
            while True:
                values = _scrape(port)
                if values.get('applier_rows_total{table="public.t"}', 0) >= 20:
                    break
                assert not errors and time.monotonic() < deadline, (errors, values, lines)
                time.sleep(0.3)
            assert values["applier_transactions_total"] >= 20
            assert values["applier_group_commits_total"] >= 1
            assert 1 <= values['applier_table_commits_total{table="public.t"}'] <= 20
            assert values["applier_group_commit_seconds_count"] == values["applier_group_commits_total"]
            assert values['applier_slot_wal_status{status="reserved"}'] == 1.0
            assert values["applier_slot_safe_wal_size_bytes"] == -1.0  # max_slot_wal_keep_size unlimited
            assert values["applier_last_progress_timestamp_seconds"] > time.time() - 60
            while "applier_lag_bytes" not in values or values["applier_lag_bytes"] > 1 << 20:
                assert time.monotonic() < deadline, (values, lines)  # the lag line (every 0.5 s) sets it
                time.sleep(0.3)
                values = _scrape(port)
            assert values['applier_copy_rows{table="public.t"}'] == 1.0  # the initial copy's one row
            assert 'applier_copy_rows_estimated{table="public.t"}' in values
            # the connection lost: the mirror reconnects by itself, counts it, and goes on applying
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND pid <> pg_backend_pid()")
            conn.execute("INSERT INTO t VALUES (21, 'after the reconnect')")
            while (values.get('applier_rows_total{table="public.t"}', 0) < 21  # (the dying walsender may send it)
                   or values.get('applier_errors_total{category="unavailable",kind="reconnect"}', 0) < 1):
                assert not errors and time.monotonic() < deadline + 60, (errors, values, lines)
                time.sleep(0.3)
                values = _scrape(port)
            conn.execute("INSERT INTO t VALUES (22, 'after the reconnect')")
            while values.get('applier_rows_total{table="public.t"}', 0) < 22:
                assert not errors and time.monotonic() < deadline + 60, (errors, values, lines)
                time.sleep(0.3)
                values = _scrape(port)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
                assert health.status == 200
        finally:
            stop.set()
            thread.join(60)
        assert not errors, errors
