"""MERGEs into a local table with deletion vectors, made by applier itself (applier.sink.store.dvmerge),
give the table the in-memory store gives, as delta-rs's own reader (DataFusion) and Polars read it, and
rewrite no data file (past ``KEEP_FILES`` live files, they carry small files' rows instead). No JVM:
tests/integration/sink/test_dv_merge_spark.py holds Spark's reading of the same commits to it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from storegroups import changes_group

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.sink.plan import fold_changes
from applier.sink.spec import TableOptions, TableSpec
from applier.sink.store import DELTARS, InMemoryStore
from applier.sink.store.deltars import DeletionVectorStore
from applier.sink.store.dvlog import live_files
from applier.values import UNCHANGED_TOAST

SCHEMA = pa.schema([pa.field("id", pa.int32()), pa.field("a", pa.string())])
SPEC = TableSpec("public.t", SCHEMA, ("id",), "d")
DV = DeletionVectorStore()


def create_dv_table(path: str, schema: pa.Schema = SCHEMA, **properties: str) -> None:
    """A table with deletion vectors enabled, as the mirror creates it (applier.sink.store.dvcommit)."""
    options = TableOptions(properties={"delta.enableDeletionVectors": "true"})
    spec = TableSpec("public.t", schema, (schema.names[0],), "d")
    assert DELTARS.can_create(path, spec, options)
    DELTARS.create(path, spec, options, {"delta.enableDeletionVectors": "true", **properties})


def dv_rows(path: str, columns: tuple[str, ...] = ("id", "a")) -> list[tuple[Any, ...]]:
    """The table's rows as delta-rs's DataFusion reads them (deletion vectors applied); Polars must agree."""
    import polars as pl
    from deltalake import DeltaTable, QueryBuilder

    table = pa.table(QueryBuilder().register("t", DeltaTable(path)).execute(
        "SELECT " + ", ".join(f'"{c}"' for c in columns) + " FROM t").read_all())
    rows = sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True), key=repr)
    polars = pl.read_delta(path).select(list(columns))
    assert sorted(polars.iter_rows(), key=repr) == rows
    return rows


def _group(rng: random.Random, live: dict[int, str], n: int, keys: int) -> list[TableChange]:
    return changes_group(rng, live, n, keys=keys, moved_to=keys + 50, truncate=0.003, insert=0.2, delete=0.45,
                         move=0.55, values=1000)


def _data_file_writes(path: str) -> tuple[int, int]:
    """(files added, files removed without being added again) by the MERGEs over the whole log (a
    truncate's overwrite removes every file)."""
    added = dropped = 0
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        if actions[0]["commitInfo"]["operation"] != "MERGE":
            assert actions[0]["commitInfo"]["operation"] in ("CREATE TABLE", "WRITE")  # created, truncated
            continue
        readded = {a["add"]["path"] for a in actions if "add" in a and "deletionVector" in a["add"]}
        added += sum(1 for a in actions if "add" in a and "deletionVector" not in a["add"])
        dropped += sum(1 for a in actions if "remove" in a and a["remove"]["path"] not in readded)
    return added, dropped


@pytest.mark.parametrize("seed", range(3))
def test_deletion_vector_merges_give_the_in_memory_table_and_rewrite_no_file(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "t")
    create_dv_table(path, **{"delta.checkpointInterval": "3"})  # checkpoints taken and replayed from
    memory = InMemoryStore()
    memory.create(path, SPEC, TableOptions(), {})
    live: dict[int, str] = {}
    for version in range(1, 13):
        plan = fold_changes(_group(rng, live, rng.randrange(1, 120), 300), SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
        # every third commit by another store: the run's store (DV) reads what it did not write itself
        writer = DV if version % 3 else DeletionVectorStore()
        ours = writer.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        theirs = memory.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        assert ours is not None, "the deletion-vector writer declined a plan it makes"
        assert ours == theirs
        assert dv_rows(path) == sorted(live.items(), key=repr)
        again = DV.merge(path, SCHEMA, plan, app_id="app", version=version, description="again")
        assert again is not None and again.rows_upserted == again.rows_deleted == 0
        assert DV.applied_version(path, "app") == version
    assert dv_rows(path) == sorted(live.items(), key=repr)
    assert _data_file_writes(path)[1] == 0, "a data file was removed: rewritten, not marked"
    assert any(Path(path, "_delta_log").glob("*.checkpoint.parquet"))
    files = live_files(Path(path), DV.version(path))
    assert any(f.deletion_vector for f in files)
    assert sum(json.loads(f.add["stats"])["numRecords"] - (f.deletion_vector or {}).get("cardinality", 0)
               for f in files) == len(live)
    assert DV.file_stats(path).rows == len(live)  # what `applier status` shows


def test_a_composite_key_and_typed_columns(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k1", pa.int64()), pa.field("k2", pa.string()), pa.field("v", pa.float64())])
    spec = TableSpec("public.c", schema, ("k1", "k2"), "d")
    path = str(tmp_path / "c")
    create_dv_table(path, schema)
    rng = random.Random(5)
    live: dict[tuple[int, str], float] = {}
    for version in range(1, 8):
        changes = []
        for i in range(60):
            key = (rng.randrange(5), rng.choice("abc"))
            if key in live and rng.random() < 0.3:
                del live[key]
                changes.append(TableChange(OP_DELETE, key, None, None, i))
            else:
                op = OP_UPDATE if key in live else OP_INSERT
                live[key] = rng.random()
                changes.append(TableChange(op, None, None, (*key, live[key]), i))
        plan = fold_changes(changes, spec.column_names, (0, 1), unchanged_marker=UNCHANGED_TOAST)
        assert DV.merge(path, schema, plan, app_id="app", version=version, description="c") is not None
        assert dv_rows(path, ("k1", "k2", "v")) == sorted(((*k, v) for k, v in live.items()), key=repr)


def test_what_it_leaves_to_spark(tmp_path: Path) -> None:
    """A value to read from the target, a table without deletion vectors and a target holding a key twice:
    declined (None), the table untouched. A truncate is delta-rs's overwrite."""
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    create_dv_table(path)
    insert = fold_changes([TableChange(OP_INSERT, None, None, (1, "x"), 0)], SPEC.column_names, (0,),
                          unchanged_marker=UNCHANGED_TOAST)
    assert DV.merge(path, SCHEMA, insert, app_id="app", version=1, description="") is not None
    truncate = fold_changes([TableChange(OP_TRUNCATE, None, None, None, 0)], SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
    toast = fold_changes([TableChange(OP_UPDATE, None, None, (1, UNCHANGED_TOAST), 0, new_partial=True)],
                         SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
    assert DV.merge(path, SCHEMA, toast, app_id="app", version=2, description="") is None
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int32()), "a": ["twice"]}), mode="append")
    update = fold_changes([TableChange(OP_UPDATE, None, None, (1, "y"), 0)], SPEC.column_names, (0,),
                          unchanged_marker=UNCHANGED_TOAST)
    assert DV.merge(path, SCHEMA, update, app_id="app", version=2, description="") is None
    assert dv_rows(path) == [(1, "twice"), (1, "x")]
    after = fold_changes([TableChange(OP_TRUNCATE, None, None, None, 0),
                          TableChange(OP_INSERT, None, None, (7, "after"), 1)], SPEC.column_names, (0,),
                         unchanged_marker=UNCHANGED_TOAST)
    assert truncate.truncated and after.truncated
    result = DV.merge(path, SCHEMA, after, app_id="app", version=2, description="")
    assert result is not None and result.overwritten
    assert dv_rows(path) == [(7, "after")]
    plain = str(tmp_path / "plain")
    DeltaTable.create(plain, SCHEMA)
    assert not DV.can_merge(plain) and DV.can_merge(path)
    assert DV.merge(plain, SCHEMA, insert, app_id="app", version=1, description="") is None


def test_a_table_replaced_at_its_path_is_read_anew(tmp_path: Path) -> None:
    """What the store keeps between commits (the log replayed, key columns, vectors, the open table) is of
    the table it read: a table deleted and created again at the same path is read from scratch."""
    import shutil

    path = str(tmp_path / "t")
    store = DeletionVectorStore()

    def apply(changes: list[TableChange], version: int) -> None:
        plan = fold_changes(changes, SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
        assert store.merge(path, SCHEMA, plan, app_id="app", version=version, description="") is not None

    create_dv_table(path)
    for version in range(1, 5):
        apply([TableChange(OP_INSERT, None, None, (k, f"old{version}"), k) for k in range(version * 10)], version)
    apply([TableChange(OP_DELETE, (k,), None, None, k) for k in range(5)], 5)
    shutil.rmtree(path)
    create_dv_table(path)
    for version in range(1, 8):
        apply([TableChange(OP_INSERT, None, None, (k, f"new{version}"), k) for k in range(3)], version)
    apply([TableChange(OP_DELETE, (1,), None, None, 0)], 8)
    assert dv_rows(path) == [(0, "new7"), (2, "new7")]


def test_a_key_moved_to_other_columns_is_matched_on_them(tmp_path: Path) -> None:
    """The key columns kept between commits are those of the key they were read for: after the source's
    key moves from ``k1`` to ``k2`` (same files), rows are matched on ``k2``."""
    schema = pa.schema([pa.field("k1", pa.int32()), pa.field("k2", pa.int32()), pa.field("v", pa.string())])
    path = str(tmp_path / "m")
    create_dv_table(path, schema)
    store = DeletionVectorStore()
    names = ("k1", "k2", "v")
    first = fold_changes([TableChange(OP_INSERT, None, None, (i, 99 - i, "a"), i) for i in range(100)], names, (0,),
                         unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, schema, first, app_id="app", version=1, description="") is not None
    on_k1 = fold_changes([TableChange(OP_UPDATE, None, None, (50, 49, "c"), 0)], names, (0,),
                         unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, schema, on_k1, app_id="app", version=2, description="") is not None  # k1 kept
    moved = fold_changes([TableChange(OP_UPDATE, None, None, (2, 97, "b"), 0)], names, (1,),
                         unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, schema, moved, app_id="app", version=3, description="") is not None
    rows = dv_rows(path, names)
    assert len(rows) == 100 and (2, 97, "b") in rows and (97, 2, "a") in rows and (50, 49, "c") in rows


def test_an_array_key_is_left_to_spark(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.list_(pa.int32())), pa.field("v", pa.string())])
    path = str(tmp_path / "a")
    create_dv_table(path, schema)
    insert = fold_changes([TableChange(OP_INSERT, None, None, ([1, 2], "x"), 0)], ("k", "v"), (0,),
                          unchanged_marker=UNCHANGED_TOAST)
    assert DV.merge(path, schema, insert, app_id="app", version=1, description="") is None


def test_a_table_with_deletion_vectors_is_created_as_spark_creates_it(tmp_path: Path) -> None:
    """The protocol Spark's CREATE TABLE gives a table with ``delta.enableDeletionVectors`` (read off Spark
    4.2 / Delta 4.4 on this machine), ``timestampNtz`` where a column needs it; not over an existing table,
    and not where this writer would not make its MERGEs (partitions, other Delta properties)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    path = str(tmp_path / "t")
    create_dv_table(path)
    protocol = DeltaTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert protocol.reader_features == ["deletionVectors"]
    assert sorted(protocol.writer_features or ()) == ["appendOnly", "deletionVectors", "invariants"]
    assert DeltaTable(path).metadata().configuration == {"delta.enableDeletionVectors": "true"}
    assert DV.can_merge(path)
    with pytest.raises(CommitFailedError):
        create_dv_table(path)
    local = pa.schema([pa.field("id", pa.int32()), pa.field("at", pa.timestamp("us"))])
    create_dv_table(str(tmp_path / "ntz"), local)
    assert sorted(DeltaTable(str(tmp_path / "ntz")).protocol().reader_features or ()) == ["deletionVectors",
                                                                                          "timestampNtz"]
    spec = TableSpec("public.t", SCHEMA, ("id",), "d")
    dv = {"delta.enableDeletionVectors": "true"}
    assert not DELTARS.can_create(str(tmp_path / "p"), spec, TableOptions(partition_by=("a",), properties=dv))
    assert not DELTARS.can_create(str(tmp_path / "o"), spec,
                                  TableOptions(properties={**dv, "delta.logRetentionDuration": "interval 1 day"}))
    assert not DELTARS.can_create("s3://bucket/t", spec, TableOptions(properties=dv))


@pytest.mark.parametrize("seed", range(40))
def test_keys_found_by_search_are_those_every_row_tested_gives(seed: int) -> None:
    """A file's one integer key searched in its KeyIndex gives the rows, live and matched, that testing
    every row gives (applier.sink.store.dvmerge._matching_in, the path of other keys): sorted files and
    shuffled ones, dense runs (a serial key in its order: no search) up to the type's extremes, keys wanted
    twice or absent, rows already deleted. A file holding a NULL or a key twice has no index (the general
    path finds every copy, and the commit is declined)."""
    import numpy as np

    from applier.sink.store.dvkeys import KeyIndex, live_rows
    from applier.sink.store.dvmerge import _matching_in

    rng = np.random.default_rng(seed)
    kind = [pa.int16(), pa.int32(), pa.int64()][seed % 3]
    info = np.iinfo(kind.to_pandas_dtype())
    n = int(rng.integers(0, 3000))
    pool = np.concatenate([[info.min, info.max, 0, -1, 1], rng.integers(info.min, info.max, 4 * n + 10)])
    values = np.unique(pool)[:n] if seed % 4 else rng.permutation(np.unique(pool))[:n]
    if seed % 3 == 1:  # a dense run: every key from its first to its last, at the bottom, top or middle
        start = [info.min, info.max - n + 1, -n // 2][seed % 9 // 3]
        values = np.arange(start, start + n, dtype=np.int64).astype(values.dtype)
    if seed % 5 == 0 and n > 2:
        values[-1] = values[0]  # a key held twice
    column = pa.chunked_array([pa.array(values[: n // 2], kind), pa.array(values[n // 2:], kind)], kind)
    if seed % 7 == 0 and n:
        column = pa.chunked_array([pa.array([None, *values[1:].tolist()], kind)], kind)
    wanted = np.concatenate([rng.choice(values, min(n, 50)) if n else values, pool[-20:]]).astype(values.dtype)
    keys = pa.table({"id": pa.array(wanted, kind)})
    deleted = np.unique(rng.integers(0, max(n, 1), n // 3)).astype(np.uint64)
    expected = _matching_in(pa.table({"id": column}), keys, deleted)
    index = KeyIndex.of(column)
    duplicated = len(set(values.tolist())) < n
    if column.null_count or duplicated:
        assert index is None
        return
    assert index is not None and (index.order is None) == bool(np.all(values[1:] > values[:-1]))
    assert index.dense or seed % 3 != 1
    rows, their_keys = index.find(wanted)
    live = live_rows(rows, deleted)
    assert rows[live].astype(np.uint64).tolist() == expected.tolist()
    assert their_keys.tolist() == column.to_numpy()[rows].tolist()
    assert live_rows(rows, deleted[::-1].copy()).tolist() == live.tolist()  # a vector read in any order


def test_a_file_holding_a_key_twice_is_left_to_spark(tmp_path: Path) -> None:
    """Within one file as across two (test_what_it_leaves_to_spark): Spark's MERGE updates both copies."""
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    create_dv_table(path)
    store = DeletionVectorStore()
    write_deltalake(path, pa.table({"id": pa.array([1, 2, 1], pa.int32()), "a": ["x", "y", "z"]}), mode="append")
    update = fold_changes([TableChange(OP_UPDATE, None, None, (1, "w"), 0)], SPEC.column_names, (0,),
                          unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, SCHEMA, update, app_id="app", version=1, description="") is None
    other = fold_changes([TableChange(OP_UPDATE, None, None, (2, "v"), 0)], SPEC.column_names, (0,),
                         unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, SCHEMA, other, app_id="app", version=1, description="") is not None
    assert dv_rows(path) == [(1, "x"), (1, "z"), (2, "v")]


def test_the_new_files_keys_are_kept_from_the_commit_not_read_back(tmp_path: Path) -> None:
    """The next commit finds the rows of the file the last one wrote from the keys it wrote (a file's
    keys read from disk at every commit were a third of a following round's key matching)."""
    from applier.sink.store.dvkeys import KeyIndex

    path = str(tmp_path / "t")
    create_dv_table(path)
    store = DeletionVectorStore()
    rows = [TableChange(OP_INSERT, None, None, (k, "a"), i) for i, k in enumerate((5, 3, 9, 1))]
    plan = fold_changes(rows, SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
    assert store.merge(path, SCHEMA, plan, app_id="app", version=1, description="") is not None
    (written,) = live_files(Path(path), store.version(path))
    (cached,) = store.cache.tables.values()
    held = cached.keys[(written.path, ("id",))]
    assert isinstance(held, KeyIndex) and held.keys.tolist() == [1, 3, 5, 9]
    Path(path, written.path).unlink()  # found from what was kept, or the commit fails
    update = fold_changes([TableChange(OP_UPDATE, None, None, (3, "b"), 0)], SPEC.column_names, (0,),
                          unchanged_marker=UNCHANGED_TOAST)
    result = store.merge(path, SCHEMA, update, app_id="app", version=2, description="")
    assert result is not None and result.rows_upserted == 1
    marked = [f for f in live_files(Path(path), store.version(path)) if f.deletion_vector]
    assert [(f.path, (f.deletion_vector or {}).get("cardinality")) for f in marked] == [(written.path, 1)]


def test_a_column_added_between_two_commits_is_read_before_the_next(tmp_path: Path) -> None:
    """A store's commits start from what its last one left (dvmerge.TableFacts) only while nobody else
    committed: a column added in between by delta-rs (as applier's schema evolution adds one) is in the
    next commit's table, and rows of both shapes read back."""
    from deltalake import DeltaTable, Field
    from deltalake.schema import PrimitiveType

    path = str(tmp_path / "t")
    create_dv_table(path)
    store = DeletionVectorStore()
    insert = [TableChange(OP_INSERT, None, None, (i, f"v{i}")) for i in range(1, 6)]
    assert store.merge(path, SCHEMA, fold_changes(insert, SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST),
                       app_id="app", version=1, description="v1") is not None
    update = [TableChange(OP_UPDATE, None, None, (2, "two"))]
    assert store.merge(path, SCHEMA, fold_changes(update, SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST),
                       app_id="app", version=2, description="v2") is not None  # from the kept facts
    DeltaTable(path).alter.add_columns([Field("b", PrimitiveType("long"), nullable=True)])
    # a plan of the old shape into the wider table is not this writer's (Spark's MERGE keeps the column)
    narrow = [TableChange(OP_UPDATE, None, None, (4, "four"))]
    assert store.merge(path, SCHEMA, fold_changes(narrow, SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST),
                       app_id="app", version=3, description="narrow") is None
    wider = pa.schema([*SCHEMA, pa.field("b", pa.int64())])
    changes = [TableChange(OP_UPDATE, None, None, (3, "three", 30)),
               TableChange(OP_INSERT, None, None, (9, "nine", 90))]
    result = store.merge(path, wider, fold_changes(changes, wider.names, (0,), unchanged_marker=UNCHANGED_TOAST),
                         app_id="app", version=3, description="v3")
    assert result is not None and result.version == 4  # after the column's commit, not over it
    assert dv_rows(path, ("id", "a", "b")) == sorted(
        [(1, "v1", None), (2, "two", None), (3, "three", 30), (4, "v4", None), (5, "v5", None), (9, "nine", 90)],
        key=repr)
    again = store.merge(path, wider, fold_changes(changes, wider.names, (0,), unchanged_marker=UNCHANGED_TOAST),
                        app_id="app", version=3, description="again")
    assert again is not None and again.rows_upserted == 0  # applied: the kept facts know it


@pytest.mark.parametrize("seed", range(2))
def test_commits_past_the_files_kept_carry_small_files_rows_and_lose_none(
        tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``KEEP_FILES`` live files, each commit carries the live rows of one size tier's files into
    its new file and removes them: the table stays the in-memory store's (inserts, updates, deletes, keys
    moved, a truncate), as delta-rs and Polars read it, and its files stay few. Small limits here; the
    writer's own are 16 files and tiers of 4."""
    from applier.sink.store import dvmerge

    monkeypatch.setattr(dvmerge, "KEEP_FILES", 4)
    monkeypatch.setattr(dvmerge, "TIER_FILES", 2)
    rng = random.Random(seed)
    path = str(tmp_path / "t")
    create_dv_table(path)
    memory = InMemoryStore()
    memory.create(path, SPEC, TableOptions(), {})
    live: dict[int, str] = {}
    most = 0
    for version in range(1, 41):
        plan = fold_changes(_group(rng, live, rng.randrange(1, 150), 400), SPEC.column_names, (0,),
                            unchanged_marker=UNCHANGED_TOAST)
        ours = DV.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        theirs = memory.merge(path, SCHEMA, plan, app_id="app", version=version, description=f"v{version}")
        assert ours is not None and ours == theirs
        assert dv_rows(path) == sorted(live.items(), key=repr), f"version {version}"
        files = live_files(Path(path), DV.version(path))
        most = max(most, len(files))
        assert sum(json.loads(f.add["stats"])["numRecords"] - (f.deletion_vector or {}).get("cardinality", 0)
                   for f in files) == len(live)
    assert _data_file_writes(path)[1] > 0, "no file was carried"
    assert most <= 12, f"{most} live files"


def test_a_checkpoint_is_taken_after_its_commit_and_waited_for_by_the_next(tmp_path: Path) -> None:
    """A commit at the checkpoint interval returns before the checkpoint is written (on a thread of the
    store's cache: a drain waited for it); the table's next commit waits for it, and every reader reads
    the table meanwhile."""
    from applier.sink.store.dvmerge import local_root

    store = DeletionVectorStore()
    path = str(tmp_path / "t")
    create_dv_table(path, **{"delta.checkpointInterval": "2"})
    live: dict[int, str] = {}
    rng = random.Random(7)
    root = local_root(path)
    assert root is not None
    for version in range(1, 6):
        plan = fold_changes(_group(rng, live, 40, 200), SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
        assert store.merge(path, SCHEMA, plan, app_id="app", version=version, description="") is not None
        assert dv_rows(path) == sorted(live.items(), key=repr)  # with a checkpoint under way or not
    store.cache.settle(root)
    checkpoints = sorted(p.name for p in Path(path, "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints[-1].startswith(f"{4:020d}")  # versions 2 and 4 (5 is not at the interval)
    assert store.applied_version(path, "app") == 5


def test_a_commit_at_the_interval_does_not_wait_for_its_checkpoint(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With delta-rs's checkpoint held back, the commit at the interval returns anyway, with no checkpoint
    written yet; the table's next commit waits until the checkpoint is done."""
    import threading

    from deltalake import DeltaTable

    from applier.sink.store.dvmerge import local_root

    release = threading.Event()
    real = DeltaTable.create_checkpoint

    def held_back(table: DeltaTable) -> None:
        release.wait(10)
        real(table)

    monkeypatch.setattr(DeltaTable, "create_checkpoint", held_back)
    store = DeletionVectorStore()
    path = str(tmp_path / "t")
    create_dv_table(path, **{"delta.checkpointInterval": "2"})
    live: dict[int, str] = {}
    rng = random.Random(11)
    plans = [fold_changes(_group(rng, live, 30, 200), SPEC.column_names, (0,), unchanged_marker=UNCHANGED_TOAST)
             for _ in range(3)]
    for version in (1, 2):
        assert store.merge(path, SCHEMA, plans[version - 1], app_id="app", version=version, description="")
    assert not list(Path(path, "_delta_log").glob("*.checkpoint.parquet"))  # held back, and not waited for
    third = threading.Thread(target=store.merge, args=(path, SCHEMA, plans[2]),
                             kwargs={"app_id": "app", "version": 3, "description": ""})
    third.start()
    third.join(0.3)
    assert third.is_alive()  # the next commit waits for the checkpoint
    release.set()
    third.join(10)
    assert not third.is_alive() and store.applied_version(path, "app") == 3
    root = local_root(path)
    assert root is not None
    store.cache.settle(root)
    assert [p.name[:20] for p in Path(path, "_delta_log").glob("*.checkpoint.parquet")] == [f"{2:020d}"]
    assert dv_rows(path) == sorted(live.items(), key=repr)


def test_files_from_before_a_column_was_added_are_not_carried(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``KEEP_FILES``, a file written before a column was added does not have the table's columns: it
    stays where it is (its rows read back with NULL there), and only files of the new shape are carried."""
    from deltalake import DeltaTable, Field
    from deltalake.schema import PrimitiveType

    from applier.sink.store import dvmerge

    monkeypatch.setattr(dvmerge, "KEEP_FILES", 3)
    monkeypatch.setattr(dvmerge, "TIER_FILES", 2)
    path = str(tmp_path / "t")
    create_dv_table(path)
    store = DeletionVectorStore()
    expected: dict[int, tuple[Any, ...]] = {}
    version = 0
    for i in range(4):  # four narrow files, one row each
        version += 1
        change = TableChange(OP_INSERT, None, None, (i, f"n{i}"))
        assert store.merge(path, SCHEMA, fold_changes([change], SPEC.column_names, (0,),
                                                      unchanged_marker=UNCHANGED_TOAST),
                           app_id="app", version=version, description="") is not None
        expected[i] = (i, f"n{i}", None)
    narrow = {f.path for f in live_files(Path(path), store.version(path))}
    DeltaTable(path).alter.add_columns([Field("b", PrimitiveType("long"), nullable=True)])
    wider = pa.schema([*SCHEMA, pa.field("b", pa.int64())])
    for i in range(10, 16):
        version += 1
        change = TableChange(OP_INSERT, None, None, (i, f"w{i}", i * 10))
        assert store.merge(path, wider, fold_changes([change], wider.names, (0,), unchanged_marker=UNCHANGED_TOAST),
                           app_id="app", version=version, description="") is not None
        expected[i] = (i, f"w{i}", i * 10)
    assert dv_rows(path, ("id", "a", "b")) == sorted(expected.values(), key=repr)
    files = {f.path for f in live_files(Path(path), store.version(path))}
    assert narrow <= files  # none carried
    assert len(files) < len(narrow) + 6  # files of the new shape were (one written by each of 6 commits)


def test_verify_reads_a_deletion_vector_table_without_spark(tmp_path: Path) -> None:
    """delta-rs's DataFusion scan applies the deletion vectors (a pyarrow dataset of the files would read
    the rows they delete too), so ``verify`` of such a table needs no JVM: its rows are the live ones, under
    names matched as Spark matches them, odd ones included, and without the soft-deleted ones."""
    schema = pa.schema([pa.field("id", pa.int32()), pa.field('we"ird', pa.string()), pa.field("Gone", pa.bool_())])
    path = str(tmp_path / "t")
    create_dv_table(path, schema)
    rng = random.Random(5)
    live: dict[int, tuple[str, bool]] = {}
    for version in range(1, 8):
        changes = []
        for i in range(60):
            key = rng.randrange(200)
            if key in live and rng.random() < 0.4:
                changes.append(TableChange(OP_DELETE, (key,), None, None, i))
                del live[key]
            else:
                op = OP_UPDATE if key in live else OP_INSERT
                live[key] = (f"v{version}-{rng.randrange(9)}", rng.random() < 0.2)
                changes.append(TableChange(op, None, None, (key, *live[key]), i))
        plan = fold_changes(changes, tuple(schema.names), (0,), unchanged_marker=UNCHANGED_TOAST)
        assert DV.merge(path, schema, plan, app_id="app", version=version, description=f"v{version}") is not None
    assert DELTARS.can_scan(path)
    assert sorted(DELTARS.scan(path, ["ID", 'we"ird'])) == sorted((k, v) for k, (v, _gone) in live.items())
    assert sorted(DELTARS.scan(path, ["id"], unless="Gone")) == sorted((k,) for k, (_v, gone) in live.items()
                                                                       if not gone)
    assert len(list(DELTARS.scan(path, []))) == len(live)
    deleted = sum((f.deletion_vector or {}).get("cardinality", 0) for f in live_files(Path(path), DV.version(path)))
    assert deleted > 0  # else the scan had no vector to apply
