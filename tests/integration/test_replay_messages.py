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


@pytest.mark.postgres
@pytest.mark.parametrize("read_mode", ["replication", "sql"])
def test_a_message_of_a_rolled_back_transaction_is_recorded_though_nothing_commits_after_it(pg, tmp_path, read_mode):
    """PostgreSQL's 020_messages workload: a non-transactional message sent from a transaction that rolls
    back, with no committed transaction after it in the run. It was never recorded, and the slot was
    confirmed past it (an idle stream's confirm), so no later run recorded it either (issue 46 item 4)."""
    from deltalake import DeltaTable

    from applier.config import MirrorConfig, SourceSettings
    from applier.drivers.mirror import mirror
    from applier.spark.session import SparkProvider

    table = str(tmp_path / "messages")
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="msgs", publication="msgs", proto_version=2,
                                                messages=True, read_mode=read_mode),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          apply=ApplySettings(messages_table=table))
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION msgs FOR TABLE t")
        mirror(no_spark, config, once=True)
        conn.execute("INSERT INTO t VALUES (1)")
        mirror(no_spark, config, once=True)  # the last transaction of the run before the message
        conn.execute("BEGIN")
        conn.execute("SELECT pg_logical_emit_message(false, 'p', 'sent although rolled back')")
        conn.execute("ROLLBACK")  # (which does not flush the message's WAL: the next commit does)
        conn.execute("CREATE TABLE unpublished (x int)")  # a commit with nothing published: no transaction sent
        mirror(no_spark, config, once=True)
        mirror(no_spark, config, once=True)  # again: recorded once
        got = DeltaTable(table).to_pyarrow_table().to_pylist()
        assert [(r["prefix"], bytes(r["content"]), r["transactional"]) for r in got] == \
            [("p", b"sent although rolled back", False)]
        # the slot went past it only once it was recorded: a later message after a commit is recorded too
        conn.execute("SELECT pg_logical_emit_message(false, 'p', 'second')")
        conn.execute("INSERT INTO t VALUES (2)")
        mirror(no_spark, config, once=True)
        got = DeltaTable(table).to_pyarrow_table().to_pylist()
        assert sorted(bytes(r["content"]) for r in got) == [b"second", b"sent although rolled back"]
