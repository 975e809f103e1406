"""The one apply loop: what happens after a group is the same for every driver.

The Structured Streaming sink used to run its own copy of the loop and had drifted (no messages
table, automatic garbage collection during a batch); these tests hold it to what replay does, on a
stream captured from a real server."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.drivers.streaming import DeltaApplySink
from applier.errors import SinkError
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Truncate
from applier.sink.idempotence import applied_version
from applier.sink.spec import app_id_for
from applier.sources.rawlog_writer import write_raw_log

pytestmark = pytest.mark.spark
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput" / "pg15_basic_proto1_messages.jsonl"
EXPECTED_MESSAGES = [("applier", b"non-transactional payload", False),
                     ("applier", b"sent although rolled back", False),
                     ("applier", b"transactional payload", True)]


def _raw_frame(spark):
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    data = [(r["lsn"], r["xid"], bytes.fromhex(r["data"]), n) for n, r in enumerate(rows)]
    return spark.createDataFrame(data, "lsn STRING, xid BIGINT, data BINARY, seq BIGINT")


def test_the_streaming_sink_records_logical_messages_like_replay(spark, tmp_path):
    table = str(tmp_path / "messages")
    sink = DeltaApplySink(str(tmp_path / "delta"), apply=ApplySettings(messages_table=table, max_group_transactions=8))
    frame = _raw_frame(spark)
    sink(frame, 0)
    sink(frame, 0)  # a retried batch: Delta's transaction ids make it a no-op, messages included
    got = sorted((r.prefix, bytes(r.content), r.transactional)
                 for r in spark.read.format("delta").load(table).collect())
    assert got == EXPECTED_MESSAGES
    assert sink.transactions > 0


def test_the_streaming_sink_collects_garbage_once_per_group_not_automatically(spark, tmp_path):
    frame = _raw_frame(spark)
    rows = frame.count()
    sink = DeltaApplySink(str(tmp_path / "delta"), apply=ApplySettings(max_group_transactions=4))
    generations: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # an automatic collection would now run on nearly every allocation
    gc.callbacks.append(record)
    try:
        sink(frame, 0)
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)
    assert rows > 50
    # the loop's full collections after each group; the few young ones are the call's own entry,
    # before the policy is in force (with the collector on, a threshold of 1 makes hundreds)
    assert generations.count(2) >= 1, generations[:20]
    assert len(generations) - generations.count(2) <= 4, generations[:20]
    assert gc.isenabled()



def test_with_overlap_an_error_in_the_group_in_flight_stops_the_run_before_any_later_commit(spark, tmp_path):
    """apply.overlap_groups: a group's commits run on a thread while the next group is decoded. A
    failure there (here: a TRUNCATE with apply.truncate 'error') must stop the run like a failure on
    the main thread: raised, and no later group committed or confirmed."""
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    raw = tmp_path / "raw.parquet"
    write_raw_log(raw, ((parse_lsn(r["lsn"]), r["xid"], bytes.fromhex(r["data"])) for r in rows))
    decoder = MessageDecoder()
    truncate_lsn = next(parse_lsn(r["lsn"]) for r in rows
                        if isinstance(decoder.decode(bytes.fromhex(r["data"]), parse_lsn(r["lsn"])), Truncate))
    target = tmp_path / "delta"
    cfg = ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)),
                       apply=ApplySettings(overlap_groups=True, max_group_transactions=1, truncate="error"))
    with pytest.raises(SinkError, match="TRUNCATE"):
        replay_log(spark, cfg)
    tables = [p.parent for p in target.glob("*/*/_delta_log") if p.parent.parent.name != "_applier"]
    assert tables, "the groups before the TRUNCATE were committed"
    for path in tables:
        source = f"{path.parent.name}.{path.name}"
        version = applied_version(spark, str(path), app_id_for(source))
        assert version is not None and version < truncate_lsn, (source, version, truncate_lsn)
