"""The one apply loop: what happens after a group is the same for every driver.

The Structured Streaming sink used to run its own copy of the loop and had drifted (no messages
table, automatic garbage collection during a batch); these tests hold it to what replay does, on a
stream captured from a real server."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from applier.config import ApplySettings
from applier.drivers.streaming import DeltaApplySink

pytestmark = pytest.mark.spark
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pgoutput" / "pg15_basic_proto1_messages.jsonl"
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

