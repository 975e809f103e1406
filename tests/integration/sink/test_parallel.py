"""Commits of several tables side by side: each keeps its own idempotent-write id (real Spark/Delta)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from test_merge import Ch

from applier.sink.idempotence import applied_version
from applier.sink.parallel import SessionPool
from applier.sink.plan import TablePlan, fold_changes
from applier.sink.schema import ensure_table
from applier.sink.spec import TableSpec, app_id_for
from applier.sink.store.sparkmerge import apply_plan

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("v", pa.string())])
TABLES = ("a", "b", "c")


def plan_of(changes) -> TablePlan:
    return fold_changes(changes, ["id", "v"], (0,), unchanged_marker=object())


def test_each_table_commit_side_by_side_records_only_its_own_id_and_version(spark, tmp_path):
    paths = {t: str(tmp_path / t) for t in TABLES}
    for t, path in paths.items():
        ensure_table(spark, path, TableSpec(f"public.{t}", SCHEMA, ("id",), "d"))
    pool = SessionPool(spark, 3)
    threads: set[str] = set()

    def commit(table: str, version: int, changes):
        def task(provider):
            session = provider.get("test")
            threads.add(threading.current_thread().name)
            return apply_plan(session, paths[table], SCHEMA, plan_of(changes), app_id=app_id_for(table),
                              version=version, description=f"public.{table}")
        return task

    for rnd in range(1, 5):  # every round: three tables, each its own version (one per table and round)
        pool.run([commit(t, rnd * 100 + i, [Ch("I", (rnd, f"{t}{rnd}")), Ch("U", (0, f"{t}{rnd}"))])
                  for i, t in enumerate(TABLES)])
    assert len(threads) > 1  # really side by side
    for i, t in enumerate(TABLES):
        assert applied_version(spark, paths[t], app_id_for(t)) == 400 + i
        for other in TABLES:
            if other != t:
                assert applied_version(spark, paths[t], app_id_for(other)) is None
        rows = sorted(tuple(r) for r in spark.read.format("delta").load(paths[t]).collect())
        assert rows == [(0, f"{t}4"), (1, f"{t}1"), (2, f"{t}2"), (3, f"{t}3"), (4, f"{t}4")]
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None

    # A replay of round 2 writes nothing anywhere (each table's own version is newer).
    pool.run([commit(t, 200 + i, [Ch("D", old_key=(1,))]) for i, t in enumerate(TABLES)])
    for t in TABLES:
        assert spark.read.format("delta").load(paths[t]).where("id = 1").count() == 1

    # One table's failure: the others still commit, then the failure is raised.
    def broken(session):
        raise RuntimeError("table b failed")

    with pytest.raises(RuntimeError, match="table b failed"):
        pool.run([commit("a", 500, [Ch("I", (5, "a5"))]), broken, commit("c", 502, [Ch("I", (5, "c5"))])])
    assert applied_version(spark, paths["a"], app_id_for("a")) == 500
    assert applied_version(spark, paths["c"], app_id_for("c")) == 502
    assert applied_version(spark, paths["b"], app_id_for("b")) == 401
