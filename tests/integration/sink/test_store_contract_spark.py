"""The Spark store keeps the stores' contract on key-less (multiset) tables and unchanged TOAST values
read from the target. The same random groups (tests/storegroups.py) are committed through Spark's MERGE
and through the in-memory store (tests/unit/sink/test_store_contract.py holds delta-rs to it), and the
tables compared after every commit; a commit applied again changes nothing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType
from storegroups import bag_group, keyed_group

from applier.sink.plan import fold_changes
from applier.sink.schema import TableOptions, TableSpec
from applier.sink.store import InMemoryStore, SparkStore, TableStore
from applier.values import UNCHANGED_TOAST

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("id", IntegerType()), StructField("a", StringType())])


def _rows(store: TableStore, spark: Any, path: str) -> list[tuple[Any, ...]]:
    if isinstance(store, InMemoryStore):
        return sorted(store.rows(path), key=repr)
    return sorted(((r[0], r[1]) for r in spark.read.format("delta").load(path).collect()), key=repr)


@pytest.mark.parametrize("keyed", [True, False], ids=["toast-lookups", "multiset"])
def test_spark_commits_give_the_same_table_as_the_in_memory_store(spark, tmp_path: Path, keyed: bool) -> None:
    rng = random.Random(7)
    spec = TableSpec("public.t", SCHEMA, ("id",) if keyed else (), "d" if keyed else "f")
    path = str(tmp_path / "t")
    memory = InMemoryStore()
    stores: list[TableStore] = [SparkStore(spark), memory]
    for store in stores:
        store.create(path, spec, TableOptions(), {"applier.source": "public.t"})
    live: dict[int, str] = {}
    bag: list[tuple[int, str | None]] = []
    for version in range(1, 5):
        changes = keyed_group(rng, live, 8) if keyed else bag_group(rng, bag, 8)
        plan = fold_changes(changes, spec.column_names, (0,) if keyed else (), unchanged_marker=UNCHANGED_TOAST)
        results = [store.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
                   for store in stores]
        assert results[0] == results[1]
        expected = sorted(live.items(), key=repr) if keyed else sorted(bag, key=repr)
        assert _rows(stores[0], spark, path) == _rows(memory, spark, path) == expected
    for store in stores:  # (Spark's result still counts the plan's rows: Delta skips the commit itself)
        store.merge(path, SCHEMA, plan, app_id="app", version=4, description="again")
    assert _rows(stores[0], spark, path) == _rows(memory, spark, path)
    assert stores[0].applied_version(path, "app") == memory.applied_version(path, "app") == 4


def test_rows_by_key_read_the_same_through_spark_and_delta_rs(spark, tmp_path: Path) -> None:
    """What the change feed and the history read back (applier.sink.derived): rows by key, every row,
    only open versions (a NULL column), not the flagged ones, and NULL for a column the table lacks."""
    import pyarrow as pa

    from applier.sink.store import DELTARS

    path = str(tmp_path / "t")
    flagged = StructType([*SCHEMA.fields, StructField("end", IntegerType()), StructField("gone", BooleanType())])
    DELTARS.create(path, TableSpec("public.t", flagged, ("id",), "d"), TableOptions(), {})
    DELTARS.write_arrow(path, pa.table({"id": pa.array([1, 2, 3, 4], pa.int32()), "a": ["x", None, "z", "w"],
                                        "end": pa.array([None, None, 7, None], pa.int32()),
                                        "gone": [False, None, False, True]}), mode="append", tag=None)
    wider = StructType([*SCHEMA.fields, StructField("later", StringType())])
    for keys, extra in (([(1,), (3,), (9,)], {}), (None, {}), ([(1,), (2,), (3,)], {"open_only": "end"}),
                        (None, {"unless": "gone"}), ([], {})):
        through_spark = SparkStore(spark).rows_by_key(path, wider, ("id",), keys, **extra)
        through_rs = DELTARS.rows_by_key(path, wider, ("id",), keys, **extra)
        assert through_rs == through_spark, (keys, extra)
    assert DELTARS.rows_by_key(path, wider, ("id",), [(1,), (3,)], open_only="end") == {(1,): [1, "x", None]}
