"""Tables derived from a mirrored table's changes: its SCD type 2 history and its change feed.

Why one place: both are written from the same group as the mirror table, each with its own applied
version (its own Delta app id), both get the initial copy's rows, and both must be created with the
table's copy (a derived table started later would silently lack what happened before). The order of
the commits is what keeps them exact after a crash: the change feed reads the mirror table's rows, so
it commits before it (applier.sink.changefeed); the history reads only itself, and commits after.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.catalog import SchemaVersion
from applier.catalog.batches import TableBatch
from applier.config import TableRule, TablesSettings
from applier.errors import SinkError
from applier.infra.crashpoints import crashpoint
from applier.lsn import format_lsn
from applier.sink.bulkload import SnapshotLoader
from applier.sink.changefeed import MirrorRows, feed_app_id, feed_rows, feed_spec
from applier.sink.conflicts import retry_on_conflict
from applier.sink.extras import OP_READ, commit_datetime
from applier.sink.history import (
    HistoryPlan,
    history_app_id,
    history_spec,
    plan_history,
    read_open_versions,
)
from applier.sink.idempotence import applied_version, carry_applied_version, is_delta_table
from applier.sink.layouts import Layouts
from applier.sink.naming import CHANGES_DIR, HISTORY_DIR, mirrored_table_dirs, table_location
from applier.sink.rowkeys import keys_continued
from applier.sink.schema import ensure_table
from applier.sink.spec import PROP_SOURCE, TableSpec
from applier.sink.store.arrow import arrow_table
from applier.sink.store.sparkmerge import write_rows
from applier.spark.session import SparkLike, SparkProvider
from applier.storage.location import is_object_store, join
from applier.storage.moves import TableInTheWay, move_table_on_store
from applier.storage.paths import TablePath, location
from applier.values import UNCHANGED_TOAST

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from applier.sink.spec import Renames, RewritePolicy
    from applier.sink.store import StorePicker

#: (group end LSN, batch) of one table, in commit order
Parts = list[tuple[int, TableBatch]]
#: a history commit to make after the mirror table's: path, spec, plan, description
HistoryJob = tuple[str, TableSpec, HistoryPlan, str]


@dataclass(frozen=True, slots=True)
class _Kind:
    name: str  # 'history' or 'changes'
    directory: str
    app_id: Callable[[str], str]
    spec: Callable[[TableSpec], TableSpec]

    def wanted(self, rule: TableRule | None) -> bool:
        return rule is not None and bool(rule.history if self.name == "history" else rule.changes)

    def custom_path(self, rule: TableRule) -> str | None:
        return rule.history_target if self.name == "history" else rule.changes_target


HISTORY = _Kind("history", HISTORY_DIR, history_app_id, history_spec)
CHANGES = _Kind("changes", CHANGES_DIR, feed_app_id, feed_spec)
KINDS = (CHANGES, HISTORY)  # in commit order: the feed before the mirror table, the history after


def derived_table_dirs(target_dir: str | Path) -> list[tuple[_Kind, TablePath]]:
    """(kind, path) of the history and change feed tables in their default places under the target."""
    return [(kind, path) for kind in KINDS for path in mirrored_table_dirs(join(target_dir, kind.directory))]


class DerivedTables:
    """The history and change feed tables of a target's mirrored tables."""

    def __init__(self, spark: SparkLike, target_dir: str, tables: TablesSettings,
                 mirror_version: Callable[[str, str], int | None], mirror_path: Callable[[str, str], str], *,
                 stores: StorePicker | None = None, rewrites: RewritePolicy | None = None) -> None:
        from applier.sink.store import StorePicker

        self._spark = SparkProvider.of(spark)
        #: which store creates, reads and writes each derived table (delta-rs where it can: no JVM)
        self.stores = stores if stores is not None else StorePicker(self._spark)
        #: how a widened column or a renamed one reaches a derived table, as its mirror table (a rewrite keeps
        #: it open to delta-rs); the renames are the mirror table's (evolve_renamed)
        self.rewrites = rewrites
        self.target_dir = target_dir
        self.tables = tables
        self._mirror_version = mirror_version  # (namespace, name) -> the mirror table's applied version
        self._mirror_path = mirror_path
        self._applied: dict[str, int] = {}  # derived table path -> applied end LSN
        self._schema_seen: dict[str, SchemaVersion] = {}
        self._exists: set[str] = set()

    @property
    def spark(self) -> SparkSession:
        """The session (started now when it is not): a history or change feed commit delta-rs does not make."""
        return self._spark.get("history or change feed tables delta-rs does not write")

    def kinds(self, qualified: str) -> list[_Kind]:
        rule = self.tables.rule_for(qualified)
        return [k for k in KINDS if k.wanted(rule)]

    def path(self, kind: _Kind, namespace: str, name: str) -> str:
        rule = self.tables.rule_for(f"{namespace}.{name}")
        custom = kind.custom_path(rule) if rule is not None else None
        return custom or str(table_location(join(self.target_dir, kind.directory), namespace, name,
                                            safe=self.tables.safe_path_names(f"{namespace}.{name}")))

    def follow(self, old_name: str, new_name: str | None, retired_to: str) -> None:
        """The source table ``old_name`` is now ``new_name`` (renamed: its mirror table moved) or, with
        None, was dropped and its name taken by a new table (its mirror table retired to ``retired_to``).
        Its history and change feed tables in their default places go with it, and a renamed one keeps
        its applied versions under the new name, so that a renamed table keeps its own history and a
        new table that takes a name never writes into the history of the table that had it. Idempotent
        (a move a crash interrupted is finished by repeating it). A derived table of another relation in
        the way (two tables with history swapped names) stops the run: nothing is merged into it."""
        old_ns, _, old_table = old_name.partition(".")
        for kind in KINDS:
            rule = self.tables.rule_for(old_name)
            if rule is not None and kind.custom_path(rule):
                continue  # a path the user chose: the rules decide where the new name's table goes
            src = str(table_location(join(self.target_dir, kind.directory), old_ns, old_table,
                                     safe=self.tables.safe_path_names(old_name)))
            if new_name is None:
                dst = f"{retired_to}.{kind.name}"
            else:
                new_ns, _, new_table = new_name.partition(".")
                dst = self.path(kind, new_ns, new_table)
            if src == dst:
                continue
            in_the_way = SinkError(
                f"the {kind.name} table of {old_name} must follow it to {dst}, where the {kind.name} table "
                f"of another table already is (two tables with {kind.name} swapped names); nothing was "
                f"written to either. Move one of them away (or delete it: the mirror then copies its "
                "table again and starts it anew), then run again", table=new_name or old_name, path=dst)
            if is_object_store(src):
                try:
                    if move_table_on_store(src, dst):
                        log.warning("the %s table of %s moved from %s to %s", kind.name, old_name, src, dst)
                except TableInTheWay:
                    raise in_the_way from None
            elif Path(src, "_delta_log").is_dir():
                if Path(dst, "_delta_log").is_dir():
                    raise in_the_way
                Path(dst).parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
                log.warning("the %s table of %s moved from %s to %s", kind.name, old_name, src, dst)
            for cache in (self._applied, self._schema_seen):
                cache.pop(src, None)
                cache.pop(dst, None)
            self._exists.discard(src)
            if new_name is not None and (location(dst) / "_delta_log").is_dir():
                carry_applied_version(self._spark, dst, kind.app_id(old_name), kind.app_id(new_name),
                                      {PROP_SOURCE: new_name})  # (status names it by this)

    def missing(self, namespace: str, name: str) -> bool:
        """A derived table the rules ask for does not exist (turned on after the copy, or deleted)."""
        for kind in self.kinds(f"{namespace}.{name}"):
            path = self.path(kind, namespace, name)
            if path not in self._exists:
                if not is_delta_table(path):
                    return True
                self._exists.add(path)
        return False

    def spec(self, kind: _Kind, table: TableSpec) -> TableSpec:
        """The derived table's spec: the table's own columns (no metadata columns) and the kind's."""
        if not table.key_columns:
            raise SinkError(f"a {kind.name} table needs a key: this table has none (set key_columns in its rule)",
                            table=table.source_name)
        own = TableSpec(table.source_name, table.source_schema,
                        table.key_columns, table.replica_identity, safe_names=table.safe_names)
        return kind.spec(own)

    def evolve_renamed(self, table: TableSpec, schema_version: SchemaVersion, renames: Renames) -> None:
        """Evolve the table's existing history and change feed tables to ``schema_version`` following the
        column renames ``renames`` proves (the mirror table's, read from the same note), so that a renamed
        column keeps its values there too: otherwise every open version would hold NULL under the new name
        and the old values under the old one. Called by the engine between the mirror table's evolution and
        marking its renames applied: a crash in between leaves the note, and the re-run renames these."""
        ns, name = schema_version.namespace, schema_version.relation.name
        for kind in self.kinds(table.source_name):
            path = self.path(kind, ns, name)
            if self._schema_seen.get(path) is not schema_version and is_delta_table(path):
                self._ensure(path, self.spec(kind, table), schema_version, renames)

    def _ensure(self, path: str, spec: TableSpec, schema_version: SchemaVersion,
                renames: Renames | None = None) -> None:
        if self._schema_seen.get(path) is schema_version:
            return
        ensure_table(self._spark, path, spec, None, stores=self.stores, rename=self.rewrites, renames=renames)
        self.stores.forget(path)  # created or evolved: its protocol is read again
        self._schema_seen[path] = schema_version
        self._exists.add(path)

    def applied(self, kind: _Kind, path: str, source_name: str) -> int | None:
        """The derived table's applied version (None: no such table yet, or none recorded)."""
        done = self._applied.get(path)
        if done is None and is_delta_table(path):
            done = applied_version(self._spark, path, kind.app_id(source_name))
            if done is not None:
                self._applied[path] = done
        return done

    def _version(self, kind: _Kind, path: str, source_name: str, namespace: str, name: str) -> int | None:
        """The derived table's applied version; a mirror table that has one while its derived table
        does not exist stops the run (what happened before is not in the stream any more)."""
        done = self._applied.get(path)
        if done is None and is_delta_table(path):
            done = applied_version(self._spark, path, kind.app_id(source_name))
        elif done is None and self._mirror_version(namespace, name) is not None:
            raise SinkError(f"{kind.name} is on but the table has no {kind.name} table (turned on after the table "
                            f"was copied, or deleted); the mirror copies such a table again and starts its "
                            f"{kind.name} there; a replay needs a new target", table=source_name, path=path)
        return done

    # --- per group ------------------------------------------------------------------------------

    def before_mirror_commit(self, table: TableSpec, last_batch: TableBatch, parts: Parts,
                             group_end: int) -> HistoryJob | None:
        """Commit the table's change feed for the group (before the mirror table's commit) and plan
        its history (committed after, by :meth:`after_mirror_commits`)."""
        kinds = self.kinds(table.source_name)
        if CHANGES in kinds:
            self._commit_feed(table, last_batch, parts, group_end)
        return self._plan_history(table, last_batch, parts, group_end) if HISTORY in kinds else None

    def after_mirror_commits(self, histories: list[HistoryJob], group_end: int) -> int:
        if histories:
            crashpoint("before_history")
        commits = 0
        for path, spec, plan, description in histories:
            if not plan.empty:
                app_id = history_app_id(spec.source_name)
                store = self.stores.merger(path, spec)  # delta-rs may decline the plan: Spark makes it
                retry_on_conflict(partial(store.merge_history, path, spec, plan, app_id=app_id,
                                          version=group_end, description=description),
                                  table=spec.source_name)
                commits += 1
            self._applied[path] = group_end
        return commits

    def _events_layout(self, spec: TableSpec) -> tuple[tuple[str, ...], tuple[int, ...]]:
        names = spec.source_column_names
        return names, tuple(names.index(k) for k in spec.key_columns)

    def _plan_history(self, table: TableSpec, last_batch: TableBatch, parts: Parts,
                      group_end: int) -> HistoryJob | None:
        rule = self.tables.rule_for(table.source_name)
        assert rule is not None
        spec = self.spec(HISTORY, table)
        path = self.path(HISTORY, last_batch.namespace, last_batch.name)
        done = self._version(HISTORY, path, table.source_name, last_batch.namespace, last_batch.name)
        todo = [(lsn, b) for lsn, b in parts if done is None or lsn > done]
        if not todo:
            return None
        self._ensure(path, spec, last_batch.schema)
        names, key_positions = self._events_layout(spec)
        if rule.history_columns is not None:  # Postgres names
            columns = [spec.delta_name(c) for c in rule.history_columns]
            unknown = set(columns) - set(names)
            if unknown:
                raise SinkError("history_columns names columns the table does not have", table=table.source_name,
                                columns=", ".join(sorted(unknown)))
            tracked = tuple(names.index(c) for c in columns)
        else:
            tracked = tuple(range(len(names)))
        layouts = Layouts(spec.postgres_column_names, last_batch.schema)
        events = [(b.commit_lsn, commit_datetime(b), c) for _lsn, b in todo for c in layouts.aligned(b)]
        read = partial(self._rows_by_key, path, key_columns=spec.key_columns)
        target = read_open_versions(read, spec, keys_continued((e[2] for e in events), key_positions))
        plan = plan_history(events, key_positions, tracked, target, UNCHANGED_TOAST)
        description = f"{table.source_name} history end_lsn={format_lsn(group_end)} transactions={len(todo)}"
        return path, spec, plan, description

    def _commit_feed(self, table: TableSpec, last_batch: TableBatch, parts: Parts, group_end: int) -> None:
        ns, name = last_batch.namespace, last_batch.name
        spec = self.spec(CHANGES, table)
        path = self.path(CHANGES, ns, name)
        done = self._version(CHANGES, path, table.source_name, ns, name)
        mirrored = self._mirror_version(ns, name)
        if done is not None and mirrored is not None and mirrored > done:
            raise SinkError("the change feed table is behind the mirror table (it was replaced or restored "
                            "from an older backup); copy the table again into both", table=table.source_name,
                            path=path, feed_at=format_lsn(done), mirror_at=format_lsn(mirrored))
        start = mirrored  # None: the mirror table holds nothing yet, so walk the group from its start
        walk = [(lsn, b) for lsn, b in parts if start is None or lsn > start]
        todo = [lsn for lsn, _b in walk if done is None or lsn > done]
        if not todo:
            return
        self._ensure(path, spec, last_batch.schema)
        names, key_positions = self._events_layout(spec)
        layouts = Layouts(spec.postgres_column_names, last_batch.schema)
        events = [(b.commit_lsn, commit_datetime(b), c, done is None or lsn > done)
                  for lsn, b in walk for c in layouts.aligned(b)]
        deleted = table.extra.deleted if table.extra is not None else None
        mirror = MirrorRows(partial(self._rows_by_key, self._mirror_path(ns, name), spec.source_schema,
                                    key_columns=spec.key_columns, unless=deleted))
        mirror.load(keys_continued((e[2] for e in events), key_positions))
        rows = feed_rows(events, key_positions, len(names), mirror, UNCHANGED_TOAST)
        description = f"{table.source_name} changes end_lsn={format_lsn(group_end)} transactions={len(todo)}"
        tag = (feed_app_id(table.source_name), group_end, description)
        piece = arrow_table(rows, spec.schema)
        store = self.stores.copier(path, spec)
        if piece is None or store.uses_spark:  # a value Arrow cannot hold: Spark's row by row
            retry_on_conflict(partial(write_rows, self.spark, path, spec.schema, rows, replace=False, tag=tag),
                              table=table.source_name)
        else:
            retry_on_conflict(partial(store.write_arrow, path, piece, mode="append", tag=tag),
                              table=table.source_name)
        self._applied[path] = group_end
        crashpoint("feed_committed")

    # --- the initial copy -----------------------------------------------------------------------

    def snapshot_loaders(self, table: TableSpec, schema_version: SchemaVersion, source_columns: tuple[str, ...],
                         lsn: int, *, commit_bytes: int, stores: StorePicker) -> list[SnapshotLoader]:
        """Loaders writing the copy's rows into the derived tables: each row an open version, or an
        'R' change, at the copy's position."""
        loaders = []
        ns, name = schema_version.namespace, schema_version.relation.name
        for kind in self.kinds(table.source_name):
            spec = self.spec(kind, table)
            path = self.path(kind, ns, name)
            if is_delta_table(path) and applied_version(self._spark, path, kind.app_id(table.source_name)) is not None:
                continue  # it exists and follows the stream: a copy of the table (table sync) leaves it alone
            self._ensure(path, spec, schema_version)
            stores.forget(path)  # just created or evolved: its protocol is read again
            constants = (lsn, None, None, None) if kind is HISTORY else (OP_READ, lsn, 0, None)
            description = f"{table.source_name} {kind.name} snapshot at {format_lsn(lsn)}"
            tag = (kind.app_id(table.source_name), lsn, description)
            loaders.append(SnapshotLoader(
                self._spark, path, spec, source_columns, tag=tag, commit_bytes=commit_bytes,
                on_done=partial(self._copied, path, lsn), constants=constants,
                store=stores.copier(path, spec)))
        return loaders

    def _rows_by_key(self, path: str, schema: pa.Schema, keys: list[tuple[Any, ...]] | None, *,
                     key_columns: tuple[str, ...], open_only: str | None = None,
                     unless: str | None = None) -> dict[object, list[Any]]:
        """The rows of ``schema``'s columns of the table at ``path`` whose key is one of ``keys`` (every row:
        None), by frozen key: read by delta-rs where it reads the table as Spark does, else by Spark."""
        if not is_delta_table(path):
            return {}
        # the store that opens the path; delta-rs reads its protocol once, in rows_by_key (Spark reads them
        # where delta-rs does not read them as Spark does)
        return self.stores.reader(path).rows_by_key(path, schema, key_columns, keys, open_only=open_only,
                                                    unless=unless)

    def _copied(self, path: str, lsn: int, _rows: int) -> None:
        self._applied[path] = lsn

