"""History, change feed, metadata and soft-delete tables under the seeded random workloads (schema
changes, TOAST, key changes, truncates with CASCADE, rolled-back work), with the mirror SIGKILLed
exactly between a change feed's commit and its mirror table's, and between the mirror tables' commits
and their history's (``APPLIER_CRASH_AT``), then restarted. Afterwards every table equals Postgres:
the mirror tables (live rows), what a CDC consumer makes of each feed, and each history's open
versions; no key has overlapping versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workloads import SCHEMA, TABLES, random_workload

from applier.checks.verify import compare, postgres_table_rows, verify_against_postgres
from applier.config import MirrorConfig, ReplayConfig, TablesSettings
from applier.drivers.mirror import mirror
from applier.drivers.replay import replay_log
from applier.sink.naming import quote_identifier

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
DERIVED = ["rw_keyed", "rw_child"]
RULES = [
    {"match": "public.rw_keyed", "metadata_columns": True, "soft_delete": True, "history": True, "changes": True},
    {"match": "public.rw_child", "history": True, "changes": True},
]


def _equal(spark, conn, table: str, df) -> None:
    names, pg_rows = postgres_table_rows(conn, "public", table)
    result = compare(table, pg_rows, df.select(*[quote_identifier(n) for n in names]).toLocalIterator())
    assert result.equal, (table, result.only_in_source[:3], result.only_in_target[:3])


def test_derived_tables_survive_kills_between_their_commits_and_equal_postgres(pg, spark, tmp_path):
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    source = {"slot": "dt", "publication": "rw_pub", "proto_version": 2, "streaming": "on"}
    settings = {
        "source": source,
        "target": {"path": str(target)},
        "tables": {"rules": RULES},
        "apply": {"max_group_transactions": 4},  # many groups: many points to die at
    }
    config.write_text(yaml.safe_dump(settings))
    # the runs that are not killed (the copy, the last one) run in the tests' Spark session with the same
    # config and state: only a killed run needs a process of its own
    in_process = MirrorConfig.model_validate({**settings, "source": {**source, "dsn": pg.dsn}})
    env = {**os.environ, "APPLIER_DSN": pg.dsn, "PYTHONPATH": str(REPO)}
    env.pop("APPLIER_CRASH_AT", None)
    command = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    kills = 0
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        steps: list[int | str | None] = [None, 41, "feed_committed:2", 42, "before_history:2"]
        for step in steps:  # None: a run without a crash (the copy); a number: a workload's seed
            if isinstance(step, int):
                random_workload(conn, step, transactions=12)
                continue
            if step is None:
                assert mirror(spark, in_process, once=True).snapshot_lsn is not None
                continue
            run = subprocess.run(command, env={**env, "APPLIER_CRASH_AT": step}, capture_output=True, text=True,
                                 timeout=600)
            assert run.returncode in (0, -9), (step, run.stdout[-2000:] + run.stderr[-3000:])
            kills += run.returncode == -9
        conn.execute("INSERT INTO rw_child SELECT 900000, NULL, 'last'")
        assert mirror(spark, in_process, once=True).transactions >= 1
        assert kills >= 2, kills

        _assert_derived_equal(spark, conn, target)


def _assert_derived_equal(spark, conn, target: Path) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    settings = TablesSettings.model_validate({"rules": RULES})
    for result in verify_against_postgres(spark, conn, str(target), TABLES, settings):
        assert result.equal, (result.source_name, result.only_in_source[:3], result.only_in_target[:3])
    for table in DERIVED:
        feed = spark.read.format("delta").load(str(target / "_changes" / "public" / table))
        last = Window.partitionBy("id").orderBy(F.col("__commit_lsn").desc(), F.col("__ordinal").desc())
        consumed = feed.withColumn("__n", F.row_number().over(last)).filter("__n = 1 AND __op <> 'D'")
        _equal(spark, conn, table, consumed)
        history = spark.read.format("delta").load(str(target / "_history" / "public" / table))
        _equal(spark, conn, table, history.filter("__end_lsn IS NULL"))
        versions = history.select("id", "__start_lsn", "__end_lsn").collect()
        by_key: dict[object, list[tuple[int, int | None]]] = {}
        for r in versions:
            by_key.setdefault(r["id"], []).append((r["__start_lsn"], r["__end_lsn"]))
        for key, spans in by_key.items():
            spans.sort()
            for (start, end), (next_start, _next_end) in zip(spans, spans[1:], strict=False):
                assert end is not None and start < end <= next_start, (table, key, spans)


def test_a_replay_killed_between_derived_commits_and_restarted_equals_postgres(pg, spark, tmp_path):
    """The same for ``replay`` of a captured raw log into a new target: the first kill comes before
    the mirror tables have any version, so the feed must walk the group from its start."""
    from applier.config import CaptureConfig, SourceSettings
    from applier.drivers.capture import capture

    log, target = tmp_path / "raw-log", tmp_path / "delta"
    cfg = CaptureConfig(source=SourceSettings(dsn=pg.dsn, slot="dr", publication="rw_pub", proto_version=2,
                                              streaming="on"), log_path=str(log))
    config = tmp_path / "replay.yaml"
    config.write_text(yaml.safe_dump({"source_log": str(log), "target": {"path": str(target)},
                                      "tables": {"rules": RULES}, "apply": {"max_group_transactions": 2}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("APPLIER_CRASH_AT", None)
    command = [sys.executable, "-m", "applier.cli", "replay", "--config", str(config)]
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        capture(spark, cfg)  # creates the slot: the log starts here, with empty tables
        big = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))"  # stored out of line
        for sql in [f"INSERT INTO rw_keyed SELECT g, {big}, g, NULL FROM generate_series(1, 6) g",
                    "INSERT INTO rw_parent (id, label) VALUES (1000000, 'p')",
                    "INSERT INTO rw_child VALUES (1, 1000000, 'c'), (2, 1000000, 'd')",
                    "UPDATE rw_keyed SET n = n + 1 WHERE id = 1",  # 'u': the value is in the first group only
                    "DELETE FROM rw_keyed WHERE id = 2",
                    "UPDATE rw_keyed SET id = 103 WHERE id = 3",
                    "TRUNCATE rw_child"]:  # every row of the first group goes: the feed must know them
            with conn.transaction():
                conn.execute(sql)
        random_workload(conn, 51, transactions=8)
        capture(spark, cfg)
        kills = 0
        regroup = {"APPLIER_APPLY__MAX_GROUP_TRANSACTIONS": "6"}  # later runs group differently: a group
        for crash, more in (("feed_committed:1", {}), ("before_history:2", regroup)):  # spans the fed one
            run = subprocess.run(command, env={**env, **more, "APPLIER_CRASH_AT": crash}, capture_output=True,
                                 text=True, timeout=600)
            assert run.returncode in (0, -9), (crash, run.stdout[-2000:] + run.stderr[-3000:])
            kills += run.returncode == -9
        assert kills == 2, kills
        # the restart (not killed) in the tests' Spark session: the config file's settings, regrouped alike
        replay_log(spark, ReplayConfig.model_validate({**yaml.safe_load(config.read_text()),
                                                       "apply": {"max_group_transactions": 6}}))
        _assert_derived_equal(spark, conn, target)
