"""The delta-rs store: Delta tables read and written in the Python process (``deltalake``), no JVM.

This is the only module of applier that imports ``deltalake`` for target tables (the raw-log reader in
``sources/`` reads logs, not targets), and the only one that knows what delta-rs can do.

Which paths: delta-rs treats a local path as a URL and decodes percent escapes in it (after checking
that the literal path exists, and differently when it writes), so applier does not give it a local
path that holds ``%``: applier's escape for names such as ``..`` or a schema ``_applier`` (``%u2E.``,
``%u5Fapplier``; ``%2E.``, ``%5Fapplier`` in targets of earlier releases, which delta-rs decodes).
Characters a URL may not hold unescaped (``[ ] ^ | \\``) make its writer panic
("Invalid object store url"), wherever they are in the path, the target directory's own name
included. Those tables are read and written through Spark instead.

Which tables: delta-rs writes protocols up to reader 3 / writer 7 with the writer features below; a
table with type widening, column mapping, deletion vectors or liquid clustering is Spark's.

Object stores are reached with delta-rs's own settings (``AWS_*``, ``AZURE_*``, ``GOOGLE_*`` environment
variables, then the bucket's ``target.storage_options``: ``applier.storage.options``), not Spark's Hadoop
configuration.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import InputError, SinkError
from applier.sink.spec import TARGET_FILE_SIZE
from applier.sink.store.base import CommitResult, CommitTag, FileStats, TableLog, WriteMode
from applier.sink.store.rsrows import READER_FEATURES, scans_rows, spark_like
from applier.storage.options import deltalake_options

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.sink.copyfiles import CopyFile
    from applier.sink.history import HistoryPlan
    from applier.sink.plan import TablePlan
    from applier.sink.spec import Renames, RewritePolicy, SchemaEvolution, TableOptions, TableSpec

#: ... and control characters, which delta-rs refuses in any path ("illegal character sequence"): applier
#: escapes them in names now, but a table bound to its path by an earlier release keeps it
_NOT_IN_LOCAL_PATHS = frozenset("%[]^|\\" + "".join(map(chr, range(0x20))) + "\x7f")

#: writer features delta-rs writes (a table with any other takes the Spark path)
_WRITER_FEATURES = {"appendOnly", "invariants", "checkConstraints", "timestampNtz"}



#: what delta-rs says of a commit file it cannot parse (truncated, or not JSON): damage, not an outage
DAMAGED_LOG_WORDS = ("Json error", "Truncated record", "Invalid JSON", "EOF while parsing", "expected value")


class DamagedTableError(InputError):
    """A target table's Delta log holds a commit file delta-rs cannot parse (a truncated write, a disk fault,
    an edit by hand): exit 2 with the remedy, not exit 3 (a restart meets the same file) with a Rust
    backtrace."""

class DeltaRsStore:
    """Delta tables through delta-rs. Stateless: every call reads the log it needs."""

    name = "delta-rs"
    uses_spark = False

    # --- what it can do ---------------------------------------------------------------------------

    @staticmethod
    def can_open(path: str | Path) -> bool:
        """Whether delta-rs can be given this path at all (see the module docstring)."""
        text = str(path)
        return "://" in text or not _NOT_IN_LOCAL_PATHS.intersection(text)

    def can_write(self, path: str) -> bool:
        """Whether delta-rs can append to (and merge into) the table at ``path``: its protocol asks
        nothing more than delta-rs writes."""
        if not self.can_open(path):
            return False
        protocol = self.open(path).protocol()
        if protocol.min_writer_version > 7 or protocol.min_reader_version > 3:
            return False
        writer = set(protocol.writer_features or ())
        reader = set(protocol.reader_features or ())
        return writer <= _WRITER_FEATURES and reader <= READER_FEATURES and \
            (protocol.min_writer_version >= 7 or protocol.min_writer_version <= 4)

    def can_scan(self, path: str) -> bool:
        """Whether delta-rs reads the rows of the table at ``path`` as Spark reads them: a table it opens
        whose reader protocol asks for nothing beyond ``timestampNtz`` and ``deletionVectors`` (column
        mapping and type widening change what a scan of the files means: Spark reads those). So ``verify``
        of a mirror whose tables have deletion vectors needs no JVM."""
        return self.can_open(path) and self.exists(path) and scans_rows(self.open(path))

    def can_create(self, path: str, spec: TableSpec, options: TableOptions) -> bool:
        """Whether delta-rs creates this table exactly as Spark's ``CREATE TABLE`` would (the same schema
        as Spark reads it, the same properties): not for column mapping, liquid clustering, type
        widening, change data feed or Delta properties of the user's (features delta-rs may enable
        differently; ``delta.enableDeletionVectors`` alone is created by applier.sink.store.dvcommit, as
        Spark would), nor for a path it cannot open. Creating without Spark saves the copy a Spark job
        per table (bench/RESULTS.md)."""
        from applier.sink.naming import needs_column_mapping

        if not self.can_open(path) or needs_column_mapping(spec.column_names):
            return False
        if any(not f.nullable for f in spec.schema):
            # delta-rs leaves the invariants feature out of the protocol of a table with named features
            # (e.g. timestamp without time zone) and a NOT NULL column, and Spark then refuses the table
            return False
        if options.type_widening or options.change_data_feed or options.cluster_by:
            return False
        delta = {k: v for k, v in options.properties.items() if k.startswith("delta.") and k != TARGET_FILE_SIZE}
        if delta == {"delta.enableDeletionVectors": delta.get("delta.enableDeletionVectors")}:
            # deletion vectors and nothing else: created as Spark's CREATE TABLE would (dvcommit), where
            # applier also writes their MERGEs (a local table without partitions)
            from applier.sink.store.dvmerge import local_root

            return str(delta["delta.enableDeletionVectors"]).lower() == "true" and local_root(path) is not None \
                and not options.partition_by
        return not delta

    # --- reading ----------------------------------------------------------------------------------

    @staticmethod
    def open(path: str) -> Any:
        """The table's newest version as a ``deltalake.DeltaTable`` (its log read up to the last commit)."""
        from deltalake import DeltaTable

        try:
            return DeltaTable(str(path), storage_options=deltalake_options(path))
        except Exception as e:  # noqa: BLE001 - delta-rs raises its own classes; the message is the detail
            detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]  # (not RUST_BACKTRACE's)
            if any(word in detail for word in DAMAGED_LOG_WORDS):
                raise DamagedTableError(
                    f"the Delta log of {path} cannot be read: a commit file in its _delta_log is damaged ({detail}). "
                    "A restart cannot mend it. Restore the table's _delta_log from a backup, or move the table's "
                    "directory away and run `applier resync --config FILE --table schema.table` to copy it anew",
                    path=path) from None
            raise SinkError("cannot read the Delta log of a target table", path=path, error=detail) from e

    def exists(self, path: str) -> bool:
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(str(path), storage_options=deltalake_options(path)))

    def applied_version(self, path: str, app_id: str) -> int | None:
        """Read from the log's ``txn`` actions (following checkpoints as Spark does); only the log is
        read, so tables with reader features delta-rs cannot scan (type widening) still answer."""
        version = self.open(path).transaction_version(app_id)
        return int(version) if version is not None else None

    def version(self, path: str) -> int:
        """The table opened (delta-rs 1.x loads its file list with it: a commit that reports its version,
        ``CommitResult.version``, saves this read)."""
        return int(self.open(path).version())

    def columns(self, path: str) -> tuple[str, ...]:
        return tuple(f.name for f in self.open(path).schema().fields)

    def schema_fields(self, path: str) -> list[dict[str, Any]]:
        """The table's fields as Delta's JSON schema writes them (``name``, ``type``, ``nullable``...)."""
        return list(json.loads(self.open(path).schema().to_json())["fields"])

    def configuration(self, path: str) -> dict[str, str]:
        """The table's properties (``metaData.configuration``)."""
        return dict(self.open(path).metadata().configuration or {})

    def reader_protocol(self, path: str) -> tuple[int, tuple[str, ...]]:
        """The table's minimum reader version and reader features."""
        protocol = self.open(path).protocol()
        return int(protocol.min_reader_version), tuple(protocol.reader_features or ())

    def is_empty(self, path: str) -> bool:
        return len(self.open(path).file_uris()) == 0

    def table_id(self, path: str) -> str | None:
        try:
            return str(self.open(path).metadata().id)
        except Exception:  # noqa: BLE001  # an unreadable log is reported by the engine that writes it
            return None

    def scan(self, path: str, columns: Sequence[str], *, unless: str | None = None) -> Iterator[tuple[Any, ...]]:
        """For a table ``can_scan`` accepts. Names are matched as Spark matches them (case-insensitively
        when not exactly); values come out as Spark's rows give them (``spark_like``), batch by batch."""
        import pyarrow.compute as pc

        table = self.open(path)
        have = list(table.schema().to_arrow().names)
        exact, folded = set(have), {n.lower(): n for n in have}
        wanted = [c if c in exact else folded.get(c.lower(), c) for c in columns]
        read = list(dict.fromkeys([*wanted, *([unless] if unless is not None else [])]))
        for batch in _batches(table, read):
            if unless is not None:
                batch = batch.filter(pc.invert(pc.fill_null(batch.column(read.index(unless)), False)))
            if not wanted:
                yield from (() for _ in range(batch.num_rows))
                continue
            yield from zip(*(spark_like(batch.column(read.index(c))) for c in wanted), strict=True)

    def file_stats(self, path: str) -> FileStats:
        return _file_stats(self.open(path), path)

    def table_log(self, path: str, *, history: int = 20) -> TableLog:
        table = self.open(path)
        metadata, protocol = table.metadata(), table.protocol()
        return TableLog(dict(metadata.configuration or {}), tuple(metadata.partition_columns),
                        tuple(protocol.reader_features or ()), tuple(protocol.writer_features or ()),
                        list(table.history(history)), _file_stats(table, path))

    # --- writing ----------------------------------------------------------------------------------

    def create(self, path: str, spec: TableSpec, options: TableOptions, properties: Mapping[str, str]) -> None:
        """For a table ``can_create`` accepts."""
        from deltalake import DeltaTable

        if str(properties.get("delta.enableDeletionVectors", "")).lower() == "true":
            from applier.sink.store.dvcommit import create_dv_table
            from applier.sink.store.dvmerge import local_root

            root = local_root(path)
            assert root is not None  # can_create: a local path
            create_dv_table(root, spec.schema, properties)
            return

        DeltaTable.create(str(path), spec.schema, mode="error",
                          storage_options=deltalake_options(path),
                          partition_by=list(options.partition_by) or None,
                          configuration=dict(properties), raise_if_key_not_exists=False)

    def add_columns(self, path: str, fields: list[dict[str, Any]]) -> None:
        """Add columns given as Delta JSON schema fields (``ALTER TABLE ... ADD COLUMNS``)."""
        from deltalake import Schema

        self.open(path).alter.add_columns(Schema.from_json(json.dumps({"type": "struct", "fields": fields})).fields)

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None:
        from deltalake import CommitProperties, Transaction

        commit = CommitProperties(app_transactions=[Transaction(*carry)]) if carry is not None else None
        self.open(path).alter.set_table_properties(dict(properties), raise_if_not_exists=False,
                                                   commit_properties=commit)

    def write_arrow(self, path: str, table: Any, *, mode: WriteMode, tag: CommitTag | None,
                    schema: pa.Schema | None = None) -> None:
        """The last commit of a copy carries the applied version as a ``txn`` action (what Spark's
        ``txnAppId``/``txnVersion`` write) and the description as the commit's ``userMetadata``; like
        Spark's idempotent write, a tagged write whose version the table has applied writes nothing. An
        append may lack columns the table has (a change feed's columns the source dropped, or renamed: kept
        in Delta, NULL from then on), as Spark's append allows: ``schema_mode='merge'`` writes them NULL
        and leaves the table's schema as it is (no metaData action)."""
        from deltalake import write_deltalake

        if tag is not None and self.exists(path):
            done = self.applied_version(path, tag[0])
            if done is not None and done >= tag[1]:
                return
        write_deltalake(str(path), table, mode=mode, commit_properties=_commit_properties(tag),
                        storage_options=deltalake_options(path), schema_mode="merge" if mode == "append" else None)

    def write_file(self, path: str, piece: pa.Table) -> CopyFile:
        """Write ``piece`` (the table's columns) as one new Parquet file in the table at ``path``, not
        committed (applier.sink.copyfiles)."""
        return self.write_files(path, piece)[0]

    def write_files(self, path: str, piece: pa.Table, *, max_bytes: int | None = None) -> list[CopyFile]:
        """Write ``piece`` as new Parquet files in the table at ``path``, not committed: one, or with
        ``max_bytes`` (the table's ``delta.targetFileSize``, which keeps a MERGE's rewrites small) as many
        as keep each near that size: a file is closed once its Parquet reaches it, checked after every
        row group of about 8 MB of Arrow (half ``max_bytes`` when that is less). A piece without rows is
        one file without rows."""
        import time
        import uuid

        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
        from deltalake.fs import DeltaStorageHandler

        from applier.sink.copyfiles import CopyFile, file_stats

        files = pafs.PyFileSystem(DeltaStorageHandler(str(path), deltalake_options(path)))
        total = piece.num_rows
        step = total if max_bytes is None or piece.nbytes <= max_bytes \
            else max(1, total * min(8 << 20, max_bytes // 2) // max(piece.nbytes, 1))
        written: list[CopyFile] = []
        start = 0
        while True:
            name = f"part-{uuid.uuid4()}-c000.snappy.parquet"
            end = start
            with files.open_output_stream(name) as out:
                with pq.ParquetWriter(out, piece.schema, compression="snappy") as writer:
                    while True:
                        part = piece.slice(end, step)
                        writer.write_table(part)
                        end += part.num_rows
                        if end >= total or (max_bytes is not None and out.tell() >= max_bytes):
                            break
                size = out.tell()  # (the footer written: the file's size, without asking the store)
            rows = piece.slice(start, end - start)
            written.append(CopyFile(name, size, rows.num_rows, int(time.time() * 1000), file_stats(rows)))
            start = end
            if start >= total:
                return written

    def commit_files(self, path: str, files: list[CopyFile], *, schema: pa.Schema, tag: CommitTag | None,
                     mode: WriteMode = "overwrite") -> None:
        """One commit of ``files`` (written into the table by ``write_file``) that replaces the table's
        rows (or appends them), tagged ``tag`` like ``write_arrow``'s last commit of a copy: a tagged
        commit whose version the table has applied commits nothing."""
        from deltalake.transaction import AddAction

        table = self.open(path)
        if tag is not None:
            done = table.transaction_version(tag[0])
            if done is not None and done >= tag[1]:
                return
        actions = [AddAction(f.path, f.size, {}, f.modified_ms, True, f.stats) for f in files]
        table.create_write_transaction(actions, mode=mode, schema=schema, commit_properties=_commit_properties(tag))

    def append_through(self, handle: Any, path: str, table: Any, *, tag: CommitTag) -> Any:
        """Append ``table`` to the table at ``path`` in one commit tagged ``tag`` through ``handle``, the
        ``DeltaTable`` an earlier call returned (delta-rs moves it to the commit it made: no log is read
        again), or None (the table opened, or created by this append). Returns the handle for the next
        append. Unlike ``write_arrow`` the tag is not checked: the caller knows what it appended (a
        consistent cut a group: applier.sink.cuts)."""
        from deltalake import write_deltalake

        if handle is None and self.exists(path):
            handle = self.open(path)
        if handle is None:
            write_deltalake(str(path), table, mode="append", commit_properties=_commit_properties(tag),
                            storage_options=deltalake_options(path))
            return self.open(path)
        write_deltalake(handle, table, mode="append", commit_properties=_commit_properties(tag),
                        schema_mode="merge")  # (a column the table lacks is added: cuts written before ids)
        return handle

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution | None:
        """Columns added and dropped (applier.sink.store.evolution); None for a rename (rewritten or
        column-mapped by Spark, as ``rename`` says), a
        retype or a change that needs a table feature (Spark makes those)."""
        from applier.sink.store.evolution import evolve_without_spark

        return evolve_without_spark(self, path, spec, renames)

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult | None:
        from applier.sink.store.rsmerge import apply_plan_deltars

        return apply_plan_deltars(self, path, schema, plan, app_id=app_id, version=version,
                                  description=description, may_be_empty=may_be_empty)

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int | None:
        """A history table's commit (applier.sink.history); None when delta-rs would not make the same one."""
        from applier.sink.store.rshistory import apply_history_deltars

        return apply_history_deltars(self, path, spec, plan, app_id=app_id, version=version, description=description)

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]] | None:
        """See applier.sink.store.readback.rows_by_key; None: Spark reads them."""
        from applier.sink.store.readback import rows_by_key

        return rows_by_key(self.open(path), schema, key_columns, keys, open_only=open_only, unless=unless)

    # --- maintenance ------------------------------------------------------------------------------

    def replace_empty(self, path: str, spec: TableSpec) -> bool | None:
        """Declined: an overwrite that replaces the schema and keeps the layout is Spark's (a resync)."""
        return None

    def fill_columns(self, path: str, spec: TableSpec, values: Mapping[str, object]) -> bool | None:
        """Declined: delta-rs's UPDATE takes SQL literals, whose types it would infer, not the column's."""
        return None

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> dict[str, Any]:
        optimizer = self.open(path).optimize  # planned again on a retry: a conflict changed the files
        if z_order:
            return optimizer.z_order(z_order, target_size=target_size)  # type: ignore[no-any-return]
        return optimizer.compact(target_size=target_size)  # type: ignore[no-any-return]

    def vacuum(self, path: str, retention_hours: int | None, *, dry_run: bool, enforce_retention: bool) -> int:
        """Files VACUUM deleted (or would delete), ``full`` as Spark's VACUUM: files a failed or
        conflicted commit left behind go too."""
        return len(self.open(path).vacuum(retention_hours=retention_hours, dry_run=dry_run, full=True,
                                          enforce_retention_duration=enforce_retention))

    def checkpoint(self, path: str) -> int:
        """A checkpoint of the newest version, and the log files it makes unneeded removed (older than
        ``delta.logRetentionDuration``); returns the version."""
        table = self.open(path)
        table.create_checkpoint()
        table.cleanup_metadata()
        return int(table.version())


class DeletionVectorStore(DeltaRsStore):
    """A local table with deletion vectors enabled, for its MERGEs: marked rows and an appended file
    instead of a rewrite (applier.sink.store.dvmerge). Every other change to it is Spark's (delta-rs
    would rewrite files the deletion vectors point into, or read them as it cannot): declined here, so
    the ``FallbackStore`` around it hands them on. It keeps what a commit read for the next one
    (``DvCache``): one store per run, not shared."""

    def __init__(self) -> None:
        from applier.sink.store.dvmerge import DvCache

        self.cache = DvCache()

    def can_merge(self, path: str) -> bool:
        """Whether this store makes the MERGEs of the table at ``path``."""
        from applier.sink.store.dvmerge import writes_deletion_vectors

        return self.can_open(path) and self.exists(path) and writes_deletion_vectors(self.open(path), path)

    def merge(self, path: str, schema: pa.Schema, plan: TablePlan, *, app_id: str, version: int,
              description: str, may_be_empty: bool = True) -> CommitResult | None:
        from applier.sink.store.dvmerge import apply_plan_dv

        return apply_plan_dv(self, path, schema, plan, app_id=app_id, version=version, description=description,
                             cache=self.cache)

    def merge_history(self, path: str, spec: TableSpec, plan: HistoryPlan, *, app_id: str, version: int,
                      description: str) -> int | None:
        return None

    def rows_by_key(self, path: str, schema: pa.Schema, key_columns: Sequence[str],
                    keys: Sequence[tuple[Any, ...]] | None, *, open_only: str | None = None,
                    unless: str | None = None) -> dict[object, list[Any]] | None:
        return None

    def evolve(self, path: str, spec: TableSpec, renames: Renames | None, *,
               rename: RewritePolicy | None = None) -> SchemaEvolution | None:
        return None

    def optimize(self, path: str, z_order: list[str], target_size: int | None) -> dict[str, Any] | None:  # type: ignore[override]
        return None


def _commit_properties(tag: CommitTag | None) -> Any:
    if tag is None:
        return None
    from deltalake import CommitProperties, Transaction

    app_id, version, description = tag
    return CommitProperties(app_transactions=[Transaction(app_id, version)],
                            custom_metadata={"userMetadata": description})


def _batches(table: Any, columns: list[str]) -> Iterator[Any]:
    """The ``columns`` of an opened table's rows, as pyarrow record batches: its files through a pyarrow
    dataset, or, for a table with deletion vectors (which a dataset does not honour), DataFusion's scan,
    which applies them (strings come as string views, whose values are the same)."""
    import pyarrow as pa

    if "deletionVectors" not in set(table.protocol().reader_features or ()):
        import pyarrow.dataset as ds

        # pre_buffer off: the scan reads a row group's pages as it decodes them, instead of the whole row group
        # at once (a 1M-row group held ~450 MB in verify; measured in bench/verify_memory.py)
        options = ds.ParquetFragmentScanOptions(pre_buffer=False)
        yield from table.to_pyarrow_dataset().to_batches(columns=columns, fragment_scan_options=options,
                                                         batch_readahead=2, fragment_readahead=1)
        return
    from deltalake import QueryBuilder

    # (no column wanted: one per row all the same, for the count)
    quoted = ", ".join('"' + c.replace('"', '""') + '"' for c in columns) or "1"
    yield from pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(f"SELECT {quoted} FROM t"))


def _file_stats(table: Any, path: str) -> FileStats:
    import pyarrow as pa

    from applier.sink.store.dvmerge import local_root

    root = local_root(path)
    if root is not None and "deletionVectors" in (table.protocol().reader_features or ()):
        # delta-rs's file list counts the rows its deletion vectors delete: the log's own add actions do
        from applier.sink.store.dvlog import live_files

        files = live_files(root, int(table.version()))
        sizes = tuple(int(f.add["size"]) for f in files)
        rows = 0
        for file in files:
            records = file.stats.get("numRecords")
            if records is None:
                return FileStats(sizes, None)
            rows += int(records) - int((file.deletion_vector or {}).get("cardinality", 0))
        return FileStats(sizes, rows)
    columns = pa.table(table.get_add_actions(flatten=True))
    names = list(columns.schema.names)
    sizes = tuple(int(s) for s in columns.column("size_bytes").to_pylist()) if "size_bytes" in names else ()
    if "num_records" not in names:
        return FileStats(sizes, None)
    counts = columns.column("num_records").to_pylist()
    if any(c is None for c in counts):
        return FileStats(sizes, None)
    deleted = 0
    if "deletionVector.cardinality" in names:
        deleted = sum(c or 0 for c in columns.column("deletionVector.cardinality").to_pylist())
    return FileStats(sizes, int(sum(counts)) - int(deleted))


def commit_failed_error() -> type[BaseException]:
    """delta-rs's failed commit (its conflict checker found that a concurrent commit removed files this
    one read, e.g. an OPTIMIZE): retried like Spark's conflicts (applier.sink.conflicts)."""
    from deltalake.exceptions import CommitFailedError

    return CommitFailedError
