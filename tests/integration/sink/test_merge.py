"""TablePlan folding and its one-commit execution on a real local Delta table."""

from __future__ import annotations

import pyarrow as pa
import pytest

from applier.changes import TableChange
from applier.errors import SinkError
from applier.sink.idempotence import applied_version
from applier.sink.plan import fold_changes
from applier.sink.schema import ensure_table
from applier.sink.spec import TableSpec, app_id_for
from applier.sink.store.sparkmerge import apply_plan

pytestmark = pytest.mark.spark

U = object()  # the unchanged-TOAST marker of these tests


def Ch(op: str, new_row: tuple | None = None, old_key: tuple | None = None, old_row: tuple | None = None,  # noqa: N802
       restart_identity: bool = False) -> TableChange:
    """A TableChange with the arguments in the order these tests read best."""
    return TableChange(op, old_key, old_row, new_row, restart_identity=restart_identity)


SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("big note", pa.string()),
                    pa.field("tags", pa.list_(pa.field("element", pa.string())))])
COLS = list(SCHEMA.names)


def rows(spark, path):
    return sorted((r[0], r[1], r[2]) for r in spark.read.format("delta").load(path).collect())


def versions(spark, path):
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history().count()


def run(spark, path, changes, version, keys=(0,)):
    plan = fold_changes(changes, COLS, keys, unchanged_marker=U)
    return apply_plan(spark, path, SCHEMA, plan, app_id=app_id_for("t"), version=version, description="public.t")


def test_keyed_fold_resolves_toast_from_target_row_of_old_key_and_is_idempotent(spark, tmp_path):
    path = str(tmp_path / "t")
    ensure_table(spark, path, TableSpec("public.t", SCHEMA, ("id",), "d"))
    run(spark, path, [Ch("I", (1, "A" * 5000, ["x"])), Ch("I", (2, "B", None)), Ch("I", (3, "C", ["y", None]))], 100)
    assert rows(spark, path) == [(1, "A" * 5000, ["x"]), (2, "B", None), (3, "C", ["y", None])]

    batch = [
        Ch("U", (10, U, ["moved"]), old_key=(1,)),  # key change; toasted note from the OLD key's row
        Ch("U", (10, U, ["moved again"])),  # chained: still the old key's value
        Ch("D", old_key=(2,)),
        Ch("U", (3, U, None)),  # unchanged note stays
        Ch("I", (4, "D", [])),
        Ch("D", old_key=(4,)),  # inserted then deleted in the same batch
    ]
    before = versions(spark, path)
    res = run(spark, path, batch, 200)
    assert rows(spark, path) == [(3, "C", None), (10, "A" * 5000, ["moved again"])]
    assert res.rows_deleted == 3 and res.rows_upserted == 2
    assert versions(spark, path) == before + 1
    assert applied_version(spark, path, app_id_for("t")) == 200

    # Replaying the same batch (crash before our state was saved) writes nothing.
    run(spark, path, batch[2:3], 200)
    assert versions(spark, path) == before + 1
    assert rows(spark, path) == [(3, "C", None), (10, "A" * 5000, ["moved again"])]


def test_unresolvable_toast_stops_with_error_and_leaves_table_unchanged(spark, tmp_path):
    path = str(tmp_path / "t")
    ensure_table(spark, path, TableSpec("public.t", SCHEMA, ("id",), "d"))
    run(spark, path, [Ch("I", (1, "a", None))], 1)
    with pytest.raises(SinkError, match="no row to take them from"):
        run(spark, path, [Ch("U", (5, U, None))], 2)  # key 5 was never mirrored
    assert rows(spark, path) == [(1, "a", None)]
    with pytest.raises(SinkError, match="deleted earlier in the same batch"):
        fold_changes([Ch("D", old_key=(1,)), Ch("U", (1, U, None))], COLS, (0,), unchanged_marker=U)


def test_truncate_is_a_barrier_insert_truncate_insert_leaves_second(spark, tmp_path):
    path = str(tmp_path / "t")
    ensure_table(spark, path, TableSpec("public.t", SCHEMA, ("id",), "d"))
    run(spark, path, [Ch("I", (1, "old", None))], 1)
    res = run(spark, path, [Ch("I", (2, "x", None)), Ch("T"), Ch("I", (3, "y", None)),
                            Ch("U", (3, U, ["t"]))], 2)
    assert res.overwritten
    assert rows(spark, path) == [(3, "y", ["t"])]


def test_multiset_table_deletes_exactly_one_duplicate_per_message(spark, tmp_path):
    path = str(tmp_path / "m")
    ensure_table(spark, path, TableSpec("public.m", SCHEMA, (), "f"))
    dup = (7, "same", ["a"])
    run(spark, path, [Ch("I", dup), Ch("I", dup), Ch("I", dup), Ch("I", (8, None, None))], 1, keys=())
    assert rows(spark, path) == [dup, dup, dup, (8, None, None)]
    # delete one copy, update another copy; unchanged TOAST in the new row is filled from 'O'
    run(spark, path, [Ch("D", old_row=dup), Ch("U", (7, U, ["b"]), old_row=dup)], 2, keys=())
    assert rows(spark, path) == [(7, "same", ["a"]), (7, "same", ["b"]), (8, None, None)]
    with pytest.raises(SinkError, match="diverged"):
        run(spark, path, [Ch("D", old_row=(9, "never", None))], 3, keys=())


def test_a_keyed_fold_into_a_table_without_rows_is_one_append_and_then_merges_again(spark, tmp_path):
    from delta.tables import DeltaTable

    def operations():
        return [r["operation"] for r in DeltaTable.forPath(spark, path).history().orderBy("version").collect()]

    path = str(tmp_path / "t")
    ensure_table(spark, path, TableSpec("public.t", SCHEMA, ("id",), "d"))
    batch = [Ch("I", (1, "a", None)), Ch("I", (2, "b", ["x"])), Ch("U", (1, "a2", None)),
             Ch("D", old_key=(2,)), Ch("D", old_key=(7,)), Ch("I", (3, "c", []))]
    res = run(spark, path, batch, 100)
    assert rows(spark, path) == [(1, "a2", None), (3, "c", [])]
    assert (res.rows_upserted, res.rows_deleted) == (2, 0)
    assert operations()[-1] == "WRITE"  # an append, not a MERGE
    assert applied_version(spark, path, app_id_for("t")) == 100
    run(spark, path, batch, 100)  # replayed after a crash: nothing written twice
    assert rows(spark, path) == [(1, "a2", None), (3, "c", [])]

    run(spark, path, [Ch("I", (1, "again", None)), Ch("U", (3, "c2", None))], 200)  # rows exist: a MERGE
    assert operations()[-1] == "MERGE"
    assert rows(spark, path) == [(1, "again", None), (3, "c2", None)]

    run(spark, path, [Ch("D", old_key=(1,)), Ch("D", old_key=(3,))], 300)  # emptied: no files left
    run(spark, path, [Ch("I", (1, "back", None))], 400)
    assert operations()[-1] == "WRITE"
    assert rows(spark, path) == [(1, "back", None)]
    assert applied_version(spark, path, app_id_for("t")) == 400


def test_delta_rs_commits_equal_spark_merges_and_are_idempotent_for_both(spark, tmp_path):
    """The same folds through delta-rs (applier.sink.store.rsmerge) and through Spark give the same table;
    a delta-rs commit's version stops a Spark re-apply and the other way round."""
    from deltalake import DeltaTable

    from applier.sink.store import DELTARS, SparkStore

    groups = [
        [Ch("I", (1, "a", ["x", None])), Ch("I", (2, "b", None)), Ch("I", (3, "ü€𝄞", []))],  # into empty: append
        [Ch("U", (1, "a2", None)), Ch("D", old_key=(2,)), Ch("I", (4, "", ["y"])),
         Ch("U", (30, "moved", None), old_key=(3,))],  # a key change: old key deleted, new inserted
        [Ch("I", (2, "back", None)), Ch("U", (4, None, None)), Ch("D", old_key=(99,))],
        [Ch("I", (5, "gone", None)), Ch("T"), Ch("I", (6, "after", ["z"]))],  # truncated: overwrite
        [Ch("I", (7, "seven", None)), Ch("U", (6, "six", None))],
    ]
    rs, sp = str(tmp_path / "rs"), str(tmp_path / "sp")
    for path in (rs, sp):
        ensure_table(spark, path, TableSpec("public.t", SCHEMA, ("id",), "d"))
    for n, changes in enumerate(groups, start=1):
        plan = fold_changes(changes, COLS, (0,), unchanged_marker=U)
        res = DELTARS.merge(rs, SCHEMA, plan, app_id=app_id_for("t"), version=n * 10, description="public.t")
        assert res is not None
        run(spark, sp, changes, n * 10)
        assert rows(spark, rs) == rows(spark, sp), n
        assert DeltaTable(rs).history(1)[0]["clientVersion"].startswith("delta-rs")
        assert applied_version(spark, rs, app_id_for("t")) == n * 10
    assert rows(spark, rs) == [(6, "six", None), (7, "seven", None)]
    before = DeltaTable(rs).version()
    run(spark, rs, [Ch("I", (8, "late", None))], 50)  # Spark sees delta-rs's txn action: nothing written
    plan = fold_changes([Ch("I", (8, "late", None))], COLS, (0,), unchanged_marker=U)
    assert DELTARS.merge(rs, SCHEMA, plan, app_id=app_id_for("t"), version=50, description="x") is not None
    DELTARS.merge(sp, SCHEMA, plan, app_id=app_id_for("t"), version=50, description="x")  # and the other way
    assert DeltaTable(rs).version() == before
    assert rows(spark, rs) == rows(spark, sp) == [(6, "six", None), (7, "seven", None)]
    # what delta-rs does not take: a value to read from a target it does not read as Spark does (column
    # mapping: 'big note'), a key-less table whose rows it would compare differently (a list column)
    toast = fold_changes([Ch("U", (7, U, ["t"]))], COLS, (0,), unchanged_marker=U)
    bag = fold_changes([Ch("I", (7, "x", None))], COLS, (), unchanged_marker=U)
    for plan in (toast, bag):
        assert DELTARS.merge(rs, SCHEMA, plan, app_id=app_id_for("t"), version=70, description="x") is None
    # a column dropped in the source stays in Delta: both engines take the narrower rows alike (NULL there
    # for a new row, the value kept for an updated one)
    narrow = pa.schema(list(SCHEMA)[:2])
    plan = fold_changes([Ch("I", (9, "nine")), Ch("U", (6, "six again"))], COLS[:2], (0,), unchanged_marker=U)
    assert DELTARS.merge(rs, narrow, plan, app_id=app_id_for("t"), version=60, description="x") is not None
    SparkStore(spark).merge(sp, narrow, plan, app_id=app_id_for("t"), version=60, description="x")
    assert rows(spark, rs) == rows(spark, sp) == [(6, "six again", None), (7, "seven", None), (9, "nine", None)]
