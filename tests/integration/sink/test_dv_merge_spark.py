"""Spark reads the deletion vectors applier writes (applier.sink.store.dvmerge), and applier reads the
ones Spark writes: random keyed groups are committed, in turns, by applier's writer and by Spark's own
MERGE into one table Spark created with ``delta.enableDeletionVectors``, through delta-rs's checkpoints
and Spark's OPTIMIZE, and the table is compared with the in-memory store's after every commit, as Spark,
delta-rs's DataFusion and Polars read it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.sink.plan import fold_changes
from applier.sink.spec import TableOptions, TableSpec
from applier.sink.store import InMemoryStore, SparkStore
from applier.sink.store.picker import StorePicker
from applier.values import UNCHANGED_TOAST

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.string()),
                    pa.field("at", pa.timestamp("us", tz="UTC"))])
SPEC = TableSpec("public.t", SCHEMA, ("id",), "d")


def _spark_rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(((r[0], r[1]) for r in spark.read.format("delta").load(path).collect()), key=repr)


def _outside_rows(path: str) -> list[tuple[Any, ...]]:
    import polars as pl
    from deltalake import DeltaTable, QueryBuilder

    table = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute("SELECT id, a FROM t").read_all())
    rows = sorted(zip(table.column("id").to_pylist(), table.column("a").to_pylist(), strict=True), key=repr)
    assert sorted(pl.read_delta(path).select(["id", "a"]).iter_rows(), key=repr) == rows
    return rows


def _group(rng: random.Random, live: dict[int, str], n: int) -> list[Any]:
    from datetime import UTC, datetime

    from applier.changes import OP_DELETE, OP_INSERT, OP_UPDATE, TableChange

    at = datetime(2026, 11, 29, tzinfo=UTC)
    out = []
    for i in range(n):
        key, roll = rng.randrange(70_000), rng.random()  # keys past one 65,536-row container of a bitmap
        if key not in live:
            live[key] = f"v{rng.randrange(100)}"
            out.append(TableChange(OP_INSERT, None, None, (key, live[key], at), i))
        elif roll < 0.3:
            del live[key]
            out.append(TableChange(OP_DELETE, (key,), None, None, i))
        else:
            live[key] = f"u{rng.randrange(100)}"
            out.append(TableChange(OP_UPDATE, None, None, (key, live[key], at), i))
    return out


def test_applier_and_spark_read_each_others_deletion_vectors(spark, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark_store, memory = SparkStore(spark), InMemoryStore()
    properties = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "4"}
    spark_store.create(path, SPEC, TableOptions(), properties)
    memory.create(path, SPEC, TableOptions(), {})
    picker = StorePicker(spark)
    dv_store = picker.dv_store
    assert picker.dv_merges(path) and not picker.deltars_writes(path)
    rng = random.Random(3)
    live: dict[int, str] = {}
    first = pa.table({"id": pa.array(range(0, 140_000, 2), pa.int64()), "a": ["c"] * 70_000,
                      "at": pa.array([None] * 70_000, pa.timestamp("us", tz="UTC"))})
    copier = picker.copier(path, SPEC)  # the initial copy: delta-rs writes it, no JVM
    assert not copier.uses_spark
    copier.write_arrow(path, first, mode="overwrite", tag=("app", 0, "copy"), schema=SCHEMA)
    memory.write_arrow(path, first, mode="append", tag=None, schema=SCHEMA)
    live.update((k, "c") for k in range(0, 140_000, 2))
    for version in range(1, 7):
        plan = fold_changes(_group(rng, live, rng.randrange(200, 3000)), SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
        writer = spark_store if version == 3 else dv_store  # Spark's own MERGE writes its vectors, read at 4
        ours = writer.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        assert ours is not None
        memory.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        expected = sorted(live.items(), key=repr)
        assert _outside_rows(path) == expected, f"version {version} by {type(writer).__name__}"
        if version == 6:  # Spark's reading of ours, after its own vectors and its OPTIMIZE
            assert _spark_rows(spark, path) == expected, f"version {version} read by Spark"
        if version == 3:
            newest = sorted(Path(path, "_delta_log").glob("*.json"))[-1].read_text()
            assert '"deletionVector"' in newest and "Apache-Spark" in newest, "Spark's MERGE wrote no vectors"
        if version == 4:
            spark.sql(f"OPTIMIZE delta.`{path}`")  # purges the vectors into rewritten files
    assert dv_store.applied_version(path, "app") == 6
    logs = sorted(Path(path, "_delta_log").glob("*.json"))
    commits = [json.loads(line) for f in logs for line in f.read_text().splitlines()
               if '"applier (deletion vectors)"' in line]
    assert len(commits) >= 4 and any(Path(path, "_delta_log").glob("*.checkpoint.parquet"))


def test_spark_reads_a_table_whose_small_files_were_carried(spark, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``KEEP_FILES`` live files applier's writer carries small files' live rows into a commit's new
    file and removes them (applier.sink.store.dvmerge._carried): Spark, delta-rs and Polars read the
    table the in-memory store holds, timestamps included. Small limits here."""
    from applier.sink.store import dvmerge

    monkeypatch.setattr(dvmerge, "KEEP_FILES", 3)
    monkeypatch.setattr(dvmerge, "TIER_FILES", 2)
    path = str(tmp_path / "t")
    spark_store, memory = SparkStore(spark), InMemoryStore()
    spark_store.create(path, SPEC, TableOptions(), {"delta.enableDeletionVectors": "true"})
    memory.create(path, SPEC, TableOptions(), {})
    dv_store = StorePicker(spark).dv_store
    rng = random.Random(5)
    live: dict[int, str] = {}
    for version in range(1, 13):
        plan = fold_changes(_group(rng, live, rng.randrange(50, 400)), SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
        assert dv_store.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        memory.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
    expected = sorted(live.items(), key=repr)
    assert _outside_rows(path) == expected
    assert _spark_rows(spark, path) == expected
    at = {r[0] for r in spark.read.format("delta").load(path).select("at").distinct().collect()}
    assert len(at) == 1 and next(iter(at)) is not None  # every row's timestamp, carried ones too
    copied = [json.loads(line)["commitInfo"]["operationMetrics"]["numTargetRowsCopied"]
              for f in sorted(Path(path, "_delta_log").glob("*.json")) for line in f.read_text().splitlines()
              if '"applier (deletion vectors)"' in line]
    assert any(int(n) for n in copied), "no file was carried"
