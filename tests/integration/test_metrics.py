"""A live mirror scraped over HTTP: /metrics moves with a workload (transactions, rows per table,
group commits, lag, the slot's WAL state) and /healthz answers 200 while it follows."""

from __future__ import annotations

import time
import urllib.request

import pytest
from background import Background, scrape_metrics

from applier.config import MetricsSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


@pytest.mark.parametrize("read_mode", ["replication", "sql"])
def test_a_running_mirror_serves_metrics_that_move_with_the_workload(pg, spark, tmp_path, read_mode):
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="mx", publication="p", read_mode=read_mode),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          metrics=MetricsSettings(port=0, host="127.0.0.1"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("INSERT INTO t VALUES (0, 'copied')")
        mirror: list[Mirror] = []

        def job(stop, progress) -> None:
            mirror.append(Mirror(spark, config, stop=stop, progress_every=0.5, progress=progress))
            mirror[0].run(once=False)

        with Background(job, seconds=180).running() as bg:
            # the workload starts once the copy is taken: rows written before the slot's point are copied,
            # not streamed, and the stream's metrics would never count them
            bg.wait_for(lambda: mirror and mirror[0].metrics_port is not None
                        and mirror[0].summary.snapshot_lsn is not None, "the initial copy")
            port = mirror[0].metrics_port
            assert port is not None
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
                assert health.status == 200
            for i in range(1, 21):  # 20 transactions of one row each
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
            values: dict[str, float] = {}

            def scraped(condition) -> bool:
                values.update(scrape_metrics(port))
                return condition(values)

            bg.wait_for(lambda: scraped(lambda v: v.get('applier_rows_total{table="public.t"}', 0) >= 20),
                        "20 rows counted")
            assert values["applier_transactions_total"] >= 20
            assert values["applier_group_commits_total"] >= 1
            assert 1 <= values['applier_table_commits_total{table="public.t"}'] <= 20
            assert values["applier_group_commit_seconds_count"] == values["applier_group_commits_total"]
            assert values['applier_slot_wal_status{status="reserved"}'] == 1.0
            assert values["applier_slot_safe_wal_size_bytes"] == -1.0  # max_slot_wal_keep_size unlimited
            assert values["applier_last_progress_timestamp_seconds"] > time.time() - 60
            # the lag line (every 0.5 s) sets it
            bg.wait_for(lambda: scraped(lambda v: v["applier_lag_bytes"] <= 1 << 20), "the lag caught up")
            assert values['applier_copy_rows{table="public.t"}'] == 1.0  # the initial copy's one row
            assert 'applier_copy_rows_estimated{table="public.t"}' in values
            # the connection lost: the mirror reconnects by itself, counts it, and goes on applying
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND pid <> pg_backend_pid()")
            conn.execute("INSERT INTO t VALUES (21, 'after the reconnect')")  # (the dying walsender may send it)
            bg.wait_for(lambda: scraped(lambda v: v.get('applier_rows_total{table="public.t"}', 0) >= 21 and v.get(
                'applier_errors_total{category="unavailable",kind="reconnect"}', 0) >= 1), "the reconnect")
            conn.execute("INSERT INTO t VALUES (22, 'after the reconnect')")
            bg.wait_for(lambda: scraped(lambda v: v.get('applier_rows_total{table="public.t"}', 0) >= 22),
                        "a row after the reconnect")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
                assert health.status == 200
