"""The table stores keep one contract: the same commits give the same table, whichever store makes
them. Random groups of inserts, updates (key changes included), deletes and truncates are folded as the
sink folds them and committed to a real delta-rs table and to the in-memory store, compared after every
commit; a commit applied again changes nothing in either. No JVM: the Spark store is held to the same
results by tests/integration/sink/test_merge.py."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from storegroups import bag_group, changes_group, keyed_group

from applier.changes import OP_DELETE, OP_INSERT, OP_UPDATE, TableChange
from applier.commands.exitcodes import ExitCode, for_exception
from applier.errors import ResyncNeededError, SinkError
from applier.sink.plan import fold_changes
from applier.sink.spec import TableOptions, TableSpec
from applier.sink.store import DELTARS, InMemoryStore, TableStore
from applier.values import UNCHANGED_TOAST

SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("a", pa.string())])
SPEC = TableSpec("public.t", SCHEMA, ("id",), "d")


def _rows(store: TableStore, path: str) -> list[tuple[Any, ...]]:
    return sorted(store.scan(path, ("id", "a")), key=repr)


def _group(rng: random.Random, live: dict[int, str], n: int) -> list[TableChange]:
    return changes_group(rng, live, n, keys=8, moved_to=12, truncate=0.04, insert=0.3, delete=0.5, move=0.6)


@pytest.mark.parametrize("seed", range(3))
def test_keyed_commits_give_the_same_table_in_delta_rs_and_in_memory(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "t")
    memory = InMemoryStore()
    stores: list[TableStore] = [DELTARS, memory]
    for store in stores:
        assert not store.exists(path)
        store.create(path, SPEC, TableOptions(), {"applier.source": "public.t"})
        assert store.exists(path) and store.is_empty(path) and store.columns(path) == ("id", "a")
        assert store.applied_version(path, "app") is None
    live: dict[int, str] = {}
    for version in range(1, 12):
        plan = fold_changes(_group(rng, live, rng.randrange(1, 15)), SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
        results = [store.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
                   for store in stores]
        assert None not in results, "delta-rs declined a plan it should make"
        assert results[0] == results[1]
        expected = sorted(live.items(), key=repr)
        assert _rows(DELTARS, path) == _rows(memory, path) == expected
        again = [store.merge(path, SCHEMA, plan, app_id="app", version=version, description="again")
                 for store in stores]
        assert all(r is not None and r.rows_upserted == r.rows_deleted == 0 for r in again)
        assert _rows(DELTARS, path) == _rows(memory, path) == expected
        assert DELTARS.applied_version(path, "app") == memory.applied_version(path, "app") == version


@pytest.mark.parametrize("keyed", [True, False], ids=["toast-lookups", "multiset"])
def test_toast_lookups_and_multisets_give_the_same_table_in_delta_rs_and_in_memory(tmp_path: Path,
                                                                                     keyed: bool) -> None:
    """The plans that read the target before they write: unchanged TOAST values taken from the committed
    row, and a key-less table's copies counted (NULLs matched as equal). delta-rs makes them itself."""
    rng = random.Random(11)
    spec = TableSpec("public.t", SCHEMA, ("id",) if keyed else (), "d" if keyed else "f")
    path = str(tmp_path / "t")
    memory = InMemoryStore()
    stores: list[TableStore] = [DELTARS, memory]
    for store in stores:
        store.create(path, spec, TableOptions(), {"applier.source": "public.t"})
    live: dict[int, str] = {}
    bag: list[tuple[int, str | None]] = []
    for version in range(1, 9):
        changes = keyed_group(rng, live, 8) if keyed else bag_group(rng, bag, 8)
        plan = fold_changes(changes, spec.column_names, (0,) if keyed else (), unchanged_marker=UNCHANGED_TOAST)
        results = [store.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
                   for store in stores]
        assert None not in results, "delta-rs declined a plan it should make"
        assert results[0] == results[1]
        expected = sorted(live.items(), key=repr) if keyed else sorted(bag, key=repr)
        assert _rows(DELTARS, path) == _rows(memory, path) == expected
        again = DELTARS.merge(path, SCHEMA, plan, app_id="app", version=version, description="again")
        assert again is not None and again.rows_upserted == again.rows_deleted == 0
        assert _rows(DELTARS, path) == expected
    assert DELTARS.applied_version(path, "app") == memory.applied_version(path, "app") == 8


def test_multiset_copies_and_toast_lookups_of_many_types_match_in_delta_rs(tmp_path: Path) -> None:
    """Counting a key-less table's copies and finding a lookup key compare values read back from Delta
    with the commit's own: instants, dates, decimals, bytes, booleans and NULLs must compare equal."""
    fields = [pa.field("at", pa.timestamp("us", "UTC")), pa.field("day", pa.date32()),
              pa.field("amount", pa.decimal128(12, 2)), pa.field("raw", pa.binary()),
              pa.field("ok", pa.bool_()), pa.field("note", pa.string())]
    schema = pa.schema(fields)
    names = tuple(f.name for f in fields)
    at = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    rows = [(at, date(2024, 5, 6), Decimal("12.34"), b"\x00\xff", True, "x"),
            (None, None, None, None, None, None), (at, date(1, 1, 1), Decimal("-0.01"), b"", False, "y")]
    memory = InMemoryStore()
    bag = str(tmp_path / "bag")
    for store in (DELTARS, memory):
        store.create(bag, TableSpec("public.bag", schema, (), "f"), TableOptions(), {})
    inserts = [TableChange(OP_INSERT, None, None, r, i) for i, r in enumerate(rows * 2)]
    changes = [TableChange(OP_DELETE, None, rows[1], None, 0), TableChange(OP_UPDATE, None, rows[0], rows[2], 1)]
    for version, group in enumerate((inserts, changes), start=1):
        plan = fold_changes(group, names, (), unchanged_marker=UNCHANGED_TOAST)
        done = [store.merge(bag, schema, plan, app_id="a", version=version, description="d")
                for store in (DELTARS, memory)]
        assert None not in done and done[0] == done[1]
    expected = sorted([rows[0], rows[1], rows[2], rows[2], rows[2]], key=repr)
    assert sorted(memory.rows(bag), key=repr) == expected
    assert sorted(DELTARS.scan(bag, names), key=repr) == expected

    keyed = pa.schema([pa.field("at", pa.timestamp("us", "UTC"), nullable=False), *fields[1:]])
    path = str(tmp_path / "keyed")
    DELTARS.create(path, TableSpec("public.k", keyed, ("at", "amount"), "d"), TableOptions(), {})
    first = fold_changes([TableChange(OP_INSERT, None, None, rows[0], 0)], names, (0, 2),
                         unchanged_marker=UNCHANGED_TOAST)
    DELTARS.merge(path, keyed, first, app_id="a", version=1, description="d")
    toast = fold_changes([TableChange(OP_UPDATE, None, None, (at, date(2025, 1, 1), Decimal("12.34"), b"1", None,
                                                                 UNCHANGED_TOAST), 0, new_partial=True)],
                         names, (0, 2), unchanged_marker=UNCHANGED_TOAST)
    assert DELTARS.merge(path, keyed, toast, app_id="a", version=2, description="d") is not None
    assert list(DELTARS.scan(path, names)) == [(at, date(2025, 1, 1), Decimal("12.34"), b"1", None, "x")]


def test_delta_rs_stops_where_the_target_lacks_what_a_plan_reads_and_declines_floating_point_multisets(
        tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    DELTARS.create(path, SPEC, TableOptions(), {})
    DELTARS.write_arrow(path, pa.table({"id": pa.array([1], pa.int32()), "a": ["long"]}), mode="append", tag=None)
    lost = fold_changes([TableChange(OP_UPDATE, None, None, (2, UNCHANGED_TOAST), 0, new_partial=True)],
                        SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
    with pytest.raises(SinkError, match="no row to take them from"):
        DELTARS.merge(path, SCHEMA, lost, app_id="a", version=1, description="d")
    gone = fold_changes([TableChange(OP_DELETE, None, (1, "other"), None, 0)], SPEC.column_names, (),
                        unchanged_marker=UNCHANGED_TOAST)
    with pytest.raises(SinkError, match="more copies of a row than the Delta table holds") as diverged:
        DELTARS.merge(path, SCHEMA, gone, app_id="a", version=2, description="public.t end_lsn=0/2 transactions=1")
    # a diverged table: exit 4 (a restart meets it again), the table named, and the command that mends it
    assert for_exception(diverged.value) == ExitCode.BAD_DATA and isinstance(diverged.value, ResyncNeededError)
    assert diverged.value.context["table"] == "public.t"
    assert "applier resync --config FILE --table public.t" in str(diverged.value)
    assert _rows(DELTARS, path) == [(1, "long")] and DELTARS.applied_version(path, "a") is None

    floats = pa.schema([pa.field("x", pa.float64())])
    bag = str(tmp_path / "bag")
    DELTARS.create(bag, TableSpec("public.bag", floats, (), "f"), TableOptions(), {})
    plan = fold_changes([TableChange(OP_INSERT, None, None, (float("nan"),), 0)], ("x",), (),
                        unchanged_marker=UNCHANGED_TOAST)
    assert DELTARS.merge(bag, floats, plan, app_id="a", version=1, description="d") is None  # NaN: Spark's


def test_arrow_writes_and_carried_versions_agree(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    memory = InMemoryStore()
    piece = pa.table({"id": pa.array([1, 2], pa.int32()), "a": ["x", "y"]})
    for store in (DELTARS, memory):
        store.create(path, SPEC, TableOptions(), {})
        table_id = store.table_id(path)
        assert table_id
        store.write_arrow(path, piece, mode="overwrite", tag=None)
        store.write_arrow(path, piece.slice(1), mode="append", tag=("app", 7, "copy at 7"))
        store.write_arrow(path, piece, mode="append", tag=("app", 7, "the same copy again: skipped"))
        assert _rows(store, path) == [(1, "x"), (2, "y"), (2, "y")]
        assert store.applied_version(path, "app") == 7 and not store.is_empty(path)
        store.set_properties(path, {"applier.source": "public.t2"}, carry=("other", 7))
        assert store.applied_version(path, "other") == 7
        assert store.table_id(path) == table_id
    assert DELTARS.configuration(path)["applier.source"] == memory.table(path).properties["applier.source"]


def test_the_memory_store_takes_unchanged_toast_values_from_the_target_and_counts_a_multiset() -> None:
    memory = InMemoryStore()
    memory.create("k", SPEC, TableOptions(), {})
    memory.write_arrow("k", pa.table({"id": pa.array([1], pa.int32()), "a": ["long"]}), mode="append", tag=None)
    plan = fold_changes([TableChange(OP_UPDATE, None, None, (1, UNCHANGED_TOAST), 0, new_partial=True)],
                        SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
    memory.merge("k", SCHEMA, plan, app_id="a", version=1, description="d")
    assert memory.rows("k") == [(1, "long")]
    lost = fold_changes([TableChange(OP_UPDATE, None, None, (2, UNCHANGED_TOAST), 0, new_partial=True)],
                        SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
    with pytest.raises(SinkError, match="no row to take them from"):
        memory.merge("k", SCHEMA, lost, app_id="a", version=2, description="d")

    bag = TableSpec("public.bag", SCHEMA, (), "f")
    memory.create("bag", bag, TableOptions(), {})
    row = (1, "same")
    inserts = fold_changes([TableChange(OP_INSERT, None, None, row, i) for i in range(3)], bag.column_names, (),
                           unchanged_marker=UNCHANGED_TOAST)
    memory.merge("bag", SCHEMA, inserts, app_id="a", version=1, description="d")
    one_less = fold_changes([TableChange(OP_DELETE, None, row, None, 0)], bag.column_names, (),
                            unchanged_marker=UNCHANGED_TOAST)
    memory.merge("bag", SCHEMA, one_less, app_id="a", version=2, description="d")
    assert memory.rows("bag") == [row, row]
    too_many = fold_changes([TableChange(OP_DELETE, None, row, None, i) for i in range(3)], bag.column_names, (),
                            unchanged_marker=UNCHANGED_TOAST)
    with pytest.raises(SinkError, match="deleted more copies"):
        memory.merge("bag", SCHEMA, too_many, app_id="a", version=3, description="d")


def test_a_scan_gives_what_a_spark_row_holds_and_leaves_out_flagged_rows(tmp_path: Path) -> None:
    """What verify compares: delta-rs's values brought to Spark's (a struct as a tuple in field order, a
    map as a dict, nested in lists too; instants aware in UTC), names matched as Spark matches them, the
    rows a soft-deleting table flags left out, and rows without columns still counted."""
    from datetime import UTC, datetime

    path = str(tmp_path / "t")
    point = pa.struct([("y", pa.int32()), ("x", pa.string())])
    table = pa.table({
        "id": pa.array([1, 2, 3], pa.int32()),
        "p": pa.array([{"y": 1, "x": "a"}, None, {"y": 3, "x": None}], point),
        "m": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "ps": pa.array([[{"y": 5, "x": "b"}], None, []], pa.list_(point)),
        "at": pa.array([datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), None, None], pa.timestamp("us", tz="UTC")),
        "gone": pa.array([None, True, False]),
    })
    DELTARS.write_arrow(path, table, mode="overwrite", tag=None)
    assert DELTARS.can_scan(path) and not DELTARS.can_scan(str(tmp_path / "nothing"))
    rows = sorted(DELTARS.scan(path, ("ID", "p", "m", "ps", "at")), key=repr)
    assert rows == [(1, (1, "a"), {"k": 1}, [(5, "b")], datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
                    (2, None, {}, None, None), (3, (3, None), None, [], None)]
    assert sorted(DELTARS.scan(path, ("id",), unless="gone")) == [(1,), (3,)]
    assert list(DELTARS.scan(path, ())) == [(), (), ()]
    memory = InMemoryStore()
    memory.create(path, TableSpec("public.t", pa.schema([pa.field("id", pa.int32()), pa.field("gone", pa.string())]),
                                  ("id",), "d"),
                  TableOptions(), {})
    memory.write_arrow(path, table.select(["id", "gone"]), mode="overwrite", tag=None)
    assert sorted(memory.scan(path, ("id",), unless="gone")) == [(1,), (3,)]
