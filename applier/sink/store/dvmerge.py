"""A keyed MERGE into a local table with deletion vectors, written without Spark: the replaced rows are
marked deleted, the new row images appended.

Why: without deletion vectors a Delta MERGE is copy-on-write. Following pgbench, each round's few
thousand updates of ``pgbench_accounts`` rewrote its 1M-row file (bench/RESULTS.md, twenty-fifth
session: the round's time was that rewrite, and its CPU was taken from the database being followed).
Spark writes deletion vectors but costs seconds a commit; delta-rs 1.6 reads them (its MERGE, its
DataFusion queries, Polars) but writes none. So applier writes them itself, as Spark's MERGE does:

* every live row whose key the plan holds is found (the files' key columns read once and kept, one
  integer key sorted and searched: applier.sink.store.dvkeys; files skipped by their key statistics),
  and added to its file's deletion vector (the old one's rows kept);
* the plan's new row images are appended in one new Parquet file (past ``KEEP_FILES`` live files, with
  the live rows of a few small files, which the commit removes: ``_carried``);
* one commit: the new file's ``add``, each touched file's ``add`` again with its new deletion vector
  (its statistics carried on, no longer tight) and the ``remove`` of its old entry, the applied version
  as the ``txn`` action Spark and delta-rs record, the description as ``userMetadata``.

A TRUNCATE (and what follows it in the group) is delta-rs's overwrite, which reads nothing.

Which tables: the user's choice (``delta.enableDeletionVectors`` in the table's properties, made by
Spark's ``CREATE TABLE``), on a local filesystem (the commit is an atomic link of the JSON file, which
fails when another writer took the version: a conflict, retried like delta-rs's), without partitions,
constraints, column mapping or other features this writer does not keep. Any other plan or table
(unchanged-TOAST values read from the target, a key-less table, a target that holds a key twice) returns
None, and the caller takes Spark's MERGE.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from applier.sink.store.arrow import OP_COL
from applier.sink.store.base import CommitResult
from applier.sink.store.dvcommit import write_commit, write_data_file
from applier.sink.store.dvkeys import KeyIndex, live_rows
from applier.sink.store.dvlog import LiveFile, LogReplay, log_identity, still_at
from applier.sink.store.rsmerge import TableOpener, commit_tags, merge_source, open_for_commit
from applier.storage.location import scheme_of

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from applier.sink.plan import TablePlan

__all__ = ["DvCache", "apply_plan_dv", "writes_deletion_vectors"]

log = logging.getLogger(__name__)

#: what this writer keeps of a table's protocol: features it has nothing to do for (timestampNtz,
#: variantType: types; appendOnly and invariants: Spark's defaults, checked below where they ask anything)
WRITER_FEATURES = frozenset({"deletionVectors", "appendOnly", "invariants", "timestampNtz", "variantType"})
READER_FEATURES = frozenset({"deletionVectors", "timestampNtz", "variantType"})
#: delta-rs's and the protocol's default when the table sets none
CHECKPOINT_INTERVAL = 100


class TableCache:
    """What one table's MERGEs read again at every commit, kept between them: its log replayed, the key
    columns of its data files and its deletion vectors. Data files and vector files are never changed
    once written (their names are new uuids), so what is kept of one stays true; only what the live
    files no longer name is dropped. ``table_id``: the Delta table these are of (a table replaced at the
    same path starts over)."""

    def __init__(self, root: Path, table_id: str) -> None:
        self.table_id = table_id
        self.log = LogReplay(root)
        #: (file, key columns) -> their values: one integer key's as a KeyIndex, others as read
        self.keys: dict[tuple[str, tuple[str, ...]], pa.Table | KeyIndex] = {}
        self.vectors: dict[str, np.ndarray] = {}
        self.rows = 0

    def keep(self, file: str, names: tuple[str, ...], held: pa.Table | KeyIndex, tables: DvCache) -> None:
        """Keep a file's key values for the next commits, if the run's bound leaves room."""
        rows = _rows(held)
        if (file, names) not in self.keys and tables.room(rows):
            self.keys[(file, names)] = held
            self.rows += rows

    def deleted_rows(self, root: Path, file: LiveFile) -> np.ndarray:
        """The rows ``file``'s deletion vector marks, as kept (a vector is never changed once written), else
        read and kept."""
        import numpy as np

        from applier.sink.store.dvformat import descriptor_id, read_dv

        dv = file.deletion_vector
        if not dv:
            return np.empty(0, dtype=np.uint64)
        dv_id = descriptor_id(dv)
        rows = self.vectors.get(dv_id)
        if rows is None:
            rows = self.vectors[dv_id] = read_dv(root, dv)
        return rows

    def keep_only(self, files: list[LiveFile]) -> None:
        from applier.sink.store.dvformat import descriptor_id

        paths = {f.path for f in files}
        ids = {descriptor_id(f.deletion_vector) for f in files if f.deletion_vector}
        for stale in [k for k in self.keys if k[0] not in paths]:
            self.rows -= _rows(self.keys.pop(stale))
        for gone in [i for i in self.vectors if i not in ids]:
            del self.vectors[gone]


def _rows(held: pa.Table | KeyIndex) -> int:
    return held.keys.size if isinstance(held, KeyIndex) else held.num_rows


class DvCache:
    """A run's :class:`TableCache` per table, held by its ``DeletionVectorStore``. The key columns kept are
    bounded by ``max_rows`` in all (a file read beyond it is read again at the next commit): 1M integer
    keys are 4-8 MB, and 4 MB more for their order when the file does not hold them sorted. Tables
    commit in parallel, each on one thread at a time: each has its own cache."""

    def __init__(self, max_rows: int = 20_000_000) -> None:
        self.max_rows = max_rows
        self.tables: dict[Path, TableCache] = {}
        self._handles: dict[Path, tuple[Any, tuple[int, int]]] = {}  # root -> open table, its log's identity
        self._facts: dict[Path, TableFacts] = {}
        self._checkpoints: dict[Path, Future[None]] = {}  # root -> its checkpoint under way
        self._checkpointer: ThreadPoolExecutor | None = None

    def checkpoint_later(self, store: TableOpener, path: str, root: Path) -> None:
        """Take the table's checkpoint on a thread of its own, after the commit: delta-rs reads the log
        and writes every live file's entry, 50-90 ms for pgbench_accounts after a minute of rounds, which
        a round waited for before it confirmed (a drain of 0.13 s where the others took 0.07). A
        checkpoint only spares readers the JSON entries before it; the table's next commit waits for it
        (``settle``: it holds the table's delta-rs handle). Its threads end with the process's."""
        if self._checkpointer is None:
            self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="applier-checkpoint")
        self._checkpoints[root] = self._checkpointer.submit(lambda: self.open(store, path, root).create_checkpoint())

    def settle(self, root: Path) -> None:
        """The table's checkpoint under way, if any, done. One that failed is reported and left: the JSON
        entries it would have summed up stay readable, and the next interval takes another."""
        pending = self._checkpoints.pop(root, None)
        if pending is None:
            return
        try:
            pending.result()
        except Exception as e:  # noqa: BLE001  # (the commit it followed exists)
            log.warning("the checkpoint of the Delta table at %s failed: %s; its log stays readable, and the "
                        "next checkpoint interval takes another", root, e)

    def open(self, store: TableOpener, path: str, root: Path) -> Any:
        """The table's newest version through the ``deltalake.DeltaTable`` an earlier commit opened, brought
        up to date (``update_incremental``: only the commits since; opening reads the log anew, 50 ms at
        60 commits past a checkpoint), or opened by ``store``. A log directory that is not the one opened
        then (the table deleted, replaced: ``log_identity``) is opened anew."""
        identity = log_identity(root)
        if identity is None:
            self._handles.pop(root, None)
            return store.open(path)
        held = self._handles.get(root)
        if held is not None and held[1] == identity:
            held[0].update_incremental()
            return held[0]
        table = store.open(path)
        self._handles[root] = (table, identity)
        return table

    def table(self, root: Path, table_id: str) -> TableCache:
        cached = self.tables.get(root)
        if cached is None or cached.table_id != table_id:
            cached = self.tables[root] = TableCache(root, table_id)
        return cached

    def room(self, rows: int) -> bool:
        return sum(t.rows for t in list(self.tables.values())) + rows <= self.max_rows

    def facts(self, root: Path, app_id: str) -> TableFacts | None:
        """What this writer's last commit to the table left it, when nothing was committed after it (no
        log entry at the next version, the same log) and ``app_id`` is the one it committed for."""
        facts = self._facts.get(root)
        if facts is None or app_id not in facts.applied:
            return None
        if not still_at(root, facts.version, facts.identity):
            del self._facts[root]  # another writer committed (or the table was made anew): read it
            return None
        return facts

    def committed(self, root: Path, facts: TableFacts) -> None:
        self._facts[root] = facts

    def forget(self, root: Path) -> None:
        self._facts.pop(root, None)


@dataclass(slots=True)
class TableFacts:
    """What a commit reads of a table besides its files, as of ``version``: the table's id, columns and
    types, its checkpoint interval, the versions applied by app id. This writer's own commit changes
    none of it but the version and its app's applied version, so the next commit starts from these
    when no other writer committed since (DvCache.facts), instead of bringing delta-rs's handle up to
    date: that read the new log entry and replayed it, 17 ms a commit, and the applied version's
    lookup 6 ms more, beside pgbench (bench/RESULTS.md, thirty-fourth session), where a round's five
    tables commit side by side and a drain waits for all of them."""

    identity: tuple[int, int]
    version: int
    table_id: str
    names: list[str]
    types: list[Any]
    required: frozenset[str]  # the columns the table holds NOT NULL
    interval: int
    applied: dict[str, int]


def local_root(path: str) -> Path | None:
    """The table's directory, for a local path (``file://`` or none); None for an object store."""
    scheme = scheme_of(path)
    if scheme is None:
        return Path(path)
    if scheme == "file":
        return Path(unquote(path[len("file://"):]))
    return None


def writes_deletion_vectors(table: Any, path: str) -> bool:
    """Whether this writer makes the opened ``deltalake.DeltaTable``'s MERGEs: deletion vectors enabled,
    a local path, no feature it would have to honour and does not."""
    if local_root(path) is None:
        return False
    protocol = table.protocol()
    metadata = table.metadata()
    configuration = dict(metadata.configuration or {})
    if configuration.get("delta.enableDeletionVectors", "").lower() != "true":
        return False
    if configuration.get("delta.appendOnly", "").lower() == "true" or metadata.partition_columns:
        return False
    if any(k.startswith("delta.constraints.") for k in configuration) or "delta.invariants" in table.schema().to_json():
        return False  # rows this writer appends would not be checked
    writer, reader = set(protocol.writer_features or ()), set(protocol.reader_features or ())
    return int(protocol.min_writer_version) == 7 and int(protocol.min_reader_version) == 3 and \
        "deletionVectors" in writer and writer <= WRITER_FEATURES and reader <= READER_FEATURES


def apply_plan_dv(store: TableOpener, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str,
                  version: int, description: str, cache: DvCache | None = None) -> CommitResult | None:
    """The one commit ``plan`` describes, as deletion vectors and an appended file; None when this writer
    does not make it (see the module's docstring). ``cache``: what earlier commits read (none: read all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    root = local_root(path)
    if root is None or plan.multiset:
        return None
    names = list(schema.names)
    source, fills, upserts, deletes = merge_source(plan, schema)
    if source is None or fills or any(source.column(p).null_count for p in plan.key_positions):
        return None
    tables = cache if cache is not None else DvCache(max_rows=0)
    tables.settle(root)
    types = [f.type for f in schema]
    facts = tables.facts(root, app_id) if not plan.truncated else None
    table: Any = None
    if facts is not None and (facts.names != names or facts.types != types):
        facts = None
    if facts is not None:
        if facts.applied[app_id] >= version:
            return CommitResult(0, 0, False)
    else:
        tables.forget(root)
        identity = log_identity(root)
        table = open_for_commit(_Opener(store, tables, root), path, names, app_id, version)
        if isinstance(table, CommitResult):
            return CommitResult(0, 0, False)
        if table is None or identity is None or not writes_deletion_vectors(table, path):
            return None
        target = pa.schema(table.schema().to_arrow())
        if [f.type for f in target] != types:
            return None  # the new file must hold the table's types exactly: Spark casts
        interval = int(dict(table.metadata().configuration or {}).get("delta.checkpointInterval", CHECKPOINT_INTERVAL))
        facts = TableFacts(identity, int(table.version()), str(table.metadata().id), names, types,
                           frozenset(f.name for f in target if not f.nullable), max(interval, 1), {})
    upserted = source.filter(pc.equal(source.column(OP_COL), "U")).drop_columns([OP_COL])
    if any(upserted.column(name).null_count for name in facts.required):
        return None  # Spark refuses the NULL with its own error
    if plan.truncated:
        assert table is not None  # (no facts looked at for a truncate: the table was opened)
        # what is left after a TRUNCATE replaces every row: delta-rs's overwrite reads nothing, and its
        # remove actions name the files' deletion vectors
        from deltalake import write_deltalake

        write_deltalake(table, upserted, mode="overwrite", commit_properties=commit_tags(app_id, version, description))
        return CommitResult(upserts, 0, True, int(table.version()))
    keys = [names[p] for p in plan.key_positions]
    read_version = facts.version
    cached = tables.table(root, facts.table_id)
    files = cached.log.files_at(read_version)
    cached.keep_only(files)
    touched = _matching_rows(root, files, source.select(keys), cached, tables)
    if touched is None:
        return None
    if not files:
        deletes = 0  # nothing to delete: counted as delta-rs's append into an empty table counts
    carried, copied = _carried(root, files, touched, upserted.schema, cached)
    rows = pa.concat_tables([upserted, copied]) if copied is not None else upserted
    marked = sum(len(hits) for _, _, hits in touched)
    gone = {f.path for f in carried}
    actions, vectors = _file_actions(root, rows, [t for t in touched if t[0].path not in gone])
    actions += [{"remove": _remove_action(f, int(time.time() * 1000))} for f in carried]
    _commit(root, read_version + 1, app_id, version, description, actions,
            upserts=upserts, deletes=deletes, marked=marked, copied=rows.num_rows - upserted.num_rows)
    cached.vectors.update(vectors)  # the next commit starts from these: no need to read them back
    if rows.num_rows:  # and from the new file's keys: no need to read them back either
        cached.keep(actions[0]["add"]["path"], tuple(keys), _key_values(rows.select(keys)), tables)
    facts.version = read_version + 1
    facts.applied[app_id] = version
    tables.committed(root, facts)
    if facts.version % facts.interval == 0:
        if cache is not None:
            tables.checkpoint_later(store, path, root)
        else:
            tables.open(store, path, root).create_checkpoint()  # (brought up to date by ``open``)
    return CommitResult(upserts, deletes, False, read_version + 1)


class _Opener:
    """``store``'s tables opened through the cache's handles (``DvCache.open``)."""

    def __init__(self, store: TableOpener, cache: DvCache, root: Path) -> None:
        self.store, self.cache, self.root = store, cache, root

    def open(self, path: str) -> Any:
        return self.cache.open(self.store, path, self.root)


#: a file whose rows a commit marks: the file, its deleted rows before, the rows it adds to them
_Touched = list[tuple[LiveFile, "np.ndarray", "np.ndarray"]]


def _matching_rows(root: Path, files: list[LiveFile], keys: pa.Table, cached: TableCache,
                   tables: DvCache) -> _Touched | None:
    """The live rows of ``files`` whose key is one of ``keys``', per file; None when the table holds a
    key twice (Spark's MERGE updates every copy; this writer would keep one) or a file is not local.
    One integer key is searched in each file's KeyIndex (applier.sink.store.dvkeys); other keys are
    matched row by row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = keys.column_names
    if not keys.num_rows:
        return []
    if any(pa.types.is_nested(t) for t in keys.schema.types):
        return None  # an array key: Arrow's matching takes no nested values
    bounds = None
    wanted = None
    if len(names) == 1 and pa.types.is_integer(keys.schema.field(0).type):
        # sorted once: each file's binary searches then walk its keys in order (2.5x faster over 100 files)
        wanted = np.sort(np.asarray(keys.column(0).to_numpy()))
        bounds = (int(wanted[0]), int(wanted[-1]))
    touched: _Touched = []
    found: list[pa.Table] = []  # the matched rows' keys, to find a key held twice
    found_keys: list[np.ndarray] = []  # (one integer key: the same, as numbers)
    for file in files:
        if "://" in file.path:
            return None
        if bounds is not None and not _may_hold(file, names[0], bounds):
            continue
        held = cached.keys.get((file.path, tuple(names)))  # a key moved to other columns is read anew
        if held is None:
            # as the table's types: a Spark file may hold a timestamp key as INT96 (applier.sink.int96)
            read = pq.read_table(root / unquote(file.path), columns=names, coerce_int96_timestamp_unit="us")
            if read.schema != keys.schema:
                try:
                    read = read.cast(keys.schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return None
            held = _key_values(read)
            cached.keep(file.path, tuple(names), held, tables)
        old = cached.deleted_rows(root, file)
        if isinstance(held, KeyIndex):
            assert wanted is not None
            rows, their_keys = held.find(wanted)
            live = live_rows(rows, old)
            hits = rows[live].astype(np.uint64)
            if hits.size:
                found_keys.append(their_keys[live])
        else:
            hits = _matching_in(held, keys, old)
            if hits.size:
                found.append(held.take(pa.array(hits.astype(np.int64))))
        if hits.size:
            touched.append((file, old, hits))
    if found_keys:  # numbers, not an Arrow table per file: 8 ms a commit over 100 files, now 0.5
        every = np.concatenate(found_keys)
        if np.unique(every).size != every.size:
            return None
    if found:
        matched = pa.concat_tables(found)
        if matched.group_by(names).aggregate([]).num_rows != matched.num_rows:
            return None
    return touched


#: Live data files a table holds before its commits carry the live rows of small files into their new file
#: (and remove them): then, at each commit, the files of the smallest size tier holding ``TIER_FILES`` of
#: them, a tier being a power of 4 of live rows, up to ``CARRY_AT_MOST_ROWS`` (larger files stay).
KEEP_FILES = 16
TIER_FILES = 4
CARRY_AT_MOST_ROWS = 1 << 18


def _carried(root: Path, files: list[LiveFile], touched: _Touched, schema: pa.Schema,
             cached: TableCache) -> tuple[list[LiveFile], pa.Table | None]:
    """The files whose live rows this commit carries into its new file (they are removed), and those rows.

    Why: every commit appends a file, and a plan's keys are spread over the table (pgbench_accounts'
    updates), so each commit marks rows in nearly every file: its search, its vectors and its log entry
    grew with the files, 7 ms a commit at 10 files, 22 ms at 80 and 50 ms at 200 (3,000 updates into 1M
    rows), without end while a mirror follows (compaction is ``applier maintain``'s, with Spark). Files
    of one size tier are carried together (size-tiered compaction): a row is carried about once a tier,
    and a table holds a few files a tier. Carrying the smallest files at each commit instead made every
    new file larger than the last, and a commit carried ever more rows. A file with no live row is
    removed unread; one this writer cannot read as the table's types (another writer's) stays."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(files) < KEEP_FILES:
        return [], None
    marked = {f.path: (old, hits) for f, old, hits in touched}
    tiers: dict[int, list[tuple[int, str, LiveFile]]] = {}
    for f in files:
        records = f.stats.get("numRecords")
        if not isinstance(records, int) or "://" in f.path:
            continue
        dv = f.deletion_vector
        live = records - (int(dv.get("cardinality", 0)) if dv else 0)
        live -= marked[f.path][1].size if f.path in marked else 0
        if live <= CARRY_AT_MOST_ROWS:
            tiers.setdefault(live.bit_length() // 2 if live else -1, []).append((live, f.path, f))
    chosen = next((sorted(tier)[:TIER_FILES] for _, tier in sorted(tiers.items())
                   if len(tier) >= TIER_FILES or (tier and tier[0][0] == 0)), [])
    carried: list[LiveFile] = []
    parts: list[pa.Table] = []
    for live, _, f in chosen:
        if not live:
            carried.append(f)  # nothing left in it to carry
            continue
        read = pq.read_table(root / unquote(f.path), coerce_int96_timestamp_unit="us")
        if read.schema.names != schema.names:
            continue
        try:
            read = read.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            continue
        if f.path in marked:
            old, hits = marked[f.path]
        else:
            old, hits = cached.deleted_rows(root, f), np.empty(0, dtype=np.uint64)
        keep = np.ones(read.num_rows, dtype=bool)
        keep[old.astype(np.int64)] = False
        keep[hits.astype(np.int64)] = False
        parts.append(read.filter(pa.array(keep)))
        carried.append(f)
    return carried, (pa.concat_tables(parts) if parts else None)


def _key_values(read: pa.Table) -> pa.Table | KeyIndex:
    """What is kept of a file's key columns: one integer key as its KeyIndex, when it has one."""
    import pyarrow as pa

    if read.num_columns == 1 and pa.types.is_integer(read.schema.field(0).type):
        return KeyIndex.of(read.column(0)) or read
    return read


def _matching_in(held: pa.Table, keys: pa.Table, deleted: np.ndarray) -> np.ndarray:
    """The rows of ``held`` (a file's key columns) whose key is one of ``keys``' and which ``deleted``
    does not hold (ascending, uint64): every row tested."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    names = keys.column_names
    if len(names) == 1:
        mask = pc.is_in(held.column(0), value_set=keys.column(0)).to_numpy(zero_copy_only=False)
    else:
        joined = held.append_column("__row", pa.array(np.arange(held.num_rows, dtype=np.int64))).join(
            keys, keys=names, join_type="inner")
        mask = np.zeros(held.num_rows, dtype=bool)
        mask[joined.column("__row").to_numpy()] = True
    mask = np.array(mask, dtype=bool)  # writable
    if deleted.size:
        mask[deleted.astype(np.int64)] = False
    return np.flatnonzero(mask).astype(np.uint64)


def _may_hold(file: LiveFile, name: str, bounds: tuple[int, int]) -> bool:
    """Whether the file's statistics allow a key within ``bounds`` (no statistics: it may)."""
    stats = file.stats
    low, high = stats.get("minValues", {}).get(name), stats.get("maxValues", {}).get(name)
    if not isinstance(low, int) or not isinstance(high, int):
        return True
    return not (high < bounds[0] or low > bounds[1])


def _file_actions(root: Path, upserted: pa.Table,
                  touched: _Touched) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """The new file's ``add`` and each touched file's ``add`` and ``remove``, and the new deletion
    vectors' rows by id; writes the new file and the vectors' file (neither is in the table until the
    commit names them)."""

    from applier.sink.store.dvformat import (
        descriptor_id,
        dv_file_bytes,
        dv_file_name,
        encode_positions,
        new_descriptor,
    )

    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = []
    if upserted.num_rows:
        actions.append(write_data_file(root, upserted, now))
    if not touched:
        return actions, {}
    deleted = [_merged(old, hits) for _, old, hits in touched]
    bitmaps = [encode_positions(rows) for rows in deleted]
    data, offsets = dv_file_bytes(bitmaps)
    dv_id = uuid.uuid4()
    (root / dv_file_name(dv_id)).write_bytes(data)
    for (file, _, _), rows, bitmap, offset in zip(touched, deleted, bitmaps, offsets, strict=True):
        add = dict(file.add)
        stats = file.stats
        add["deletionVector"] = new_descriptor(dv_id, offset, len(bitmap), int(rows.size))
        add["dataChange"] = True
        if stats:
            add["stats"] = json.dumps({**stats, "tightBounds": False}, separators=(",", ":"))
        actions += [{"add": add}, {"remove": _remove_action(file, now)}]
    return actions, {descriptor_id(a["add"]["deletionVector"]): rows
                     for a, rows in zip(actions[-2 * len(touched)::2], deleted, strict=True)}


def _remove_action(file: LiveFile, now: int) -> dict[str, Any]:
    """The ``remove`` of a live file's entry (with its deletion vector, which names the entry)."""
    remove: dict[str, Any] = {"path": file.path, "deletionTimestamp": now, "dataChange": True,
                              "extendedFileMetadata": True, "partitionValues": file.add.get("partitionValues", {}),
                              "size": file.add["size"]}
    if file.deletion_vector:
        remove["deletionVector"] = file.deletion_vector
    stats = file.stats
    if "numRecords" in stats:
        remove["stats"] = json.dumps({"numRecords": stats["numRecords"]})
    return remove


def _merged(old: np.ndarray, hits: np.ndarray) -> np.ndarray:
    """A file's deleted rows with ``hits`` added: both ascending and disjoint (hits skip the old rows), so
    merged in one pass; sorting their concatenation anew cost 30 ms a commit for a vector of 300k rows (a
    1M-row file of pgbench_accounts after a minute of following pgbench)."""
    import numpy as np

    if old.size and not bool(np.all(old[1:] > old[:-1])):
        old = np.unique(old)  # (a vector as read is ascending; any other stays correct, only slower)
    return np.insert(old, np.searchsorted(old, hits), hits)


def _commit(root: Path, new_version: int, app_id: str, version: int, description: str,
            actions: list[dict[str, Any]], *, upserts: int, deletes: int, marked: int, copied: int = 0) -> None:
    """Write ``new_version``: the MERGE's commitInfo as Spark's reads, the applied version, ``actions``."""
    now = int(time.time() * 1000)
    info = {"commitInfo": {
        "timestamp": now, "operation": "MERGE", "operationParameters": {"predicate": "key"},
        "readVersion": new_version - 1, "isolationLevel": "Serializable", "isBlindAppend": False,
        "operationMetrics": {"numSourceRows": str(upserts + deletes), "numTargetRowsDeleted": str(deletes),
                             "numTargetRowsMarkedDeleted": str(marked), "numTargetRowsCopied": str(copied),
                             "numOutputRows": str(upserts + copied)},
        "userMetadata": description, "engineInfo": "applier (deletion vectors)"}}
    write_commit(root, new_version, [info, {"txn": {"appId": app_id, "version": version, "lastUpdated": now}},
                                     *actions])
