"""Table maintenance: compaction (OPTIMIZE, Z-order), VACUUM and a checkpoint per mirrored table.

A mirror commits one small set of files per group, so a table that follows a busy slot for a day
holds thousands of files and every reader pays for them. Maintenance rewrites them into few, removes
the files no version within the retention still needs, and writes a checkpoint so that opening the
table reads one Parquet file instead of thousands of JSON commits.

Why it is safe beside a running mirror of the same table (docs/operations.md, "Table maintenance"):
- exactly-once lives in the tables' ``txn`` actions (applier.sink.idempotence). Compaction commits
  only rewrites (``dataChange: false``) and never touches them; a checkpoint carries them all.
- a compaction and a mirror's MERGE that race are ordinary Delta commit conflicts: whichever commits
  second finds the other's commit, and retries (applier.sink.conflicts) — the mirror's write is
  idempotent, so retrying it is exactly right; a compaction retried just plans again.
- VACUUM deletes only files that no version within the retention references and that are older than
  it: a file a MERGE has written but not yet committed is seconds old. (``full``, as Spark's VACUUM: files
  a failed or conflicted commit left behind are deleted too.) The mirror reads the newest version. A
  retention under the table's own ``delta.deletedFileRetentionDuration`` (7 days by default) is refused
  unless ``maintenance.enforce_retention`` is false, which is for a stopped mirror and no readers of
  older versions.

delta-rs does the work (no JVM) on every table it can write; the others (deletion vectors, type
widening, liquid clustering...) go through Spark's ``OPTIMIZE``/``VACUUM``, which checkpoint on their own
every ``delta.checkpointInterval`` commits.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import SinkError
from applier.infra.progress import Progress, byte_size
from applier.sink.conflicts import retry_on_conflict
from applier.sink.naming import quote_identifier
from applier.sink.store import DELTARS, DeltaRsStore, FileStats, SparkStore, writer
from applier.sink.store.checkpoints import refresh_checkpoint
from applier.sink.store.picker import deltars_writer
from applier.storage.paths import TablePath

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from applier.config import MaintenanceSettings
    from applier.spark.session import SparkProvider


@dataclass(frozen=True, slots=True)
class DataFiles:
    """The data files of a table's newest version: how many, how many are small, their bytes."""

    count: int
    small: int
    size_bytes: int

    @classmethod
    def of(cls, files: FileStats, small_below: int) -> DataFiles:
        return cls(files.count, files.small(small_below), files.size_bytes)


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    """What maintenance did to one table (or would do, with ``dry_run``)."""

    table: str
    path: str
    engine: str  # 'delta-rs' or 'spark'
    before: DataFiles
    after: DataFiles
    compacted: bool  # compaction ran (it runs when before.small >= maintenance.min_small_files)
    vacuumed: int | None  # files VACUUM deleted (None: not run, or not counted)
    checkpoint_version: int | None  # the version a checkpoint was written at (None: not written here)
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    dry_run: bool = False  # nothing changed: ``vacuumed`` counts what VACUUM would delete

    def line(self) -> str:
        files = f"{self.before.count} files ({self.before.small} small, {byte_size(self.before.size_bytes)})"
        if self.compacted:
            files += f" -> {self.after.count} files"
        else:
            files += " left as they are"
        parts = [files]
        if self.vacuumed is not None:
            parts.append(f"vacuum {'would delete' if self.dry_run else 'deleted'} {self.vacuumed} files")
        if self.checkpoint_version is not None:
            parts.append(f"checkpoint at version {self.checkpoint_version}")
        parts += list(self.notes)
        return f"{self.table}: " + "; ".join(parts) + f" ({self.seconds:.1f}s, {self.engine})"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "path": self.path, "engine": self.engine, "files_before": self.before.count,
                "small_files_before": self.before.small, "bytes_before": self.before.size_bytes,
                "files_after": self.after.count, "bytes_after": self.after.size_bytes, "compacted": self.compacted,
                "vacuumed_files": self.vacuumed, "checkpoint_version": self.checkpoint_version,
                "seconds": round(self.seconds, 3), "notes": list(self.notes), "dry_run": self.dry_run}


class TableMaintainer:
    """Maintains one table at a time with the settings of ``maintenance`` (see the module docstring)."""

    def __init__(self, settings: MaintenanceSettings, spark: SparkProvider | None = None, *,
                 dry_run: bool = False, progress: Progress | None = None) -> None:
        self.settings = settings
        self.spark = spark
        self.dry_run = dry_run
        self.progress = progress or (lambda _m: None)

    def z_order_for(self, table: str) -> list[str]:
        """The Z-order columns of the first ``maintenance.z_order`` glob matching ``schema.table``."""
        return next((cols for pattern, cols in self.settings.z_order.items() if fnmatch.fnmatchcase(table, pattern)),
                    [])

    def maintain(self, path: TablePath | str, table: str, *, z_order: bool = True) -> MaintenanceResult:
        """Maintain the table at ``path`` (``table`` names it in lines and errors). ``z_order``: whether
        ``maintenance.z_order`` applies (the mirrored tables' columns; not their history or feed tables)."""
        started = time.monotonic()
        path = str(path)
        columns = self.z_order_for(table) if z_order else []
        repaired = self._rewrite_int96(path, table)
        store = deltars_writer(path)
        if store is not None:
            result = self._with_deltars(store, path, table, columns, started)
        elif self.spark is None:
            raise SinkError("this table needs Spark for maintenance (a Delta feature delta-rs cannot write) and "
                            "no Spark session was given", table=table, path=path)
        else:
            result = self._with_spark(path, table, columns, started)
        return replace(result, notes=(repaired, *result.notes)) if repaired else result

    def _rewrite_int96(self, path: str, table: str) -> str | None:
        """Before anything else (a delta-rs compaction would write overflowed values back): data files that
        store timestamps as INT96 are rewritten by Spark as microseconds (applier.sink.int96). What was
        done, for the result's notes; None when no file needed it (or delta-rs cannot read the table: then
        Spark does all its maintenance, and reads INT96 right)."""
        from applier.sink.int96 import CHECKED, PROP_TIMESTAMPS, int96_files_at, rewrite_with_spark

        found = int96_files_at(path)
        if found is None:  # nothing to check (marked already, no timestamp column, not delta-rs's to read)
            return None
        mark = {PROP_TIMESTAMPS: CHECKED}
        if not found:
            if not self.dry_run:
                retry_on_conflict(lambda: writer(path, self.spark).set_properties(path, mark), table=table)
            return None
        what = (f"{len(found)} data files store timestamps as INT96, which delta-rs and other readers misread "
                "outside 1677-2262")
        if self.dry_run:
            return f"{what}: would rewrite them with Spark"
        if self.spark is None:
            raise SinkError(f"{what}, and rewriting them needs Spark, which was not given", table=table, path=path)
        self.progress(f"{table}: {what}; rewriting the table's data files with Spark (timestamps as microseconds)")
        spark = self.spark.get(f"{table}: rewriting INT96 timestamps")
        retry_on_conflict(lambda: rewrite_with_spark(spark, path), table=table)
        retry_on_conflict(lambda: writer(path, self.spark).set_properties(path, mark), table=table)
        return f"rewrote {len(found)} INT96 data files with Spark (timestamps now microseconds)"

    # --- delta-rs ---------------------------------------------------------------------------------

    def _with_deltars(self, store: DeltaRsStore, path: str, table: str, zorder: list[str],
                      started: float) -> MaintenanceResult:
        s = self.settings
        before = DataFiles.of(store.file_stats(path), s.small_file_bytes)
        compact = before.small >= s.min_small_files
        notes: list[str] = []
        if self.dry_run:
            notes.append("dry run: " + (f"would {'z-order by ' + ', '.join(zorder) if zorder else 'compact'}"
                                        if compact else f"fewer than {s.min_small_files} small files"))
            removed = store.vacuum(path, s.retention_hours, dry_run=True, enforce_retention=s.enforce_retention) \
                if s.vacuum else None
            return MaintenanceResult(table, path, "delta-rs", before, before, False, removed, None,
                                     time.monotonic() - started, tuple(notes), dry_run=True)
        if self.spark is not None:  # delta-rs's checkpoints fail on one in older column types: Spark's first
            refresh_checkpoint(self.spark, path, table=table)
        if compact:
            self.progress(f"{table}: {'z-ordering' if zorder else 'compacting'} {before.small} small files "
                          f"of {before.count}")
            retry_on_conflict(lambda: store.optimize(path, zorder, s.target_file_bytes), table=table)
        removed = None
        if s.vacuum:
            removed = retry_on_conflict(
                lambda: store.vacuum(path, s.retention_hours, dry_run=False, enforce_retention=s.enforce_retention),
                table=table)
        version = None
        if s.checkpoint:
            version = store.checkpoint(path)
        after = DataFiles.of(store.file_stats(path), s.small_file_bytes)
        return MaintenanceResult(table, path, "delta-rs", before, after, compact, removed, version,
                                 time.monotonic() - started, tuple(notes))

    # --- Spark ------------------------------------------------------------------------------------

    def _with_spark(self, path: str, table: str, zorder: list[str], started: float) -> MaintenanceResult:
        assert self.spark is not None
        s = self.settings
        before = _data_files(path, s.small_file_bytes)
        compact = before is None or before.small >= s.min_small_files
        notes = ["checkpoints written by Spark every delta.checkpointInterval commits"]
        if self.dry_run:  # before Spark starts: a dry run plans nothing with it
            empty = before or DataFiles(0, 0, 0)
            return MaintenanceResult(table, path, "spark", empty, empty, False, None, None,
                                     time.monotonic() - started, ("dry run: Spark tables are not planned ahead",),
                                     dry_run=True)
        store = SparkStore(self.spark)
        if compact:
            clause = f" ZORDER BY ({', '.join(quote_identifier(c) for c in zorder)})" if zorder else ""
            self.progress(f"{table}: OPTIMIZE{clause} with Spark")
            retry_on_conflict(lambda: store.optimize(path, zorder, s.target_file_bytes), table=table)
        if s.vacuum:
            retry_on_conflict(lambda: store.vacuum(path, s.retention_hours, dry_run=False,
                                                   enforce_retention=s.enforce_retention), table=table)
            notes.append("vacuum ran (Spark does not count the files it deleted)")
        after = _data_files(path, s.small_file_bytes)
        empty = DataFiles(0, 0, 0)
        return MaintenanceResult(table, path, "spark", before or empty, after or empty, compact, None, None,
                                 time.monotonic() - started, tuple(notes))


@dataclass(frozen=True, slots=True)
class TargetTable:
    """A Delta table under a target: its source table's name, what kind of table it is, where it is."""

    source_name: str  # schema.table in Postgres
    kind: str  # 'mirror', 'history', 'changes' or 'retired'
    path: TablePath

    @property
    def label(self) -> str:
        """How lines and reports name it: ``schema.table``, ``schema.table (history)``..."""
        return self.source_name if self.kind == "mirror" else f"{self.source_name} ({self.kind})"


def tables_under(target: str | Path) -> list[TargetTable]:
    """Every Delta table under a target: mirrored tables, their history and change feed tables and
    retired tables."""
    from applier.sink.derived import derived_table_dirs
    from applier.sink.naming import mirrored_table_dirs, retired_table_dirs, source_name_of

    def name(path: TablePath) -> str:
        return ".".join(source_name_of(path))

    tables = [TargetTable(name(path), "mirror", path) for path in mirrored_table_dirs(target)]
    tables += [TargetTable(name(path), kind.name, path) for kind, path in derived_table_dirs(target)]
    tables += [TargetTable(name(path), "retired", path) for path in retired_table_dirs(target)]
    return tables


class MaintenanceSchedule:
    """``maintenance.every_minutes`` inside ``mirror``: called while the stream is idle (between groups, so
    never beside the mirror's own commits), it maintains at most one table per call, each table at most
    once per period, counted from the start of the run. A failure is logged and the table tried again
    next period: maintenance never stops a mirror."""

    def __init__(self, maintainer: TableMaintainer, target: str | Path, every_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.maintainer = maintainer
        self.target = target
        self.every_seconds = every_seconds
        self.clock = clock
        self._started = clock()
        self._last: dict[TablePath, float] = {}
        self.results: list[MaintenanceResult] = []

    def tick(self) -> None:
        now = self.clock()
        for table in tables_under(self.target):
            if now - self._last.get(table.path, self._started) < self.every_seconds:
                continue
            self._last[table.path] = now
            try:
                result = self.maintainer.maintain(table.path, table.label, z_order=table.kind == "mirror")
            except Exception as e:  # noqa: BLE001 - logged; the mirror goes on and the table is tried again
                logging.getLogger("applier.maintain").warning("%s: maintenance failed, tried again in %.0f "
                                                               "minutes: %s", table.label, self.every_seconds / 60, e)
                return
            self.results.append(result)
            self.maintainer.progress(result.line())
            return


def _data_files(path: str, small_below: int) -> DataFiles | None:
    """The table's data files as delta-rs lists them from its log, even when it cannot write or scan the
    data; None when delta-rs cannot open the log at all (the counts are then unknown)."""
    try:
        return DataFiles.of(DELTARS.file_stats(path), small_below)
    except Exception:  # noqa: BLE001 - a table delta-rs cannot open
        return None
