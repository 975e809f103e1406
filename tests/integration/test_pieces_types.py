"""A column's type changed by a fresh copy, then a large transaction applied in pieces (the soak, seed 2 on
PostgreSQL 18, steps 314 and 328: the follower with ``piece_rows: 8`` stopped twice with delta-rs's
``Kernel error: Invalid argument error: Incorrect datatype. Expected Int64, got Decimal128(10, 2)`` and
``... Expected Utf8, got Int32``, exit 4, and went on at the next run).

What happened: Spark writes a checkpoint every ten of its commits, with each file's statistics also as a
struct (``add.stats_parsed``) in the column types of that moment. A type Delta cannot widen (``ALTER
COLUMN ... TYPE text USING``, a column dropped and added again) is mended by a fresh copy, which empties the
table with the new types (applier.sink.store.sparkddl.empty_with_schema, an overwrite with
``overwriteSchema``) and leaves that checkpoint the newest. delta-rs writes a checkpoint after its commits
at versions 99, 199...; it reads the newest checkpoint's ``stats_parsed`` in the table's present types and
fails on a column whose type changed: the commit is in the log, the write raises, the run stops. The next
run finds the commit applied and goes on, until the next hundred commits. A table seldom gets there; pieces
(a commit per table per piece) get it there in one transaction."""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, DistributedSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]


def _config(pg, target: Path, **apply: object) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="pieces", publication="pieces"),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(piece_rows=8, **apply),
                        distributed=DistributedSettings(mode="off"))


def _delta_type(table: Path, column: str) -> str:
    fields = json.loads(deltalake.DeltaTable(str(table)).schema().to_json())["fields"]
    return str(next(f["type"] for f in fields if f["name"] == column))


def _checkpoints(table: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in (table / "_delta_log").glob("*.checkpoint*.parquet"))


def test_a_retype_copied_again_then_pieces_past_a_hundred_commits(pg, spark, tmp_path):
    target = tmp_path / "delta"
    table = target / "public" / "t"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, c int, pad text)")
        conn.execute("INSERT INTO t SELECT g, g, 'p' FROM generate_series(1, 120) g")
        conn.execute("CREATE PUBLICATION pieces FOR TABLE t")
        mirror(spark, _config(pg, target), once=True)
        # 15 pieces, each a Spark MERGE: Spark's checkpoint at version 10, its statistics of c as int
        conn.execute("UPDATE t SET pad = pad || 'x'")
        mirror(spark, _config(pg, target, merge_engine="spark"), once=True)
        assert _checkpoints(table), "no checkpoint by Spark: the case is not set up"
        # a type Delta cannot widen: the table is copied again with c as string
        conn.execute("ALTER TABLE t ALTER COLUMN c TYPE text USING c::text")
        conn.execute("UPDATE t SET c = 'changed' WHERE id = 1")
        mirror(spark, _config(pg, target), once=True)
        assert _delta_type(table, "c") == "string"
        # a transaction of 840 row changes in pieces of 8: a delta-rs commit each, past version 99
        conn.execute("BEGIN")
        for _ in range(7):
            conn.execute("UPDATE t SET pad = pad || 'y', c = c || 'y'")
        conn.execute("COMMIT")
        mirror(spark, _config(pg, target), once=True)
        version = deltalake.DeltaTable(str(table)).version()
        assert version >= 100, version
        assert any(v >= 99 for v in _checkpoints(table)), _checkpoints(table)  # delta-rs's own, in the new types
        for result in verify_against_postgres(spark, conn, str(target), [("public", "t")]):
            assert result.equal, (result.only_in_source[:3], result.only_in_target[:3], result.problems)


@pytest.mark.spark
def test_a_table_left_with_a_checkpoint_in_older_types_gets_a_new_one_before_delta_rs_writes_it(spark, tmp_path):
    """A target rewritten with new types before applier refreshed checkpoints after such rewrites (or by
    another tool): the picker has Spark write a checkpoint before delta-rs writes the table, and delta-rs's
    own at version 99 then reads that one."""
    import pyarrow as pa

    from applier.sink.store.checkpoints import checkpoint_type_changes
    from applier.sink.store.picker import StorePicker

    path = str(tmp_path / "t")
    for i in range(11):  # Spark's checkpoint at version 10, its statistics of c as int
        spark.createDataFrame([(i, i)], "id int, c int").write.format("delta").mode("append").save(path)
    spark.createDataFrame([(1, "1")], "id int, c string").write.format("delta").mode("overwrite") \
        .option("overwriteSchema", "true").save(path)
    assert checkpoint_type_changes(path) == {"c": ("int32", "string")}
    assert StorePicker(spark).deltars_writes(path)
    assert checkpoint_type_changes(path) == {}
    table = deltalake.DeltaTable(path)
    row = pa.table({"id": pa.array([2], pa.int32()), "c": pa.array(["2"])})
    while table.version() < 99:
        deltalake.write_deltalake(table, row, mode="append")
    assert 99 in _checkpoints(Path(path))
