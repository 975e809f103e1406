"""The Spark store keeps the stores' contract on key-less (multiset) tables and unchanged TOAST values
read from the target. The same random groups (tests/storegroups.py) are committed through Spark's MERGE
and through the in-memory store (tests/unit/sink/test_store_contract.py holds delta-rs to it), and the
tables compared after every commit; a commit applied again changes nothing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from storegroups import bag_group, keyed_group

from applier.sink.plan import fold_changes
from applier.sink.spec import TableOptions, TableSpec
from applier.sink.store import InMemoryStore, SparkStore, TableStore
from applier.values import UNCHANGED_TOAST

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("a", pa.string())])


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
    from applier.sink.store import DELTARS

    path = str(tmp_path / "t")
    flagged = pa.schema([*SCHEMA, pa.field("end", pa.int32()), pa.field("gone", pa.bool_())])
    DELTARS.create(path, TableSpec("public.t", flagged, ("id",), "d"), TableOptions(), {})
    DELTARS.write_arrow(path, pa.table({"id": pa.array([1, 2, 3, 4], pa.int32()), "a": ["x", None, "z", "w"],
                                        "end": pa.array([None, None, 7, None], pa.int32()),
                                        "gone": [False, None, False, True]}), mode="append", tag=None)
    wider = pa.schema([*SCHEMA, pa.field("later", pa.string())])
    for keys, extra in (([(1,), (3,), (9,)], {}), (None, {}), ([(1,), (2,), (3,)], {"open_only": "end"}),
                        (None, {"unless": "gone"}), ([], {})):
        through_spark = SparkStore(spark).rows_by_key(path, wider, ("id",), keys, **extra)
        through_rs = DELTARS.rows_by_key(path, wider, ("id",), keys, **extra)
        assert through_rs == through_spark, (keys, extra)
    assert DELTARS.rows_by_key(path, wider, ("id",), [(1,), (3,)], open_only="end") == {(1,): [1, "x", None]}


def test_a_keyed_table_with_a_column_the_source_dropped_commits_the_same_through_delta_rs_and_spark(
        spark, tmp_path: Path) -> None:
    """The plan carries the source's columns; the table still holds the dropped one (applier.sink.schema).
    delta-rs took such a commit to Spark (a JVM for every run of a mirror whose table lost a column);
    it now makes it, and both engines must leave the same table: an updated row keeps its value in the
    dropped column, a new row has NULL there, unchanged TOAST values come from the target, and a
    TRUNCATE's rows have NULL there too."""
    from applier.changes import OP_INSERT, OP_TRUNCATE, TableChange
    from applier.sink.store import DELTARS

    held = pa.schema([SCHEMA.field(0), pa.field("gone", pa.string()), SCHEMA.field(1)])
    paths = {"spark": str(tmp_path / "spark"), "delta-rs": str(tmp_path / "rs")}
    for path in paths.values():
        DELTARS.create(path, TableSpec("public.t", held, ("id",), "d"), TableOptions(), {})
        DELTARS.write_arrow(path, pa.table({"id": pa.array(range(6), pa.int32()), "gone": [f"g{i}" for i in range(6)],
                                            "a": [f"a{i}" for i in range(6)]}), mode="append", tag=None)
    stores: dict[str, TableStore] = {"spark": SparkStore(spark), "delta-rs": DELTARS}
    rng = random.Random(11)
    live = {i: f"a{i}" for i in range(6)}
    kept: set[int] = set()

    def table(name: str) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in spark.read.format("delta").load(paths[name]).collect()), key=repr)

    for version in range(1, 6):
        changes = keyed_group(rng, live, 8)
        if version == 5:  # a TRUNCATE, then rows again
            changes = [TableChange(OP_TRUNCATE, None, None, None, 0), TableChange(OP_INSERT, None, None, (3, "t"), 1)]
        plan = fold_changes(changes, SCHEMA.names, (0,), unchanged_marker=UNCHANGED_TOAST)
        results = {name: store.merge(paths[name], SCHEMA, plan, app_id="app", version=version,
                                     description=f"v{version}") for name, store in stores.items()}
        assert results["delta-rs"] is not None, version  # taken, not handed to Spark
        assert table("delta-rs") == table("spark"), version
        if version < 5:
            assert sorted((r[0], r[2]) for r in table("spark")) == sorted(live.items())
            kept.update(r[0] for r in table("spark") if r[1] is not None)
    assert kept, "no row kept its dropped column's value: the case was not exercised"
    assert table("spark") == [(3, None, "t")]


def test_a_history_table_with_a_column_the_source_dropped_commits_the_same_through_delta_rs_and_spark(
        spark, tmp_path: Path) -> None:
    """A history table keeps the columns the source dropped, like its mirror table. Both engines' history
    commits assign only the source's columns: a version the group closes keeps its value in the
    dropped column, a version it opens has NULL there, and a TRUNCATE closes the other open versions
    with their values kept. Compared row by row after every commit."""
    from datetime import UTC, datetime

    from applier.sink.history import END_AT, END_LSN, START_AT, START_LSN, HistoryPlan, history_spec
    from applier.sink.store import DELTARS

    own = TableSpec("public.t", SCHEMA, ("id",), "d")
    spec = history_spec(own)  # id, a, then the four version columns
    fields = list(spec.schema)
    held = pa.schema([fields[0], pa.field("gone", pa.string()), *fields[1:]])
    at = [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(4)]
    paths = {"spark": str(tmp_path / "spark"), "delta-rs": str(tmp_path / "rs")}
    for path in paths.values():
        DELTARS.create(path, TableSpec("public.t", held, ("id",), "d", added=4), TableOptions(), {})
        DELTARS.write_arrow(path, pa.table({
            "id": pa.array(range(4), pa.int32()), "gone": [f"g{i}" for i in range(4)], "a": [f"a{i}" for i in range(4)],
            START_LSN: pa.array([10] * 4, pa.int64()), END_LSN: pa.array([None] * 4, pa.int64()),
            START_AT: pa.array([at[0]] * 4, pa.timestamp("us", "UTC")),
            END_AT: pa.array([None] * 4, pa.timestamp("us", "UTC"))}, schema=held), mode="append", tag=None)
    plans = [
        HistoryPlan(updates=[(1, "a1", 10, 20, at[0], at[1])], inserts=[(1, "a1 again", 20, None, at[1], None),
                                                                      (9, "new", 20, None, at[1], None)]),
        HistoryPlan(inserts=[(5, "after truncate", 30, None, at[2], None)], truncate=(30, at[2])),
    ]
    stores: dict[str, TableStore] = {"spark": SparkStore(spark), "delta-rs": DELTARS}

    def table(name: str) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in spark.read.format("delta").load(paths[name])
                      .select("id", "gone", "a", START_LSN, END_LSN).collect()), key=repr)

    for version, plan in enumerate(plans, start=1):
        done = {name: store.merge_history(paths[name], spec, plan, app_id="h", version=version, description="d")
                for name, store in stores.items()}
        assert done["delta-rs"] is not None, version  # taken, not handed to Spark
        assert table("delta-rs") == table("spark"), version
    assert table("spark") == sorted([
        (0, "g0", "a0", 10, 30), (1, None, "a1 again", 20, 30), (1, "g1", "a1", 10, 20), (2, "g2", "a2", 10, 30),
        (3, "g3", "a3", 10, 30), (5, None, "after truncate", 30, None), (9, None, "new", 20, 30)], key=repr)


def test_a_fresh_copys_empty_table_and_a_column_fill_are_the_same_through_spark_and_in_memory(
        spark, tmp_path: Path) -> None:
    """The store operations a resync and a column added with a constant default make: the table left
    empty with the new columns (its applied version and source kept, what described the old columns
    gone), and every row given the constant. delta-rs declines both (Spark's store makes them), and
    compacts the tables it writes (apply.optimize_every_commits) without Spark."""
    from applier.sink.spec import PROP_DROPPED, PROP_KEYS, PROP_SOURCE
    from applier.sink.store import DELTARS

    spec = TableSpec("public.t", SCHEMA, ("id",), "d")
    wider = pa.schema([*SCHEMA, pa.field("n", pa.int16()), pa.field("at", pa.timestamp("us", "UTC"))])
    wider_spec = TableSpec("public.t", wider, ("id", "a"), "d")
    rows = pa.table({"id": pa.array([1, 2], pa.int32()), "a": ["x", None]})
    path = str(tmp_path / "t")
    memory = InMemoryStore()
    stores: list[TableStore] = [SparkStore(spark), memory]
    for store in stores:
        store.create(path, spec, TableOptions(), {PROP_SOURCE: "public.t", PROP_DROPPED: '["old"]'})
        store.write_arrow(path, rows, mode="append", tag=("app", 5, "copy"))
        assert store.evolve(path, wider_spec, None) is not None
        assert store.fill_columns(path, wider_spec, {"n": 7}) is True
    spark_rows = sorted(tuple(r) for r in spark.read.format("delta").load(path).select("id", "a", "n", "at").collect())
    assert spark_rows == sorted(memory.rows(path)) == [(1, "x", 7, None), (2, None, 7, None)]

    for store in stores:
        assert store.replace_empty(path, wider_spec) is True
    spark_store = SparkStore(spark)
    for store in stores:
        assert store.is_empty(path) and store.columns(path) == ("id", "a", "n", "at")
        assert store.applied_version(path, "app") == 5
    for configuration in (spark_store.configuration(path), memory.configuration(path)):
        assert configuration[PROP_SOURCE] == "public.t" and configuration[PROP_KEYS] == '["id", "a"]'
        assert PROP_DROPPED not in configuration

    rs_path = str(tmp_path / "rs")
    DELTARS.create(rs_path, spec, TableOptions(), {})
    deltars: TableStore = DELTARS
    assert deltars.replace_empty(rs_path, spec) is None and deltars.fill_columns(rs_path, spec, {"a": "z"}) is None
    for i in range(3):
        DELTARS.write_arrow(rs_path, pa.table({"id": pa.array([i], pa.int32()), "a": ["r"]}), mode="append",
                            tag=None)
    assert DELTARS.file_stats(rs_path).count == 3
    DELTARS.optimize(rs_path, [], None)
    assert DELTARS.file_stats(rs_path).count == 1
    assert sorted(DELTARS.scan(rs_path, ["id"])) == [(0,), (1,), (2,)]
