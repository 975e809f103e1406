"""`applier capture` drains a slot into a Delta raw log exactly once; `replay` of that log rebuilds
tables equal to Postgres. A crash between the Delta commit and the slot advance is simulated by
failing the advance once: the next capture must store nothing twice."""

from __future__ import annotations

import pytest
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import verify_against_postgres
from applier.config import CaptureConfig, ReplayConfig, SourceSettings, TargetSettings
from applier.drivers.capture import capture
from applier.drivers.replay import replay_log
from applier.errors import SourceError
from applier.sources import sql_slot
from applier.sources.rawlog import read_raw_log

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


# On the driver path only (not conftest ``replay_path``): the captured log's catalog notes record the
# workload's ALTER TABLEs, so its replay never folds on executors (applier.drivers.executors.eligibility:
# recorded_schema_changes; test_stored_log_ddl checks that routing), and an executors run would repeat this one.
def test_capture_then_replay_equals_postgres_even_after_a_crash_before_the_advance(pg, spark, tmp_path,
                                                                                   monkeypatch):
    log = tmp_path / "raw-log"
    cfg = CaptureConfig(source=SourceSettings(dsn=pg.dsn, slot="c", publication="rw_pub", proto_version=2,
                                              streaming="on"),
                        log_path=str(log), batch_changes=50)
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        capture(spark, cfg)  # creates the slot: the history starts here
        random_workload(conn, 31, transactions=25)
        first = capture(spark, cfg)
        assert first.messages > 0 and first.rounds >= 2  # small rounds: many Delta commits

        random_workload(conn, 32, transactions=15)
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")
        real_advance = sql_slot.advance

        def crash_once(*args, **kwargs):
            monkeypatch.setattr(sql_slot, "advance", real_advance)
            raise SourceError("simulated crash after the Delta commit, before the slot advance")

        monkeypatch.setattr(sql_slot, "advance", crash_once)
        with pytest.raises(SourceError, match="simulated crash"):
            capture(spark, cfg)
        again = capture(spark, cfg)
        assert again.skipped_already_stored > 0  # re-sent rows were recognised and not stored twice
        assert capture(spark, cfg).messages == 0  # drained

        stored = list(read_raw_log(log))
        seqs = spark.read.format("delta").load(str(log)).orderBy("seq").select("lsn", "data").collect()
        assert [(r.lsn, bytes(r.data)) for r in seqs] == [(f"{m.lsn >> 32:X}/{m.lsn & 0xFFFFFFFF:X}", m.data)
                                                          for m in stored]  # seq order == log order
        target = tmp_path / "delta"
        replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target))))
        for result in verify_against_postgres(spark, conn, str(target), TABLES):
            assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])


def test_a_quiet_publication_holds_no_wal_and_a_following_capture_serves_metrics(pg, spark, tmp_path):
    """Other tables keep writing while the published one is idle: the drained slot is advanced to the
    server's position, so it does not hold their WAL. ``metrics.port`` serves the capture's numbers."""
    import re
    import urllib.request

    from background import Background

    from applier.config import MetricsSettings
    from applier.lsn import parse_lsn

    log = tmp_path / "raw-log"
    cfg = CaptureConfig(source=SourceSettings(dsn=pg.dsn, slot="q", publication="qp"), log_path=str(log),
                        metrics=MetricsSettings(port=0, host="127.0.0.1"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE pub (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE busy (id int, pad text)")  # not published
        conn.execute("CREATE PUBLICATION qp FOR TABLE pub")
        capture(spark, cfg)  # creates the slot
        conn.execute("INSERT INTO busy SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g")
        (flushed,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        capture(spark, cfg)
        (confirmed,) = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                    "WHERE slot_name = 'q'").fetchone()
        assert parse_lsn(confirmed) >= parse_lsn(flushed)  # the busy table's ~10 MB are not held

        def follow(stop, progress) -> None:
            capture(spark, cfg, once=False, progress=progress, stop=stop, poll_seconds=0.2)

        with Background(follow).running() as bg:
            bg.wait_for(lambda: any("metrics at" in line for line in bg.lines), "the metrics server")
            found = re.search(r":(\d+)/metrics", next(ln for ln in bg.lines if "metrics at" in ln))
            assert found is not None
            port = int(found.group(1))
            for i in range(5):
                conn.execute("INSERT INTO pub VALUES (%s)", (i,))
            text = ""

            def captured() -> float:
                nonlocal text
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                    text = response.read().decode()
                value = re.search(r"^applier_captured_messages_total (\S+)$", text, re.M)
                assert value is not None, text
                return float(value.group(1))

            bg.wait_for(lambda: captured() >= 15, "5 transactions of Begin, Insert, Commit stored")
            assert 'applier_slot_wal_status{status="reserved"} 1.0' in text
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
                assert health.status == 200
    assert sorted(m.lsn for m in read_raw_log(log)) == [m.lsn for m in read_raw_log(log)]
