"""The Spark store keeps the stores' contract on the plans delta-rs declines: key-less (multiset) tables
and unchanged TOAST values read from the target. The same random groups are committed through Spark's
MERGE and through the in-memory store (tests/unit/sink/test_store_contract.py holds delta-rs to it), and
the tables compared after every commit; a commit applied again changes nothing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from applier.changes import OP_DELETE, OP_INSERT, OP_UPDATE, TableChange
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


def _keyed_group(rng: random.Random, live: dict[int, str], n: int) -> list[TableChange]:
    """Updates that leave ``a`` unchanged (TOAST): its value comes from the row as committed before."""
    out = []
    for i in range(n):
        key, roll = rng.randrange(6), rng.random()
        if key not in live:
            live[key] = f"v{rng.randrange(50)}"
            out.append(TableChange(OP_INSERT, None, None, (key, live[key]), i))
        elif roll < 0.3:
            del live[key]
            out.append(TableChange(OP_DELETE, (key,), None, None, i))
        else:
            out.append(TableChange(OP_UPDATE, None, None, (key, UNCHANGED_TOAST), i, new_partial=True))
    return out


def _bag_group(rng: random.Random, bag: list[tuple[int, str]], n: int) -> list[TableChange]:
    out = []
    for i in range(n):
        if bag and rng.random() < 0.4:
            row = bag.pop(rng.randrange(len(bag)))
            if rng.random() < 0.5:
                out.append(TableChange(OP_DELETE, None, row, None, i))
            else:
                new = (row[0], f"w{rng.randrange(3)}")
                bag.append(new)
                out.append(TableChange(OP_UPDATE, None, row, new, i))
        else:
            row = (rng.randrange(3), f"w{rng.randrange(3)}")  # few images: duplicates are the point
            bag.append(row)
            out.append(TableChange(OP_INSERT, None, None, row, i))
    return out


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
    bag: list[tuple[int, str]] = []
    for version in range(1, 5):
        changes = _keyed_group(rng, live, 8) if keyed else _bag_group(rng, bag, 8)
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
