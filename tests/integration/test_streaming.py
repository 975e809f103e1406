"""Structured Streaming: the foreachBatch sink over a Delta raw log cut mid-transaction, and the
`pgoutput` data source over a live slot, each reach the same tables as `replay` (and Postgres)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.drivers.streaming import DeltaApplySink
from applier.lsn import format_lsn, parse_lsn
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _load_stream_job():
    spec = importlib.util.spec_from_file_location("stream_job", Path(__file__).parents[2] / "jobs" / "stream.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _workload_on_a_new_slot(conn, *, seed: int) -> None:
    conn.execute(SCHEMA)
    create_slot(conn, "s")
    random_workload(conn, seed, transactions=20)
    conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")  # ends with a commit: peek sees only flushed WAL


def _assert_equal(spark, conn, target) -> None:
    for result in verify_against_postgres(spark, conn, str(target), TABLES):
        assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])


def test_foreach_batch_sink_over_a_raw_log_cut_mid_transaction(pg, spark, tmp_path):
    log = tmp_path / "raw-log"
    target = tmp_path / "delta"
    checkpoint = tmp_path / "checkpoint"
    with pg.connect() as conn:
        _workload_on_a_new_slot(conn, seed=41)
        rows = [(format_lsn(m.lsn), m.xid, m.data, n)
                for n, m in enumerate(peek(conn, "s", pgoutput_options("rw_pub", proto_version=2,
                                                                         streaming="on")))]
        half = len(rows) // 2

        def append(part: list) -> None:  # 7 rows per Delta commit: transactions span micro-batches
            for i in range(0, len(part), 7):
                (spark.createDataFrame(part[i:i + 7], "lsn STRING, xid BIGINT, data BINARY, seq BIGINT")
                 .coalesce(1).write.format("delta").mode("append").save(str(log)))

        from applier.infra.metrics import MetricsServer, MirrorMetrics

        metrics = MirrorMetrics()  # what jobs/stream.py --metrics-port serves
        server = MetricsServer(metrics, 0, "127.0.0.1")

        def run_stream() -> None:
            sink = DeltaApplySink(str(target), metrics=metrics)
            query = (spark.readStream.format("delta").option("maxFilesPerTrigger", 3).load(str(log))
                     .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            assert query.exception() is None

        append(rows[:half])
        run_stream()
        append(rows[half:])
        run_stream()  # a restart from the checkpoint, with the tail of an open transaction saved
        _assert_equal(spark, conn, target)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        server.close()
        (applied,) = conn.execute("SELECT count(*) FROM rw_bag").fetchone()
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        commits = sum(1 for r in rows if bytes(r[2][:1]) in (b"C", b"c"))  # Commit, Stream Commit
        assert float(values["applier_transactions_total"]) == commits, (values, commits)
        assert float(values["applier_group_commits_total"]) >= 2  # a batch or more per run
        # a consistent cut after each micro-batch's group (issue 51): the newest at the log's last commit
        from applier.sink.cuts import CutLog

        cuts = CutLog(str(target)).cuts()
        last_commit = max(parse_lsn(r[0]) for r in rows if bytes(r[2][:1]) in (b"C", b"c"))
        assert len(cuts) >= 2 and all(c.commit_time is not None for c in cuts), cuts
        assert cuts[-1].lsn >= last_commit and cuts[-1].tables, cuts[-1]
        assert float(values["applier_cut_lsn"]) > 0
        assert float(values['applier_rows_total{table="public.rw_bag"}']) >= applied


def test_pgoutput_data_source_into_the_sink_equals_postgres(pg, spark, tmp_path):
    target = tmp_path / "delta"
    with pg.connect() as conn:
        _workload_on_a_new_slot(conn, seed=42)
        job = _load_stream_job()  # jobs/stream.py --slot --once, as spark-submit would run it
        args = job.parse_args(["--slot", "s", "--dsn", pg.dsn, "--publication", "rw_pub", "--target", str(target),
                               "--checkpoint", str(tmp_path / "checkpoint"), "--once", "--metrics-port", "0"])
        assert job.run(spark, args) == 0
        _assert_equal(spark, conn, target)
        # The slot advanced over every applied commit: nothing is left for it to send. (Comparing with
        # pg_current_wal_flush_lsn() is wrong: background WAL such as running-xacts records follows.)
        assert list(peek(conn, "s", pgoutput_options("rw_pub"))) == []
