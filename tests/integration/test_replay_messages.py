"""Logical decoding messages from a captured stream are recorded in a Delta table, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.lsn import parse_lsn
from applier.sources.rawlog_writer import write_raw_log

pytestmark = pytest.mark.spark
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput" / "pg15_basic_proto1_messages.jsonl"


def test_messages_are_recorded_once(spark, tmp_path):
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    raw = tmp_path / "raw.parquet"
    write_raw_log(raw, ((parse_lsn(r["lsn"]), r["xid"], bytes.fromhex(r["data"])) for r in rows))
    table = str(tmp_path / "messages")
    cfg = ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(tmp_path / "delta")),
                       apply=ApplySettings(messages_table=table, max_group_transactions=8))
    replay_log(spark, cfg)
    replay_log(spark, cfg)  # again: nothing new
    rows = spark.read.format("delta").load(table).collect()
    got = sorted((r.prefix, bytes(r.content), r.transactional) for r in rows)
    assert got == [("applier", b"non-transactional payload", False), ("applier", b"sent although rolled back", False),
                   ("applier", b"transactional payload", True)]
    # created and appended through the run's store: by delta-rs (a run that records messages needs no JVM)
    commits = [json.loads(line) for f in sorted((Path(table) / "_delta_log").glob("*.json"))
               for line in f.read_text().splitlines() if line.strip()]
    infos = [c["commitInfo"] for c in commits if "commitInfo" in c]
    assert infos and all("delta-rs" in str(i.get("clientVersion", "")) for i in infos), infos
