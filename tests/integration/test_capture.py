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


@pytest.mark.usefixtures("replay_path")
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
