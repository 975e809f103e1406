"""Seeded random histories on a real PostgreSQL: the Delta tables and an independent pure-Python
reference sink must both equal Postgres, row by row."""

from __future__ import annotations

import os
from typing import Any

import pytest
from reference_sink import ReferenceSink
from workloads import SCHEMA, TABLES, random_workload

from applier.assembly.feeder import TransactionFeeder
from applier.checks.verify import compare, postgres_table_rows, verify_against_postgres
from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.protocol.decoder import MessageDecoder
from applier.sources.rawlog import read_raw_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options
from applier.state import StateDir

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.usefixtures("replay_path")]

OPTION_SETS: dict[str, dict[str, Any]] = {
    "proto1-text": dict(),
    "proto1-binary": dict(binary=True),
    "proto2-streaming": dict(proto_version=2, streaming="on"),
    "proto3-twophase-streaming": dict(proto_version=3, streaming="on"),
}


# One seed per option set keeps CI near 20 minutes (each history costs about a minute of Spark);
# APPLIER_RANDOM_SEEDS=1,2,3,... runs every option set under each of those seeds instead.
SEEDS = [int(s) for s in os.environ.get("APPLIER_RANDOM_SEEDS", "").split(",") if s.strip()]
CASES = ([(o, s) for o in sorted(OPTION_SETS) for s in SEEDS] if SEEDS
         else [(o, n + 1) for n, o in enumerate(sorted(OPTION_SETS))])


@pytest.mark.parametrize(("options", "seed"), CASES)
def test_random_history_equals_postgres_in_delta_and_reference_sink(pg, spark, tmp_path, seed, options):
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        two_phase = options.startswith("proto3")
        create_slot(conn, "s", two_phase=two_phase)
        random_workload(conn, seed, prepared=two_phase)
        conn.execute("INSERT INTO rw_bag VALUES (-1, 'last')")  # a final commit makes everything visible
        raw = tmp_path / "raw.parquet"
        options_used = pgoutput_options("rw_pub", **OPTION_SETS[options])
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", options_used)))

        # The independent oracle: row images applied one at a time.
        feeder = TransactionFeeder.from_state(StateDir(tmp_path / "ref-state"), ApplySettings(memory_budget_mb=1))
        sink = ReferenceSink(feeder._convert)
        dec = MessageDecoder()
        for msg in read_raw_log(raw):
            for txn, _batches in feeder.feed(msg.lsn, dec.decode(msg.data, msg.lsn)):
                sink.apply(txn)
                feeder.applied(txn)
        for ns, name in TABLES:
            names, pg_rows = postgres_table_rows(conn, ns, name)
            res = compare(f"{ns}.{name}", pg_rows, iter(sink.rows(f"{ns}.{name}", names)))
            assert res.equal, (name, res.only_in_source[:3], res.only_in_target[:3])

        # The Delta sink, grouped, must equal Postgres too; every other case with the next group
        # decoded while the previous one commits (apply.overlap_groups), and seeds 3 and 4 with every
        # commit a Spark MERGE (apply.merge_engine), the others with delta-rs where it can. A Spark MERGE
        # costs a second or more whatever its size, so those two cut the stream into groups of 25 (the
        # others into groups of 7): the same stream cut differently, at a third of the Spark jobs.
        target = tmp_path / "delta"
        spark_merges = seed % 4 in (0, 3)
        apply = ApplySettings(max_group_transactions=25 if spark_merges else 7, overlap_groups=seed % 2 == 1,
                              merge_engine="spark" if spark_merges else "auto")
        replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(target)), apply=apply))
        for reader in ("auto", "spark"):  # delta-rs where it reads a table, and what Spark reads of each
            for r in verify_against_postgres(spark, conn, str(target), TABLES, reader=reader):
                assert r.equal, (reader, r.source_name, r.only_in_source[:3], r.only_in_target[:3])
